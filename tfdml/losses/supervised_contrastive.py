"""Softmax losses over pairs: supervised contrastive (SupCon), NT-Xent, circle, soft nearest neighbour."""

from __future__ import annotations

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_positive
from tfdml._docs import fill_doc
from tfdml._embeddings import check_batch_sizes, check_embeddings, compute_dtype
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import mined_pairs, resolve_miner
from tfdml.losses.terms import anchor_terms, triplet_terms
from tfdml.miners import AllPairsMiner

__all__ = [
    "CircleLoss",
    "NTXentLoss",
    "SoftNearestNeighborLoss",
    "SupConLoss",
    "circle_loss",
    "multiple_negatives_ranking_loss",
    "ntxent_loss",
    "soft_nearest_neighbor_loss",
    "supcon_loss",
]


def _mined_pairs(inputs, miner):
    similarity = dml.pairwise_similarity(inputs.x, inputs.ref)
    return similarity, mined_pairs(inputs, similarity, miner)


def _check_ntxent_args(temperature: float = 0.07, miner=None):
    return {"temperature": check_positive("temperature", temperature),
            "miner": resolve_miner(miner, AllPairsMiner)}


def _check_supcon_args(temperature: float = 0.1, miner=None, graded: bool = False):
    if not isinstance(graded, bool):
        raise ValueError(f"`graded` must be True or False. Received: graded={graded!r}")
    return {**_check_ntxent_args(temperature, miner), "graded": graded}


def _check_circle_args(margin: float = 0.4, gamma: float = 80.0, miner=None):
    return {"margin": check_positive("margin", margin, allow_zero=True),
            "gamma": check_positive("gamma", gamma), "miner": resolve_miner(miner, AllPairsMiner)}


def _check_snn_args(temperature: float = 1.0, distance: str = "squared_l2", miner=None):
    return {"temperature": check_positive("temperature", temperature),
            "distance": dml.check_distance(distance), "miner": resolve_miner(miner, AllPairsMiner)}


def _has_both(pairs):
    return ops.logical_and(ops.any(pairs.positive, axis=1), ops.any(pairs.negative, axis=1))


def _supcon_terms(inputs, temperature, miner, graded=False):
    similarity, pairs = _mined_pairs(inputs, miner)
    dtype = dtype_name(similarity)
    logits = similarity / ops.convert_to_tensor(temperature, dtype)
    others = ops.logical_or(pairs.positive, pairs.negative)
    denominator, _ = dml.masked_logsumexp(logits, others, axis=1)
    active = _has_both(pairs)
    # Finite stand-in where the anchor is inactive (its row is dropped anyway).
    denominator = ops.where(active, denominator, ops.zeros((), dtype))
    log_prob = logits - denominator[:, None]
    positives = ops.cast(pairs.positive, dtype)
    if graded:  # Multi-SupCon: each positive weighted by the Jaccard similarity of the sets
        log_prob = log_prob * ops.cast(dml.label_jaccard(inputs.labels, inputs.ref_labels),
                                       dtype)
    total = -ops.sum(ops.where(pairs.positive, log_prob, ops.zeros((), dtype)), axis=1)
    losses = dml.divide_no_nan(total, ops.sum(positives, axis=1))
    return anchor_terms(losses, active)


def _ntxent_terms(inputs, temperature, miner):
    similarity, pairs = _mined_pairs(inputs, miner)
    dtype = dtype_name(similarity)
    logits = similarity / ops.convert_to_tensor(temperature, dtype)
    negatives, has_negative = dml.masked_logsumexp(logits, pairs.negative, axis=1)
    negatives = ops.where(has_negative, negatives, ops.zeros((), dtype))
    # -log(e^{s_ap} / (e^{s_ap} + sum_n e^{s_an})) = softplus(lse_n s_an - s_ap); 0 without n.
    values = ops.softplus(negatives[:, None] - logits)
    values = ops.where(has_negative[:, None], values, ops.zeros((), dtype))
    return triplet_terms(values, pairs.positive)


def _circle_terms(inputs, margin, gamma, miner):
    similarity, pairs = _mined_pairs(inputs, miner)
    dtype = dtype_name(similarity)
    zero = ops.zeros((), dtype)
    m, g = ops.convert_to_tensor(margin, dtype), ops.convert_to_tensor(gamma, dtype)
    one = ops.ones((), dtype)
    fixed = ops.stop_gradient(similarity)
    alpha_p = dml.maximum(one + m - fixed, zero)  # [O_p - s_p]_+, O_p = 1 + m
    alpha_n = dml.maximum(fixed + m, zero)  # [s_n - O_n]_+, O_n = -m
    positive, _ = dml.masked_logsumexp(-g * alpha_p * (similarity - (one - m)), pairs.positive,
                                       axis=1)
    negative, _ = dml.masked_logsumexp(g * alpha_n * (similarity - m), pairs.negative, axis=1)
    active = _has_both(pairs)
    total = ops.where(active, positive + negative, zero)
    return anchor_terms(ops.softplus(total), active)


def _snn_terms(inputs, temperature, distance, miner):
    x, ref = inputs.x, inputs.ref
    dist = dml.distance_matrix(x, ref, distance)
    pairs = mined_pairs(inputs, -dist, miner)
    dtype = dtype_name(dist)
    logits = -dist / ops.convert_to_tensor(temperature, dtype)
    same, active = dml.masked_logsumexp(logits, pairs.positive, axis=1)
    everyone, _ = dml.masked_logsumexp(logits, ops.logical_or(pairs.positive, pairs.negative),
                                       axis=1)
    zero = ops.zeros((), dtype)
    # An anchor without a same-class neighbour (-inf - -inf) is left out with a finite 0.
    losses = ops.where(active, everyone, zero) - ops.where(active, same, zero)
    return anchor_terms(losses, active)


def multiple_negatives_ranking_loss(query_embeddings, key_embeddings, scale: float = 20.0,
                                    normalize: bool = False, add_one: bool = False):
    """In-batch negatives: query ``i``'s key is its positive, the other keys its negatives.

    With ``s_ij = scale * <q_i, k_j>`` (cosine similarities with ``normalize``)::

        L = mean_i ( log sum_j exp(s_ij) - s_ii )

    the softmax cross-entropy of each query over the batch's keys (Henderson et
    al. 2017). ``add_one=True`` adds 1 inside the log, ``log(1 + sum_j
    exp(s_ij)) - s_ii``, which is TensorFlow Similarity's
    ``MultiNegativesRankLoss`` (its default inner product: ``normalize=False``).
    Computed with log-sum-exps in float32 (float64 for float64 input).

    For pairs without class labels (question and answer, two views of one
    item); with labels, use :class:`NTXentLoss` or :class:`SupConLoss`. It is
    a plain function of two embedding batches, not a ``(y_true, y_pred)``
    Keras loss: call it in a custom ``train_step`` or through ``add_loss``.

    Args:
        query_embeddings: ``[B, D]``.
        key_embeddings: ``[B, D]``; row ``i`` is the positive of query ``i``.
        scale: ``> 0``, multiplies the similarities. Defaults to `20.0`.
        normalize: L2-normalize both first. Defaults to `False`.
        add_one: TensorFlow Similarity's ``1 +`` inside the log. Defaults to
            `False`.

    Returns:
        A scalar of the dtype of ``query_embeddings``; NaN when an embedding is
        NaN or Inf, or, without ``normalize``, so large that dot products could
        overflow (:func:`tfdml.ops.all_finite`).

    Examples:

    >>> loss = tfdml.losses.multiple_negatives_ranking_loss(
    ...     question_model(questions), answer_model(answers), normalize=True)

    Reference:
        Henderson et al., "Efficient natural language response suggestion
        for smart reply", arXiv:1705.00652 (2017).
    """
    scale = check_positive("scale", scale)
    queries = check_embeddings(query_embeddings, "query_embeddings")
    keys = check_embeddings(key_embeddings, "key_embeddings")
    check_batch_sizes(queries, keys, "query_embeddings", "key_embeddings")
    dtype = compute_dtype(queries.dtype)
    q, k = ops.cast(queries, dtype), ops.cast(keys, dtype)
    if normalize:
        q, k = dml.l2_normalize(q), dml.l2_normalize(k)
    logits = dml.pairwise_similarity(q, k) * ops.convert_to_tensor(scale, dtype)
    every = ops.ones_like(logits, dtype="bool")
    total, _ = dml.masked_logsumexp(logits, every, axis=1, add_one=add_one)
    # A sum and a division: keras.ops.mean under PyTorch rounds float64 to float32.
    rows = total - ops.diagonal(logits)
    value = ops.sum(rows) / ops.cast(ops.shape(rows)[0], dtype)
    value = dml.nan_unless_finite(value, queries, keys, distances=not normalize)
    return ops.cast(value, dtype_name(queries))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("supcon_loss"))
class SupConLoss(MetricLoss):
    """Supervised contrastive loss: each positive against all other samples, in one softmax.

    With cosine similarities ``s``, ``P(a)`` the positives of anchor ``a``
    and ``A(a)`` all its positives and negatives (every other sample)::

        L_a = -1/|P(a)| sum_{p in P(a)} log( exp(s_ap / T) / sum_{j in A(a)} exp(s_aj / T) )

    **Averaged over** the anchors that have a positive and a negative
    (``average="anchors"``), as pytorch-metric-learning does (its
    ``AvgNonZeroReducer``, and a zero loss for a batch without negatives).
    Khosla et al.'s eq. 2 sums over anchors; their code takes the mean and
    multiplies it by ``T / 0.07``, a constant that only rescales the learning
    rate, and which tfdml (like pytorch-metric-learning) leaves out. A
    :class:`CrossBatchMemory` plugs in through ``ref_embeddings``.

    **Multi-label** (``y_true`` ``[B, L]`` multi-hot): ``P(a)`` are the samples
    that share a label with ``a``. ``graded=True`` is Multi-SupCon
    (pytorch-metric-learning #658 / #667): each positive's term is weighted by the Jaccard similarity
    ``J_ap = |Y_a & Y_p| / |Y_a | Y_p|`` of the label sets::

        L_a = -1/|P(a)| sum_{p in P(a)} J_ap log( exp(s_ap / T) / sum_{j in A(a)} exp(s_aj / T) )

    so that a positive sharing one label of five pulls less than an exact
    match. With one label per sample ``J_ap = 1`` and it is SupCon.

    Args:
        temperature: ``T > 0``. Defaults to `0.1`.
        miner: a pair miner restricting ``P(a)`` and ``A(a)``. Defaults to
            `None` (every pair).
        graded: weight each positive by the Jaccard similarity of its label
            set with the anchor's (Multi-SupCon). Defaults to `False`.
        {SHARED_ARGS}

    Examples:

    >>> model.compile(optimizer="adam", loss=tfdml.losses.SupConLoss(temperature=0.1))

    Reference:
        Khosla et al., "Supervised contrastive learning", NeurIPS 2020.
        Multi-SupCon: the multi-label supervised contrastive loss of the
        NeurIPS 2022 Self-Supervised Learning workshop (paper 8), as proposed
        for pytorch-metric-learning in issue #658 and PR #667.
    """

    def __init__(self, temperature: float = 0.1, miner=None, normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="supcon_loss", dtype=None, block_size=None,
                 graded: bool = False):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_supcon_args(temperature, miner, graded))

    def terms(self, inputs):
        return _supcon_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def supcon_loss(y_true, y_pred, temperature: float = 0.1, miner=None, normalize=True,
                ref_embeddings=None, ref_labels=None, ref_offset=None, average="anchors",
                graded: bool = False):
    """Functional form of :class:`SupConLoss`: the mean over anchors with a positive and a negative.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids, or ``[B, L]`` multi-hot
            label sets.
        y_pred: ``[B, D]`` embeddings.
        temperature, miner, normalize, average, graded: as in :class:`SupConLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a positive and a
        negative, NaN when an embedding is NaN or Inf.
    """
    return functional_loss(SupConLoss, _supcon_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average,
                           **_check_supcon_args(temperature, miner, graded))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("ntxent_loss", average="terms"))
class NTXentLoss(MetricLoss):
    """NT-Xent (InfoNCE) loss with same-label pairs as positives: one softmax per positive pair.

    For each positive pair ``(a, p)`` with ``N(a)`` the negatives of ``a``::

        L_ap = -log( exp(s_ap / T) / (exp(s_ap / T) + sum_{n in N(a)} exp(s_an / T)) )

    **Averaged over** all positive pairs (``average="terms"``), as
    pytorch-metric-learning's ``NTXentLoss`` does (a pair whose anchor has no
    negative counts with loss 0). With one augmented view per label this is
    SimCLR's loss (Chen et al. 2020). Unlike :class:`SupConLoss`, the other
    positives of the anchor are not in the denominator.

    Args:
        temperature: ``T > 0``. Defaults to `0.07`.
        miner: a pair miner. Defaults to `None` (every pair).
        {SHARED_ARGS}

    Examples:

    >>> model.compile(optimizer="adam", loss=tfdml.losses.NTXentLoss(temperature=0.07))

    Reference:
        Chen, Kornblith, Norouzi, Hinton, "A simple framework for contrastive
        learning of visual representations", ICML 2020; Sohn, "Improved deep
        metric learning with multi-class N-pair loss objective", NeurIPS 2016.
    """

    def __init__(self, temperature: float = 0.07, miner=None, normalize=True, average="terms",
                 reduction="sum_over_batch_size", name="ntxent_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_ntxent_args(temperature, miner))

    def terms(self, inputs):
        return _ntxent_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def ntxent_loss(y_true, y_pred, temperature: float = 0.07, miner=None, normalize=True,
                ref_embeddings=None, ref_labels=None, ref_offset=None, average="terms"):
    """Functional form of :class:`NTXentLoss`: the mean over positive pairs.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        temperature, miner, normalize, average: as in :class:`NTXentLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a positive and a
        negative, NaN when an embedding is NaN or Inf.
    """
    return functional_loss(NTXentLoss, _ntxent_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check_ntxent_args(temperature, miner))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("circle_loss"))
class CircleLoss(MetricLoss):
    """Circle loss: pairs re-weighted by how far each is from its optimum.

    With cosine similarities ``s``, ``O_p = 1 + m``, ``O_n = -m``,
    ``Delta_p = 1 - m`` and ``Delta_n = m``::

        L_a = softplus( logsumexp_{p} (-gamma alpha_p (s_ap - Delta_p))
                      + logsumexp_{n} ( gamma alpha_n (s_an - Delta_n)) )

    with ``alpha_p = [O_p - s_ap]_+`` and ``alpha_n = [s_an - O_n]_+``, which
    are constants in the gradient (Sun et al.'s code detaches them, as
    pytorch-metric-learning does). **Averaged over** the anchors that have a
    positive and a negative (pytorch-metric-learning's ``AvgNonZeroReducer``).

    **Against** ``keras.losses.Circle``: on L2-normalized embeddings the
    per-anchor values are equal (Keras writes the same formula in cosine
    distances), and so is the mean (Keras masks out the anchors whose loss is
    0), but Keras differentiates through ``alpha_p`` and ``alpha_n``, so its
    gradients differ from those of Sun et al.'s code; Keras also leaves the
    normalization of the embeddings to the model.

    Args:
        margin: ``m >= 0``, the relaxation. Defaults to `0.4`.
        gamma: ``gamma > 0``, the scale. Defaults to `80.0`.
        miner: a pair miner. Defaults to `None` (every pair).
        {SHARED_ARGS}

    Examples:

    >>> model.compile(optimizer="adam", loss=tfdml.losses.CircleLoss(margin=0.25, gamma=256))

    Reference:
        Sun et al., "Circle loss: A unified perspective of pair similarity
        optimization", CVPR 2020.
    """

    def __init__(self, margin: float = 0.4, gamma: float = 80.0, miner=None, normalize=True,
                 average="anchors", reduction="sum_over_batch_size", name="circle_loss", dtype=None,
                 block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_circle_args(margin, gamma, miner))

    def terms(self, inputs):
        return _circle_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def circle_loss(y_true, y_pred, margin: float = 0.4, gamma: float = 80.0, miner=None,
                normalize=True, ref_embeddings=None, ref_labels=None, ref_offset=None,
                average="anchors"):
    """Functional form of :class:`CircleLoss`: the mean over anchors with a positive and a negative.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, gamma, miner, normalize, average: as in :class:`CircleLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a positive and a
        negative, NaN when an embedding is NaN or Inf.
    """
    return functional_loss(CircleLoss, _circle_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average,
                           **_check_circle_args(margin, gamma, miner))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("soft_nearest_neighbor_loss", normalize=False))
class SoftNearestNeighborLoss(MetricLoss):
    """Soft nearest neighbour loss: how much of a sample's neighbourhood is its own class.

    With squared Euclidean distances ``d`` and temperature ``T``, for an
    anchor ``a`` with same-class samples ``P(a)`` and every other sample
    ``A(a)`` (both exclude ``a``)::

        L_a = -log( sum_{p in P(a)} exp(-d_ap / T) / sum_{j in A(a)} exp(-d_aj / T) )

    computed as a difference of two log-sum-exps, so small temperatures (or
    far-apart samples) neither underflow nor give NaN. Frosst et al. average
    over the batch; an anchor alone in its class has ``P(a)`` empty and an
    infinite term, so here it is **left out**: the loss is **averaged over**
    the anchors that have another sample of their class
    (``average="anchors"``; ``"batch"`` divides by the batch size instead).
    An anchor whose whole batch is its class has ``L_a = 0`` and counts. A
    batch of singletons gives 0 with zero gradients. The paper uses the loss
    on unnormalized hidden representations (``normalize=False``); it treats
    ``T`` as a free parameter, here fixed.

    **Against TensorFlow Similarity's** ``SoftNearestNeighborLoss`` (same
    defaults: squared L2, ``T = 1``): it exponentiates the distances
    directly and adds ``1e-9`` inside the log, so far-apart samples or small
    temperatures give ``-log(1e-9)`` with no gradient, or NaN when every
    exponential underflows; its singletons count 0 in a mean over the whole
    batch (``average="batch"`` here) and ``reduction="none"`` gives
    ``[B, 1]`` (tfdml: ``[B]``).

    Args:
        temperature: ``T > 0``. Defaults to `1.0`.
        distance: ``"squared_l2"``, ``"l2"`` or ``"cosine"``. Defaults to
            `"squared_l2"`.
        miner: a pair miner restricting ``P(a)`` and ``A(a)``. Defaults to
            `None` (every pair).
        {SHARED_ARGS}

    Examples:

    >>> model.compile(optimizer="adam",
    ...               loss=tfdml.losses.SoftNearestNeighborLoss(temperature=10.0))

    Reference:
        Frosst, Papernot, Hinton, "Analyzing and improving representations
        with the soft nearest neighbor loss", ICML 2019 (eq. 1); Salakhutdinov
        and Hinton, AISTATS 2007.
    """

    def __init__(self, temperature: float = 1.0, distance: str = "squared_l2", miner=None,
                 normalize=False, average="anchors", reduction="sum_over_batch_size",
                 name="soft_nearest_neighbor_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_snn_args(temperature, distance, miner))

    def terms(self, inputs):
        return _snn_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def soft_nearest_neighbor_loss(y_true, y_pred, temperature: float = 1.0,
                               distance: str = "squared_l2", miner=None, normalize=False,
                               ref_embeddings=None, ref_labels=None, ref_offset=None,
                               average="anchors"):
    """Functional form of :class:`SoftNearestNeighborLoss`: the mean over anchors with a positive.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        temperature, distance, miner, normalize, average: as in
            :class:`SoftNearestNeighborLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a positive, NaN when
        an embedding is NaN or Inf.
    """
    return functional_loss(SoftNearestNeighborLoss, _snn_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_snn_args(temperature, distance, miner))
