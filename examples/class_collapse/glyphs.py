"""Easy positive sampling against class collapse on glyphs, trained with alphabet labels.

The Omniglot experiment of "Reducing class collapse in metric learning with easy positive
sampling" (Section 5.2, Table 3; Table 4 for the training set) in miniature, on the glyph
benchmark (`tfdml.datasets.load("glyphs", ...)`: 30 training alphabets of 20 characters,
20 unseen test alphabets; 20 drawings of each character, 28 x 28) under its shared recipe
(`examples/glyphs/glyph_recipe.py`: the same CNN, Adam 1e-3, 1,000 steps).

As the paper does with Omniglot, the network is trained with the **alphabet** labels only
(`DatasetSplit.categories`): each class is an alphabet made of 20 characters, sub-classes
the labels never name. Batches hold P = 8 alphabets x K = 16 drawings (128 images; EPS
needs K > 2, and with 16 drawings of an alphabet an anchor finds another drawing of its own
character in the batch about half the time). Compared, with the same initial weights and
the same batches for each seed:

* `Trip.+SH`: `TripletMarginLoss(margin=0.2)` with `TripletMiner("random", "semihard")`
  (a random positive of the anchor's alphabet, the plain loss);
* `EPS + Trip.+SH`: `TripletMiner("easy", "semihard")`, the positive is the anchor's
  nearest same-alphabet drawing in the batch (easy positive sampling, Section 4.3);
* `Dist-Margin`: `MarginLoss(alpha=0.2, beta=1.2 learned per alphabet)` with
  `TripletMiner("random", "distance_weighted")`;
* `EPS + Dist-Margin`: `TripletMiner("easy", "distance_weighted")`;
* `char. labels (Trip.+SH)`: the reference, the plain triplet loss trained with the
  **character** labels, P x K = 32 x 4 (the same 128 images a batch).

Measured with the **character** labels (the paper's "Omniglot-letters") and with the
alphabet labels ("Omniglot-languages"): on the test split (unseen alphabets), and on the
training images (the paper's Table 4: characters the alphabet-label runs never saw named).
Recall@1 and MAP@R, cosine, query excluded; every trained number next to the raw pixels and
the untrained network of the same seed, on the same split. The mean cosine similarity
between the test embeddings is reported as a sign of a collapse of the whole embedding (1
when every image is mapped to the same point).

    python examples/class_collapse/glyphs.py                  # 5 configurations x 3 seeds
    python examples/class_collapse/glyphs.py --configs triplet eps-triplet --seeds 0
    python examples/class_collapse/glyphs.py --smoke          # tiny data, 2 steps, 1 seed

Writes `results_glyphs.json` next to this file (`--output` to change; a `--smoke` run
writes into the temporary directory unless `--output` is given) and prints markdown tables.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "glyphs"))

import comparison  # noqa: E402
import glyph_recipe  # noqa: E402

import tfdml  # noqa: E402

#: name: (title, training labels, loss, positive strategy)
CONFIGS = {
    "triplet": ("Trip.+SH", "alphabet", "triplet", "random"),
    "eps-triplet": ("EPS + Trip.+SH", "alphabet", "triplet", "easy"),
    "margin": ("Dist-Margin", "alphabet", "margin", "random"),
    "eps-margin": ("EPS + Dist-Margin", "alphabet", "margin", "easy"),
    "character-triplet": ("char. labels (Trip.+SH)", "character", "triplet", "random"),
}
#: P x K by training labels: the same 128 images a batch.
BATCH = {"alphabet": {"classes_per_batch": 8, "samples_per_class": 16},
         "character": {"classes_per_batch": 32, "samples_per_class": 4}}
#: The evaluation sets: (split, labels).
SETS = (("test", "character"), ("test", "alphabet"), ("train", "character"),
        ("train", "alphabet"))
DEFAULT_OUTPUT = os.path.join(HERE, "results_glyphs.json")
#: `--smoke`: 60 characters of 6 alphabets of 10 (4 for training), 4 drawings each; 2 steps.
SMOKE_DATA = {"num_classes": 60, "samples_per_class": 4, "characters_per_alphabet": 10}
SMOKE_BATCH = {"alphabet": {"classes_per_batch": 2, "samples_per_class": 8},
               "character": {"classes_per_batch": 4, "samples_per_class": 4}}
SMOKE_STEPS = 2


def make_loss(loss, positive, seed):
    """`(num_classes, embedding_dim) -> loss`, called by the recipe after it set the seed."""
    def build(num_classes, embedding_dim):
        if loss == "triplet":
            miner = tfdml.miners.TripletMiner(positive, "semihard", seed=seed)
            return tfdml.losses.TripletMarginLoss(margin=0.2, miner=miner)
        miner = tfdml.miners.TripletMiner(positive, "distance_weighted", seed=seed)
        return tfdml.losses.MarginLoss(margin=0.2, beta=1.2, num_classes=num_classes,
                                       miner=miner)
    return build


def alphabet_labels(split):
    """The alphabet of each image of `split`."""
    return np.array([split.categories[int(c)] for c in split.labels], np.int64)


def by_alphabet(split):
    """`split` labelled by alphabet: each class an alphabet, its characters sub-classes."""
    return dataclasses.replace(split, labels=alphabet_labels(split), categories=None,
                               class_names=dict(split.category_names), category_names={})


def evaluate(embeddings, labels):
    """`{set: {"recall@1", "map@r"}}` for the sets of `SETS`, from the embeddings of each
    split (`{"train": ..., "test": ...}`) and its labels (`{(split, kind): labels}`)."""
    return {f"{split} {kind}": glyph_recipe.retrieval(embeddings[split], labels[split, kind])
            for split, kind in SETS}


def parse_args(argv=None):
    parser = comparison.make_parser(
        __doc__.split("\n", 1)[0], CONFIGS, smoke_steps=SMOKE_STEPS,
        smoke_output=os.path.join(tempfile.gettempdir(), "class_collapse_glyphs_smoke.json"))
    return comparison.parse_args(parser, argv, DEFAULT_OUTPUT)


def _summary(runs, key):
    return {name: {metric: glyph_recipe.mean_std([run[key][name][metric] for run in runs])
                   for metric in ("recall@1", "map@r")}
            for name in runs[0][key]}


def tables(results):
    """Markdown tables: character labels (test, train), then alphabet labels."""
    baselines = results["baselines"]
    configs = [(c["title"], f"{c['labels']}s", c["summary"], c["mean_cosine"])
               for c in results["configs"].values() if c["runs"]]
    out = []
    for kind, title in (("character", "Character labels (the paper's 'letters')"),
                        ("alphabet", "Alphabet labels (the paper's 'languages')")):
        cols = [f"{split} {kind}" for split in ("test", "train")]
        lines = [f"{title}: Recall@1 and MAP@R on the unseen test alphabets and on the "
                 "training images", "",
                 "| embedding | trained with | test R@1 | test MAP@R | train R@1 | train MAP@R "
                 "| test mean cos |",
                 "|---|---|---|---|---|---|---|"]
        raw = baselines["raw_pixels"]
        lines.append("| raw pixels | - | " + " | ".join(
            f"{raw[c][m]:.3f}" for c in cols for m in ("recall@1", "map@r")) + " | - |")
        if "untrained" in baselines:
            u = baselines["untrained"]["summary"]
            lines.append("| untrained network | - | " + " | ".join(
                glyph_recipe.cell(u[c][m]) for c in cols for m in ("recall@1", "map@r"))
                + f" | {glyph_recipe.cell(baselines['untrained']['mean_cosine'])} |")
        for name, labels, summary, cosine in configs:
            lines.append(f"| {name} | {labels} | " + " | ".join(
                glyph_recipe.cell(summary[c][m]) for c in cols for m in ("recall@1", "map@r"))
                + f" | {glyph_recipe.cell(cosine)} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    data_knobs = SMOKE_DATA if args.smoke else {}
    batches = SMOKE_BATCH if args.smoke else BATCH
    train, test = glyph_recipe.load_data(**data_knobs)
    coarse = by_alphabet(train)
    labels = {(split.split, kind): (split.labels if kind == "character"
                                     else alphabet_labels(split))
              for split in (train, test) for kind in ("character", "alphabet")}
    print(f"glyphs: {train.num_classes} training characters in {coarse.num_classes} alphabets "
          f"({len(train)} drawings), {test.num_classes} unseen test characters in "
          f"{len(np.unique(labels['test', 'alphabet']))} alphabets ({len(test)} drawings); "
          f"{glyph_recipe.machine()}", flush=True)
    pixels = {split.split: split.images.reshape(len(split), -1) for split in (train, test)}
    raw = evaluate(pixels, labels)
    print("raw pixels: " + ", ".join(f"{name} R@1 {v['recall@1']:.3f}"
                                     for name, v in raw.items()), flush=True)

    results = {
        "paper": "Reducing class collapse in metric learning with easy positive sampling",
        "command": " ".join(["python", "examples/class_collapse/glyphs.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": glyph_recipe.machine(),
        "smoke": args.smoke,
        "data": {**glyph_recipe.DATA, **data_knobs, "train_characters": train.num_classes,
                 "train_alphabets": coarse.num_classes, "test_characters": test.num_classes,
                 "train_images": len(train), "test_images": len(test)},
        "recipe": {**glyph_recipe.RECIPE, "steps": args.steps, "batches": batches},
        "seeds": args.seeds,
        "metrics": "Recall@1 and MAP@R, cosine, query excluded, of each split against "
                   "itself, with character or alphabet labels",
        "baselines": {"raw_pixels": raw},
        "configs": {},
        "complete": False,
    }
    untrained, untrained_cosine = {}, {}

    def measure(model):
        """`(the sets' Recall@1 and MAP@R, the test split's mean cosine)` of `model`."""
        embed = {split.split: glyph_recipe.embed(model, split) for split in (train, test)}
        return evaluate(embed, labels), glyph_recipe.mean_cosine(embed["test"])

    total = len(args.configs) * len(args.seeds)
    done = 0
    for name in args.configs:
        title, trained_with, loss, positive = CONFIGS[name]
        config = results["configs"][name] = {
            "title": title, "labels": trained_with, "loss": loss, "positive": positive,
            "batch": batches[trained_with], "runs": []}
        data = (coarse if trained_with == "alphabet" else train, test)
        for seed in args.seeds:
            done += 1
            print(f"[{done}/{total}] {title} (trained with {trained_with} labels, "
                  f"{positive} positive), seed {seed}", flush=True)
            run = glyph_recipe.train_and_evaluate(
                make_loss(loss, positive, seed), seed=seed, data=data, steps=args.steps,
                measure=measure, **batches[trained_with])
            measured = run.pop("measured")
            run["sets"], run["mean_cosine"] = measured["trained"]
            # The same initial weights for every configuration of a seed.
            untrained.setdefault(seed, measured["untrained"][0])
            untrained_cosine.setdefault(seed, measured["untrained"][1])
            run["untrained_sets"] = untrained[seed]
            sets = run["sets"]
            print("  " + ", ".join(f"{s}: R@1 {v['recall@1']:.3f} MAP@R {v['map@r']:.3f}"
                                   for s, v in sets.items())
                  + f"; test mean cos {run['mean_cosine']:.3f}", flush=True)
            config["runs"].append(run)
            config["summary"] = _summary(config["runs"], "sets")
            config["mean_cosine"] = glyph_recipe.mean_std([r["mean_cosine"]
                                                           for r in config["runs"]])
            results["baselines"]["untrained"] = {
                "per_seed": {str(s): v for s, v in sorted(untrained.items())},
                "summary": _summary([{"sets": v} for v in untrained.values()], "sets"),
                "mean_cosine_per_seed": {str(s): v for s, v in sorted(untrained_cosine.items())},
                "mean_cosine": glyph_recipe.mean_std(list(untrained_cosine.values()))}
            results["wall_seconds"] = time.perf_counter() - start
            glyph_recipe.write_json(args.output, results)  # partial results after each run
    results["complete"] = True
    results["wall_seconds"] = time.perf_counter() - start
    glyph_recipe.write_json(args.output, results)
    print(f"\nMean ± std over seeds {args.seeds} ({args.steps} steps; "
          f"{results['wall_seconds']:.0f} s in all):\n")
    print(tables(results))
    print(f"\nResults: {args.output}")
    return results


if __name__ == "__main__":
    main()
