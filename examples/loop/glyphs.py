"""LoOp on glyphs: base losses with and without optimal hard negatives, on unseen characters.

The comparison of Table 2 of "LoOp: Looking for Optimal Hard Negative Embeddings for Deep
Metric Learning" (Vasudeva et al., ICCV 2021), each metric learning loss against its LoOp
form, in miniature: the glyph benchmark's recipe (`examples/glyphs/glyph_recipe.py`: 600
training characters, 400 unseen test characters, a small CNN trained from scratch, P x K =
16 x 4, Adam 1e-3, 1,000 steps), every configuration over three seeds, Recall@1 and MAP@R
on the test characters next to the raw pixels and the untrained network of the same seeds.

Configurations (`--configs`; the default is the first six):

* `triplet`: the paper's "Triplet" (eq. 14), rand-disjoint triplets
  (`TripletMarginLoss(distance="l2")` with `TripletMiner("random", "random", disjoint=True)`),
  margin 0.2; `loop-triplet`: `LoOpLoss("triplet")` (eq. 15);
* `hphn`: `HPHNTripletLoss`, margin 0.2; `loop-hphn`: `LoOpLoss("hphn_triplet")`;
* `ms`: `MultiSimilarityLoss` (alpha 2, beta 50, lambda 0.5) with
  `MultiSimilarityMiner(epsilon=0.1)`; `loop-ms`: `LoOpLoss("multi_similarity")`, epsilon
  -0.02 (the value the paper holds fixed in Fig. 3d; the plain miner needs epsilon >= 0);
* `lifted`, `loop-lifted` (not run by default, to keep the run short): `LiftedStructureLoss`
  (the hinge form, eq. 16) and `LoOpLoss("lifted_structure")`.

These are the settings of `examples/loop/train.py` (margin 0.2, MS alpha 2, beta 50,
lambda 0.5); the optimizer, batches and network are the recipe's. LoOp pairs the drawings of
a character (1st with 2nd, 3rd with 4th), so K must be even: the recipe's K = 4 is.

    python examples/loop/glyphs.py                      # 6 configurations x 3 seeds
    python examples/loop/glyphs.py --configs lifted loop-lifted
    python examples/loop/glyphs.py --smoke              # seconds: 40 characters, 4 steps

Writes `results_glyphs.json` next to this script (`--output` elsewhere; a `--smoke` run
writes only where `--output` says) and prints a markdown table.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "glyphs"))

import comparison  # noqa: E402

import tfdml  # noqa: E402

MARGIN = 0.2
MS = {"alpha": 2.0, "beta": 50.0, "lambda": 0.5}
MS_EPSILON = {"plain": 0.1, "loop": -0.02}


def _triplet(seed):
    miner = tfdml.miners.TripletMiner("random", "random", disjoint=True, seed=seed)
    return tfdml.losses.TripletMarginLoss(margin=MARGIN, distance="l2", miner=miner)


def _ms(seed):
    return tfdml.losses.MultiSimilarityLoss(
        alpha=MS["alpha"], beta=MS["beta"], base=MS["lambda"],
        miner=tfdml.miners.MultiSimilarityMiner(epsilon=MS_EPSILON["plain"]))


#: key -> (the paper's name, `seed -> loss`, the key of its base loss or None).
CONFIGS = {
    "triplet": ("Triplet (rand-disjoint)", _triplet, None),
    "loop-triplet": ("LoOp (Triplet)",
                     lambda seed: tfdml.losses.LoOpLoss("triplet", margin=MARGIN), "triplet"),
    "hphn": ("HPHNtri", lambda seed: tfdml.losses.HPHNTripletLoss(margin=MARGIN), None),
    "loop-hphn": ("LoOp (HPHNtri)",
                  lambda seed: tfdml.losses.LoOpLoss("hphn_triplet", margin=MARGIN), "hphn"),
    "ms": ("MS", _ms, None),
    "loop-ms": ("LoOp (MS)",
                lambda seed: tfdml.losses.LoOpLoss(
                    "multi_similarity", margin=MS["lambda"], alpha=MS["alpha"],
                    beta=MS["beta"], epsilon=MS_EPSILON["loop"]), "ms"),
    "lifted": ("LS", lambda seed: tfdml.losses.LiftedStructureLoss(margin=MARGIN), None),
    "loop-lifted": ("LoOp (LS)",
                    lambda seed: tfdml.losses.LoOpLoss("lifted_structure", margin=MARGIN),
                    "lifted"),
}
DEFAULT_CONFIGS = ("triplet", "loop-triplet", "hphn", "loop-hphn", "ms", "loop-ms")
SETTINGS = {"margin": MARGIN, "ms_alpha": MS["alpha"], "ms_beta": MS["beta"],
            "ms_lambda": MS["lambda"], "ms_epsilon": MS_EPSILON["plain"],
            "loop_ms_epsilon": MS_EPSILON["loop"]}

TITLE = "LoOp on glyphs: each loss with and without optimal hard negatives"
CLAIM = ("Replacing the anchor-negative distance by the LoOp distance (the minimum distance "
         "between the arcs of a positive pair and a negative pair) improves each base loss's "
         "retrieval on unseen classes (Table 2).")
DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_glyphs.json")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = comparison.make_parser(__doc__.split("\n", 1)[0], CONFIGS, DEFAULT_CONFIGS)
    args = comparison.parse_args(parser, argv, DEFAULT_OUTPUT)
    return comparison.run(args, argv, script="examples/loop/glyphs.py", title=TITLE, claim=CLAIM,
                          configs=CONFIGS, settings=SETTINGS)


if __name__ == "__main__":
    main()
