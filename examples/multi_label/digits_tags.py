"""Multi-label retrieval and category-aware batches on scikit-learn's digits.

**Multi-label.** Each digit image is tagged with the properties of its digit (six tags: even,
prime, at least 5, a closed loop, straight strokes only, a perfect square), so an image
carries one to three tags, and 6 and 8 carry the same set. An embedding is trained on the
tags alone (multi-hot ``y``, P x K batches drawn by tag) with a multi-similarity loss,
SupCon and Multi-SupCon (``SupConLoss(graded=True)``), and on the digit ids for comparison.
Held-out images retrieve each other: a neighbour is relevant when it shares a tag (mAP@10,
recall@1), or when its tag set is the same (``min_jaccard=1``), and the graded mAP@10 gains
the Jaccard similarity of the tag sets.

**Categories.** The ten digits are grouped by shape (round 0 6 8 9, straight 1 4 7, curved
2 3 5); a model trained on the digit ids with batches drawn from one category at a time
(``categories_per_batch=1``: the negatives of a batch look alike) or from two, is compared
with plain P x K batches, by recall@1 and by the share of held-out queries whose nearest neighbour is a
different digit of the same category.

Runs under every Keras backend::

    python examples/multi_label/digits_tags.py              # 3 seeds, writes results.json
    KERAS_BACKEND=jax python examples/multi_label/digits_tags.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import keras
import numpy as np

import tfdml

#: The tags of each digit 0..9.
TAGS = ("even", "prime", "large", "loop", "straight", "square")
DIGIT_TAGS = {
    0: ("even", "loop", "square"), 1: ("straight", "square"), 2: ("even", "prime"),
    3: ("prime",), 4: ("even", "straight", "square"), 5: ("prime", "large"),
    6: ("even", "large", "loop"), 7: ("prime", "large", "straight"),
    8: ("even", "large", "loop"), 9: ("large", "loop", "square"),
}
#: Shape categories of the digits, for the category-aware batches.
CATEGORIES = {0: "round", 6: "round", 8: "round", 9: "round", 1: "straight", 4: "straight",
              7: "straight", 2: "curved", 3: "curved", 5: "curved"}

LABEL_RUNS = ("digit_ids_ms", "tags_ms", "tags_supcon", "tags_multi_supcon")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
    parser.add_argument("--output-dir", default="runs/multi_label")
    parser.add_argument("--smoke", action="store_true", help="2 epochs of 3 batches, 1 seed")
    parser.add_argument("--verbose", type=int, default=0)
    return parser.parse_args(argv)


def tag_matrix(digits):
    """``[N, 6]`` multi-hot tags of the digits."""
    ids = [[TAGS.index(t) for t in DIGIT_TAGS[int(d)]] for d in digits]
    return tfdml.ops.multi_hot(ids, len(TAGS)).astype("int32")


def digits(seed):
    """Train and held-out halves: features in [0, 1], digit ids and tags."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    order = np.random.default_rng(seed).permutation(len(x))
    cut = len(x) // 2
    split = []
    for rows in (order[:cut], order[cut:]):
        split.append((x[rows], data.target[rows], tag_matrix(data.target[rows])))
    return split


def embedder(seed):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu", kernel_initializer=init(seed)),
        keras.layers.Dense(32, kernel_initializer=init(seed + 1)),
    ])


def embed(model, x):
    return tfdml.ops.l2_normalize(model.predict(x, batch_size=512, verbose=0))


def fit(loss, x, y, args, seed, **batches):
    keras.utils.set_random_seed(seed)
    model = embedder(seed)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    data = tfdml.data.PKDataset((x, y), batches.pop("classes_per_batch", 4),
                                batches.pop("samples_per_class", 16), seed=seed, **batches)
    history = model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps,
                        verbose=args.verbose)
    return model, float(history.history["loss"][-1])


def tag_scores(model, test):
    x, _, tags = test
    e = keras.ops.convert_to_numpy(embed(model, x))
    return {
        "map@10": float(tfdml.metrics.map_at_k(e, tags, ks=(10,))[10]),
        "graded_map@10": float(tfdml.metrics.map_at_k(e, tags, ks=(10,), graded=True)[10]),
        "same_set_map@10": float(tfdml.metrics.map_at_k(e, tags, ks=(10,),
                                                        min_jaccard=1.0)[10]),
        "recall@1": float(tfdml.metrics.recall_at_k(e, tags, ks=(1,))[1]),
    }


def label_runs(train, test, args, seed):
    x, ids, tags = train
    runs = {"untrained": tag_scores(embedder(seed), test)}
    losses = {
        "digit_ids_ms": (tfdml.losses.MultiSimilarityLoss(), ids),
        "tags_ms": (tfdml.losses.MultiSimilarityLoss(), tags),
        "tags_supcon": (tfdml.losses.SupConLoss(0.1), tags),
        "tags_multi_supcon": (tfdml.losses.SupConLoss(0.1, graded=True), tags),
    }
    for name, (loss, y) in losses.items():
        model, final = fit(loss, x, y, args, seed)
        runs[name] = {**tag_scores(model, test), "final_loss": final}
    return runs


def category_scores(model, test):
    x, ids, _ = test
    e = keras.ops.convert_to_numpy(embed(model, x))
    similarity = e @ e.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = ids[np.argmax(similarity, axis=1)]
    same_category = np.array([CATEGORIES[int(a)] == CATEGORIES[int(b)]
                              for a, b in zip(nearest, ids, strict=True)])
    return {"recall@1": float(np.mean(nearest == ids)),
            "confused_within_category": float(np.mean(same_category & (nearest != ids)))}


def category_runs(train, test, args, seed):
    x, ids, _ = train
    runs = {}
    for name, batches in (("pk", {}),
                          ("one_category_per_batch",
                           {"categories": CATEGORIES, "categories_per_batch": 1}),
                          ("two_categories_per_batch",
                           {"categories": CATEGORIES, "categories_per_batch": 2})):
        model, final = fit(tfdml.losses.MultiSimilarityLoss(), x, ids, args, seed,
                           classes_per_batch=3, samples_per_class=16, **batches)
        runs[name] = {**category_scores(model, test), "final_loss": final}
    return runs


def summarize(runs):
    """Mean and standard deviation over the seeds of every number of every run."""
    summary = {}
    for part in ("labels", "categories"):
        names = runs[0][part]
        summary[part] = {
            name: {key: [float(np.mean([r[part][name][key] for r in runs])),
                         float(np.std([r[part][name][key] for r in runs]))]
                   for key in runs[0][part][name]}
            for name in names}
    return summary


def write_json(path, payload):
    """Writes ``payload`` whole or not at all (a temporary file, flushed, then renamed)."""
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        args.epochs, args.steps, args.seeds = 2, 3, args.seeds[:1]
    out = pathlib.Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {"backend": keras.backend.backend(), "smoke": args.smoke, "epochs": args.epochs,
               "steps_per_epoch": args.steps, "tags": {d: list(t) for d, t in
                                                      DIGIT_TAGS.items()},
               "categories": CATEGORIES, "runs": []}
    for seed in args.seeds:
        start = time.time()
        train, test = digits(seed)
        run = {"seed": seed, "labels": label_runs(train, test, args, seed),
               "categories": category_runs(train, test, args, seed),
               "seconds": round(time.time() - start, 1)}
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
    results["summary"] = summarize(results["runs"])
    write_json(out / "results.json", results)
    print(json.dumps(results["summary"], indent=1))
    return results


if __name__ == "__main__":
    main()
