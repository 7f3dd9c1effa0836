"""Five losses on scikit-learn's digits: Recall@K and MAP@R on held-out classes.

The protocol of `examples/digits_demo.py`: a 16-d linear embedding of the 8x8
digit images, trained on the digits 0-5 with `tfdml.data.pk_batches` batches
(6 classes x 8 images, 10 epochs x 40 steps, Adam 1e-3), evaluated on the
held-out digits 6-9, classes never seen in training (cosine, query excluded).
The same network, seed, batches, steps and optimizer for each of

* `TripletNCALoss(order=2)` with EPHN mining (easy positive, hard negative), the
  demo's loss;
* `MultiSimilarityLoss()` with its pair miner;
* `ProxyAnchorLoss(num_classes=6)`, one learned proxy per training class;
* `ArcFaceLoss(num_classes=6)`, one learned class weight per training class;
* `SupConLoss()`, supervised contrastive over every pair of the batch.

Every loss trains through `tfdml.models.MetricModel(embedder, loss)`, which owns
the proxies and class weights (and trains them with the network); it is
compiled without `loss=`. The proxy and classification losses need class ids in
`[0, C)`: the training classes are numbered 0..C-1 (`np.unique`), which for the
digits 0-5 changes nothing. The losses keep their default settings.

The table starts with two baselines on the same test images: the raw 64 pixel
values (cosine, no learning at all) and the network before training (the same
seed, so the same initial weights as every loss). On these digits the raw
pixels beat every trained row: the script compares the losses' code paths on
one protocol, it is not evidence that training helps (for that, see the glyph
benchmark, `examples/glyphs/demo.py` and `docs/glyphs.md`).

Runs offline in about a minute on 2 CPU cores:

    python examples/digits_losses.py
    python examples/digits_losses.py --epochs 20 --losses proxy-anchor arcface
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import keras
import numpy as np

import tfdml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_demo import (  # noqa: E402  (the demo's)
    JIT_COMPILE,
    add_training_options,
    build_model,
    check_sizes,
)

KS = (1, 2, 4, 8)
LOSSES = ("nca2-ephn", "multi-similarity", "proxy-anchor", "arcface", "supcon")
LABELS = {
    "nca2-ephn": "TripletNCALoss(order=2), EPHN",
    "multi-similarity": "MultiSimilarityLoss()",
    "proxy-anchor": "ProxyAnchorLoss()",
    "arcface": "ArcFaceLoss()",
    "supcon": "SupConLoss()",
}


def make_loss(name, num_classes):
    losses = tfdml.losses
    if name == "nca2-ephn":
        return losses.TripletNCALoss(order=2, miner=tfdml.miners.TripletMiner("easy", "hard"))
    if name == "multi-similarity":
        return losses.MultiSimilarityLoss()
    if name == "proxy-anchor":
        return losses.ProxyAnchorLoss(num_classes=num_classes)
    if name == "arcface":
        return losses.ArcFaceLoss(num_classes=num_classes)
    if name == "supcon":
        return losses.SupConLoss()
    raise ValueError(f"unknown loss {name!r}")


def retrieval(embeddings, y):
    """Recall@K and MAP@R of ``embeddings`` (cosine, query excluded)."""
    recalls = tfdml.metrics.recall_at_k(embeddings, y, ks=KS)
    return {**{f"R@{k}": float(recalls[k]) for k in KS},
            "MAP@R": float(tfdml.metrics.map_at_r(embeddings, y))}


def evaluate(embedder, x, y):
    return retrieval(embedder.predict(x, verbose=0), y)


def format_table(results):
    columns = [f"R@{k}" for k in KS] + ["MAP@R"]
    lines = ["| loss | " + " | ".join(columns) + " | train s |",
             "|---|" + "---:|" * (len(columns) + 1)]
    for name, row in results.items():
        cells = " | ".join(f"{100 * row[c]:.1f}" for c in columns)
        seconds = row.get("seconds")
        lines.append(f"| {LABELS.get(name, name)} | {cells} | "
                     f"{'' if seconds is None else f'{seconds:.1f}'} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES))
    parser.add_argument("--model", choices=("linear", "cnn"), default="linear")
    add_training_options(parser)
    args = parser.parse_args(argv)
    check_sizes(parser, args)

    start = time.perf_counter()
    train = tfdml.datasets.load("digits", "train", dtype="float32")  # digits 0-5
    test = tfdml.datasets.load("digits", "test", dtype="float32")    # digits 6-9
    # Class ids in [0, C) for the proxy and classification losses.
    class_ids, train_ids = np.unique(train.labels, return_inverse=True)
    train = dataclasses.replace(train, labels=train_ids)
    num_classes = len(class_ids)
    print(f"tfdml {tfdml.__version__}: {num_classes} training classes (digits "
          f"{', '.join(str(c) for c in class_ids)}; {len(train)} images), held-out digits 6-9 "
          f"for testing ({len(test)} images); {args.model} {args.embedding_dim}-d embedding, "
          f"batches of {args.classes_per_batch} classes x {args.samples_per_class} images, "
          f"{args.epochs} epochs x {args.steps_per_epoch} steps, Adam {args.learning_rate:g}, "
          f"seed {args.seed}", flush=True)

    keras.utils.set_random_seed(args.seed)
    results = {"raw pixels": retrieval(test.images.reshape(len(test), -1), test.labels),
               "before training": evaluate(build_model(args.model, args.embedding_dim),
                                           test.images, test.labels)}
    for name in args.losses:
        keras.utils.set_random_seed(args.seed)  # the same initial weights for every loss
        model = tfdml.models.MetricModel(build_model(args.model, args.embedding_dim),
                                         make_loss(name, num_classes))
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), jit_compile=JIT_COMPILE)
        dataset = tfdml.data.PKDataset(train, args.classes_per_batch, args.samples_per_class,
                                       seed=args.seed)
        t = time.perf_counter()
        history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                            shuffle=False, verbose=0)
        seconds = time.perf_counter() - t
        row = evaluate(model.embedder, test.images, test.labels)
        row["seconds"] = seconds
        row["final_loss"] = float(history.history["loss"][-1])
        results[name] = row
        print(f"{LABELS[name]:<32} R@1 {100 * row['R@1']:5.1f}  MAP@R {100 * row['MAP@R']:5.1f}  "
              f"final loss {row['final_loss']:.4f}  ({seconds:.1f} s)", flush=True)

    print("\nRecall@K and MAP@R (%) on the held-out digits 6-9 (cosine, query excluded):\n")
    print(format_table(results))
    trained = [results[name]["R@1"] for name in args.losses]
    if results["raw pixels"]["R@1"] >= max(trained):
        print("\nThe raw pixels retrieve the unseen digits at least as well as every trained "
              "embedding (Recall@1): this table compares code paths, not whether training "
              "helps (see examples/glyphs/demo.py).")
    print(f"\n({time.perf_counter() - start:.0f} s in all)")
    return results


if __name__ == "__main__":
    main()
