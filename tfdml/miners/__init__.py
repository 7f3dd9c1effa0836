"""Miners: which positives and negatives each anchor is trained with.

A miner looks at a score matrix ``scores[a, r]`` (larger means more similar:
a cosine similarity, or a negated distance) between ``B`` anchors and ``R``
reference samples, the class ids of both and (for strategies that need them,
such as distance-weighted sampling, and for the miners that measure
distances themselves) the embeddings, and returns a fixed-shape description
of what to train on:

* :class:`Triplets` (from :class:`TripletMiner`, :class:`TripletMarginMiner`,
  :class:`AngularMiner`, ...): (anchor, positive, negative) index triples and
  a mask;
* :class:`Pairs` (from :class:`AllPairsMiner`, :class:`MultiSimilarityMiner`,
  :class:`PairMarginMiner`, ...): ``[B, R]`` masks of the positive and
  negative pairs each anchor keeps.

Every tfdml loss accepts either kind: :func:`as_pairs` turns triplets into
the pairs they contain, :func:`as_triplets` turns pairs into every
(positive pair, negative pair) combination of an anchor. Losses gather the
scores of the chosen pairs and apply their formula; mining itself is never
differentiated.

Everything is written with ``keras.ops`` and runs under every Keras backend
(TensorFlow, JAX, PyTorch), eagerly and compiled (``jit_compile=True``,
``jax.jit``): every single choice is a masked arg-max of a key (the scores,
their negation, or random noise), and the rest are sorts, scatters and
cumulative sums of fixed shape. Only the ``positive="all", negative="all"``
strategy, the miners that keep triplets by a margin or an angle
(:class:`TripletMarginMiner`, :class:`AngularMiner`) and :func:`as_triplets`
build a ``[B, R, R]`` tensor.

The package, from the bottom up (each module imports only those before it):

* :mod:`tfdml.miners.base`: :class:`Miner`, :class:`Triplets`,
  :class:`Pairs`, :func:`as_pairs`, :func:`as_triplets`,
  :func:`gather_triplet_scores`;
* :mod:`tfdml.miners.selection`: the one selection routine every miner
  chooses with (:func:`tfdml.miners.selection.pick`, a masked arg-max over a
  table of strategies) and the per-pair draws;
* one module per family: :mod:`tfdml.miners.triplet` (:class:`TripletMiner`,
  :class:`EmbeddingsAlreadyPackagedAsTriplets`), :mod:`tfdml.miners.pairs`
  (:class:`AllPairsMiner`, :class:`MultiSimilarityMiner`,
  :class:`PairMarginMiner`), :mod:`tfdml.miners.distance`
  (:class:`TripletMarginMiner`, :class:`BatchEasyHardMiner`,
  :class:`HDCMiner`, :class:`AngularMiner`: pytorch-metric-learning's miners,
  which measure the L2-normalized embeddings) and
  :mod:`tfdml.miners.histogram` (:class:`UniformHistogramMiner`).

Every public name is imported from ``tfdml.miners``.

Example:

>>> miner = tfdml.miners.TripletMiner("easy", "semihard")
>>> loss = tfdml.losses.TripletNCALoss(order=2, miner=miner)
"""

from tfdml.miners.base import (
    Miner,
    Pairs,
    Triplets,
    as_pairs,
    as_triplets,
    gather_triplet_scores,
)
from tfdml.miners.distance import AngularMiner, BatchEasyHardMiner, HDCMiner, TripletMarginMiner
from tfdml.miners.histogram import UniformHistogramMiner
from tfdml.miners.pairs import MS_POSITIVE_STRATEGIES as MS_POSITIVE_STRATEGIES
from tfdml.miners.pairs import AllPairsMiner, MultiSimilarityMiner, PairMarginMiner
from tfdml.miners.selection import NEGATIVE_STRATEGIES as NEGATIVE_STRATEGIES
from tfdml.miners.selection import POSITIVE_STRATEGIES as POSITIVE_STRATEGIES
from tfdml.miners.selection import distance_log_weights, negatives_at_or_below
from tfdml.miners.triplet import EmbeddingsAlreadyPackagedAsTriplets, TripletMiner

__all__ = [
    "AllPairsMiner",
    "AngularMiner",
    "BatchEasyHardMiner",
    "EmbeddingsAlreadyPackagedAsTriplets",
    "HDCMiner",
    "Miner",
    "MultiSimilarityMiner",
    "PairMarginMiner",
    "Pairs",
    "TripletMarginMiner",
    "TripletMiner",
    "Triplets",
    "UniformHistogramMiner",
    "as_pairs",
    "as_triplets",
    "distance_log_weights",
    "gather_triplet_scores",
    "negatives_at_or_below",
]
