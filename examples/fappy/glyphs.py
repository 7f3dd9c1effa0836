"""FAPPY on glyphs: the false positive probability loss against the histogram loss.

The comparison of Table 1 of "Deep Metric Learning with False Positive Probability" (Zhong,
Li and Li, ICONIP 2017), FAPPY at the paper's three minimum bin widths against its baseline,
the histogram loss (Ustinova and Lempitsky 2016, bin width 0.01), in miniature: the glyph
benchmark's recipe (`examples/glyphs/glyph_recipe.py`: 600 training characters, 400 unseen
test characters, a small CNN trained from scratch, P x K = 16 x 4, Adam 1e-3, 1,000 steps),
every configuration over three seeds, Recall@1 and MAP@R on the test characters next to the
raw pixels and the untrained network of the same seeds.

Configurations (`--configs`; all four by default):

* `histogram`: `HistogramLoss(bin_width=0.01)`, the paper's baseline;
* `fappy-0.01`, `fappy-0.001`, `fappy-0.0001`: `FAPPYLoss(min_bin_width=...)`, Algorithm 1
  of the paper with Delta_min = 0.01, 0.001 and 0.0001 (8, 11 and 15 scales).

    python examples/fappy/glyphs.py                     # 4 configurations x 3 seeds
    python examples/fappy/glyphs.py --configs histogram fappy-0.01 --seeds 0
    python examples/fappy/glyphs.py --smoke             # seconds: 40 characters, 4 steps

Writes `results_glyphs.json` next to this script (`--output` elsewhere; a `--smoke` run
writes only where `--output` says) and prints a markdown table.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "glyphs"))

import comparison  # noqa: E402

import tfdml  # noqa: E402

HISTOGRAM_BIN_WIDTH = 0.01
MIN_BIN_WIDTHS = (0.01, 0.001, 0.0001)

#: key -> (the paper's name, `seed -> loss`, the key of its base loss or None).
CONFIGS = {
    "histogram": ("Histogram",
                  lambda seed: tfdml.losses.HistogramLoss(bin_width=HISTOGRAM_BIN_WIDTH), None),
    **{f"fappy-{width:g}": (f"FAPPY {width:g}",
                            lambda seed, width=width: tfdml.losses.FAPPYLoss(min_bin_width=width),
                            "histogram")
       for width in MIN_BIN_WIDTHS},
}
DEFAULT_CONFIGS = tuple(CONFIGS)
SETTINGS = {"histogram_bin_width": HISTOGRAM_BIN_WIDTH, "fappy_min_bin_widths": MIN_BIN_WIDTHS}

TITLE = "FAPPY on glyphs: FAPPY at three minimum bin widths against the histogram loss"
CLAIM = ("FAPPY is comparable to or better than the histogram loss, its baseline, and its "
         "results hardly change with the minimum bin width (0.01, 0.001, 0.0001) (Table 1).")
DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_glyphs.json")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = comparison.make_parser(__doc__.split("\n", 1)[0], CONFIGS, DEFAULT_CONFIGS)
    args = comparison.parse_args(parser, argv, DEFAULT_OUTPUT)
    return comparison.run(args, argv, script="examples/fappy/glyphs.py", title=TITLE, claim=CLAIM,
                          configs=CONFIGS, settings=SETTINGS)


if __name__ == "__main__":
    main()
