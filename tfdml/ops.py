"""Core tensor operations shared by every loss, miner and metric.

Everything here is written in ``keras.ops`` and runs under the TensorFlow, JAX and
PyTorch backends. Everything has fixed output shapes and compiles (``jit_compile=True``,
``jax.jit``):
selections are expressed as masks and masked reductions, never as boolean
indexing or index lists.

Conventions:

* ``labels`` are integer class ids of shape ``[B]`` (``[B, 1]`` is accepted), or
  multi-hot label sets ``[B, L]`` (``L >= 2``; :func:`multi_hot` converts a padded list
  of label ids), which :func:`label_masks` turns into pairs. Class ids are cast to ``int32`` (``int64`` ids stay ``int64``) before anything
  else: in ``bfloat16`` the ids 256 and 257 are the same number, so converting
  labels to the loss dtype first would silently merge classes.
* A *reference set* ``(ref_embeddings, ref_labels)`` of size ``R`` is what
  anchors are compared against. By default it is the batch itself
  (``R == B``). ``ref_offset`` tells where the batch sits inside the reference
  set (anchor ``i`` is reference row ``i + ref_offset``) so that self-pairs are
  excluded; ``ref_offset=None`` means the anchors are not part of the
  reference set.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

# cast_labels, multi_hot (tfdml._labels) and the backend shims of __all__ (tfdml._shims, the
# same semantics on every backend) are part of this module's API.
from tfdml._embeddings import compute_dtype
from tfdml._labels import (
    cast_labels,
    check_min_jaccard,
    is_multi_label,
    multi_hot,
    same_label_dtype,
)
from tfdml._shims import (
    arccos,
    clip,
    cos_sin,
    cumsum,
    divide_no_nan,
    dtype_name,
    float_bits,
    floor,
    map_indices,
    matmul,
    maximum,
    mean,
    minimum,
    scatter_rows,
    segment_sum,
    stable_argsort,
    take_along_axis,
    top_k,
)

__all__ = [
    "all_finite",
    "cast_labels",
    "arccos",
    "clip",
    "cos_sin",
    "cumsum",
    "distance_matrix",
    "divide_no_nan",
    "floor",
    "l2_normalize",
    "label_jaccard",
    "label_masks",
    "label_overlap",
    "map_row_blocks",
    "masked_argmax",
    "masked_argmin",
    "masked_logsumexp",
    "masked_max",
    "masked_min",
    "matmul",
    "maximum",
    "mean",
    "multi_hot",
    "minimum",
    "nan_unless",
    "nan_unless_finite",
    "paired_distance",
    "pairwise_distance",
    "pairwise_distance_from_products",
    "pairwise_similarity",
    "safe_sqrt",
    "scatter_rows",
    "segment_sum",
    "stable_argsort",
    "take_along_axis",
    "top_k",
]


def all_finite(*tensors, distances: bool = False):
    """Scalar bool tensor: every entry of every (non-None) tensor is finite.

    With ``distances``, also ``4 |x|^2`` of every row ``x`` (along the last axis)
    must be finite in the compute dtype (float32; float64 for float64 tensors):
    then no squared distance ``|x - y|^2 <= 4 max(|x|^2, |y|^2)`` and no dot
    product between rows overflows. In float32 that holds for norms up to
    about 9.2e18 (6.7e153 in float64). One ``[B, D]`` pass per tensor.
    """
    ok = ops.convert_to_tensor(True)
    for t in tensors:
        if t is None:
            continue
        if distances:
            t = ops.convert_to_tensor(t)
            t = ops.cast(t, compute_dtype(t.dtype))
            # NaN or Inf entries make the sum NaN or Inf too.
            fits = ops.isfinite(ops.sum(ops.square(t), axis=-1) * 4.0)
        else:
            fits = ops.isfinite(t)
        ok = ops.logical_and(ok, ops.all(fits))
    return ok


def nan_unless(value, ok):
    """``value`` where the scalar bool ``ok`` holds, NaN (everywhere) otherwise.

    How a loss reports an input it cannot check in a compiled step (class ids
    out of range, a negative sample weight): a NaN loss, so that
    ``keras.callbacks.TerminateOnNaN`` stops training. ``ok=True`` (a Python
    bool: checked already) returns ``value`` unchanged. The gradient where
    ``ok`` holds is ``value``'s, and 0 otherwise.
    """
    value = ops.convert_to_tensor(value)
    if ok is True:
        return value
    return ops.where(ok, value, ops.cast(float("nan"), dtype_name(value)))


def nan_unless_finite(value, *inputs, distances: bool = False):
    """``value`` where every input is finite, NaN (everywhere) otherwise.

    How every tfdml loss turns a NaN or Inf embedding into a NaN loss, so that
    ``keras.callbacks.TerminateOnNaN`` fires, instead of the finite value a
    masked selection would leave (NaN comparisons are false, so a NaN sample
    is simply never mined).

    ``distances=True`` is for a loss that computes distances or dot products
    of the inputs without normalizing them: it is NaN also where those could
    overflow (:func:`all_finite`), e.g. float32 embeddings of norm 1e19 and
    above, whose squared distances are Inf and whose Inf - Inf are NaN, which
    a selection would skip as well. A loss that L2-normalizes its inputs
    (:func:`l2_normalize` is exact for every finite vector) needs only finite
    inputs.
    """
    return nan_unless(value, all_finite(*inputs, distances=distances))












# -- distances --------------------------------------------------------------------------------


def l2_normalize(x, axis=-1, epsilon: float | None = None):
    """L2-normalizes ``x`` along ``axis``: every non-zero finite vector to unit norm, zero
    vectors to zero.

    ``y = x / |x|``, whatever the scale of ``x``: the norm is computed without
    overflow or underflow, each vector divided by its largest absolute entry
    ``m`` first, ``y = u / |u|`` with ``u = x / m`` (``|u|^2`` is between 1 and
    the vector's length). So every non-zero finite vector gets unit norm, to
    the rounding of the compute dtype (``| |y| - 1 | < 1e-6`` in float32): a
    float32 vector of norm 1e30 (whose ``sum(x^2)`` is Inf in float32), 1e-25
    or 1e-40, float16 and bfloat16 vectors down to their smallest subnormal
    number, float64 vectors from 1e-320 to 1.8e308. A vector whose entries are
    all subnormal (below 1.2e-38 in float32, 2.2e-308 in float64) is read from
    its bits, since XLA and TensorFlow's CPU kernels treat subnormal numbers as
    0 in arithmetic (there, too, the subnormal entries of a vector with a normal
    one count as 0). The zero vector (``+0`` or ``-0`` entries) gives zeros. A
    NaN or Inf entry gives a NaN vector.

    The gradient is that of ``x / |x|``, ``(I - y y^T) / |x|``, for every
    vector with a normal entry (it may overflow to Inf for a float32 vector of
    norm near 1e-38), and 0 for the zero vector and for vectors of subnormal
    entries (whose exact gradient, above ``1 / 1.2e-38``, overflows float32).

    With ``epsilon``, the formula of ``tf.math.l2_normalize`` instead,
    ``y = x / sqrt(max(sum(x^2), epsilon))``: a vector of norm below
    ``sqrt(epsilon)`` is scaled by ``1 / sqrt(epsilon)``, not to unit norm
    (its gradient is ``1 / sqrt(epsilon)`` there, at the zero vector too).

    The computation runs in float32 (float64 for float64 input); the result has
    the dtype of ``x``.

    Args:
        x: a float tensor.
        axis: the axis (or tuple of axes) to normalize. Defaults to `-1`.
        epsilon: `None`, or ``> 0``: the lower bound of the squared norm of
            ``tf.math.l2_normalize``. Defaults to `None`.
    """
    x = ops.convert_to_tensor(x)
    dtype = dtype_name(x)
    work = compute_dtype(dtype)
    if work != dtype:
        x = ops.cast(x, work)
    one = ops.ones((), work)
    # max|x|, without gradient: the result does not depend on it, so its gradient is exact
    # without the scale's.
    scale = ops.stop_gradient(ops.max(ops.abs(x), axis=axis, keepdims=True, initial=0.0))
    if epsilon is not None:
        scale = ops.where(scale > 0, scale, one)
        out = _l2_normalize_epsilon(x, _divide_by_scale(x, scale), scale, axis, epsilon)
        return out if work == dtype else ops.cast(out, dtype)
    # The zero vector, and a vector of subnormal entries (which XLA and TensorFlow read as 0
    # in arithmetic: their maximum is 0 there) are not divided by their scale. A subnormal
    # entry is the integer of its bits without the sign times the same power of two, so u
    # is those integers with their signs (0 for the zero vector), from the bits, without
    # gradient. A NaN stays NaN (compiled TensorFlow's maximum skips it, so its row may be
    # here).
    tiny_row = scale < ops.convert_to_tensor(_SMALLEST_NORMAL[work], dtype=work)
    bits = float_bits(x)
    whole = ops.cast(ops.bitwise_and(bits, _ABS_MASK[work]), work)
    whole = ops.where(ops.isnan(x), x, ops.where(bits < 0, -whole, whole))
    u = ops.where(tiny_row, whole, _divide_by_scale(x, ops.where(tiny_row, one, scale)))
    # |u|^2 >= 1 unless x is zero (NaN for a NaN or Inf entry). A zero vector gives u = 0
    # without gradient, so zeros with a zero gradient.
    square_sum = ops.sum(ops.square(u), axis=axis, keepdims=True)
    out = u / ops.sqrt(ops.where(square_sum == 0, one, square_sum))
    return out if work == dtype else ops.cast(out, dtype)


def _divide_by_scale(x, scale):
    """``x / scale`` (``scale > 0``, without gradient), through a power of two ``c`` that
    keeps ``1 / (c * scale)`` a normal number (XLA may divide by multiplying with the
    reciprocal, and flushes subnormals to 0)."""
    work = dtype_name(x)
    one = ops.ones((), work)
    big, tiny = ops.cast(2.0**64, work), ops.cast(2.0**-64, work)
    c = ops.where(scale > big, tiny, ops.where(scale < tiny, big, one))
    return (x * c) * (one / (scale * c))


#: The smallest positive normal number of the compute dtypes, and the mask of the bits of
#: a float's absolute value.
_SMALLEST_NORMAL = {"float32": 2.0**-126, "float64": 2.0**-1022}
_ABS_MASK = {"float32": (1 << 31) - 1, "float64": (1 << 63) - 1}


def _l2_normalize_epsilon(x, u, scale, axis, epsilon):
    """:func:`l2_normalize` with ``epsilon``: ``x / sqrt(max(sum(x^2), epsilon))``, from
    ``u = x / scale``."""
    work = dtype_name(x)
    one = ops.ones((), work)
    square_sum = ops.sum(ops.square(u), axis=axis, keepdims=True)
    eps = ops.convert_to_tensor(epsilon, dtype=work)
    # |x|^2 = scale^2 |u|^2 < epsilon; scale^2 may overflow (false) or underflow (true).
    small = ops.square(scale) * square_sum < eps
    # |u|^2 is about 1 or more unless x is zero (small): the branch not taken stays finite,
    # and so does its gradient.
    unit = u / ops.sqrt(ops.where(small, one, square_sum))
    return ops.where(small, x * ops.rsqrt(eps), unit)


def safe_sqrt(x, epsilon: float = 1e-12):
    """``sqrt(x)`` for ``x >= 0`` whose value and gradient are 0 at (and below) ``epsilon``.

    The plain square root has an infinite derivative at 0, which turns the
    gradient of a distance between duplicate points into NaN.
    """
    x = ops.convert_to_tensor(x)
    dtype = dtype_name(x)
    positive = x > ops.cast(epsilon, dtype)
    one, zero = ops.ones((), dtype), ops.zeros((), dtype)  # broadcast, not materialized
    return ops.where(positive, ops.sqrt(ops.where(positive, x, one)), zero)


#: tfdml's names of distances, the same in losses, miners, metrics, callbacks and search:
#: ``"cosine"`` (``1 - x.y`` of L2-normalized vectors; as a similarity, ``x.y``), ``"dot"``
#: (the dot product, a similarity), ``"l2"`` (the Euclidean distance) and ``"squared_l2"``
#: (its square). Each function takes those it computes.
DISTANCES = ("cosine", "dot", "l2", "squared_l2")

#: The distances of the losses (:func:`tfdml.ops.distance_matrix`,
#: :func:`tfdml.ops.paired_distance`).
LOSS_DISTANCES = ("squared_l2", "l2", "cosine")


def check_distance(value, accepted=LOSS_DISTANCES, name: str = "distance"):
    """``value`` as a name of :data:`DISTANCES`, if the argument ``name`` takes it.

    Args:
        value: the name given.
        accepted: the names the argument takes. Defaults to :data:`LOSS_DISTANCES`.
        name: the argument, for the messages. Defaults to `"distance"`.

    Raises:
        ValueError: naming ``name`` and the names of ``accepted``, when ``accepted``
            does not hold ``value``.
    """
    accepted = tuple(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"`{name}` must be one of {accepted}. Received: {name}={value!r}")
    return value


def pairwise_similarity(x, y=None):
    """Dot products ``x @ y^T`` of shape ``[B, R]`` (cosine similarity for unit vectors).

    Args:
        x: ``[B, D]`` tensor.
        y: ``[R, D]`` tensor. Defaults to ``x``.
    """
    x = ops.convert_to_tensor(x)
    y = x if y is None else ops.convert_to_tensor(y)
    return matmul(x, ops.transpose(y))


def pairwise_distance(x, y=None, squared: bool = False):
    """Euclidean distances of shape ``[B, R]`` between rows of ``x`` and of ``y``.

    Uses ``|x|^2 + |y|^2 - 2 x.y`` clipped at 0; the square root is
    :func:`safe_sqrt`, so the gradient at zero distance is 0 rather than NaN.

    Args:
        x: ``[B, D]`` tensor.
        y: ``[R, D]`` tensor. Defaults to ``x``.
        squared: return squared distances. Defaults to `False`.
    """
    x = ops.convert_to_tensor(x)
    y = x if y is None else ops.convert_to_tensor(y)
    # -2 folded into the [B, D] factor (exact, and the same sums in the same order as
    # x_sq + y_sq^T - 2 x.y): one [B, R] temporary fewer.
    return pairwise_distance_from_products(x, y, matmul(-2.0 * x, ops.transpose(y)), squared)


def pairwise_distance_from_products(x, y, products, squared=False):
    """:func:`pairwise_distance` from ``products = matmul(-2 x, y^T)``, for a caller that
    also needs the dot products: ``-products / 2`` is ``x @ y^T`` exactly.

    Args:
        x: ``[B, D]`` tensor.
        y: ``[R, D]`` tensor.
        products: ``[B, R]``, ``matmul(-2.0 * x, transpose(y))``.
        squared: return squared distances. Defaults to `False`.
    """
    x_sq = ops.sum(ops.square(x), axis=1, keepdims=True)
    y_sq = ops.sum(ops.square(y), axis=1, keepdims=True)
    sq = maximum((x_sq + ops.transpose(y_sq)) + products, 0.0)
    return sq if squared else safe_sqrt(sq)


def paired_distance(x, y, distance: str = "l2"):
    """``d(x_k, y_k)`` of matching rows (along the last axis), by name, with the formulas of
    :func:`distance_matrix`: ``[..., D]`` and ``[..., D]`` give ``[...]``."""
    check_distance(distance)
    dot = ops.sum(x * y, axis=-1)
    if distance == "cosine":
        return 1.0 - dot
    sq = maximum(ops.sum(ops.square(x), axis=-1) + ops.sum(ops.square(y), axis=-1)
                 - 2.0 * dot, 0.0)
    return sq if distance == "squared_l2" else safe_sqrt(sq)




def distance_matrix(x, y=None, distance: str = "l2"):
    """``[B, R]`` distances by name: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).

    The ``"l2"`` square root is guarded (gradient 0 at distance 0).
    """
    check_distance(distance)
    if distance == "cosine":
        return 1.0 - pairwise_similarity(x, y)
    return pairwise_distance(x, y, squared=distance == "squared_l2")


# -- masks and masked selections --------------------------------------------------------------


def _label_pair(labels, ref_labels):
    """Both label tensors cast, of one form: class ids (common dtype) or multi-hot (same L)."""
    labels = cast_labels(labels)
    ref_labels = labels if ref_labels is None else cast_labels(ref_labels, "ref_labels")
    multi = is_multi_label(labels)
    if multi != is_multi_label(ref_labels):
        raise ValueError(
            "`labels` and `ref_labels` must both be class ids ([B]) or both multi-hot label "
            f"sets ([B, L]). Received shapes {tuple(labels.shape)} and "
            f"{tuple(ref_labels.shape)}")
    if not multi:
        return same_label_dtype(labels, ref_labels)
    width, ref_width = labels.shape[-1], ref_labels.shape[-1]
    if width is not None and ref_width is not None and width != ref_width:
        raise ValueError("Multi-hot `labels` and `ref_labels` must have the same number of "
                         f"labels L. Received L={width} and L={ref_width}")
    return labels, ref_labels


def _hot(labels):
    return ops.cast(ops.equal(labels, 1), "float32")


def _overlap(labels, ref_labels):
    """:func:`label_overlap` of labels cast by :func:`_label_pair`."""
    if not is_multi_label(labels):
        return ops.cast(ops.equal(labels[:, None], ref_labels[None, :]), "float32")
    return ops.matmul(_hot(labels), ops.transpose(_hot(ref_labels)))


def _jaccard(labels, ref_labels, inter):
    """:func:`label_jaccard` of labels cast by :func:`_label_pair`, from their overlap."""
    if not is_multi_label(labels):
        return inter
    size = ops.sum(_hot(labels), axis=1)
    ref_size = ops.sum(_hot(ref_labels), axis=1)
    return divide_no_nan(inter, size[:, None] + ref_size[None, :] - inter)


def label_overlap(labels, ref_labels=None):
    """``[B, R]`` float32: the number of labels each pair shares.

    For class ids, 1 where the ids are equal and 0 elsewhere; for ``[B, L]``
    multi-hot label sets, ``|A & B|`` (a matrix product, exact up to 2**24
    labels). Self-pairs are not removed.

    Args:
        labels: ``[B]`` class ids or ``[B, L]`` multi-hot labels.
        ref_labels: the same form, ``[R]`` or ``[R, L]``. Defaults to ``labels``.
    """
    return _overlap(*_label_pair(labels, ref_labels))


def label_jaccard(labels, ref_labels=None):
    """``[B, R]`` float32 Jaccard similarity ``|A & B| / |A | B|`` of the label sets.

    1 or 0 for class ids (same id or not). See :func:`label_overlap`.
    """
    labels, ref_labels = _label_pair(labels, ref_labels)
    return _jaccard(labels, ref_labels, _overlap(labels, ref_labels))


def label_masks(labels, ref_labels=None, ref_offset=0, min_jaccard=None):
    """Positive and negative masks of shape ``[B, R]``: the one place labels become pairs.

    Class ids: positives share the id, negatives do not. Multi-hot label sets
    ``[B, L]`` (``L >= 2``): positives share a label (with ``min_jaccard``,
    their Jaccard similarity reaches it), negatives share none; with
    ``min_jaccard``, a pair that shares labels below it is neither.

    Args:
        labels: ``[B]`` int32 class ids (``[B, 1]`` accepted) or ``[B, L]``
            multi-hot labels of the anchors.
        ref_labels: the reference set's labels, in the same form. Defaults to
            ``labels``.
        ref_offset: anchor ``i`` is reference row ``i + ref_offset``; that
            pair is excluded from the positives. ``None`` when the anchors are
            not in the reference set. Defaults to `0`.
        min_jaccard: for multi-hot labels, the Jaccard similarity a positive
            pair needs (in ``(0, 1]``); None: one shared label. Ignored for
            class ids. Defaults to `None`.

    Returns:
        ``(positive_mask, negative_mask)``, boolean. Self-pairs are never
        positives.

    Raises:
        ValueError: for labels of two forms, multi-hot labels of different
            ``L``, or a ``min_jaccard`` outside ``(0, 1]``.
    """
    min_jaccard = check_min_jaccard(min_jaccard)
    labels, ref_labels = _label_pair(labels, ref_labels)
    if is_multi_label(labels):
        inter = _overlap(labels, ref_labels)
        negative = ops.equal(inter, 0.0)
        if min_jaccard is None:
            same = ops.greater(inter, 0.0)
        else:
            same = ops.greater_equal(_jaccard(labels, ref_labels, inter), min_jaccard - 1e-6)
    else:
        same = ops.equal(labels[:, None], ref_labels[None, :])
        negative = ops.logical_not(same)
    if ref_offset is None:
        return same, negative
    rows = ops.arange(ops.shape(labels)[0], dtype="int32") + ops.cast(ref_offset, "int32")
    cols = ops.arange(ops.shape(ref_labels)[0], dtype="int32")
    not_self = ops.not_equal(rows[:, None], cols[None, :])
    return ops.logical_and(same, not_self), negative


def masked_max(x, mask, axis: int = -1):
    """Maximum of ``x`` over the entries where ``mask`` is true.

    Returns:
        ``(values, found)``: ``values`` is 0 where the mask is empty along
        ``axis``; ``found`` is a boolean tensor saying where it was not.
    """
    x = ops.convert_to_tensor(x)
    dtype = dtype_name(x)
    found = ops.any(mask, axis=axis)
    if any(size == 0 for size in x.shape):  # nothing to take: PyTorch's max refuses it
        return ops.zeros(ops.shape(found), dtype), found
    values = ops.max(ops.where(mask, x, ops.cast(-float("inf"), dtype)), axis=axis)
    return ops.where(found, values, ops.zeros((), dtype)), found


def masked_min(x, mask, axis: int = -1):
    """Minimum of ``x`` over the entries where ``mask`` is true; see :func:`masked_max`."""
    values, found = masked_max(-ops.convert_to_tensor(x), mask, axis=axis)
    return -values, found


def masked_logsumexp(x, mask, axis: int = -1, add_one: bool = False):
    """``log(sum_{mask} exp(x))`` along ``axis`` (``log(1 + sum ...)`` with ``add_one``).

    Stable for large ``x`` (the masked maximum is subtracted first). An empty
    mask gives ``-inf`` (0 with ``add_one``) and a zero gradient, never NaN;
    masked-out entries get no gradient even when they are ``inf``.

    Returns:
        ``(values, found)`` as :func:`masked_max`.
    """
    x = ops.convert_to_tensor(x)
    dtype = dtype_name(x)
    zero = ops.zeros((), dtype)
    best, found = masked_max(ops.stop_gradient(x), mask, axis=axis)
    if add_one:
        best = maximum(best, zero)
    shifted = ops.where(mask, x - ops.expand_dims(best, axis), ops.cast(-float("inf"), dtype))
    total = ops.sum(ops.exp(shifted), axis=axis)
    if add_one:
        return best + ops.log(total + ops.exp(-best)), found
    empty = ops.logical_not(found)
    values = best + ops.log(ops.where(empty, ops.ones((), dtype), total))
    return ops.where(empty, ops.cast(-float("inf"), dtype), values), found




def masked_argmax(x, mask, axis: int = -1):
    """Index of the largest ``x`` where ``mask`` is true.

    Returns:
        ``(indices, found)``: int32 indices (0 where the mask is empty) and
        the boolean ``found``. Ties go to the lowest index; the index is
        always inside the mask, even when every candidate is ``-inf``.
    """
    x = ops.stop_gradient(ops.convert_to_tensor(x))
    best, found = masked_max(x, mask, axis=axis)
    if any(size == 0 for size in x.shape):  # an empty batch: no index to take
        return ops.zeros(ops.shape(found), "int32"), found
    is_best = ops.logical_and(mask, ops.equal(x, ops.expand_dims(best, axis)))
    # The first best column, as a minimum: a reduction over an axis of length 0 (an empty
    # batch whose size is known at run time only) gives its identity where argmax fails.
    width = ops.shape(x)[axis]
    shape = [1] * len(x.shape)
    shape[axis] = -1
    columns = ops.reshape(ops.arange(width, dtype="int32"), shape)
    end = ops.cast(width, "int32")
    idx = ops.min(ops.where(is_best, columns, end), axis=axis)
    # No entry equal to the maximum: the row's maximum is NaN (nothing equals it), or a
    # compiler computed ``x`` twice, for the maximum and for the comparison, rounding it
    # differently (XLA fusions). The arg-max of the masked row then, and the first
    # candidate if that is not one (a NaN selects NaN whichever index it takes).
    # (One padded column: an arg-max over an axis of length 0, an empty reference set whose
    # size is known at run time only, fails where a reduction gives its identity.)
    name = keras.backend.standardize_dtype(x.dtype)
    low = -np.inf if "float" in name else np.iinfo(name).min
    padding = [[0, 0]] * len(x.shape)
    padding[axis] = [0, 1]
    fallback = ops.cast(ops.argmax(ops.pad(ops.where(mask, x, ops.full_like(x, low)), padding,
                                           constant_values=low), axis=axis), "int32")
    candidate = ops.pad(ops.cast(mask, "int32"), padding)
    candidate = ops.squeeze(take_along_axis(candidate, ops.expand_dims(fallback, axis),
                                            axis=axis), axis)
    first = ops.min(ops.where(mask, columns, end), axis=axis)
    idx = ops.where(idx < end, idx, ops.where(candidate > 0, fallback, first))
    return ops.where(found, ops.minimum(idx, end - 1), ops.zeros((), "int32")), found


def masked_argmin(x, mask, axis: int = -1):
    """Index of the smallest ``x`` where ``mask`` is true; see :func:`masked_argmax`."""
    return masked_argmax(-ops.convert_to_tensor(x), mask, axis=axis)


# -- row blocks -------------------------------------------------------------------------------

#: Elements per block in :func:`map_row_blocks` (4 Mi: 16 MiB per int32 temporary).
ROW_BLOCK_ELEMENTS = 1 << 22


def map_row_blocks(fn, tensors, output_dtypes, max_elements: int | None = None):
    """Applies a row-wise ``fn`` to blocks of rows, bounding its temporaries.

    ``fn`` maps ``[b, R]`` slices of ``tensors`` to a tuple of ``[b, R]``
    tensors and must treat rows independently. When ``B * R`` is larger than
    ``max_elements``, the rows are processed ``max(1, max_elements // R)`` at
    a time in a loop (:func:`map_indices`: a while loop under XLA), so the
    temporaries of ``fn`` (sorts, scatters) take ``O(max_elements)`` memory
    instead of ``O(B R)``. Meant for index computations without gradients
    (sorting, counting); the outputs have no gradient path to ``tensors``.

    Args:
        fn: callable taking ``len(tensors)`` ``[b, R]`` tensors, returning a
            tuple of ``[b, R]`` tensors.
        tensors: sequence of ``[B, R]`` tensors.
        output_dtypes: the dtypes of ``fn``'s outputs (names such as ``"int32"``).
        max_elements: the block size in elements. Defaults to
            ``tfdml.ops.ROW_BLOCK_ELEMENTS`` (read at trace time).

    Returns:
        A tuple of ``[B, R]`` tensors.
    """
    if max_elements is None:
        max_elements = ROW_BLOCK_ELEMENTS
    output_dtypes = [keras.backend.standardize_dtype(d) for d in output_dtypes]
    tensors = [ops.stop_gradient(ops.convert_to_tensor(t)) for t in tensors]
    rows, width = tensors[0].shape[0], tensors[0].shape[1]
    if rows is not None and width is not None and rows * width <= max_elements:
        return tuple(fn(*tensors))
    n = ops.shape(tensors[0])[0]
    r = ops.shape(tensors[0])[1]
    if width is not None:  # static block size (XLA needs it)
        block = max(1, max_elements // max(width, 1))
        if rows is not None:
            block = min(block, rows)
    else:
        block = ops.minimum(ops.maximum(max_elements // ops.maximum(r, 1), 1),
                             ops.maximum(n, 1))
    num_blocks = (n + block - 1) // block

    def one_block(i):
        # The last block repeats the last row; the extra rows are cut below.
        index = ops.minimum(i * block + ops.arange(block, dtype="int32"),
                             ops.maximum(n - 1, 0))
        return tuple(fn(*[ops.take(t, index, axis=0) for t in tensors]))

    block_dim = block if isinstance(block, int) else None
    blocks = map_indices(one_block, num_blocks,
                         [((block_dim, width), dtype) for dtype in output_dtypes])
    return tuple(ops.reshape(b, (-1, r))[:n] for b in blocks)

