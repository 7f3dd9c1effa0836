"""Figure 3b: the positive batch size effect, R@1 of EPS + margin loss against K (the
images per class in a batch) at a fixed batch size (P = batch size / K classes).

The baseline without EPS (the paper's "zero positives": distance sampling only) is run at
the first K and drawn as a dashed line. Omniglot with alphabet labels (the paper's
setting, 30 training alphabets) needs K >= 6 at a batch of 160 (P <= 30).

    python examples/class_collapse/positives.py --data-dir /data/omniglot
    python examples/class_collapse/positives.py --ks 8 16 32 --batch-size 96 --loss triplet ...
    python examples/class_collapse/positives.py --smoke --ks 2 4 --batch-size 8   # seconds
"""

from __future__ import annotations

import os

import train


def main(argv=None):
    parser = train.sweep_parser(__doc__.split("\n", 1)[0], **{
        "--ks": dict(type=int, nargs="+", default=[8, 16, 32, 40, 80],
                     help="images per class in a batch"),
        "--batch-size": dict(type=int, default=160),
        "--loss": dict(choices=train.LOSSES, default="margin"),
        "--baseline": dict(action=train.argparse.BooleanOptionalAction, default=True,
                           help="also run the loss without EPS at the first K")})
    args, rest = parser.parse_known_args(argv)
    out = train.sweep_dir(args, rest, "positives")
    common = [*rest, "--loss", args.loss, "--batch-size", str(args.batch_size)]
    runs = {f"K{k}": ["--eps", "-K", str(k)] for k in args.ks}
    if args.baseline:
        runs[f"K{args.ks[0]}-base"] = ["--no-eps", "-K", str(args.ks[0])]
    summary = train.run_grid(common, runs, args.seeds, out,
                             title=f"Positive batch size effect ({args.loss}, batch "
                                   f"{args.batch_size})")
    metric = args.metric or train.default_metric(rest)
    eps = [r for r in summary if not r["run"].endswith("-base")]
    base = [("without EPS", r[metric]) for r in summary if r["run"].endswith("-base")]
    train.plot_lines(os.path.join(out, "positives.png"),
                     {f"EPS + {train.NAMES[args.loss]}": (args.ks, [r[metric] for r in eps])},
                     "K (images per class in a batch)", metric,
                     f"Figure 3b: batch {args.batch_size}", references=base, log_x=True)
    return summary


if __name__ == "__main__":
    main()
