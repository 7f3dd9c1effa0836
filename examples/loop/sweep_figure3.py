"""LoOp Figure 3: Recall@1 against batch size, margin, epsilon and lambda.

One panel per call; every run is ``train.py`` with the panel's fixed settings, the swept
flag and the flags given here (they override the fixed ones: ``--dataset``,
``--data-dir``, ``--epochs``, ...). Writes ``sweep.md``, ``sweep.json`` and ``sweep.png``
to ``--output-dir`` (or its alias ``--sweep-dir``; default ``runs/loop-fig3-<figure>``),
each run in a folder of its own there; finished runs are not run again, an unfinished one
resumes.

    python examples/loop/sweep_figure3.py --figure batch --data-dir /data/cars196
    python examples/loop/sweep_figure3.py --figure margin --data-dir /data/cub200
    python examples/loop/sweep_figure3.py --figure epsilon --data-dir /data/cars196
    python examples/loop/sweep_figure3.py --figure lambda --data-dir /data/cars196
    python examples/loop/sweep_figure3.py --figure margin --values 0.1 0.2 --smoke
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)
import train  # noqa: E402

#: The panels: the flag varied, its values, and the fixed settings of Section 4.1.
FIGURES = {
    "batch": dict(
        flag="--batch-size", values=("8", "16", "32", "64", "128"), log_x=True,
        fixed=["--dataset", "cars196", "--loss", "hphn", "-P", "4"],
        title="Fig. 3a: LoOp (HPHNtri), 4 classes per batch"),
    "margin": dict(
        flag="--margin", values=("0.05", "0.1", "0.2", "0.3", "0.5", "0.7", "1.0"),
        fixed=["--dataset", "cub200", "--loss", "lifted", "--batch-size", "32"],
        title="Fig. 3b: LoOp (LS), batch 32"),
    "epsilon": dict(
        flag="--epsilon", values=("-0.1", "-0.05", "-0.02", "0.0", "0.05", "0.1"),
        fixed=["--dataset", "cars196", "--loss", "ms", "--batch-size", "8", "-K", "4",
               "--lambda", "0.5"],
        title="Fig. 3c: LoOp (MS), batch 8, K 4, lambda 0.5"),
    "lambda": dict(
        flag="--lambda", values=("0.3", "0.4", "0.5", "0.6", "0.7", "0.8"),
        fixed=["--dataset", "cars196", "--loss", "ms", "--batch-size", "8", "-K", "4",
               "--epsilon", "-0.02"],
        title="Fig. 3d: LoOp (MS), batch 8, K 4, epsilon -0.02"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     epilog="Other flags go to train.py.")
    parser.add_argument("--figure", choices=tuple(FIGURES), required=True)
    parser.add_argument("--values", nargs="+", default=None,
                        help="the swept values (default: the panel's)")
    parser.add_argument("--output-dir", "--sweep-dir", dest="output_dir", default=None,
                        help="the sweep's folder; default: runs/loop-fig3-<figure>")
    args, rest = parser.parse_known_args(argv)
    panel = FIGURES[args.figure]
    flag = panel["flag"]
    runs = {f"{flag.lstrip('-')}{v}": [flag, v] for v in (args.values or panel["values"])}
    return experiments.sweep(
        train.main, [*panel["fixed"], *rest], runs,
        args.output_dir or os.path.join("runs", f"loop-fig3-{args.figure}"),
        title=panel["title"], x_label=flag, log_x=panel.get("log_x", False),
        check=lambda flags: train.check_args(train.make_parser(), flags))


if __name__ == "__main__":
    main()
