"""What every miner builds on: the two results, the base class and the helpers they share.

A miner returns :class:`Triplets` (anchor, positive, negative index triples
and a mask) or :class:`Pairs` (``[B, R]`` masks of the positive and negative
pairs each anchor keeps). :func:`as_pairs` and :func:`as_triplets` turn one
into the other, so that every loss takes either; :func:`gather_triplet_scores`
gathers the scores of mined triplets. The miners that measure the embeddings
themselves (``distance=``) share :func:`embedding_distances` and
:data:`MAX_DISTANCE`.

This module imports nothing from the rest of :mod:`tfdml.miners`.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any, NamedTuple

from keras import ops

from tfdml import ops as dml

__all__ = ["Miner", "Pairs", "Triplets", "as_pairs", "as_triplets", "gather_triplet_scores"]


class Triplets(NamedTuple):
    """Mined triplets, as indices into the reference set and a validity mask.

    Shapes use ``B`` anchors, ``R`` reference samples, ``P`` positives per
    anchor (1, or ``R`` for ``positive="all"``) and ``N`` negatives per
    (anchor, positive) pair (1, or ``R`` for ``negative="all"``).

    Attributes:
        positive: ``[B, P]`` int32 reference indices of the positives, or
            ``None`` when every reference sample is a candidate (``P = R``,
            positive ``j`` is reference row ``j``).
        negative: ``[B, P]`` int32 reference index of the negative chosen for
            each (anchor, positive) pair, or ``None`` when every reference
            sample is a candidate (``N = R``).
        mask: ``[B, P, N]`` bool, true for the triplets that exist. An anchor
            whose mask is all false has no triplet and is left out of the loss.
    """

    positive: Any | None
    negative: Any | None
    mask: Any


class Pairs(NamedTuple):
    """Mined pairs: which reference samples each anchor is paired with.

    Attributes:
        positive: ``[B, R]`` bool, true for the kept same-class pairs
            (never the anchor itself).
        negative: ``[B, R]`` bool, true for the kept different-class pairs.
    """

    positive: Any
    negative: Any


def scatter_columns(indices, valid, width):
    """``[B, width]`` bool: true at ``indices[b, t]`` for every valid ``t`` (O(B T) memory)."""
    indices = ops.cast(indices, "int32")
    columns = ops.where(valid, indices, width)  # column `width` collects the invalid ones
    target = ops.zeros((ops.shape(indices)[0], width + 1), "int32")
    hits = dml.scatter_rows(target, columns, ops.ones_like(columns), mode="max")
    return ops.cast(hits[:, :width], "bool")


def check_seed(seed):
    """The seed of a random miner: an int or None.

    Args:
        seed: the value received.

    Returns:
        ``seed`` as an ``int``, or ``None``.

    Raises:
        ValueError: for anything else (a bool included), naming the value.
    """
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
        raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
    return None if seed is None else int(seed)


def as_pairs(mined, num_ref=None) -> Pairs:
    """The pairs contained in mined triplets (or ``mined`` itself if it is :class:`Pairs`).

    A triplet ``(a, p, n)`` contributes the positive pair ``(a, p)`` and the
    negative pair ``(a, n)``; a pair used by several triplets appears once.

    Args:
        mined: :class:`Triplets` or :class:`Pairs`.
        num_ref: ``R``, the size of the reference set. Needed only when
            neither index tensor is ``None`` (it is read from the mask
            otherwise). Defaults to `None`.
    """
    if isinstance(mined, Pairs):
        return mined
    mask = mined.mask
    if num_ref is None:
        if mined.positive is None:
            num_ref = ops.shape(mask)[1]
        elif mined.negative is None:
            num_ref = ops.shape(mask)[2]
        else:
            raise ValueError("`num_ref` is needed to turn single-choice triplets into pairs.")
    pair_valid = ops.any(mask, axis=2)  # [B, P]
    if mined.positive is None:
        positive = pair_valid
    else:
        positive = scatter_columns(mined.positive, pair_valid, num_ref)
    if mined.negative is None:
        negative = ops.any(mask, axis=1)
    else:
        negative = scatter_columns(mined.negative, pair_valid, num_ref)
    return Pairs(positive, negative)


def as_triplets(mined) -> Triplets:
    """Triplets from mined pairs: every (positive pair, negative pair) of an anchor.

    :class:`Triplets` pass through unchanged. From :class:`Pairs` the result
    has ``P = N = R`` and a ``[B, R, R]`` mask.
    """
    if isinstance(mined, Triplets):
        return mined
    mask = ops.logical_and(mined.positive[:, :, None], mined.negative[:, None, :])
    return Triplets(None, None, mask)


def gather_triplet_scores(scores, triplets: Triplets):
    """Scores of the mined pairs, broadcastable against ``triplets.mask``.

    Args:
        scores: ``[B, R]`` score matrix the triplets were mined from (or any
            differentiable function of the same pairs, e.g. a distance).
        triplets: output of a miner.

    Returns:
        ``(s_ap, s_an)`` of shapes ``[B, P, 1]`` and ``[B, P, N]``; gradients
        flow into ``scores`` at the gathered entries only.
    """
    if triplets.positive is None:
        s_ap = scores
    else:
        s_ap = dml.take_along_axis(scores, triplets.positive, axis=1)
    if triplets.negative is None:
        s_an = scores[:, None, :]
    else:
        s_an = dml.take_along_axis(scores, triplets.negative, axis=1)[:, :, None]
    return s_ap[:, :, None], s_an


class Miner:
    """Base class of tfdml miners: serializable objects passed to losses as ``miner=``."""

    #: Each anchor's selection depends on its own row of ``scores`` and on the reference
    #: set only, so that a loss computed in row blocks (``block_size``) selects what it
    #: selects without blocks. Miners that rank, bin or visit the pairs of the whole batch
    #: (:class:`tfdml.miners.HDCMiner`, :class:`tfdml.miners.UniformHistogramMiner`, a
    #: disjoint :class:`tfdml.miners.TripletMiner`) are not, and a loss with ``block_size``
    #: refuses them.
    blockwise = True

    #: For multi-hot label sets: the Jaccard similarity a positive pair needs, or None (a
    #: shared label). Miners take it as ``min_jaccard=``.
    min_jaccard = None

    def label_masks(self, labels, ref_labels=None, ref_offset=0):
        """The positive and negative masks the miner selects from: :func:`tfdml.ops.label_masks`
        with its ``min_jaccard``."""
        return dml.label_masks(labels, ref_labels, ref_offset, self.min_jaccard)

    def with_min_jaccard(self, config: dict) -> dict:
        """``config`` with ``min_jaccard`` when it is set (configs without it load as before)."""
        return config if self.min_jaccard is None else {**config, "min_jaccard": self.min_jaccard}

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        """Selects triplets or pairs.

        Args:
            scores: ``[B, R]`` float tensor, larger means more similar.
            labels: ``[B]`` class ids of the anchors, or ``[B, L]`` multi-hot label
                sets (positives share a label, or reach ``min_jaccard``).
            ref_labels: ``[R]`` class ids (``[R, L]`` label sets) of the reference set. Defaults to
                ``labels`` (the reference set is the batch).
            ref_offset: anchor ``i`` is reference row ``i + ref_offset``
                (excluded from its positives); ``None`` when the anchors are
                not in the reference set. Defaults to `0`.
            embeddings: ``[B, D]`` anchor embeddings, for strategies that
                need more than the scores (distance-weighted sampling).
                tfdml losses always pass them. Defaults to `None`.
            ref_embeddings: ``[R, D]`` reference embeddings. Defaults to
                ``embeddings``.

        Returns:
            :class:`Triplets` or :class:`Pairs`.
        """
        raise NotImplementedError

    @property
    def seed_generator(self):
        """The ``keras.random.SeedGenerator`` of a random strategy, or None.

        Its state changes at every draw. A loss using this miner holds it in its state
        (``loss.state``), which :class:`tfdml.models.MetricModel` owns, so that ``fit``
        updates it under every backend: JAX training is stateless and only updates the
        model's own variables.
        """
        return getattr(self, "_seed_generator", None)

    @contextlib.contextmanager
    def drawing_from(self, generator):
        """Inside the ``with`` block, this miner draws from ``generator``, not its own.

        A loss in row blocks (:mod:`tfdml.losses.row_blocks`) gives each block a generator
        derived from the step's seed and the block's index, so that recomputing the block
        in the backward pass draws the same numbers; the miner's own generator (and its
        state) is back in place when the block ends, also on an error.

        Args:
            generator: a ``keras.random.SeedGenerator`` (or an object with its
                ``next()``).
        """
        own = self.seed_generator
        self._seed_generator = generator
        try:
            yield self
        finally:
            self._seed_generator = own

    def __call__(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
                 ref_embeddings=None):
        return self.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset,
                         embeddings=embeddings, ref_embeddings=ref_embeddings)

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def unit_embeddings(embeddings, ref_embeddings):
    """The L2-normalized embeddings and reference set (the embeddings for None), without
    gradient."""
    if embeddings is None:
        raise ValueError("This miner measures the embeddings: pass `embeddings` (tfdml losses "
                         "always do).")
    x = dml.l2_normalize(ops.stop_gradient(ops.convert_to_tensor(embeddings)))
    ref = x if ref_embeddings is None else dml.l2_normalize(
        ops.stop_gradient(ops.convert_to_tensor(ref_embeddings)))
    return x, ref


def embedding_distances(embeddings, ref_embeddings, distance):
    """``[B, R]`` distances between the L2-normalized embeddings, without gradient."""
    return dml.distance_matrix(*unit_embeddings(embeddings, ref_embeddings), distance)


def check_distance(distance):
    """``distance`` if the distance miners measure it (``"l2"``, ``"squared_l2"``,
    ``"cosine"``); a ValueError naming it otherwise."""
    return dml.check_distance(distance, ("l2", "squared_l2", "cosine"))


#: The ``Args`` line of ``min_jaccard``, which every miner takes (for
#: :func:`tfdml._docs.fill_doc`'s ``{MIN_JACCARD}``).
MIN_JACCARD_DOC = """\
min_jaccard: for multi-hot label sets ``[B, L]``, the Jaccard similarity
    a positive pair needs (:func:`tfdml.ops.label_masks`); `None`: one
    shared label. Defaults to `None`."""

#: The ``Args`` line of the distance miners' ``distance`` (``{DISTANCE}``).
DISTANCE_DOC = """\
distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).
    Defaults to `"l2"`."""

#: The largest distance between two L2-normalized embeddings (antipodal unit vectors): the
#: miners' distances lie in ``[0, MAX_DISTANCE[distance]]``.
MAX_DISTANCE = {"l2": 2.0, "squared_l2": 4.0, "cosine": 2.0}


def refuse(name, value, distance, requirement, reason):
    """Raises the ValueError of an argument with which a distance miner can keep nothing.

    Args:
        name: the argument's name.
        value: the value received.
        distance: the miner's distance.
        requirement: what the value must be (``"> 0"``).
        reason: why.

    Raises:
        ValueError: always, naming the argument, the requirement and the value.
    """
    raise ValueError(f"`{name}` must be {requirement}: {reason} (distance={distance!r}). "
                     f"Received: {name}={value!r}")
