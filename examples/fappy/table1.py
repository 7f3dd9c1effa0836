"""Table 1 of the FAPPY paper: Recall@K of every loss, and of FAPPY at three bin widths.

Runs ``train.py`` once per row of Table 1 (Contrastive, Triplet, LiftStruct, Histogram,
FAPPY with Delta_min = 0.01, 0.001, 0.0001) with the same flags, one after the other, and
writes ``sweep.md`` / ``sweep.json`` (every metric of every row) to ``--output-dir``. Each
run is resumable and a finished one is not run again. Flags not listed below go to every
``train.py`` run.

    python examples/fappy/table1.py --dataset cub200 --data-dir /data/cub200 \\
        --output-dir runs/fappy-table1-cub200
    python examples/fappy/table1.py --dataset sop --data-dir /data/sop \\
        --output-dir runs/fappy-table1-sop
    python examples/fappy/table1.py --smoke --only fappy-0.01 histogram
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)
import train  # noqa: E402

RUNS = {
    "contrastive": ["--loss", "contrastive"],
    "triplet": ["--loss", "triplet"],
    "lifted": ["--loss", "lifted"],
    "histogram": ["--loss", "histogram"],
    "fappy-0.01": ["--loss", "fappy", "--min-bin-width", "0.01"],
    "fappy-0.001": ["--loss", "fappy", "--min-bin-width", "0.001"],
    "fappy-0.0001": ["--loss", "fappy", "--min-bin-width", "0.0001"],
}


def parse(argv, description, default_dir, runs):
    p = argparse.ArgumentParser(description=description, add_help=False)
    p.add_argument("--output-dir", default=default_dir, help="folder of the sweep")
    p.add_argument("--only", nargs="+", choices=tuple(runs), default=None,
                   help="run only these rows")
    p.add_argument("-h", "--help", action="store_true")
    args, rest = p.parse_known_args(argv)
    if args.help:
        p.print_help()
        print("\nEvery other flag goes to train.py:\n")
        train.make_parser().print_help()
        raise SystemExit(0)
    selected = {k: v for k, v in runs.items() if args.only is None or k in args.only}
    return args, rest, selected


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, rest, runs = parse(argv, __doc__.split("\n", 1)[0], "runs/fappy-table1", RUNS)
    return experiments.sweep(train.main, rest, runs, args.output_dir, metric="val_recall@1",
                             title="FAPPY Table 1: Recall@K", check=train.check_args)


if __name__ == "__main__":
    main()
