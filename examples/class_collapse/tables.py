"""Tables 2 and 3: each loss (triplet + semi-hard, distance-weighted margin, MS) without
and with easy positive sampling.

Table 2 is Cars196 and CUB-200 (``--dataset cars196`` / ``cub200``), Table 3 Omniglot
trained with the alphabet labels and evaluated with the letter and the alphabet labels
(the default). Each run is a ``train.py`` run in ``<output-dir>/<loss>-<base|eps>-s<seed>``
(resumable; finished runs are not run again); ``summary.md`` has the mean over the seeds.

    python examples/class_collapse/tables.py --data-dir /data/omniglot --seeds 8
    python examples/class_collapse/tables.py --dataset cars196 --data-dir /data/cars196
    python examples/class_collapse/tables.py --smoke --losses triplet   # seconds
"""

from __future__ import annotations

import train


def main(argv=None):
    parser = train.sweep_parser(__doc__.split("\n", 1)[0], **{
        "--losses": dict(nargs="+", choices=train.LOSSES, default=list(train.LOSSES))})
    args, rest = parser.parse_known_args(argv)
    runs = {}
    for loss in args.losses:
        runs[f"{loss}-base"] = ["--loss", loss, "--no-eps"]
        runs[f"{loss}-eps"] = ["--loss", loss, "--eps"]
    return train.run_grid(rest, runs, args.seeds, train.sweep_dir(args, rest, "tables"),
                          title="Easy positive sampling: Tables 2/3")


if __name__ == "__main__":
    main()
