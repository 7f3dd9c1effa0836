"""The inputs of a loss's terms: labels and embeddings checked, cast and normalized, and
the pairs and triplets a miner selects from them."""

from __future__ import annotations

from typing import NamedTuple

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._embeddings import check_batch_sizes, check_embeddings, check_ref_offset, compute_dtype
from tfdml.miners import AllPairsMiner, Miner, Pairs, Triplets, as_pairs, as_triplets

__all__ = ["Inputs", "mined_pairs", "mined_triplets", "prepare_inputs", "resolve_miner"]


class Inputs(NamedTuple):
    """The checked inputs of a per-anchor function (:func:`prepare_inputs`).

    Attributes:
        labels: ``[B]`` integer class ids of the anchors.
        x: ``[B, D]`` embeddings in the compute dtype.
        ref_labels: ``[R]`` class ids of the reference set.
        ref: ``[R, D]`` reference set (``x`` itself without one).
        ref_offset: anchor ``i`` is row ``i + ref_offset`` of ``ref`` (0 for
            the batch itself), or None when the anchors are not in it.
    """

    labels: object
    x: object
    ref_labels: object
    ref: object
    ref_offset: object

    @property
    def batch_is_reference(self) -> bool:
        """The reference set is the batch itself (no ``ref_embeddings`` were given)."""
        return self.ref is self.x


def prepare_inputs(
    labels,
    embeddings,
    ref_embeddings=None,
    ref_labels=None,
    ref_offset=None,
    normalize: bool = True,
):
    """Validates and casts the inputs of a functional loss.

    Returns:
        :class:`Inputs` ``(labels, x, ref_labels, ref, ref_offset)``: integer
        labels, the embeddings in the compute dtype (float32, or float64 for
        float64 input), L2-normalized if ``normalize``, and the same for the
        reference set (the batch itself when ``ref_embeddings`` is None, with
        offset 0).

    Raises:
        ValueError: for embeddings that are not rank 2, labels that are not
            ``[B]``/``[B, 1]`` integer ids, batch sizes that differ, a
            reference set with embeddings but no labels (or the reverse), or
            a ``ref_offset`` that puts the anchors outside the reference set.
    """
    labels = dml.cast_labels(labels, "y_true")
    embeddings = check_embeddings(embeddings, "y_pred")
    check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    dtype = compute_dtype(embeddings.dtype)
    x = ops.cast(embeddings, dtype)
    if normalize:
        x = dml.l2_normalize(x)
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError(
                "`ref_labels` was given without `ref_embeddings`. Pass both or neither."
            )
        return Inputs(labels, x, labels, x, 0)
    if ref_labels is None:
        raise ValueError("`ref_embeddings` was given without `ref_labels`. Pass both or neither.")
    ref_labels = dml.cast_labels(ref_labels, "ref_labels")
    ref = check_embeddings(ref_embeddings, "ref_embeddings")
    check_batch_sizes(ref_labels, ref, "ref_labels", "ref_embeddings")
    if ref.shape[-1] is not None and x.shape[-1] is not None and ref.shape[-1] != x.shape[-1]:
        raise ValueError(
            "`ref_embeddings` must have the same embedding size as `y_pred`. "
            f"Received: ref_embeddings.shape={ref.shape}, y_pred.shape={embeddings.shape}"
        )
    batch = x.shape[0] if x.shape[0] is not None else ops.shape(x)[0]
    num_ref = ref.shape[0] if ref.shape[0] is not None else ops.shape(ref)[0]
    ref_offset = check_ref_offset(ref_offset, batch, num_ref)
    ref = ops.cast(ref, dtype)
    if normalize:
        ref = dml.l2_normalize(ref)
    return Inputs(labels, x, ref_labels, ref, ref_offset)


def mined_pairs(inputs: Inputs, scores, miner: Miner) -> Pairs:
    """The pairs ``miner`` keeps, mined on the ``[B, R]`` ``scores`` (higher: more similar)."""
    labels, x, ref_labels, ref, ref_offset = inputs
    return as_pairs(miner.mine(scores, labels, ref_labels, ref_offset, x, ref),
                    num_ref=ops.shape(scores)[1])


def mined_triplets(inputs: Inputs, scores, miner: Miner) -> Triplets:
    """The triplets ``miner`` keeps, mined on the ``[B, R]`` ``scores`` (higher: more
    similar)."""
    labels, x, ref_labels, ref, ref_offset = inputs
    return as_triplets(miner.mine(scores, labels, ref_labels, ref_offset, x, ref))


def resolve_miner(miner, default_factory):
    """A Miner instance from ``miner``.

    ``"default"`` gives the loss's own miner (``default_factory()``, the
    paper's); ``None`` gives :class:`tfdml.miners.AllPairsMiner` (no mining:
    every positive and negative pair), for every loss alike; a serialized
    dict is deserialized.
    """
    if isinstance(miner, str) and miner == "default":
        return default_factory()
    if miner is None:
        return AllPairsMiner()
    if isinstance(miner, dict):
        miner = keras.saving.deserialize_keras_object(miner)
    if not isinstance(miner, Miner):
        raise ValueError(
            "`miner` must be a tfdml.miners.Miner instance, \"default\" (the loss's own "
            f"miner) or None (no mining: every pair). Received: miner={miner!r}"
        )
    return miner
