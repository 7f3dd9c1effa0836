"""Appendix C, Figure 6: the trimmed loss (Shen & Sanghavi 2019) against EPS.

For each loss: R@1 without EPS with the trimmed loss at several trim fractions (0 = the
plain loss), and with EPS (no trimming) as a dashed reference line.

    python examples/class_collapse/trimmed.py --data-dir /data/omniglot
    python examples/class_collapse/trimmed.py --dataset cub200 --data-dir /data/cub200 --losses margin
    python examples/class_collapse/trimmed.py --smoke --losses margin --trims 0 0.25  # seconds
"""

from __future__ import annotations

import os

import train


def main(argv=None):
    parser = train.sweep_parser(__doc__.split("\n", 1)[0], **{
        "--losses": dict(nargs="+", choices=train.LOSSES, default=list(train.LOSSES)),
        "--trims": dict(type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.4],
                        help="fractions of the anchors of a batch left out")})
    args, rest = parser.parse_known_args(argv)
    out = train.sweep_dir(args, rest, "trimmed")
    runs = {}
    for loss in args.losses:
        for t in args.trims:
            runs[f"{loss}-trim{t:g}"] = ["--loss", loss, "--no-eps", "--trim", str(t)]
        runs[f"{loss}-eps"] = ["--loss", loss, "--eps"]
    summary = train.run_grid(rest, runs, args.seeds, out, title="Trimmed loss vs EPS")
    metric = args.metric or train.default_metric(rest)
    by_run = {r["run"]: r for r in summary}
    series = {train.NAMES[loss]: (args.trims, [by_run[f"{loss}-trim{t:g}"][metric]
                                               for t in args.trims])
              for loss in args.losses}
    refs = [(f"EPS + {train.NAMES[loss]}", by_run[f"{loss}-eps"][metric])
            for loss in args.losses]
    train.plot_lines(os.path.join(out, "trimmed.png"), series, "trimmed fraction", metric,
                     "Figure 6: trimmed loss (lines) vs EPS (dashed)", references=refs)
    return summary


if __name__ == "__main__":
    main()
