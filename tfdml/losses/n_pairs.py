"""The multi-class N-pair loss (Sohn, NIPS 2016): one anchor-positive pair per class.

The pairs are chosen as pytorch-metric-learning chooses them
(``convert_to_pos_pairs_with_unique_labels``), deterministically: for each class
with at least two samples, its first sample (in batch order) is the anchor and its
second sample the positive. Each anchor's logits are its dot products with the
positives of every chosen pair; the loss is the cross-entropy of its own positive.
"""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._docs import fill_doc
from tfdml._labels import same_label_dtype
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.terms import anchor_terms

__all__ = ["NPairsLoss", "n_pairs_loss"]

#: The shared arguments of the loss, in the order of its signature (no ``block_size``: the
#: pairs are chosen over the whole batch).
_N_PAIRS_ARGUMENTS = ("normalize", "average", "reduction", "name", "dtype")


def _ranks(ref_labels):
    """``(rank [R], count [R])``: how many earlier rows of the reference set share a row's
    class, and how many rows have its class."""
    same = ops.equal(ref_labels[:, None], ref_labels[None, :])
    rows = ops.arange(ops.shape(ref_labels)[0], dtype="int32")
    earlier = rows[None, :] < rows[:, None]
    rank = ops.sum(ops.cast(ops.logical_and(same, earlier), "int32"), axis=1)
    return rank, ops.sum(ops.cast(same, "int32"), axis=1)


def n_pairs_choice(labels, ref_labels=None, ref_offset=0):
    """The N-pair loss's pairs: which anchors it uses, and which reference rows are positives.

    For each class with at least two rows in the reference set (the batch by
    default), its first row is the anchor and its second row the positive, as
    pytorch-metric-learning 2.9 chooses them.

    Args:
        labels: ``[B]`` integer class ids of the anchors.
        ref_labels: ``[R]`` class ids of the reference set. Defaults to ``labels``.
        ref_offset: anchor ``i`` is row ``i + ref_offset`` of the reference set.
            Defaults to `0`.

    Returns:
        ``(anchor [B], positive [B, R], positives [R])``, boolean: ``anchor[i]``
        says that ``i`` is the anchor of its class; ``positive[i, j]`` that
        reference row ``j`` is the positive of the class of ``i`` (whether or
        not ``i`` is the anchor); ``positives[j]`` that row ``j`` is the
        positive of a pair.
    """
    labels = dml.cast_labels(labels)
    ref_labels = labels if ref_labels is None else dml.cast_labels(ref_labels, "ref_labels")
    labels, ref_labels = same_label_dtype(labels, ref_labels)
    rank, count = _ranks(ref_labels)
    first = ops.logical_and(ops.equal(rank, 0), count >= 2)
    rows = ops.arange(ops.shape(labels)[0], dtype="int32") + ops.cast(ref_offset, "int32")
    anchor = ops.take(first, rows, axis=0)
    second = ops.equal(rank, 1)
    positive = ops.logical_and(ops.equal(labels[:, None], ref_labels[None, :]), second[None, :])
    return anchor, positive, second


def _n_pairs_terms(inputs):
    labels, x, ref_labels, ref, ref_offset = inputs
    if ref_offset is None:
        raise ValueError(
            "NPairsLoss chooses its anchors among the reference set: pass `ref_offset` (the "
            "row of the first anchor in it), or no reference set.")
    anchor, positive, columns = n_pairs_choice(labels, ref_labels, ref_offset)
    logits = dml.pairwise_similarity(x, ref)
    dtype = dtype_name(logits)
    zero = ops.zeros((), dtype)
    own = ops.sum(ops.where(positive, logits, zero), axis=1)
    # log(1 + sum_{c' != c} exp(l_c' - l_c)): a pair without negatives is exactly 0, with a
    # zero gradient (the softmax form's log(exp(l_c)) - l_c rounds).
    negatives = ops.logical_and(columns[None, :], ops.logical_not(positive))
    values, _ = dml.masked_logsumexp(logits - own[:, None], negatives, add_one=True)
    return anchor_terms(ops.where(anchor, values, zero), anchor)


def _check_n_pairs():
    return {}


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("n_pairs_loss",
                        arguments=("normalize", "average", "reduction", "name", "dtype")))
class NPairsLoss(MetricLoss):
    """The multi-class N-pair loss: each pair's anchor against the positives of all pairs.

    One pair per class with at least two samples (:func:`n_pairs_choice`):
    its first sample in the batch is the anchor ``a_c`` and its second the
    positive ``p_c``. With ``x`` the embeddings (L2-normalized by default)
    and ``C`` the classes with a pair, per pair (the paper's N-pair-mc loss,
    in its softmax form)::

        L_c = log(1 + sum_{c' != c} exp(x_a_c^T x_p_c' - x_a_c^T x_p_c))
            = -log softmax_c(x_a_c^T x_p_c' over c' in C)

    **Averaged over** the pairs (``average="anchors"``: one anchor per
    pair). The other samples of a class are not used. A batch without a
    class of two samples gives 0; a batch of one class gives 0 (its one
    pair has no negative).

    The paper compares raw embeddings (``normalize=False``), whose L2 norms
    it penalizes instead of normalizing them (TensorFlow's former
    ``npairs_loss`` weighs that penalty ``0.002``); as in
    pytorch-metric-learning, whose default dot-product similarity normalizes,
    ``normalize`` defaults to `True`, and the penalty is left to the model
    (e.g. an activity regularizer on the embedding layer).

    Args:
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.NPairsLoss()
    >>> model.compile(optimizer="adam", loss=loss)

    Reference:
        Sohn, "Improved deep metric learning with multi-class N-pair loss
        objective", NIPS 2016.
    """

    #: The anchor and positive of each class are its first two rows.
    multi_label = "it takes the first two rows of each class as its pair"


    def __init__(self, normalize=True, average="anchors", reduction="sum_over_batch_size",
                 name="n_pairs_loss", dtype=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, **_check_n_pairs())

    def terms(self, inputs):
        return _n_pairs_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def n_pairs_loss(y_true, y_pred, normalize=True, ref_embeddings=None, ref_labels=None,
                 ref_offset=None, average="anchors"):
    """Functional form of :class:`NPairsLoss`: the mean over the chosen pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        normalize, average: as in :class:`NPairsLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 without a class of two samples, NaN when
        an embedding is NaN or Inf.
    """
    return functional_loss(NPairsLoss, _n_pairs_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check_n_pairs())
