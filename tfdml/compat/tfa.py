"""A drop-in for TensorFlow Addons' metric-learning losses (``tfa.losses``, TFA 0.23).

TensorFlow Addons is end of life and does not import under Keras 3. Replacing::

    import tensorflow_addons as tfa

by::

    from tfdml.compat import tfa

keeps ``tfa.losses.TripletSemiHardLoss(margin=1.0, distance_metric="L2")``,
``TripletHardLoss``, ``LiftedStructLoss``, ``ContrastiveLoss``, ``NpairsLoss``,
``NpairsMultilabelLoss``, their functional forms and
``tfa.losses.metric_learning.pairwise_distance`` / ``angular_distance`` working
with TFA's arguments, defaults and values: no L2-normalization inside, the
distance metrics ``"L2"``, ``"squared-L2"``, ``"angular"`` or a callable, TFA's
averaging and its fallbacks. The classes are registered under TFA's names
(``Addons>TripletSemiHardLoss``...), so models saved with them load.

Differences, on purpose:

* Memory. TFA's semi-hard and lifted-structure losses tile a ``B^2 x B``
  tensor. Here one sort per row of the ``B x B`` distance matrix finds the
  same semi-hard negatives, and the lifted loss uses that both members of a
  positive pair have the same negatives (one log-sum-exp per row): ``O(B^2)``
  memory, also under XLA.
* Labels are cast to integers before anything else (under mixed precision TFA
  would compare class ids in the loss dtype).
* A batch without any positive pair gives 0 where TFA gives NaN (a 0/0); so
  does a lifted-structure pair whose class has no negative (TFA: NaN).
* The soft batch-hard loss uses a softplus: TFA's ``log1p(exp(x))`` overflows
  to inf for large distances (e.g. squared-L2 on unnormalized embeddings).
* Embeddings so large that their Euclidean distances overflow (float32
  norms above about 9.2e18) give NaN in the semi-hard, hard and lifted
  losses, as NaN or Inf embeddings do: Inf distances and their Inf - Inf
  NaNs, skipped by the masks, could leave a finite but wrong value.
* ``npairs_loss`` accepts ``[B, 1]`` labels (TFA broadcasts them wrongly and
  returns NaN).
* ``npairs_multilabel_loss``: a sample without labels (an all-zero row of
  ``y_true``) is left out of the mean (TFA: NaN, a 0/0 target row); its column
  still counts in the other rows' softmax. No labelled sample at all gives 0.
"""

from __future__ import annotations

import numbers
import types

import keras
import tensorflow as tf

from tfdml import ops as dml
from tfdml._embeddings import check_batch_sizes, check_embeddings
from tfdml.miners import negatives_at_or_below

__all__ = [
    "ContrastiveLoss",
    "LiftedStructLoss",
    "NpairsLoss",
    "NpairsMultilabelLoss",
    "TripletHardLoss",
    "TripletSemiHardLoss",
    "angular_distance",
    "contrastive_loss",
    "lifted_struct_loss",
    "losses",
    "npairs_loss",
    "npairs_multilabel_loss",
    "pairwise_distance",
    "triplet_hard_loss",
    "triplet_semihard_loss",
]

_METRICS = ("L2", "squared-L2", "angular")


def pairwise_distance(feature, squared: bool = False):
    """Pairwise Euclidean distances of the rows of ``feature`` (TFA semantics).

    Squared distances below 0 (rounding) are clipped to 0; the square root of
    a zero distance is 0 with a zero gradient; the diagonal is exactly 0.

    Args:
        feature: ``[B, D]`` embeddings (not normalized).
        squared: return squared distances. Defaults to `False`.

    Returns:
        ``[B, B]`` distances, in the dtype of ``feature``.
    """
    feature = tf.convert_to_tensor(feature)
    dist = dml.pairwise_distance(feature, feature, squared=squared)
    return tf.linalg.set_diag(dist, tf.zeros_like(dist[:, 0]))


def angular_distance(feature):
    """``max(1 - cos, 0)`` between the rows of ``feature`` (L2-normalized first), as in TFA.

    As in TFA the diagonal is not forced to 0: it is 0 up to rounding, and 1 for
    a zero vector.

    Returns:
        ``[B, B]`` distances in ``[0, 2]``.
    """
    # TFA's tf.math.l2_normalize rule: a row of norm below 1e-6 is scaled by 1e6.
    x = dml.l2_normalize(tf.convert_to_tensor(feature), epsilon=1e-12)
    return tf.maximum(1.0 - dml.pairwise_similarity(x, x), 0.0)


def _distances(embeddings, distance_metric):
    if distance_metric == "L2":
        return pairwise_distance(embeddings, squared=False)
    if distance_metric == "squared-L2":
        return pairwise_distance(embeddings, squared=True)
    if distance_metric == "angular":
        return angular_distance(embeddings)
    return distance_metric(embeddings)


def _euclidean(distance_metric) -> bool:
    """The metric is one of the Euclidean distances, computed from unnormalized embeddings."""
    return isinstance(distance_metric, str) and distance_metric in ("L2", "squared-L2")


def _check(margin, distance_metric):
    if not isinstance(margin, numbers.Real) or isinstance(margin, bool):
        raise ValueError(f"`margin` must be a number. Received: margin={margin!r}")
    if not callable(distance_metric) and distance_metric not in _METRICS:
        raise ValueError(
            f"`distance_metric` must be one of {_METRICS} or a callable. "
            f"Received: distance_metric={distance_metric!r}"
        )


def _prepare(y_true, y_pred):
    labels = tf.reshape(dml.cast_labels(y_true, "y_true"), [-1])
    embeddings = tf.convert_to_tensor(y_pred)
    check_embeddings(embeddings, "y_pred")
    check_batch_sizes(labels, embeddings, "y_true", "y_pred")
    precise = embeddings
    if embeddings.dtype in (tf.float16, tf.bfloat16):
        precise = tf.cast(embeddings, tf.float32)
    same = tf.equal(labels[:, None], labels[None, :])
    return same, precise, embeddings.dtype


def _masked_maximum(data, mask):
    """TFA's masked maximum: the maximum over ``mask``; the row minimum if ``mask`` is empty."""
    row_min = tf.reduce_min(data, axis=1, keepdims=True)
    mask = tf.cast(mask, data.dtype)
    return tf.reduce_max((data - row_min) * mask, axis=1, keepdims=True) + row_min


def _masked_minimum(data, mask):
    """TFA's masked minimum: the minimum over ``mask``; the row maximum if ``mask`` is empty."""
    row_max = tf.reduce_max(data, axis=1, keepdims=True)
    mask = tf.cast(mask, data.dtype)
    return tf.reduce_min((data - row_max) * mask, axis=1, keepdims=True) + row_max


def _closest_negative_farther(dist, negative):
    """Per entry ``(a, j)``: the closest negative of ``a`` strictly farther than ``j``, and if found.

    It is the count-th negative in ascending distance, count = the number of
    negatives at most as far as ``j``. Rows are independent (row blocks).
    """
    count, negatives = negatives_at_or_below(dist, negative)
    num_negatives = tf.reduce_sum(tf.cast(negative, tf.int32), axis=1, keepdims=True)
    found = count < num_negatives
    index = tf.gather(negatives, tf.minimum(count, tf.maximum(num_negatives - 1, 0)),
                      batch_dims=1)
    return index, found


def _masked_maximum_gradient(data, mask):
    """The gradient of :func:`_masked_maximum` w.r.t. ``data``: ``[B, R]`` row weights summing to 1.

    As TensorFlow differentiates it: ``reduce_max`` splits the gradient evenly
    among the tied maxima of the masked differences, and what does not reach
    ``data`` through them goes to the row minimum, split among its ties.
    """
    row_min = tf.reduce_min(data, axis=1, keepdims=True)
    mask = tf.cast(mask, data.dtype)
    masked = (data - row_min) * mask
    top = tf.cast(tf.equal(masked, tf.reduce_max(masked, axis=1, keepdims=True)), data.dtype)
    through_max = top / tf.reduce_sum(top, axis=1, keepdims=True) * mask
    bottom = tf.cast(tf.equal(data, row_min), data.dtype)
    to_min = 1.0 - tf.reduce_sum(through_max, axis=1, keepdims=True)
    return through_max + to_min * bottom / tf.reduce_sum(bottom, axis=1, keepdims=True)


def _sum_at_columns(columns, updates):
    """``out[a, j]`` = the sum of ``updates[a, t]`` over ``columns[a, t] == j``; ``[B, R]`` both.

    One segment sum over the flattened cells (several times faster on the CPU
    than a row-wise ``tensor_scatter_nd_add``).
    """
    shape = tf.shape(updates)
    cells = columns + tf.range(shape[0])[:, None] * shape[1]
    total = tf.math.unsorted_segment_sum(tf.reshape(updates, [-1]), tf.reshape(cells, [-1]),
                                         shape[0] * shape[1])
    return tf.reshape(total, shape)


def _semihard_rows(dist, negative, positive, margin):
    """The semi-hard hinge of every entry ``(a, p)`` and the loss sum's gradient w.r.t. ``dist``.

    The hinge is TFA's ``max(margin + d_ap - d_an, 0)`` on positive pairs (0
    elsewhere). Where it is active (``>= 0``, as ``tf.maximum``'s gradient) it
    adds +1 to the gradient at ``(a, p)`` and -1 at ``d_an``: at the chosen
    negative (one of them at ties), or spread as the masked maximum's gradient
    for the fallback. Rows are independent (row blocks).
    """
    outside, found = _closest_negative_farther(dist, negative)
    d_an = tf.where(found, tf.gather(dist, outside, batch_dims=1),
                    _masked_maximum(dist, negative))
    violation = margin + dist - d_an
    hinge = tf.where(positive, tf.maximum(violation, 0.0), 0.0)
    active = tf.logical_and(positive, violation >= 0.0)
    to_outside = tf.cast(tf.logical_and(active, found), dist.dtype)
    to_inside = tf.reduce_sum(tf.cast(tf.logical_and(active, tf.logical_not(found)), dist.dtype),
                              axis=1, keepdims=True)
    gradient = (tf.cast(active, dist.dtype)
                - _sum_at_columns(outside, to_outside)
                - to_inside * _masked_maximum_gradient(dist, negative))
    return hinge, gradient


def _with_gradient(value, x, gradient):
    """``value`` (computed without a gradient path) with ``gradient`` as its gradient w.r.t. ``x``.

    Only ``gradient`` is kept for the backward pass: none of the computation of
    ``value`` is recorded (in eager mode, a recorded op keeps its inputs until
    ``tape.gradient``).
    """

    @tf.custom_gradient
    def attach(x):
        del x
        return value, lambda upstream: upstream * gradient

    return attach(x)


def triplet_semihard_loss(y_true, y_pred, margin: float = 1.0, distance_metric="L2"):
    """TFA's semi-hard triplet loss, in ``O(B^2)`` memory.

    For every anchor ``a`` and positive ``p`` (same label, ``p != a``), the
    negative is the closest one *farther* than the positive
    (``d_an > d_ap``); if there is none, the farthest negative of ``a`` (TFA's
    fallback; with no negative at all, the smallest distance of ``a``'s row,
    normally 0). The loss is ``mean over (a, p) of max(margin + d_ap - d_an, 0)``.

    The selection is not recorded for the gradient: the backward pass keeps one
    ``[B, B]`` matrix besides the distances' own, in eager mode as in a
    ``tf.function``. When several negatives are exactly the closest farther
    one, the gradient goes to one of them (TFA splits it).

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer labels.
        y_pred: ``[B, D]`` embeddings; not normalized here.
        margin: the margin. Defaults to `1.0`.
        distance_metric: ``"L2"``, ``"squared-L2"``, ``"angular"`` or a
            callable mapping embeddings to a ``[B, B]`` distance matrix.
            Defaults to `"L2"`.

    Returns:
        A scalar in the dtype of ``y_pred``; 0 when there is no positive pair
        (TFA returns NaN); NaN when an embedding is NaN or Inf (as TFA).
    """
    _check(margin, distance_metric)
    same, precise, dtype = _prepare(y_true, y_pred)
    dist = _distances(precise, distance_metric)
    negative = tf.logical_not(same)
    positive = tf.logical_and(same, tf.logical_not(tf.eye(tf.shape(dist)[0], dtype=tf.bool)))
    # Between changes of the selection the loss is linear in the distances: the selection
    # and the hinge run without gradient (in row blocks), and the backward pass keeps only
    # the [B, B] gradient w.r.t. dist (a recorded selection would keep its temporaries).
    hinge, gradient = dml.map_row_blocks(
        lambda d, n, p: _semihard_rows(d, n, p, margin), (dist, negative, positive),
        (dist.dtype, dist.dtype))
    total = _with_gradient(tf.reduce_sum(hinge), dist, gradient)
    loss = tf.math.divide_no_nan(total, tf.cast(tf.math.count_nonzero(positive), dist.dtype))
    return tf.cast(dml.nan_unless_finite(loss, precise, distances=_euclidean(distance_metric)),
                   dtype)


def triplet_hard_loss(y_true, y_pred, margin: float = 1.0, soft: bool = False,
                      distance_metric="L2"):
    """TFA's batch-hard triplet loss.

    Per anchor, the farthest positive and the closest negative (TFA's masked
    maximum and minimum: an anchor without positives uses its row's smallest
    distance, one without negatives its row's largest), then
    ``max(d_ap - d_an + margin, 0)`` or, with ``soft=True``,
    ``log1p(exp(d_ap - d_an))``; the mean over all anchors.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer labels.
        y_pred: ``[B, D]`` embeddings; not normalized here.
        margin: the margin. Defaults to `1.0`.
        soft: soft-margin form. Defaults to `False`.
        distance_metric: as in :func:`triplet_semihard_loss`. Defaults to `"L2"`.

    Returns:
        A scalar in the dtype of ``y_pred``.
    """
    _check(margin, distance_metric)
    same, precise, dtype = _prepare(y_true, y_pred)
    dist = _distances(precise, distance_metric)
    positive = tf.logical_and(same, tf.logical_not(tf.eye(tf.shape(dist)[0], dtype=tf.bool)))
    hardest_positive = _masked_maximum(dist, positive)
    hardest_negative = _masked_minimum(dist, tf.logical_not(same))
    if soft:  # log1p(exp(.)) as softplus: the same value, but no overflow to inf
        losses = tf.math.softplus(hardest_positive - hardest_negative)
    else:
        losses = tf.maximum(hardest_positive - hardest_negative + margin, 0.0)
    return tf.cast(dml.nan_unless_finite(tf.reduce_mean(losses), precise,
                                         distances=_euclidean(distance_metric)), dtype)


def lifted_struct_loss(labels, embeddings, margin: float = 1.0):
    """TFA's lifted structured loss (Oh Song et al. 2016), in ``O(B^2)`` memory.

    With ``D`` the Euclidean distances and ``N`` the samples of other classes
    (the same set for both members of a positive pair ``(i, j)``)::

        J_ij = log(sum_{k in N} exp(margin - D_ik) + sum_{l in N} exp(margin - D_jl)) + D_ij
        L = sum over unordered positive pairs of max(J_ij, 0)^2 / (2 * #pairs)

    Args:
        labels: ``[B]`` or ``[B, 1]`` integer labels.
        embeddings: ``[B, D]``; not normalized here.
        margin: Defaults to `1.0`.

    Returns:
        A scalar in the dtype of ``embeddings``; 0 without positive pairs, and
        pairs without any negative count 0 (TFA: NaN in both cases); NaN
        when an embedding is NaN or Inf (as TFA).
    """
    _check(margin, "L2")
    same, precise, dtype = _prepare(labels, embeddings)
    dist = pairwise_distance(precise)
    negative = tf.logical_not(same)
    positive = tf.logical_and(same, tf.logical_not(tf.eye(tf.shape(dist)[0], dtype=tf.bool)))
    logits = tf.where(negative, margin - dist, tf.constant(-float("inf"), dist.dtype))
    row_max = tf.reduce_max(logits, axis=1, keepdims=True)
    row_max = tf.stop_gradient(tf.where(tf.math.is_finite(row_max), row_max, 0.0))
    row_sum = tf.reduce_sum(tf.exp(logits - row_max), axis=1, keepdims=True)  # [B, 1]
    has_negative = row_sum > 0
    # log(e^{lse_i} + e^{lse_j}) with lse_i = row_max_i + log(row_sum_i), computed stably.
    top = tf.maximum(row_max, tf.transpose(row_max))
    both = (row_sum * tf.exp(row_max - top)
            + tf.transpose(row_sum) * tf.exp(tf.transpose(row_max) - top))
    usable = tf.logical_and(positive, tf.logical_and(has_negative, tf.transpose(has_negative)))
    both = tf.where(usable, both, tf.ones_like(both))
    j = top + tf.math.log(both) + dist
    hinge = tf.where(usable, tf.square(tf.maximum(j, 0.0)), tf.zeros_like(j))
    pairs = 0.5 * tf.reduce_sum(tf.cast(positive, dist.dtype))
    loss = tf.math.divide_no_nan(0.25 * tf.reduce_sum(hinge), pairs)
    return tf.cast(dml.nan_unless_finite(loss, precise, distances=True), dtype)


def contrastive_loss(y_true, y_pred, margin: float = 1.0):
    """TFA's contrastive loss on given pair distances, one value per pair.

    ``y_true * y_pred^2 + (1 - y_true) * max(margin - y_pred, 0)^2``.

    Args:
        y_true: ``[N]`` binary: 1 for a similar pair.
        y_pred: ``[N]`` distances of the pairs.
        margin: Defaults to `1.0`.

    Returns:
        ``[N]`` losses.
    """
    _check(margin, "L2")
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.cast(y_true, y_pred.dtype)
    return y_true * tf.square(y_pred) + (1.0 - y_true) * tf.square(
        tf.maximum(margin - y_pred, 0.0))


def npairs_loss(y_true, y_pred):
    """TFA's N-pairs loss (Sohn 2016) on a similarity matrix.

    Each row of ``y_pred`` (``[B, B]`` similarities, e.g. anchors x positives)
    is a softmax over the columns; the target spreads evenly over the columns
    with the row's label. The mean cross-entropy over rows.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer labels.
        y_pred: ``[B, B]`` similarity logits.

    Returns:
        A scalar.
    """
    labels = tf.reshape(dml.cast_labels(y_true, "y_true"), [-1])
    y_pred = tf.convert_to_tensor(y_pred)
    target = tf.cast(tf.equal(labels[:, None], labels[None, :]), y_pred.dtype)
    target = target / tf.reduce_sum(target, axis=1, keepdims=True)
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=y_pred))


def _check_similarities(y_pred, name="y_pred"):
    """Converts to a tensor; raises ValueError unless it is a square ``[B, B]`` float matrix."""
    y_pred = tf.convert_to_tensor(y_pred)
    shape = y_pred.shape
    if shape.rank is not None and (
            shape.rank != 2 or (shape[0] is not None and shape[1] is not None
                                and shape[0] != shape[1])):
        raise ValueError(
            f"`{name}` must be a square [B, B] matrix of similarity logits. "
            f"Received: {name}.shape={tuple(shape)}"
        )
    if not y_pred.dtype.is_floating:
        raise ValueError(
            f"`{name}` must have a floating dtype. Received: {name}.dtype={y_pred.dtype.name}"
        )
    return y_pred


def npairs_multilabel_loss(y_true, y_pred):
    """TFA's multi-label N-pairs loss on a similarity matrix.

    With ``Y`` the ``[B, C]`` label indicator, the target of row ``i`` is
    ``T_i = (Y Y^T)_i / sum_j (Y Y^T)_ij``: the columns weighted by the number
    of labels they share with sample ``i``. The loss is the mean over rows of
    the softmax cross-entropy of ``y_pred``'s row against ``T_i``::

        L = mean_{i : Y_i != 0} ( - sum_j T_ij * log softmax(y_pred_i)_j )

    With one-hot ``Y`` it equals :func:`npairs_loss` on the class ids.
    Entries of ``y_true`` other than 0/1 are used as weights, as in TFA.

    Unlike TFA (which divides 0 by 0 and returns NaN), a sample without labels
    (an all-zero row of ``y_true``; in general a row of ``Y Y^T`` summing to 0)
    is left out of the mean, with a zero gradient for its row of ``y_pred``;
    its column still counts as a candidate in the other rows' softmax.

    Args:
        y_true: ``[B, C]`` 0/1 label indicator, dense or a ``tf.SparseTensor``
            (densified).
        y_pred: ``[B, B]`` similarity logits (e.g. anchors x positives).

    Returns:
        A scalar in the dtype of ``y_pred``: the mean over the samples with at
        least one label, 0 when no sample has one; NaN when ``y_pred`` holds a
        NaN or Inf anywhere (as TFA).

    Raises:
        ValueError: if ``y_true`` is not of rank 2, ``y_pred`` is not a square
            float matrix, or their (static) batch sizes differ.
    """
    y_pred = _check_similarities(y_pred)
    if isinstance(y_true, tf.SparseTensor):
        # Indices in any order (no reordering op: it has no XLA kernel).
        y_true = tf.sparse.to_dense(y_true, validate_indices=False)
    y_true = tf.convert_to_tensor(y_true)
    if y_true.shape.rank is not None and y_true.shape.rank != 2:
        raise ValueError(
            "`y_true` must be a rank-2 [B, C] label indicator. "
            f"Received: y_true.shape={tuple(y_true.shape)}"
        )
    check_batch_sizes(y_true, y_pred, "y_true", "y_pred")
    indicator = tf.cast(y_true, y_pred.dtype)
    shared = tf.matmul(indicator, indicator, transpose_b=True)  # [B, B] shared label counts
    row_sum = tf.reduce_sum(shared, axis=1, keepdims=True)
    counted = tf.not_equal(row_sum[:, 0], 0.0)
    target = tf.math.divide_no_nan(shared, row_sum)
    xent = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=y_pred)
    # tf.where, not a product: a row left out gets a zero gradient (its xent's gradient
    # assumes a target summing to 1, which an all-zero one does not).
    xent = tf.where(counted, xent, tf.zeros_like(xent))
    loss = tf.math.divide_no_nan(tf.reduce_sum(xent),
                                 tf.cast(tf.math.count_nonzero(counted), xent.dtype))
    # A NaN or Inf in a row left out is masked above: NaN in, NaN out, wherever it is.
    return dml.nan_unless_finite(loss, y_pred)


class _TFALoss(keras.losses.Loss):
    """A scalar batch loss with TFA's reduction (none: the function's value itself).

    A subclass names its ``_function`` and the ``_arguments`` that follow ``(y_true, y_pred)``
    in its calls: they are attributes of the loss and its config. The default name is the
    function's (TFA's names).
    """

    _function = None
    _arguments = ()

    def __init__(self, name=None, **kwargs):
        kwargs.pop("reduction", None)
        super().__init__(name=name or self._function.__name__, reduction="none", **kwargs)

    def __call__(self, y_true, y_pred, sample_weight=None):
        with tf.name_scope(self.name):
            value = self.call(y_true, y_pred)
            if sample_weight is not None:
                value = value * tf.reduce_mean(tf.cast(sample_weight, value.dtype))
            return value

    def call(self, y_true, y_pred):
        return self._function(y_true, y_pred, *(getattr(self, a) for a in self._arguments))

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        config.update({a: getattr(self, a) for a in self._arguments})
        return config


@keras.saving.register_keras_serializable(package="Addons")
class TripletSemiHardLoss(_TFALoss):
    """``tfa.losses.TripletSemiHardLoss``: see :func:`triplet_semihard_loss`.

    Args:
        margin: Defaults to `1.0`.
        distance_metric: ``"L2"``, ``"squared-L2"``, ``"angular"`` or a
            callable. Defaults to `"L2"`.
        name: Defaults to `"triplet_semihard_loss"`.

    A ``sample_weight`` scales the batch value by its mean.
    """

    _function = staticmethod(triplet_semihard_loss)
    _arguments = ("margin", "distance_metric")

    def __init__(self, margin=1.0, distance_metric="L2", name=None, **kwargs):
        _check(margin, distance_metric)
        super().__init__(name=name, **kwargs)
        self.margin = margin
        self.distance_metric = distance_metric


@keras.saving.register_keras_serializable(package="Addons")
class TripletHardLoss(_TFALoss):
    """``tfa.losses.TripletHardLoss``: see :func:`triplet_hard_loss`.

    Args:
        margin: Defaults to `1.0`.
        soft: Defaults to `False`.
        distance_metric: Defaults to `"L2"`.
        name: Defaults to `"triplet_hard_loss"`.
    """

    _function = staticmethod(triplet_hard_loss)
    _arguments = ("margin", "soft", "distance_metric")

    def __init__(self, margin=1.0, soft=False, distance_metric="L2", name=None, **kwargs):
        _check(margin, distance_metric)
        super().__init__(name=name, **kwargs)
        self.margin = margin
        self.soft = bool(soft)
        self.distance_metric = distance_metric


@keras.saving.register_keras_serializable(package="Addons")
class LiftedStructLoss(_TFALoss):
    """``tfa.losses.LiftedStructLoss``: see :func:`lifted_struct_loss`.

    Args:
        margin: Defaults to `1.0`.
        name: Defaults to `"lifted_struct_loss"`.
    """

    _function = staticmethod(lifted_struct_loss)
    _arguments = ("margin",)

    def __init__(self, margin=1.0, name=None, **kwargs):
        _check(margin, "L2")
        super().__init__(name=name, **kwargs)
        self.margin = margin


@keras.saving.register_keras_serializable(package="Addons")
class NpairsLoss(_TFALoss):
    """``tfa.losses.NpairsLoss``: see :func:`npairs_loss`.

    Args:
        name: Defaults to `"npairs_loss"`.
    """

    _function = staticmethod(npairs_loss)


@keras.saving.register_keras_serializable(package="Addons")
class NpairsMultilabelLoss(_TFALoss):
    """``tfa.losses.NpairsMultilabelLoss``: see :func:`npairs_multilabel_loss`.

    Args:
        name: Defaults to `"npairs_multilabel_loss"`.
    """

    _function = staticmethod(npairs_multilabel_loss)


@keras.saving.register_keras_serializable(package="Addons")
class ContrastiveLoss(keras.losses.Loss):
    """``tfa.losses.ContrastiveLoss``: :func:`contrastive_loss` per pair, then the reduction.

    Args:
        margin: Defaults to `1.0`.
        reduction: Keras reduction of the per-pair values. Defaults to
            `"sum_over_batch_size"` (TFA's default, the mean).
        name: Defaults to `"contrastive_loss"`.
    """

    def __init__(self, margin=1.0, reduction="sum_over_batch_size", name="contrastive_loss",
                 **kwargs):
        _check(margin, "L2")
        super().__init__(name=name, reduction=reduction, **kwargs)
        self.margin = margin

    def call(self, y_true, y_pred):
        return contrastive_loss(y_true, y_pred, self.margin)

    def get_config(self):
        config = super().get_config()
        config["margin"] = self.margin
        return config


def _namespace(*objects, **more):
    """A namespace of ``objects`` under their own names (``tfa.losses.X``), and ``more``."""
    return types.SimpleNamespace(**{obj.__name__: obj for obj in objects}, **more)


#: ``tfa.losses`` of TensorFlow Addons: the loss classes and functional forms above, and
#: ``losses.metric_learning.pairwise_distance`` / ``angular_distance``.
losses = _namespace(
    ContrastiveLoss, LiftedStructLoss, NpairsLoss, NpairsMultilabelLoss, TripletHardLoss,
    TripletSemiHardLoss, contrastive_loss, lifted_struct_loss, npairs_loss,
    npairs_multilabel_loss, triplet_hard_loss, triplet_semihard_loss,
    metric_learning=_namespace(pairwise_distance, angular_distance),
)
