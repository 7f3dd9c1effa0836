"""Table 2 of the FAPPY paper: VehicleID top-1/top-5 match rates, and the small set's CMC.

Runs ``train.py --dataset vehicleid`` once per row of Table 2 that tfdml has (Triplet,
LiftStruct, Histogram, FAPPY with Delta_min = 0.01, 0.001, 0.0001; CCL is not in tfdml) and
writes ``sweep.md`` / ``sweep.json`` with the match rates of the small, medium and large test
sets, plus ``cmc_small.png``: the CMC curves of all rows on the small test set (Fig. 6).
Each run writes its own curve to ``<run>/results.json`` (``cmc_small``) and
``<run>/figures/cmc_small.png``. Flags not listed below go to every ``train.py`` run.

    python examples/fappy/table2.py --data-dir /data/vehicleid \\
        --output-dir runs/fappy-table2-vehicleid
    python examples/fappy/table2.py --smoke --only fappy-0.01
"""

from __future__ import annotations

import json
import os
import sys

from tfdml._files import save_figure  # whole or not at all

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)
import table1  # noqa: E402
import train  # noqa: E402

RUNS = {k: v for k, v in table1.RUNS.items() if k != "contrastive"}


def plot_all_cmc(output_dir, names):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in names:
        with open(os.path.join(output_dir, name, "results.json")) as f:
            curve = json.load(f).get("cmc_small")
        if curve:
            ax.plot(range(1, len(curve) + 1), [100 * v for v in curve], marker="o",
                    markersize=2, label=name)
    ax.set_xlabel("rank")
    ax.set_ylabel("match rate (%)")
    ax.set_title("CMC on the VehicleID small test set", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(output_dir, "cmc_small.png")
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, rest, runs = table1.parse(argv, __doc__.split("\n", 1)[0], "runs/fappy-table2",
                                    RUNS)
    rows = experiments.sweep(train.main, ["--dataset", "vehicleid", *rest], runs,
                             args.output_dir, metric="val_small_top1",
                             title="FAPPY Table 2: VehicleID match rates",
                             check=train.check_args)
    plot_all_cmc(args.output_dir, runs)
    return rows


if __name__ == "__main__":
    main()
