"""Core tensor operations shared by every loss, miner and metric.

Everything here has fixed output shapes and compiles under ``jit_compile=True``:
selections are expressed as masks and masked reductions, never as boolean
indexing or index lists.

Conventions:

* ``labels`` are integer class ids of shape ``[B]`` (``[B, 1]`` is accepted).
  They are cast to ``int32`` (``int64`` ids stay ``int64``) before anything
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

import numbers

import numpy as np
import tensorflow as tf

__all__ = [
    "all_finite",
    "cast_labels",
    "check_ref_offset",
    "check_batch_sizes",
    "check_embeddings",
    "compute_dtype",
    "distance_matrix",
    "is_number",
    "l2_normalize",
    "label_masks",
    "masked_argmax",
    "masked_argmin",
    "masked_max",
    "masked_min",
    "map_row_blocks",
    "nan_unless_finite",
    "pairwise_distance",
    "pairwise_similarity",
    "safe_sqrt",
    "same_label_dtype",
]


def cast_labels(labels, name: str = "labels") -> tf.Tensor:
    """Returns integer class ids as an integer tensor of shape ``[B]``.

    Accepts shape ``[B]`` or ``[B, 1]``, any integer dtype, and floats that
    hold whole numbers. The result is ``int32`` for integer types of at most
    32 bits (``uint32``: ``int64``) and ``int64`` for 64-bit ids and for
    floats, so that no two distinct ids are merged: ``uint64`` ids are
    reinterpreted bit for bit (ids at or above 2**63 become negative, still
    distinct), and float ids beyond 2**31 keep their value. Ids already
    rounded by a ``bfloat16`` conversion cannot be recovered, so pass integer
    labels.

    Raises:
        ValueError: if the labels are not of rank 1, or rank 2 with a last
            dimension of 1; if they are strings or another non-numeric
            dtype; or if float labels hold a value that is not a whole
            number (checked eagerly; inside ``tf.function`` an assertion,
            which XLA does not evaluate).
    """
    if not tf.is_tensor(labels):
        array = np.asarray(labels)
        if array.dtype.kind in "USO":
            raise ValueError(
                f"`{name}` must be integer class ids, not strings or objects. Map them to "
                f"integers first (e.g. with keras.layers.StringLookup). Received: "
                f"{name}.dtype={array.dtype}"
            )
    labels = tf.convert_to_tensor(labels)
    if not (labels.dtype.is_integer or labels.dtype.is_floating or labels.dtype == tf.bool):
        raise ValueError(
            f"`{name}` must be integer class ids. Received: {name}.dtype={labels.dtype.name}"
        )
    rank = labels.shape.rank
    if rank == 2 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, axis=-1)
    elif rank != 1:
        raise ValueError(
            f"`{name}` must be integer class ids of shape [B] or [B, 1]. "
            f"Received: {name}.shape={labels.shape}"
        )
    if labels.dtype in (tf.int32, tf.int64):
        return labels
    if labels.dtype == tf.uint64:
        return tf.bitcast(labels, tf.int64)
    if labels.dtype == tf.uint32:
        return tf.cast(labels, tf.int64)
    if labels.dtype.is_floating:
        return _whole_number_ids(labels, name)
    return tf.cast(labels, tf.int32)


def _whole_number_ids(labels, name):
    """Float class ids as int64, refusing values that are not whole numbers."""
    whole = tf.logical_and(tf.math.is_finite(labels), tf.equal(labels, tf.round(labels)))
    message = (f"`{name}` holds float values that are not whole numbers (or NaN/Inf); "
               "class ids must be integers.")
    if tf.executing_eagerly():
        bad = np.asarray(labels)[~np.asarray(whole)]
        if bad.size:
            raise ValueError(f"{message} Received e.g. {bad[:3].tolist()}")
        return tf.cast(labels, tf.int64)
    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(whole), [message])]):
        return tf.cast(labels, tf.int64)


def check_ref_offset(ref_offset, batch, num_ref):
    """Checks that anchors ``[ref_offset, ref_offset + B)`` lie inside a reference set of ``R``.

    ``ref_offset=None`` (anchors outside the reference set) passes. A static
    offset with static sizes raises a ValueError; otherwise an assertion is
    added (graphs; not evaluated under XLA).

    Returns:
        ``ref_offset``, as given or with the assertion attached.
    """
    if ref_offset is None:
        return None
    if not tf.is_tensor(ref_offset):
        if not isinstance(ref_offset, numbers.Integral) or isinstance(ref_offset, bool):
            raise ValueError(f"`ref_offset` must be an int or None. Received: ref_offset={ref_offset!r}")
        ref_offset = int(ref_offset)
        if isinstance(batch, int) and isinstance(num_ref, int):
            if not 0 <= ref_offset <= num_ref - batch:
                raise ValueError(
                    f"`ref_offset` must be in [0, {num_ref - batch}] so that the {batch} anchors "
                    f"are rows ref_offset .. ref_offset + {batch} - 1 of the {num_ref} reference "
                    f"samples (None: the anchors are not in the reference set). "
                    f"Received: ref_offset={ref_offset}"
                )
            return ref_offset
    offset = tf.cast(ref_offset, tf.int32)
    ok = tf.logical_and(offset >= 0, offset + tf.cast(batch, tf.int32) <= tf.cast(num_ref, tf.int32))
    if tf.executing_eagerly():
        if not bool(ok):
            raise ValueError(
                f"`ref_offset` must be in [0, {int(num_ref) - int(batch)}]. "
                f"Received: ref_offset={int(offset)}"
            )
        return ref_offset
    message = "`ref_offset` must be in [0, len(ref_embeddings) - len(y_pred)]."
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(offset)


def all_finite(*tensors) -> tf.Tensor:
    """Scalar bool: every entry of every (non-None) tensor is finite."""
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def nan_unless_finite(value, *inputs) -> tf.Tensor:
    """``value`` where every input is finite, NaN (everywhere) otherwise.

    How every tfdml loss turns a NaN or Inf embedding into a NaN loss, so that
    ``keras.callbacks.TerminateOnNaN`` fires, instead of the finite value a
    masked selection would leave (NaN comparisons are false, so a NaN sample
    is simply never mined).
    """
    value = tf.convert_to_tensor(value)
    inputs = [tf.convert_to_tensor(t) for t in inputs if t is not None]
    ok = all_finite(*inputs)
    return tf.where(ok, value, tf.constant(float("nan"), value.dtype))


def same_label_dtype(a, b):
    """Casts two label tensors to a common dtype (int64 if either is int64)."""
    if a.dtype == b.dtype:
        return a, b
    return tf.cast(a, tf.int64), tf.cast(b, tf.int64)


def check_embeddings(embeddings, name: str = "embeddings") -> tf.Tensor:
    """Converts to a tensor and checks that it is a rank-2 ``[B, D]`` float tensor."""
    embeddings = tf.convert_to_tensor(embeddings)
    if embeddings.shape.rank != 2:
        raise ValueError(
            f"`{name}` must be a rank-2 tensor of shape [B, D]. "
            f"Received: {name}.shape={embeddings.shape}"
        )
    if not embeddings.dtype.is_floating:
        raise ValueError(
            f"`{name}` must have a floating dtype. Received: {name}.dtype={embeddings.dtype.name}"
        )
    return embeddings


def check_batch_sizes(labels, embeddings, labels_name="labels", embeddings_name="embeddings"):
    """Raises ValueError when the static batch sizes of labels and embeddings differ."""
    n_labels = labels.shape[0]
    n_embeddings = embeddings.shape[0]
    if n_labels is not None and n_embeddings is not None and n_labels != n_embeddings:
        raise ValueError(
            f"`{labels_name}` and `{embeddings_name}` must have the same batch size. "
            f"Received: {labels_name}.shape={labels.shape}, "
            f"{embeddings_name}.shape={embeddings.shape}"
        )


def compute_dtype(dtype) -> tf.DType:
    """The dtype computations run in: float64 stays float64, all else float32."""
    return tf.float64 if tf.as_dtype(dtype) == tf.float64 else tf.float32


def l2_normalize(x, axis: int = -1, epsilon: float = 1e-12) -> tf.Tensor:
    """L2-normalizes ``x`` along ``axis``; zero vectors stay zero, gradients stay finite."""
    x = tf.convert_to_tensor(x)
    square_sum = tf.reduce_sum(tf.square(x), axis=axis, keepdims=True)
    return x * tf.math.rsqrt(tf.maximum(square_sum, tf.cast(epsilon, x.dtype)))


def safe_sqrt(x, epsilon: float = 1e-12) -> tf.Tensor:
    """``sqrt(x)`` for ``x >= 0`` whose value and gradient are 0 at (and below) ``epsilon``.

    The plain square root has an infinite derivative at 0, which turns the
    gradient of a distance between duplicate points into NaN.
    """
    x = tf.convert_to_tensor(x)
    eps = tf.cast(epsilon, x.dtype)
    positive = x > eps
    one, zero = tf.ones([], x.dtype), tf.zeros([], x.dtype)  # broadcast, not materialized
    return tf.where(positive, tf.sqrt(tf.where(positive, x, one)), zero)


def pairwise_similarity(x, y=None) -> tf.Tensor:
    """Dot products ``x @ y^T`` of shape ``[B, R]`` (cosine similarity for unit vectors).

    Args:
        x: ``[B, D]`` tensor.
        y: ``[R, D]`` tensor. Defaults to ``x``.
    """
    x = tf.convert_to_tensor(x)
    y = x if y is None else tf.convert_to_tensor(y)
    return tf.matmul(x, y, transpose_b=True)


def pairwise_distance(x, y=None, squared: bool = False) -> tf.Tensor:
    """Euclidean distances of shape ``[B, R]`` between rows of ``x`` and of ``y``.

    Uses ``|x|^2 + |y|^2 - 2 x.y`` clipped at 0; the square root is
    :func:`safe_sqrt`, so the gradient at zero distance is 0 rather than NaN.

    Args:
        x: ``[B, D]`` tensor.
        y: ``[R, D]`` tensor. Defaults to ``x``.
        squared: return squared distances. Defaults to `False`.
    """
    x = tf.convert_to_tensor(x)
    y = x if y is None else tf.convert_to_tensor(y)
    x_sq = tf.reduce_sum(tf.square(x), axis=1, keepdims=True)
    y_sq = tf.reduce_sum(tf.square(y), axis=1, keepdims=True)
    # -2 folded into the [B, D] factor (exact, and the same sums in the same order as
    # x_sq + y_sq^T - 2 x.y): one [B, R] temporary fewer.
    sq = (x_sq + tf.transpose(y_sq)) + tf.matmul(-2.0 * x, y, transpose_b=True)
    sq = tf.maximum(sq, 0.0)
    return sq if squared else safe_sqrt(sq)


def is_number(x) -> bool:
    """A real Python or NumPy number, not a bool: what hyperparameter checks accept."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


DISTANCES = ("squared_l2", "l2", "cosine")


def distance_matrix(x, y=None, distance: str = "l2") -> tf.Tensor:
    """``[B, R]`` distances by name: ``"l2"``, ``"squared_l2"`` or ``"cosine"`` (``1 - x.y``).

    The ``"l2"`` square root is guarded (gradient 0 at distance 0).
    """
    if distance not in DISTANCES:
        raise ValueError(f"`distance` must be one of {DISTANCES}. Received: distance={distance!r}")
    if distance == "cosine":
        return 1.0 - pairwise_similarity(x, y)
    return pairwise_distance(x, y, squared=distance == "squared_l2")


def label_masks(labels, ref_labels=None, ref_offset=0):
    """Same-class and different-class masks of shape ``[B, R]``.

    Args:
        labels: ``[B]`` int32 class ids of the anchors.
        ref_labels: ``[R]`` int32 class ids of the reference set. Defaults to
            ``labels``.
        ref_offset: anchor ``i`` is reference row ``i + ref_offset``; that
            pair is excluded from the positives. ``None`` when the anchors are
            not in the reference set. Defaults to `0`.

    Returns:
        ``(positive_mask, negative_mask)``, boolean. Self-pairs are never
        positives; negatives are all reference rows of another class.
    """
    labels = cast_labels(labels)
    ref_labels = labels if ref_labels is None else cast_labels(ref_labels, "ref_labels")
    labels, ref_labels = same_label_dtype(labels, ref_labels)
    same = tf.equal(labels[:, None], ref_labels[None, :])
    negative = tf.logical_not(same)
    if ref_offset is None:
        return same, negative
    rows = tf.range(tf.shape(labels)[0], dtype=tf.int32) + tf.cast(ref_offset, tf.int32)
    cols = tf.range(tf.shape(ref_labels)[0], dtype=tf.int32)
    not_self = tf.not_equal(rows[:, None], cols[None, :])
    return tf.logical_and(same, not_self), negative


def masked_max(x, mask, axis: int = -1):
    """Maximum of ``x`` over the entries where ``mask`` is true.

    Returns:
        ``(values, found)``: ``values`` is 0 where the mask is empty along
        ``axis``; ``found`` is a boolean tensor saying where it was not.
    """
    x = tf.convert_to_tensor(x)
    found = tf.reduce_any(mask, axis=axis)
    values = tf.reduce_max(tf.where(mask, x, tf.constant(-float("inf"), x.dtype)), axis=axis)
    return tf.where(found, values, tf.zeros_like(values)), found


def masked_min(x, mask, axis: int = -1):
    """Minimum of ``x`` over the entries where ``mask`` is true; see :func:`masked_max`."""
    values, found = masked_max(-tf.convert_to_tensor(x), mask, axis=axis)
    return -values, found


def masked_argmax(x, mask, axis: int = -1):
    """Index of the largest ``x`` where ``mask`` is true.

    Returns:
        ``(indices, found)``: int32 indices (0 where the mask is empty) and
        the boolean ``found``. Ties go to the lowest index; the index is
        always inside the mask, even when every candidate is ``-inf``.
    """
    x = tf.stop_gradient(tf.convert_to_tensor(x))
    best, found = masked_max(x, mask, axis=axis)
    is_best = tf.logical_and(mask, tf.equal(x, tf.expand_dims(best, axis)))
    idx = tf.argmax(tf.cast(is_best, tf.int32), axis=axis, output_type=tf.int32)
    return tf.where(found, idx, tf.zeros_like(idx)), found


def masked_argmin(x, mask, axis: int = -1):
    """Index of the smallest ``x`` where ``mask`` is true; see :func:`masked_argmax`."""
    return masked_argmax(-tf.convert_to_tensor(x), mask, axis=axis)


#: Elements per block in :func:`map_row_blocks` (4 Mi: 16 MiB per int32 temporary).
ROW_BLOCK_ELEMENTS = 1 << 22


def map_row_blocks(fn, tensors, output_dtypes, max_elements: int | None = None):
    """Applies a row-wise ``fn`` to blocks of rows, bounding its temporaries.

    ``fn`` maps ``[b, R]`` slices of ``tensors`` to a tuple of ``[b, R]``
    tensors and must treat rows independently. When ``B * R`` is larger than
    ``max_elements``, the rows are processed ``max(1, max_elements // R)`` at
    a time in a loop (``tf.map_fn``, an XLA while loop under
    ``jit_compile=True``), so the temporaries of ``fn`` (sorts, scatters)
    take ``O(max_elements)`` memory instead of ``O(B R)``. Meant for index
    computations without gradients (sorting, counting); the outputs have no
    gradient path to ``tensors``.

    Args:
        fn: callable taking ``len(tensors)`` ``[b, R]`` tensors, returning a
            tuple of ``[b, R]`` tensors.
        tensors: sequence of ``[B, R]`` tensors.
        output_dtypes: the dtypes of ``fn``'s outputs.
        max_elements: the block size in elements. Defaults to
            ``tfdml.ops.ROW_BLOCK_ELEMENTS`` (read at trace time).

    Returns:
        A tuple of ``[B, R]`` tensors.
    """
    if max_elements is None:
        max_elements = ROW_BLOCK_ELEMENTS
    tensors = [tf.stop_gradient(tf.convert_to_tensor(t)) for t in tensors]
    rows, width = tensors[0].shape[0], tensors[0].shape[1]
    if rows is not None and width is not None and rows * width <= max_elements:
        return tuple(fn(*tensors))
    n = tf.shape(tensors[0])[0]
    r = tf.shape(tensors[0])[1]
    if width is not None:  # static block size (XLA needs it)
        block = max(1, max_elements // max(width, 1))
        if rows is not None:
            block = min(block, rows)
        block_dim = block
    else:
        block = tf.minimum(tf.maximum(max_elements // tf.maximum(r, 1), 1), tf.maximum(n, 1))
        block_dim = None
    num_blocks = (n + block - 1) // block

    def one_block(i):
        # The last block repeats the last row; the extra rows are cut below.
        index = tf.minimum(i * block + tf.range(block), tf.maximum(n - 1, 0))
        return tuple(fn(*[tf.gather(t, index) for t in tensors]))

    signature = tuple(tf.TensorSpec([block_dim, width], dtype) for dtype in output_dtypes)
    blocks = tf.map_fn(one_block, tf.range(num_blocks), fn_output_signature=signature)
    return tuple(tf.reshape(b, [-1, r])[:n] for b in blocks)
