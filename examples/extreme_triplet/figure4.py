"""Extreme triplet learning, Figure 4: Recall@1 against the group size n.

For n in {2, 4, 8, 16, 32} (batch 128, so 128/n classes per batch) trains 1st and 2nd
order triplet NCA with EPHN and EPSHN mining (`train.py`, Table 1 settings otherwise) and
plots Recall@1 against n, one line per (order, mining). Each run is resumable and
finished runs are not run again, so the sweep can be stopped and restarted.

    python examples/extreme_triplet/figure4.py --dataset cub200 --data-dir /data/cub200
    python examples/extreme_triplet/figure4.py --smoke        # 2 x 2 x 2 tiny runs

Other flags go to every run (e.g. --epochs 20). Writes figure4.md, figure4.json and
figure4.png to the output directory (default runs/figure4-<dataset>).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import experiments  # noqa: E402  (examples/experiments/: the papers' training loop)
import train  # noqa: E402

from tfdml._files import save_figure, write_json, write_text  # whole or not at all

GROUP_SIZES = (2, 4, 8, 16, 32)
METHODS = ((1, "EPHN"), (2, "EPHN"), (1, "EPSHN"), (2, "EPSHN"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dataset", default="cub200")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=list(GROUP_SIZES))
    parser.add_argument("--methods", nargs="+", default=[f"{o}:{m}" for o, m in METHODS],
                        help="order:mining pairs (default: all four)")
    parser.add_argument("--smoke", action="store_true")
    args, rest = parser.parse_known_args(argv)
    sizes = args.group_sizes if not args.smoke else [2, 4]
    out = args.output_dir or os.path.join("runs", f"figure4-{args.dataset}")
    common = ["--dataset", args.dataset, *(["--smoke", "--no-export"] if args.smoke else []),
              *rest]
    methods = [(int(m.split(":")[0]), m.split(":")[1]) for m in args.methods]
    if args.smoke:
        methods = methods[:2]
    rows = []
    for order, mining in methods:
        method = f"order{order}-{mining}"
        runs = {f"n{n}": ["--order", str(order), "--mining", mining, "--group-size", str(n)]
                for n in sizes}
        for row, n in zip(experiments.sweep(train.main, common, runs, os.path.join(out, method),
                                            title=f"{method} on {args.dataset}",
                                            check=train.check_args),
                          sizes, strict=True):
            rows.append({"order": order, "mining": mining, "n": n,
                         "recall@1": row.get("val_recall@1"), "run": f"{method}/{row['run']}"})
    write_json(os.path.join(out, "figure4.json"), rows)
    write_text(os.path.join(out, "figure4.md"),
               f"# Figure 4: Recall@1 vs group size n on {args.dataset}"
               f"{' (smoke run)' if args.smoke else ''}\n\n" + experiments.markdown_table(rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for order, mining in {(r["order"], r["mining"]) for r in rows}:
        points = sorted((r["n"], r["recall@1"]) for r in rows
                        if r["order"] == order and r["mining"] == mining)
        ax.plot(*zip(*points, strict=True), marker="o",
                label=f"{'1st' if order == 1 else '2nd'} order {mining}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size n")
    ax.set_ylabel("Recall@1")
    ax.set_title(args.dataset)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, os.path.join(out, "figure4.png"), dpi=110)
    plt.close(fig)
    print(experiments.markdown_table(rows))
    return rows


if __name__ == "__main__":
    main()
