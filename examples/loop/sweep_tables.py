"""LoOp Tables 2 and 3 (and Figure 4): every loss with and without LoOp, and the samplers.

Runs ``train.py`` once per method (and seed) with the flags given here (``--dataset``,
``--data-dir``, ``--epochs``, ...), then writes ``sweep.md`` / ``sweep.json`` (every run)
and ``table.md`` (per method: mean and standard deviation over the seeds, in %, next to
the paper's NMI, F1 and Recall@1 for CUB-200-2011, Cars196 and SOP) to ``--output-dir``
(or its alias ``--sweep-dir``; default ``runs/loop-tables-<dataset>``), each run in a
folder of its own there. Finished runs are not run again; an unfinished one resumes.

    python examples/loop/sweep_tables.py --dataset cub200 --data-dir /data/cub200
    python examples/loop/sweep_tables.py --dataset sop --data-dir /data/sop --runs triplet loop-triplet
    python examples/loop/sweep_tables.py --runs triplet loop-triplet --smoke --no-export
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)
import train  # noqa: E402

from tfdml._files import write_text  # whole or not at all

#: Table 2 (the four losses, plain and with LoOp), Table 3 (the triplet samplers; the
#: plain triplet loss is rand-disjoint) and Figure 4 (LoOp triplet without l2).
RUNS = {
    "triplet": ["--loss", "triplet", "--no-loop"],
    "loop-triplet": ["--loss", "triplet"],
    "hphn": ["--loss", "hphn", "--no-loop"],
    "loop-hphn": ["--loss", "hphn"],
    "lifted": ["--loss", "lifted", "--no-loop"],
    "loop-lifted": ["--loss", "lifted"],
    "ms": ["--loss", "ms", "--no-loop"],
    "loop-ms": ["--loss", "ms"],
    "semihard": ["--loss", "triplet", "--no-loop", "--sampling", "semihard"],
    "distance-weighted": ["--loss", "triplet", "--no-loop", "--sampling", "distance-weighted"],
    "loop-triplet-no-l2": ["--loss", "triplet", "--no-normalize"],
}
#: The paper's (NMI, F1, R@1) in %, Tables 2 and 3 (GoogLeNet, batch 32 / 128 on SOP).
PAPER = {
    "cub200": {"triplet": (49.8, 15.0, 35.9), "loop-triplet": (59.9, 26.5, 50.3),
               "hphn": (58.1, 24.2, 48.3), "loop-hphn": (61.2, 27.5, 51.8),
               "lifted": (56.4, 22.6, 46.9), "loop-lifted": (60.3, 27.4, 52.8),
               "ms": (59.3, 26.0, 50.9), "loop-ms": (61.1, 28.4, 52.0),
               "semihard": (53.4, 17.9, 40.6), "distance-weighted": (56.3, 25.4, 44.1)},
    "cars196": {"triplet": (52.9, 17.9, 45.1), "loop-triplet": (60.2, 28.0, 61.7),
                "hphn": (57.4, 22.6, 60.3), "loop-hphn": (64.8, 34.1, 74.5),
                "lifted": (57.8, 25.1, 59.9), "loop-lifted": (57.4, 25.9, 66.2),
                "ms": (63.3, 31.7, 71.0), "loop-ms": (63.0, 30.6, 72.6),
                "semihard": (55.7, 22.4, 53.2), "distance-weighted": (58.3, 25.4, 59.4)},
    "sop": {"triplet": (86.3, 20.2, 53.9), "loop-triplet": (88.7, 30.6, 69.6),
            "hphn": (91.4, 43.3, 75.5), "loop-hphn": (90.8, 36.9, 77.6),
            "lifted": (87.2, 25.3, 62.6), "loop-lifted": (89.8, 35.9, 77.1),
            "ms": (89.3, 33.7, 75.0), "loop-ms": (89.4, 34.2, 76.6),
            "semihard": (86.7, 22.1, 57.8), "distance-weighted": (87.9, 23.4, 58.9)},
}
METRICS = (("NMI", "val_nmi"), ("F1", "val_f1"), ("R@1", "val_recall@1"))


def summarize(rows, runs, seeds, dataset):
    """Per method: the paper's numbers and mean +- std over the seeds (in %)."""
    paper = PAPER.get(dataset, {})
    table = []
    for run in runs:
        done = [r for r in rows if r["run"] in {f"{run}-s{s}" for s in seeds}]
        row = {"run": run, "method": done[0]["method"] if done else None}
        for i, (label, _) in enumerate(METRICS):
            row[f"paper {label}"] = paper[run][i] if run in paper else None
        for label, key in METRICS:
            values = 100 * np.asarray([r[key] for r in done if r.get(key) is not None])
            if len(values):
                row[label] = f"{values.mean():.1f} ± {values.std():.1f}"
        table.append(row)
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     epilog="Other flags go to train.py.")
    parser.add_argument("--runs", nargs="+", choices=tuple(RUNS), default=list(RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--output-dir", "--sweep-dir", dest="output_dir", default=None,
                        help="the sweep's folder; default: runs/loop-tables-<dataset>")
    parser.add_argument("--dataset", default=train.make_parser().get_default("dataset"))
    args, rest = parser.parse_known_args(argv)
    out = args.output_dir or os.path.join("runs", f"loop-tables-{args.dataset}")
    runs = {f"{run}-s{seed}": [*RUNS[run], "--seed", str(seed)]
            for run in args.runs for seed in args.seeds}
    rows = experiments.sweep(train.main, ["--dataset", args.dataset, *rest], runs, out,
                             title=f"LoOp Tables 2 and 3 on {args.dataset}",
                             check=lambda flags: train.check_args(train.make_parser(), flags))
    table = summarize(rows, args.runs, args.seeds, args.dataset)
    write_text(os.path.join(out, "table.md"),
               f"# LoOp Tables 2 and 3 on {args.dataset}: paper vs. these runs (%, "
               f"mean ± std over seeds {args.seeds})\n\n"
               + experiments.markdown_table(table, digits=1))
    print(experiments.markdown_table(table, digits=1), flush=True)
    return table


if __name__ == "__main__":
    main()
