"""Extreme triplet learning on glyphs: EPHN against EPSHN and HPHN, 1st against 2nd order.

The comparisons of "Extreme triplet learning: effectively optimizing easy positives and
hard negatives" (Section 6, Figure 4, Table 1) in miniature, on the glyph benchmark
(`tfdml.datasets.load("glyphs", ...)`: train on 600 characters of 30 alphabets, evaluate
on 400 characters of 20 unseen alphabets) under its shared recipe
(`examples/glyphs/glyph_recipe.py`: the same CNN, P x K = 16 x 4, Adam 1e-3, 1,000 steps
for every configuration):

* triplet NCA, 1st order (eq. 1) against the paper's 2nd-order loss (eq. 16),
  `tfdml.losses.TripletNCALoss(order=1 | 2)`, temperature 1 (the paper's equations);
* each with easy-positive / hard-negative mining (EPHN, the paper's method), easy-positive
  / semi-hard-negative mining (EPSHN, Figure 4's other curve) and hard-positive /
  hard-negative mining (HPHN, Section 6.1's "Problem 1": the 1st order is predicted to pull
  every triplet towards (S_ap, S_an) = (1, 1)), `tfdml.miners.TripletMiner`.

Every trained number is reported next to its baselines on the same split: the raw pixels
and the untrained network of the same seed (the same initial weights for every
configuration). The mean cosine similarity between the test embeddings is reported as a
sign of collapse (1 when every image is mapped to the same point).

    python examples/extreme_triplet/glyphs.py                    # 6 configurations x 3 seeds
    python examples/extreme_triplet/glyphs.py --configs EPHN-1st EPHN-2nd --seeds 0
    python examples/extreme_triplet/glyphs.py --smoke            # tiny data, 2 steps, 1 seed

Writes `results_glyphs.json` next to this file (`--output` to change; a `--smoke` run
writes into the temporary directory unless `--output` is given) and prints a markdown
table.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "glyphs"))

import comparison  # noqa: E402
import glyph_recipe  # noqa: E402

import tfdml  # noqa: E402

#: name: (order of the triplet NCA loss, positive strategy, negative strategy)
CONFIGS = {
    "EPHN-1st": (1, "easy", "hard"),
    "EPHN-2nd": (2, "easy", "hard"),
    "EPSHN-1st": (1, "easy", "semihard"),
    "EPSHN-2nd": (2, "easy", "semihard"),
    "HPHN-1st": (1, "hard", "hard"),
    "HPHN-2nd": (2, "hard", "hard"),
}
DEFAULT_OUTPUT = os.path.join(HERE, "results_glyphs.json")
#: `--smoke`: a tiny data set (100 characters of 5 alphabets, 6 drawings each) and 2 steps.
SMOKE_DATA = {"num_classes": 100, "samples_per_class": 6}
SMOKE_BATCH = {"classes_per_batch": 4, "samples_per_class": 3}
SMOKE_STEPS = 2


def make_loss(order, positive, negative, seed):
    """A function of no argument building the configuration's loss (called by the recipe
    after it has set the seed)."""
    def build():
        miner = tfdml.miners.TripletMiner(positive, negative, seed=seed)
        return tfdml.losses.TripletNCALoss(order=order, miner=miner)
    return build


def parse_args(argv=None):
    parser = comparison.make_parser(
        __doc__.split("\n", 1)[0], CONFIGS, smoke_steps=SMOKE_STEPS,
        smoke_output=os.path.join(tempfile.gettempdir(), "extreme_triplet_glyphs_smoke.json"))
    return comparison.parse_args(parser, argv, DEFAULT_OUTPUT)


def table(results):
    """The markdown table of `results`: baselines, then each configuration."""
    lines = ["| embedding | mining | loss | Recall@1 | MAP@R | mean cos |",
             "|---|---|---|---|---|---|"]
    raw = results["baselines"]["raw_pixels"]
    lines.append(f"| raw pixels | - | - | {raw['recall@1']:.3f} | {raw['map@r']:.3f} | - |")
    untrained = results["baselines"]["untrained"]
    lines.append(f"| untrained network | - | - | {glyph_recipe.cell(untrained['recall@1'])} | "
                 f"{glyph_recipe.cell(untrained['map@r'])} | "
                 f"{glyph_recipe.cell(untrained['mean_cosine'])} |")
    for name, config in results["configs"].items():
        if not config["runs"]:
            continue
        s = config["summary"]
        lines.append(f"| {name} | {config['mining']} | {config['loss']} | "
                     f"{glyph_recipe.cell(s['recall@1'])} | {glyph_recipe.cell(s['map@r'])} | "
                     f"{glyph_recipe.cell(s['mean_cosine'])} |")
    return "\n".join(lines)


def _untrained_summary(configs):
    """Mean ± std over the seeds of the untrained network (the same initial weights for
    every configuration of a seed: taken from the first configuration that ran it)."""
    per_seed = {}
    for config in configs.values():
        for run in config["runs"]:
            per_seed.setdefault(run["seed"], {**run["untrained"],
                                              "mean_cosine": run["untrained_mean_cosine"]})
    if not per_seed:
        return {"per_seed": {}}
    values = list(per_seed.values())
    return {"per_seed": {str(k): v for k, v in sorted(per_seed.items())},
            **{key: glyph_recipe.mean_std([v[key] for v in values])
               for key in ("recall@1", "map@r", "mean_cosine")}}


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    data_knobs = SMOKE_DATA if args.smoke else {}
    batch = SMOKE_BATCH if args.smoke else {}
    train, test = glyph_recipe.load_data(**data_knobs)
    print(f"glyphs: {train.num_classes} training characters ({len(train)} drawings), "
          f"{test.num_classes} unseen test characters ({len(test)} drawings); "
          f"{glyph_recipe.machine()}", flush=True)
    raw = glyph_recipe.raw_pixels(test)
    print(f"raw pixels: Recall@1 {raw['recall@1']:.3f}, MAP@R {raw['map@r']:.3f}", flush=True)

    recipe = {**glyph_recipe.RECIPE, **batch, "steps": args.steps}
    results = {
        "paper": "Extreme triplet learning: effectively optimizing easy positives and hard "
                 "negatives",
        "command": " ".join(["python", "examples/extreme_triplet/glyphs.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": glyph_recipe.machine(),
        "smoke": args.smoke,
        "data": {**glyph_recipe.DATA, **data_knobs, "train_classes": train.num_classes,
                 "test_classes": test.num_classes, "test_images": len(test)},
        "recipe": recipe,
        "loss": "tfdml.losses.TripletNCALoss(order, temperature=1.0, "
                "miner=TripletMiner(positive, negative))",
        "seeds": args.seeds,
        "metrics": "test split (unseen characters), cosine, query excluded; mean_cosine: "
                   "mean cosine similarity between distinct test embeddings",
        "baselines": {"raw_pixels": raw},
        "configs": {},
        "complete": False,
    }
    total = len(args.configs) * len(args.seeds)
    done = 0
    for name in args.configs:
        order, positive, negative = CONFIGS[name]
        config = results["configs"][name] = {
            "order": order, "positive": positive, "negative": negative,
            "mining": name.split("-")[0], "loss": f"NCA {'1st' if order == 1 else '2nd'} order",
            "runs": []}
        for seed in args.seeds:
            done += 1
            print(f"[{done}/{total}] {name} (order {order}, positive {positive}, negative "
                  f"{negative}), seed {seed}", flush=True)
            run = glyph_recipe.train_and_evaluate(
                make_loss(order, positive, negative, seed), seed=seed, data=(train, test),
                steps=args.steps,
                measure=lambda model: glyph_recipe.mean_cosine(glyph_recipe.embed(model, test)),
                **batch)
            cosines = run.pop("measured")
            run["mean_cosine"] = cosines["trained"]
            run["untrained_mean_cosine"] = cosines["untrained"]
            config["runs"].append(run)
            config["summary"] = {**glyph_recipe.summarize(config["runs"], "trained"),
                                 "mean_cosine": glyph_recipe.mean_std(
                                     [r["mean_cosine"] for r in config["runs"]])}
            results["baselines"]["untrained"] = _untrained_summary(results["configs"])
            results["wall_seconds"] = time.perf_counter() - start
            glyph_recipe.write_json(args.output, results)  # partial results after each run
    results["complete"] = True
    results["wall_seconds"] = time.perf_counter() - start
    glyph_recipe.write_json(args.output, results)
    print(f"\nUnseen test characters, mean ± std over seeds {args.seeds} "
          f"({args.steps} steps; {results['wall_seconds']:.0f} s in all):\n")
    print(table(results))
    print(f"\nResults: {args.output}")
    return results


if __name__ == "__main__":
    main()
