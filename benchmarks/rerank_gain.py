"""The gain of tfdml.search.PairReranker on held-out classes: the digits, and a harder set.

For each data set, a first search ranks each held-out item's neighbours among the other
held-out items (cosine, itself excluded); the re-ranker, trained only on the training
classes' mined pairs, re-orders the top ``--top-n`` (30) of each list. Reported: Recall@1,
Precision@5 and MAP@10 before and after, over ``--seeds`` seeds (mean and range).

* **digits**: scikit-learn's 8x8 digits; digits 0-5 train a 16-d linear embedding
  (``TripletNCALoss(order=2)`` with EPHN mining, as ``examples/digits_demo.py``), digits
  6-9 are held out. The re-ranker sees the 16-d embeddings.
* **synthetic** (harder): 200 classes in 64 dimensions; a class is a mean in an 8-d
  "identity" subspace (means N(0, 1)) plus its own anisotropic spread (0.1-0.4), and every
  item also carries a class-independent "nuisance" vector in the other 56 dimensions
  (N(0, 0.5^2) each), then everything is rotated by one random orthogonal matrix. The
  cosine of these raw vectors is misled by the nuisance; classes 0-99 train, 100-199 are
  held out. The
  embeddings are the raw vectors (no embedder): what a pair model can learn of the
  similarity itself.

    python benchmarks/rerank_gain.py --output benchmarks/results/rerank_gain.md
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np
from workers import write_report  # benchmarks/workers.py

import tfdml

KS = {"recall@1": 1, "precision@5": 5, "map@10": 10}

#: The standard deviation of the class-independent nuisance coordinates (the identity
#: coordinates: class means N(0, 1), spreads 0.1-0.4).
NUISANCE = 0.5


def digits_embeddings(seed):
    keras.utils.set_random_seed(seed)
    train = tfdml.datasets.load("digits", "train", dtype="float32")
    test = tfdml.datasets.load("digits", "test", dtype="float32")
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=tfdml.losses.TripletNCALoss(
        order=2, miner=tfdml.miners.TripletMiner("easy", "hard")))
    model.fit(tfdml.data.PKDataset(train, 6, 8, seed=seed), epochs=10, steps_per_epoch=40,
              verbose=0)
    return (model.predict(train.images, verbose=0), train.labels,
            model.predict(test.images, verbose=0), test.labels)


def synthetic(seed, classes=200, per_class=30, dim=64, identity=8):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(classes, identity))
    spread = rng.uniform(0.1, 0.4, size=(classes, identity))
    labels = np.repeat(np.arange(classes), per_class)
    x = np.zeros((len(labels), dim))
    x[:, :identity] = means[labels] + rng.normal(size=(len(labels), identity)) * spread[labels]
    x[:, identity:] = rng.normal(size=(len(labels), dim - identity)) * NUISANCE
    x = (x @ np.linalg.qr(rng.normal(size=(dim, dim)))[0]).astype(np.float32)
    train = labels < classes // 2
    return x[train], labels[train], x[~train], labels[~train]


def measure(results):
    return {"recall@1": results.recall_at_k(1)[1], "precision@5": results.precision_at_k(5)[5],
            "map@10": results.map_at_k(10)[10]}


def run(name, data, top_n, epochs):
    x_train, y_train, x_test, y_test = data
    index = tfdml.search.Index("cosine", query_buckets=False)
    index.add(x_test, labels=y_test)
    first = index.retrieve(x_test, max(10, top_n), query_labels=y_test, exclude_self=True)
    reranker = tfdml.search.PairReranker(top_n=top_n)
    reranker.fit(x_train, y_train, epochs=epochs)
    second = reranker.rerank(first, x_test, index.embeddings)
    return measure(first), measure(second)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data", nargs="+", default=["digits", "synthetic"])
    parser.add_argument("--top-n", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    lines = ["# Pairwise re-ranking on held-out classes", "",
             f"`PairReranker(top_n={args.top_n})`, {args.epochs} epochs; the first search is "
             "cosine, each held-out item a query against the others (itself excluded). "
             f"Mean [min, max] over {args.seeds} seeds.", "",
             "| data | metric | first search | re-ranked | gain |", "|---|---|---:|---:|---:|"]
    for name in args.data:
        runs = []
        for seed in range(args.seeds):
            data = digits_embeddings(seed) if name == "digits" else synthetic(seed)
            runs.append(run(name, data, args.top_n, args.epochs))
        for metric in KS:
            before = np.array([r[0][metric] for r in runs])
            after = np.array([r[1][metric] for r in runs])
            gain = after - before
            lines.append(f"| {name} | {metric} | {before.mean():.3f} | {after.mean():.3f} | "
                         f"{gain.mean():+.3f} [{gain.min():+.3f}, {gain.max():+.3f}] |")
        print("\n".join(lines[-3:]), flush=True)
    lines += ["", f"Backend {keras.backend.backend()}, {time.perf_counter() - began:.0f} s. "
              "Command: `python benchmarks/rerank_gain.py`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        write_report(text, args.output)


if __name__ == "__main__":
    main()
