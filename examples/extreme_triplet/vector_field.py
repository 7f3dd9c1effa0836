"""Figures 2 and 5 of "Extreme triplet learning": where a gradient step moves a triplet.

For each point (S_ap, S_an) of the triplet scatter diagram, the closed form of
``tfdml.analysis.vector_field.similarity_change`` gives the change of the two
similarities after one gradient step on the features (then re-normalized to the
sphere), for the 1st-order NCA loss, the 2nd-order loss and the vanilla margin
loss, without and with the paper's entanglement model (strength p).

Writes five PNG files (see README.md next to this script):

* ``fig2_gamma0.5.png``: Figure 2 (gamma = 0.5, p = 0.4 and 0.8), 1st and 2nd order,
  problem regions and vector fields, with a zoom on the corner near (1, 1);
* ``fig5_regions_nca.png``, ``fig5_regions_nca2.png``, ``fig5_regions_margin.png``:
  Figure 5, problem regions for gamma = 0.2, 0.5, 0.8 and p = 0.4, 0.8;
* ``vector_fields.png``: the vector fields of the three losses for every gamma and p.

Runs offline in a few seconds (NumPy + matplotlib, no training):

    python examples/extreme_triplet/vector_field.py
    # or: python examples/extreme_triplet/vector_field.py --out-dir /tmp/figs --lr 0.05
"""

from __future__ import annotations

import argparse
import pathlib
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tfdml._files import save_figure  # whole or not at all
from tfdml.analysis.vector_field import plot_problem_regions, plot_vector_field  # noqa: E402

GAMMAS = (0.2, 0.5, 0.8)
PS = (0.4, 0.8)
LOSSES = ("nca", "nca2", "margin")
CORNER = (0.8, 1.0, 0.8, 1.0)  # the zoom near (1, 1)


def _regions_row(axes, gamma, loss, args):
    """Six panels: ds_ap < 0, ds_an > 0, then the totals for each p."""
    common = dict(grid=args.grid, lr=args.lr)
    plot_problem_regions(gamma, 0.0, loss, axes=axes[:2], quantities=("ds_ap", "ds_an"),
                         **common)
    for i, p in enumerate(PS):
        plot_problem_regions(gamma, p, loss, axes=axes[2 + 2 * i:4 + 2 * i],
                             quantities=("ds_ap_total", "ds_an_total"), **common)


def figure_2(args):
    fig, axes = plt.subplots(3, 6, figsize=(19, 10.5))
    gamma = 0.5
    _regions_row(axes[0], gamma, "nca", args)
    _regions_row(axes[1], gamma, "nca2", args)
    col = 0
    for loss in ("nca", "nca2"):
        for p in PS:
            plot_vector_field(gamma, p, loss, ax=axes[2, col], grid=args.arrows, lr=args.lr)
            col += 1
    for loss in ("nca", "nca2"):
        ax = plot_vector_field(gamma, 0.8, loss, ax=axes[2, col], grid=args.arrows,
                               region=CORNER, lr=args.lr)
        ax.set_title(ax.get_title() + "\n(zoom near (1, 1))", fontsize=9)
        col += 1
    fig.suptitle(f"Figure 2: gamma = {gamma}, lr = {args.lr}. Rows: 1st-order problem regions, "
                 "2nd-order problem regions, vector fields (ds_ap_total, ds_an_total)")
    return fig


def figure_5(loss, args):
    fig, axes = plt.subplots(len(GAMMAS), 6, figsize=(19, 10.5))
    for row, gamma in zip(axes, GAMMAS, strict=True):
        _regions_row(row, gamma, loss, args)
    fig.suptitle(f"Figure 5, {loss}: problem regions (blue: S_ap decreases, red: S_an "
                 f"increases), gamma = {GAMMAS} (rows), p = {PS}, lr = {args.lr}")
    return fig


def vector_fields(args):
    fig, axes = plt.subplots(len(LOSSES), len(GAMMAS) * len(PS), figsize=(19, 10.5))
    for row, loss in zip(axes, LOSSES, strict=True):
        for j, (gamma, p) in enumerate((g, p) for g in GAMMAS for p in PS):
            plot_vector_field(gamma, p, loss, ax=row[j], grid=args.arrows, lr=args.lr)
    fig.suptitle("Vector fields (ds_ap_total, ds_an_total): unit arrows coloured by log10 "
                 f"of the magnitude; rows: 1st order, 2nd order, vanilla; lr = {args.lr}")
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "figures"),
                        help="where to write the PNG files (default: figures/ next to this)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate of the step")
    parser.add_argument("--grid", type=int, default=101, help="grid points per axis, regions")
    parser.add_argument("--arrows", type=int, default=17, help="arrows per axis, vector fields")
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    figures = {"fig2_gamma0.5.png": figure_2(args)}
    for loss in LOSSES:
        figures[f"fig5_regions_{loss}.png"] = figure_5(loss, args)
    figures["vector_fields.png"] = vector_fields(args)
    written = []
    for name, fig in figures.items():
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        path = out / name
        save_figure(fig, path, dpi=args.dpi)
        plt.close(fig)
        written.append(str(path))
        print(f"wrote {path}")
    print(f"done in {time.time() - start:.1f} s")
    return written


if __name__ == "__main__":
    main()
