"""Triplet losses: NCA (1st order) and its 2nd-order fix ("Extreme triplet learning"), margin, PN."""

from __future__ import annotations

import numbers

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_number, is_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import REFERENCE_ARGS, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import mined_triplets, resolve_miner
from tfdml.losses.terms import triplet_terms
from tfdml.miners import TripletMiner, gather_triplet_scores

__all__ = [
    "PNLoss",
    "TripletMarginLoss",
    "TripletNCALoss",
    "pn_loss",
    "triplet_margin_loss",
    "triplet_nca_loss",
]


def _check_nca_args(order: int = 1, temperature: float = 1.0, miner="default"):
    if not isinstance(order, numbers.Integral) or isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"`order` must be 1 or 2. Received: order={order!r}")
    return {"order": int(order),
            "temperature": check_number("temperature", temperature, low=0, low_open=True),
            "miner": resolve_miner(miner, _ephn)}


def _check_margin_args(margin: float = 0.2, distance: str = "squared_l2", miner="default"):
    return {"margin": check_number("margin", margin, low=0),
            "distance": dml.check_distance(distance),
            "miner": resolve_miner(miner, _facenet)}


def _check_pn_args(margin: float | None = None, distance: str = "cosine", miner="default"):
    if margin is not None and (not is_number(margin) or not margin >= 0):
        raise ValueError(
            f"`margin` must be None (the soft margin) or a number >= 0. Received: margin={margin!r}")
    return {"margin": None if margin is None else float(margin),
            "distance": dml.check_distance(distance), "miner": resolve_miner(miner, _hard_semihard)}


def _ephn():
    return TripletMiner("easy", "hard")


def _facenet():
    return TripletMiner("all", "semihard")


def _hard_semihard():
    return TripletMiner("hard", "semihard")


def _nca_terms(inputs, order, temperature, miner):
    scores = dml.pairwise_similarity(inputs.x, inputs.ref)
    triplets = mined_triplets(inputs, scores, miner)
    s_ap, s_an = gather_triplet_scores(scores, triplets)
    if order == 1:
        logits = s_an - s_ap
    else:
        logits = 0.5 * ops.square(s_an) - (s_ap - 0.5 * ops.square(s_ap))
    values = ops.softplus(logits / ops.convert_to_tensor(temperature, dtype_name(logits)))
    return triplet_terms(values, triplets.mask)


def _margin_terms(inputs, margin, distance, miner):
    scores = -dml.distance_matrix(inputs.x, inputs.ref, distance)
    triplets = mined_triplets(inputs, scores, miner)
    s_ap, s_an = gather_triplet_scores(scores, triplets)
    values = ops.relu(s_an - s_ap + ops.convert_to_tensor(margin, dtype_name(scores)))
    return triplet_terms(values, triplets.mask)


def _between_references(ref, triplets, distance, ref_dist=None):
    """``d(p, n)`` of every mined triplet, broadcastable against ``triplets.mask`` ``[B, P, N]``.

    The positives and negatives are rows of the reference set ``ref``.
    ``ref_dist`` is its ``[R, R]`` distance matrix when it is at hand (the
    batch is its own reference set); otherwise only the distances the
    triplets use are computed, except for every positive with its own
    negative (``positive="all"`` with a single-choice negative), which needs
    the ``[R, R]`` matrix.
    """
    if triplets.negative is not None and triplets.positive is not None and ref_dist is None:
        positives = ops.take(ref, triplets.positive, axis=0)  # [B, P, D]
        negatives = ops.take(ref, triplets.negative, axis=0)
        return dml.paired_distance(positives, negatives, distance)[:, :, None]
    if triplets.negative is None and triplets.positive is not None and ref_dist is None:
        positives = ops.take(ref, triplets.positive[:, 0], axis=0)  # P = 1
        return dml.distance_matrix(positives, ref, distance)[:, None, :]
    if ref_dist is None:
        ref_dist = dml.distance_matrix(ref, ref, distance)
    num_ref = ops.shape(ref_dist)[0]
    if triplets.positive is None and triplets.negative is None:
        return ref_dist[None, :, :]
    if triplets.negative is None:  # one positive per anchor, every negative
        return ops.take(ref_dist, triplets.positive, axis=0)
    positive = triplets.positive
    if positive is None:  # every positive j, each with its own negative
        positive = ops.arange(num_ref, dtype="int32")[None, :]
    flat = positive * num_ref + triplets.negative
    return ops.take(ops.reshape(ref_dist, (-1,)), flat)[:, :, None]


def _pn_terms(inputs, margin, distance, miner):
    ref = inputs.ref
    dist = dml.distance_matrix(inputs.x, ref, distance)
    triplets = mined_triplets(inputs, -dist, miner)
    d_ap, d_an = gather_triplet_scores(dist, triplets)
    ref_dist = dist if inputs.batch_is_reference else None
    d_n = dml.minimum(d_an, _between_references(ref, triplets, distance, ref_dist))
    if margin is None:
        values = ops.softplus(d_ap - d_n)
    else:
        values = ops.relu(d_ap - d_n + ops.convert_to_tensor(margin, dtype_name(dist)))
    return triplet_terms(values, triplets.mask)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("triplet_nca_loss"))
class TripletNCALoss(MetricLoss):
    """Triplet NCA loss (1st order) and the 2nd-order loss of "Extreme triplet learning".

    With ``S_ap``, ``S_an`` the cosine similarities of a mined triplet and
    ``T`` the temperature:

    * ``order=1`` (eq. 1): ``L = -log(e^{S_ap/T} / (e^{S_ap/T} + e^{S_an/T}))
      = softplus((S_an - S_ap) / T)``.
    * ``order=2`` (eq. 16): ``u = S_ap - S_ap^2 / 2``, ``v = S_an^2 / 2``,
      ``L = softplus((v - u) / T)``. Its gradients weight the positive by
      ``w_ap = 1 - S_ap`` and the negative by ``w_an = S_an`` (eqs. 13-15),
      which stops hard-negative triplets from collapsing to (1, 1).

    The temperature divides the logits of the softmax (``S`` for order 1,
    ``u`` and ``v`` for order 2), so the 2nd-order weights keep their form.
    ``T = 1`` is the paper's equations; the authors' released easy-positive
    code used ``T = 0.1`` with order 1.

    **Averaged over** the anchors kept (``average="anchors"``): per anchor
    the mean over its mined triplets, then the mean over the anchors that
    have a triplet, as the authors' code does. Anchors without a triplet (no
    positive or no negative in the batch) are left out, and a batch with
    none gives 0 with zero gradients.

    Args:
        order: 1 or 2. Defaults to `1`.
        temperature: ``T > 0``. Defaults to `1.0`.
        miner: a :class:`tfdml.miners.Miner`; `"default"` for
            `TripletMiner("easy", "hard")` (EPHN); `None` for no mining
            (every triplet of the batch, :class:`tfdml.miners.AllPairsMiner`).
            Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.TripletNCALoss(order=2)
    >>> model.compile(optimizer="adam", loss=loss, jit_compile=True)
    >>> model.fit(dataset_of_images_and_int_labels, epochs=10)

    Reference:
        "Extreme triplet learning: effectively optimizing easy positives and
        hard negatives" (eqs. 1 and 16); Goldberger et al., "Neighbourhood
        components analysis", NIPS 2005.
    """

    def __init__(self, order: int = 1, temperature: float = 1.0, miner="default", normalize=True,
                 average="anchors", reduction="sum_over_batch_size", name="triplet_nca_loss",
                 dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_nca_args(order, temperature, miner))

    def terms(self, inputs):
        return _nca_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def triplet_nca_loss(y_true, y_pred, order: int = 1, temperature: float = 1.0, miner="default",
                     normalize=True, ref_embeddings=None, ref_labels=None, ref_offset=None,
                     average="anchors"):
    """Functional form of :class:`TripletNCALoss`: by default the mean over anchors with a triplet.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        order, temperature, miner, normalize, average: as in :class:`TripletNCALoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a triplet, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(TripletNCALoss, _nca_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average,
                           **_check_nca_args(order, temperature, miner))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("triplet_margin_loss"))
class TripletMarginLoss(MetricLoss):
    """The vanilla margin triplet loss (appendix E of "Extreme triplet learning").

    ``L = max(d(a, p) - d(a, n) + margin, 0)`` for each mined triplet, with
    ``d`` one of:

    * ``"squared_l2"``: ``|f_a - f_p|^2``, which on the unit sphere is
      ``2 - 2 S`` (so ``L = max(2 (S_an - S_ap) + margin, 0)``);
    * ``"l2"``: ``|f_a - f_p|`` (square root guarded at 0);
    * ``"cosine"``: ``1 - S``.

    Mining ranks by the same distance (smaller is more similar).

    **Averaged over** the anchors kept (``average="anchors"``): per anchor
    the mean over its mined triplets, then the mean over the anchors with a
    triplet, as the extreme-triplet authors' code does. FaceNet sums over
    its triplets, TensorFlow Addons divides by the number of positive pairs
    (its ``TripletSemiHardLoss``, also in :mod:`tfdml.compat.tfa`) and
    pytorch-metric-learning by the number of triplets with a non-zero loss:
    ``average="terms"`` and ``average="nonzero"``. Anchors without a triplet
    are left out, and a batch with none gives 0 with zero gradients.

    Args:
        margin: ``>= 0``. Defaults to `0.2`.
        distance: ``"squared_l2"``, ``"l2"`` or ``"cosine"``. Defaults to
            `"squared_l2"`.
        miner: a :class:`tfdml.miners.Miner`; `"default"` for
            `TripletMiner("all", "semihard")` (every positive, each with its
            semi-hard negative, as in FaceNet); `None` for no mining (every
            triplet, :class:`tfdml.miners.AllPairsMiner`). Defaults to
            `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> loss = tfdml.losses.TripletMarginLoss(
    ...     margin=0.2, miner=tfdml.miners.TripletMiner("easy", "hard"))

    Reference:
        Schroff, Kalenichenko, Philbin, "FaceNet", CVPR 2015; appendix E of
        "Extreme triplet learning".
    """

    def __init__(self, margin: float = 0.2, distance: str = "squared_l2", miner="default",
                 normalize=True, average="anchors", reduction="sum_over_batch_size",
                 name="triplet_margin_loss", dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_margin_args(margin, distance, miner))

    def terms(self, inputs):
        return _margin_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def triplet_margin_loss(y_true, y_pred, margin: float = 0.2, distance: str = "squared_l2",
                        miner="default", normalize=True, ref_embeddings=None, ref_labels=None,
                        ref_offset=None, average="anchors"):
    """Functional form of :class:`TripletMarginLoss`: by default the mean over anchors with a triplet.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, distance, miner, normalize, average: as in :class:`TripletMarginLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a triplet, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(TripletMarginLoss, _margin_terms, y_true, y_pred, ref_embeddings,
                           ref_labels, ref_offset, normalize, average,
                           **_check_margin_args(margin, distance, miner))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(SHARED_ARGS=shared_args("pn_loss"))
class PNLoss(MetricLoss):
    """PN triplet loss: the negative must be far from the anchor *and* from the positive.

    For a mined triplet ``(a, p, n)`` with distances ``d``::

        d_n = min(d(a, n), d(p, n))
        L   = softplus(d(a, p) - d_n)              (margin=None, the soft margin)
        L   = max(d(a, p) - d_n + margin, 0)       (a number)

    Balntas et al.'s PN-Net takes the smaller of the two negative distances
    so that a triplet pushes the negative away from whichever of ``a`` and
    ``p`` it is closer to; they put it in a ratio loss (SoftPN), Szubert et
    al.'s ivis and TensorFlow Similarity's ``PNLoss`` in the margin loss
    written here. Arguments and defaults are those of TensorFlow Similarity
    0.17's ``PNLoss``: cosine distance ``1 - cos``, the soft margin
    (``margin=None``; a number gives the hinge), the hardest (farthest)
    positive and its semi-hard negative (:class:`tfdml.miners.TripletMiner`
    ``("hard", "semihard")``: the closest negative at least as far as the
    positive). Any triplet miner works.

    **Averaged over** the anchors that have a triplet (``average="anchors"``).
    **Against TensorFlow Similarity's** ``PNLoss``: an anchor with no
    negative at least as far as its positive is left out here, where
    TensorFlow Similarity falls back to the anchor's farthest negative; an
    anchor without a positive is left out too (TensorFlow Similarity gives it
    a value); and ``reduction="none"`` gives ``[B]`` values (TensorFlow
    Similarity: ``[B, 1]``). ``tests/losses/test_tfsim_parity.py`` checks both
    differences against TensorFlow Similarity's recorded values. With :class:`CrossBatchMemory` the positive-negative
    distances come from an ``[R, R]`` matrix of the reference set.

    Args:
        margin: `None` for the soft margin, or the hinge's margin ``>= 0``.
            Defaults to `None`.
        distance: ``"cosine"``, ``"squared_l2"`` or ``"l2"``. Defaults to
            `"cosine"`.
        miner: a :class:`tfdml.miners.Miner`; `"default"` for
            `TripletMiner("hard", "semihard")`; `None` for every triplet.
            Defaults to `"default"`.
        {SHARED_ARGS}

    Examples:

    >>> model.compile(optimizer="adam", loss=tfdml.losses.PNLoss())
    >>> loss = tfdml.losses.PNLoss(margin=1.0,
    ...                            miner=tfdml.miners.TripletMiner("easy", "hard"))

    Reference:
        Balntas, Johns, Tang, Mikolajczyk, "PN-Net: conjoined triple deep
        network for learning local image descriptors", arXiv:1601.05030
        (2016); Szubert, Cole, Monaco, Drozdov, "Structure-preserving
        visualisation of high dimensional single-cell datasets", Sci. Rep. 9,
        8914 (2019).
    """

    def __init__(self, margin: float | None = None, distance: str = "cosine", miner="default",
                 normalize=True, average="anchors", reduction="sum_over_batch_size", name="pn_loss",
                 dtype=None, block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size,
                         **_check_pn_args(margin, distance, miner))
        if (self.block_size is not None and isinstance(self.miner, TripletMiner)
                and self.miner.positive == "all" and self.miner.negative != "all"):
            raise ValueError(
                "PNLoss cannot run in blocks with every positive and a single-choice negative: "
                "d(p, n) would need the [B, B] distances of the batch. Remove `block_size` or "
                f"use another miner. Received: block_size={self.block_size!r}, miner={self.miner!r}")

    def terms(self, inputs):
        return _pn_terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def pn_loss(y_true, y_pred, margin: float | None = None, distance: str = "cosine", miner="default",
            normalize=True, ref_embeddings=None, ref_labels=None, ref_offset=None,
            average="anchors"):
    """Functional form of :class:`PNLoss`: by default the mean over anchors with a triplet.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, distance, miner, normalize, average: as in :class:`PNLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``; 0 when no anchor has a triplet, NaN when an
        embedding is NaN or Inf.
    """
    return functional_loss(PNLoss, _pn_terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average,
                           **_check_pn_args(margin, distance, miner))
