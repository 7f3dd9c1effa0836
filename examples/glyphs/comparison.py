"""The driver of the papers' comparisons on glyphs.

The flags (`make_parser`, `parse_args`) of the four comparison scripts
(`examples/{extreme_triplet,class_collapse,loop,fappy}/glyphs.py`), and the training loop
of those that pit losses against their base losses: `examples/loop/glyphs.py` and
`examples/fappy/glyphs.py` define their configurations (a key -> the paper's name, a
`seed -> loss` builder, the key of its base loss) and hand them to `run`: it trains each configuration over the seeds under the shared recipe
(`glyph_recipe.train_and_evaluate`), writes the results JSON after every run (`"complete":
false` until the last), pairs each configuration with its base by seed and prints the tables.
"""

from __future__ import annotations

import argparse
import os
import time

import glyph_recipe

#: `--smoke`: 2 alphabets (20 training and 20 test characters) of 8 drawings, 4 x 4 batches.
SMOKE = {"data": {"num_classes": 40, "samples_per_class": 8}, "steps": 4,
         "classes_per_batch": 4, "samples_per_class": 4}


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed must be >= 0, got {value}")
    return value


def _steps(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    per_epoch = glyph_recipe.STEPS_PER_EPOCH
    if value < 1 or (value > per_epoch and value % per_epoch):
        raise argparse.ArgumentTypeError(
            f"must be a positive number of steps, below {per_epoch} or a multiple of "
            f"{per_epoch}, got {value}")
    return value


def make_parser(description, configs, default_configs=None, smoke_steps=SMOKE["steps"],
                smoke_output=None):
    """The flags of a comparison script: `--configs`, `--seeds`, `--steps`, `--output`,
    `--smoke`. `smoke_output`: where a `--smoke` run writes without `--output` (None:
    nowhere)."""
    default_configs = list(configs if default_configs is None else default_configs)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--configs", nargs="+", choices=tuple(configs),
                        default=default_configs, metavar="CONFIG",
                        help=f"which configurations, in order (choices: {', '.join(configs)}; "
                             f"default: {' '.join(default_configs)})")
    parser.add_argument("--seeds", type=_seed, nargs="+", default=None,
                        help="training seeds (default: 0 1 2; 0 with --smoke)")
    parser.add_argument("--steps", type=_steps, default=None,
                        help=f"training steps per run (default: {glyph_recipe.RECIPE['steps']}; "
                             f"{smoke_steps} with --smoke)")
    parser.add_argument("--output", default=None,
                        help="the results JSON (default: results_glyphs.json next to the "
                             f"script; with --smoke: {smoke_output or 'none'})")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run in seconds: a few characters and steps, one seed")
    parser.set_defaults(smoke_steps=smoke_steps, smoke_output=smoke_output)
    return parser


def parse_args(parser, argv, default_output):
    """`parser.parse_args(argv)` with the defaults filled in and the flags checked together;
    a bad flag exits with status 2 before any work."""
    args = parser.parse_args(argv)
    for flag, values in (("--configs", args.configs), ("--seeds", args.seeds)):
        if values is not None and len(set(values)) != len(values):
            parser.error(f"{flag} must not repeat a value, got {' '.join(map(str, values))}")
    if args.seeds is None:
        args.seeds = [0] if args.smoke else list(glyph_recipe.SEEDS)
    if args.steps is None:
        args.steps = args.smoke_steps if args.smoke else glyph_recipe.RECIPE["steps"]
    if args.output is None:
        args.output = args.smoke_output if args.smoke else default_output
    if args.output is not None:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            parser.error(f"--output: no folder {folder}")
    return args


def _summary(runs):
    return {key: {metric: list(value) for metric, value in
                  glyph_recipe.summarize(runs, key).items()} for key in ("untrained", "trained")}


def _paired(runs, base_runs):
    """The per-seed differences (this - base) of the trained numbers: `(mean, std)`."""
    base = {run["seed"]: run for run in base_runs}
    out = {}
    for metric in ("recall@1", "map@r"):
        diffs = [run["trained"][metric] - base[run["seed"]]["trained"][metric]
                 for run in runs if run["seed"] in base]
        if diffs:
            out[metric] = list(glyph_recipe.mean_std(diffs))
            out[f"{metric} seeds better"] = sum(d > 0 for d in diffs)
            out["seeds"] = len(diffs)
    return out


def markdown(results):
    """The results' tables: absolute numbers, then each configuration against its base."""
    seeds = results["seeds"]
    lines = [f"Test split: {results['test_classes']} unseen characters, "
             f"{results['test_images']} drawings; mean ± std over seeds "
             f"{', '.join(map(str, seeds))}.", "",
             "| embedding | Recall@1 | MAP@R | training s / run | final loss |",
             "|---|---|---|---|---|"]
    raw = results["raw_pixels"]
    lines.append(f"| raw pixels | {raw['recall@1']:.3f} | {raw['map@r']:.3f} | | |")
    untrained = results.get("untrained")
    if untrained:
        lines.append(f"| untrained CNN | {glyph_recipe.cell(untrained['recall@1'])} | "
                     f"{glyph_recipe.cell(untrained['map@r'])} | | |")
    for config in results["configurations"]:
        if not config["runs"]:
            continue
        trained = config["trained"]
        seconds = glyph_recipe.mean_std([run["seconds"] for run in config["runs"]])
        loss = glyph_recipe.mean_std([run["final_loss"] for run in config["runs"]])
        lines.append(f"| {config['name']} | {glyph_recipe.cell(trained['recall@1'])} | "
                     f"{glyph_recipe.cell(trained['map@r'])} | {seconds[0]:.0f} | "
                     f"{loss[0]:.3g} |")
    pairs = [c for c in results["configurations"] if c.get("versus")]
    if pairs:
        lines += ["", "| configuration - its base, paired by seed | Δ Recall@1 | Δ MAP@R | "
                      "seeds better (R@1, MAP@R) |", "|---|---|---|---|"]
        for config in pairs:
            d = config["versus"]
            lines.append(f"| {config['name']} - {d['base']} | "
                         f"{glyph_recipe.cell(d['recall@1'])} | {glyph_recipe.cell(d['map@r'])} "
                         f"| {d['recall@1 seeds better']} / {d['seeds']}, "
                         f"{d['map@r seeds better']} / {d['seeds']} |")
    return "\n".join(lines)


def _factory(make_loss, seed):
    """The loss builder `train_and_evaluate` calls (with no argument: the recipe passes the
    number of classes and the embedding size to a builder that takes arguments)."""

    def build():
        return make_loss(seed)

    return build


def run(args, argv, *, script, title, claim, configs, settings):
    """Trains every configuration of `args.configs` over `args.seeds`; writes the JSON after
    each run (`"complete": false` until the last one) and returns the results. A
    configuration whose third entry names another is compared with it, seed by seed."""
    start = time.perf_counter()
    base_of = {key: base for key, (_, _, base) in configs.items() if base}
    data_knobs = SMOKE["data"] if args.smoke else {}
    train, test = glyph_recipe.load_data(**data_knobs)
    shape = ({"classes_per_batch": SMOKE["classes_per_batch"],
              "samples_per_class": SMOKE["samples_per_class"]} if args.smoke else {})
    recipe = {**glyph_recipe.RECIPE, **shape, "steps": args.steps}
    raw = glyph_recipe.raw_pixels(test)
    command = " ".join(["python", script, *argv])
    print(f"{title}\n{glyph_recipe.machine()}\n{train.num_classes} training characters, "
          f"{test.num_classes} unseen test characters; P x K = {recipe['classes_per_batch']} x "
          f"{recipe['samples_per_class']}, {args.steps} steps, seeds {args.seeds}; raw pixels "
          f"R@1 {raw['recall@1']:.3f} MAP@R {raw['map@r']:.3f}", flush=True)
    results = {"title": title, "claim": claim, "command": command,
               "machine": glyph_recipe.machine(), "smoke": bool(args.smoke),
               "complete": False, "seeds": list(args.seeds),
               "data": {**glyph_recipe.DATA, **data_knobs}, "recipe": recipe,
               "settings": settings, "train_classes": int(train.num_classes),
               "test_classes": int(test.num_classes), "test_images": len(test),
               "raw_pixels": raw, "untrained": None, "configurations": [],
               "wall_seconds": None}
    by_key = {}
    total = len(args.configs) * len(args.seeds)
    done = 0
    for index, key in enumerate(args.configs, 1):
        name, make_loss, _ = configs[key]
        config = {"key": key, "name": name, "runs": []}
        results["configurations"].append(config)
        by_key[key] = config
        print(f"[{index}/{len(args.configs)}] {name}", flush=True)
        for seed in args.seeds:
            outcome = glyph_recipe.train_and_evaluate(
                _factory(make_loss, seed), seed=seed,
                data=(train, test), steps=args.steps,
                classes_per_batch=recipe["classes_per_batch"],
                samples_per_class=recipe["samples_per_class"],
                log=lambda line: print(line, flush=True))
            config["runs"].append({k: outcome[k] for k in
                                   ("seed", "untrained", "trained", "seconds", "final_loss")})
            config.update(_summary(config["runs"]))
            for other, base in base_of.items():
                if other in by_key and base in by_key and by_key[base]["runs"]:
                    by_key[other]["versus"] = {
                        "base": by_key[base]["name"],
                        **_paired(by_key[other]["runs"], by_key[base]["runs"])}
            done += 1
            # The untrained network depends on the seed only: the first configuration's.
            first = results["configurations"][0]
            results["untrained"] = _summary(first["runs"])["untrained"]
            results["wall_seconds"] = time.perf_counter() - start
            results["complete"] = done == total
            if args.output is not None:
                glyph_recipe.write_json(args.output, results)
    print()
    print(markdown(results))
    print(f"\nWall time {results['wall_seconds']:.0f} s"
          + (f"; results in {args.output}" if args.output else ""), flush=True)
    return results
