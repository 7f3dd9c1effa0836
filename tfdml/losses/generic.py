"""Pair and triplet losses as their maths: the scores, the mining and the terms written once.

A loss over mined pairs or triplets is, beyond its signature, one function of the scores
(pytorch-metric-learning's ``GenericPairLoss`` is the model):

* :class:`PairLoss`: ``pair_losses(scores) -> (positive, negative)``, the ``[B, R]`` loss
  of each pair were it a positive or a negative one; the terms are those of the pairs the
  miner keeps (:func:`tfdml.losses.terms.split_pair_terms`), so ``average="halves"`` works;
* :class:`TripletLoss`: ``triplet_loss(s_ap, s_an)``, the loss of each mined triplet from
  its anchor-positive and anchor-negative scores (``[B, P, N]`` after broadcasting).

The scores both read (and the miner ranks) are :meth:`PairLoss.scores`: the cosine
similarities of the embeddings, or minus the distance for a loss with a ``distance``
argument. Larger is more similar either way.
"""

from __future__ import annotations

from tfdml import ops as dml
from tfdml.losses.base import MetricLoss
from tfdml.losses.inputs import Inputs, mined_pairs, mined_triplets
from tfdml.losses.terms import AnchorTerms, split_pair_terms, triplet_terms
from tfdml.miners import gather_triplet_scores

__all__ = ["PairLoss", "TripletLoss", "pair_scores"]


def pair_scores(inputs: Inputs, distance=None):
    """The ``[B, R]`` scores of the anchors against the reference set, larger is more similar:
    dot products (cosine similarities of normalized embeddings) for ``distance=None``, else
    minus the distance :func:`tfdml.ops.distance_matrix` names."""
    if distance is None:
        return dml.pairwise_similarity(inputs.x, inputs.ref)
    return -dml.distance_matrix(inputs.x, inputs.ref, distance)


class _ScoredLoss(MetricLoss):
    def scores(self, inputs: Inputs):
        """The ``[B, R]`` scores the miner ranks and the loss reads (:func:`pair_scores` with
        the loss's ``distance`` argument, or similarities without one)."""
        return pair_scores(inputs, getattr(self, "distance", None))


class PairLoss(_ScoredLoss):
    """Base class of a loss over the pairs a miner keeps: a subclass is its maths.

    It writes its ``__init__`` (its arguments checked and passed on as keywords, a
    ``miner`` among them) and :meth:`pair_losses`. The terms of an anchor are the losses of
    its mined positive pairs and of its mined negative pairs, kept apart so that the loss
    takes ``average="halves"`` (each half over its own non-zero terms, as
    pytorch-metric-learning averages).

    Example:

    >>> class SquaredContrastiveLoss(PairLoss):
    ...     def __init__(self, margin=0.5, miner="default", **kwargs):
    ...         super().__init__(margin=check_number("margin", margin, low=0),
    ...                          miner=resolve_miner(miner, AllPairsMiner),
    ...                          distance="l2", **kwargs)
    ...
    ...     def pair_losses(self, scores):
    ...         dist = -scores
    ...         return ops.square(dist), ops.square(ops.relu(self.margin - dist))
    """

    split_terms = True

    def pair_losses(self, scores):
        """``(positive, negative)``: the ``[B, R]`` loss of each pair were it a positive pair,
        and were it a negative one (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__} implements no `pair_losses` method.")

    def terms(self, inputs: Inputs) -> AnchorTerms:
        scores = self.scores(inputs)
        pairs = mined_pairs(inputs, scores, self.miner)
        positive, negative = self.pair_losses(scores)
        return split_pair_terms(positive, negative, pairs)


class TripletLoss(_ScoredLoss):
    """Base class of a loss over the triplets a miner keeps: a subclass is its maths.

    It writes its ``__init__`` (its arguments checked and passed on as keywords, a
    ``miner`` among them) and :meth:`triplet_loss`. The terms of an anchor are the losses
    of its mined triplets.

    Example:

    >>> class CosineHingeLoss(TripletLoss):
    ...     def __init__(self, margin=0.1, miner="default", **kwargs):
    ...         super().__init__(margin=check_number("margin", margin, low=0),
    ...                          miner=resolve_miner(miner, TripletMiner), **kwargs)
    ...
    ...     def triplet_loss(self, s_ap, s_an):
    ...         return ops.relu(s_an - s_ap + self.margin)
    """

    def triplet_loss(self, s_ap, s_an):
        """The loss of each triplet from its scores ``s(a, p)`` and ``s(a, n)``, which
        broadcast to ``[B, P, N]`` (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__} implements no `triplet_loss` method.")

    def terms(self, inputs: Inputs) -> AnchorTerms:
        scores = self.scores(inputs)
        triplets = mined_triplets(inputs, scores, self.miner)
        s_ap, s_an = gather_triplet_scores(scores, triplets)
        return triplet_terms(self.triplet_loss(s_ap, s_an), triplets.mask)
