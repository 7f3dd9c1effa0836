"""The uniform histogram miner: pairs drawn evenly over the range of their distances.

:func:`histogram_bins` splits the distances of the positive (negative) pairs into equal
bins from their minimum to their maximum, as pytorch-metric-learning's
``UniformHistogramMiner`` does, and :func:`sample_per_bin` draws a uniformly random subset
of each bin. :class:`UniformHistogramMiner` returns :class:`tfdml.miners.Pairs`.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int
from tfdml._docs import fill_doc
from tfdml._labels import check_min_jaccard
from tfdml._shims import dtype_name
from tfdml.miners.base import (
    MIN_JACCARD_DOC,
    Miner,
    Pairs,
    check_distance,
    check_seed,
    embedding_distances,
)

__all__ = ["UniformHistogramMiner", "histogram_bins", "sample_per_bin"]


def histogram_bins(values, mask, num_bins):
    """The bin of each masked entry among ``num_bins`` equal bins of ``[min, max]`` of them.

    pytorch-metric-learning's ``UniformHistogramMiner`` bins: the edges are
    ``linspace(min, max, num_bins + 1)`` (computed as ``torch.linspace`` does, from both
    ends), bin ``i`` holds ``edge_i <= v < edge_i+1``, the last bin is closed.

    Args:
        values: ``[B, R]`` (distances).
        mask: ``[B, R]`` bool, the entries to bin.
        num_bins: the number of bins.

    Returns:
        ``(bins, edges)``: ``[B, R]`` int32 bins (``num_bins`` outside ``mask``) and the
        ``num_bins + 1`` edges (zeros without any masked entry).
    """
    values = ops.convert_to_tensor(values)
    dtype = dtype_name(values)
    found = ops.any(mask)
    inf = ops.convert_to_tensor(float("inf"), dtype)
    low = ops.where(found, ops.min(ops.where(mask, values, inf)), ops.zeros((), dtype))
    high = ops.where(found, ops.max(ops.where(mask, values, -inf)), ops.zeros((), dtype))
    step = (high - low) / float(num_bins)
    index = ops.arange(num_bins + 1, dtype="int32")
    count = ops.cast(index, dtype)
    edges = ops.where(index < (num_bins + 1) // 2, low + step * count,
                      high - step * (float(num_bins) - count))
    # The bin by division, then moved to the one whose edges hold the value (at most one
    # off by rounding).
    safe = ops.where(step > 0, step, ops.ones((), dtype))
    guess = ops.where(step > 0, ops.floor((values - low) / safe), float(num_bins - 1))
    guess = ops.cast(ops.clip(ops.where(mask, guess, 0.0), 0.0, float(num_bins - 1)), "int32")
    below = values < ops.take(edges, guess)
    guess = ops.where(ops.logical_and(below, guess > 0), guess - 1, guess)
    above = ops.logical_and(values >= ops.take(edges, guess + 1), guess < num_bins - 1)
    guess = ops.where(above, guess + 1, guess)
    return ops.where(mask, guess, num_bins), edges


def sample_per_bin(bins, num_bins, per_bin, seed):
    """``[B, R]`` bool: in every bin, ``min(per_bin, size)`` distinct entries drawn uniformly
    (a uniformly random subset); entries of bin ``num_bins`` (outside) are never drawn.

    The entries are shuffled by random keys, sorted by bin (stably: in key order within a
    bin), and the first ``per_bin`` of each bin kept.
    """
    shape = ops.shape(bins)
    flat = ops.reshape(ops.cast(bins, "int32"), (1, -1))
    size = ops.shape(flat)[1]
    keys = keras.random.uniform(ops.shape(flat), dtype="float32", seed=seed)
    shuffle = dml.stable_argsort(keys, axis=1)
    order = dml.take_along_axis(shuffle, dml.stable_argsort(
        dml.take_along_axis(flat, shuffle, axis=1), axis=1), axis=1)
    ordered = dml.take_along_axis(flat, order, axis=1)
    counts = dml.scatter_rows(ops.zeros((1, num_bins + 1), "int32"), flat, ops.ones_like(flat),
                              mode="add")
    starts = ops.cumsum(counts, axis=1) - counts
    rank = ops.arange(size, dtype="int32")[None, :] - dml.take_along_axis(starts, ordered,
                                                                          axis=1)
    keep = ops.logical_and(rank < per_bin, ordered < num_bins)
    kept = dml.scatter_rows(ops.zeros((1, size), "int32"), order, ops.cast(keep, "int32"))
    return ops.reshape(ops.cast(kept, "bool"), shape)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(MIN_JACCARD=MIN_JACCARD_DOC)
class UniformHistogramMiner(Miner):
    """Positive and negative pairs spread uniformly over their range of distances.

    The positive pairs' distances (L2-normalized embeddings) are split into ``num_bins``
    equal bins from their minimum to their maximum (:func:`histogram_bins`), and
    ``pos_per_bin`` pairs are drawn uniformly from every bin, without replacement: a bin
    with fewer pairs gives all of them. The same for the negative pairs with
    ``neg_per_bin``. The pairs are binned over the whole batch, not per anchor. Returns
    :class:`tfdml.miners.Pairs`; every tfdml loss takes them.

    pytorch-metric-learning's ``UniformHistogramMiner`` bins the same way and draws with
    replacement (a pair may come several times, and a bin with fewer pairs than asked
    repeats them); a pair mask holds a pair once, so tfdml draws distinct pairs. The
    draws come from a ``keras.random.SeedGenerator``, which a loss holding the miner keeps
    in its state (``loss.state``, owned by :class:`tfdml.models.MetricModel`).

    Args:
        num_bins: the number of bins, ``>= 1``. Defaults to `100`.
        pos_per_bin: positive pairs drawn per bin, ``>= 1``. Defaults to `10`.
        neg_per_bin: negative pairs drawn per bin, ``>= 1``. Defaults to `10`.
        distance: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``). Defaults to
            `"l2"` (pytorch-metric-learning's default distance).
        seed: seed of the draws; the same seed gives the same sequence of draws.
            Defaults to `None` (unseeded).
        {MIN_JACCARD}

    Examples:

    >>> miner = tfdml.miners.UniformHistogramMiner(num_bins=50, pos_per_bin=5, seed=0)
    >>> loss = tfdml.losses.ContrastiveLoss(miner=miner)
    """

    blockwise = False  # the pairs of the whole batch are ranked (binned) together

    def __init__(self, num_bins: int = 100, pos_per_bin: int = 10, neg_per_bin: int = 10,
                 distance: str = "l2", seed: int | None = None, min_jaccard: float | None = None):
        self.min_jaccard = check_min_jaccard(min_jaccard)
        self.num_bins = check_int("num_bins", num_bins)
        self.pos_per_bin = check_int("pos_per_bin", pos_per_bin)
        self.neg_per_bin = check_int("neg_per_bin", neg_per_bin)
        self.distance = check_distance(distance)
        self.seed = check_seed(seed)
        self._seed_generator = keras.random.SeedGenerator(self.seed)

    def get_config(self):
        return self.with_min_jaccard({
            "num_bins": self.num_bins, "pos_per_bin": self.pos_per_bin,
            "neg_per_bin": self.neg_per_bin, "distance": self.distance, "seed": self.seed})

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None) -> Pairs:
        dist = embedding_distances(embeddings, ref_embeddings, self.distance)
        positive, negative = self.label_masks(labels, ref_labels, ref_offset)
        chosen = []
        for mask, per_bin in ((positive, self.pos_per_bin), (negative, self.neg_per_bin)):
            bins, _ = histogram_bins(dist, mask, self.num_bins)
            chosen.append(sample_per_bin(bins, self.num_bins, per_bin, self._seed_generator))
        return Pairs(*chosen)
