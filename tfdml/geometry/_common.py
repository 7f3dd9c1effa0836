"""The plumbing of the geometry kernels: inputs checked, cast to one compute dtype and
broadcast; small shared kernels (dot products, guarded norms, the running arg-best over
candidates); and the docstring text the public functions share."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfdml._embeddings import compute_dtype
from tfdml._shims import dtype_name

__all__ = [
    "POINTS_DOC",
    "Best",
    "degenerate_sines",
    "dot",
    "dots_doc",
    "endpoints",
    "eps_of",
    "prepare_dots",
    "safe_norm2",
    "tiny_of",
]


def dots_doc(names):
    """The ``Args`` entries of the dot products ``names`` (``"x1y2"``: ``x1 . y2``)."""
    lines = [f"{name}: dot product `{name[:2]} . {name[2:]}`." for name in names]
    lines[0] += " Any shape; all arguments broadcast."
    return "\n".join(lines)


# The Returns and Raises of the functions that take the vectors.
POINTS_DOC = """\
Returns:
    The distances, of the broadcast leading shape; with
    `return_points=True`, `(distance, (p1, p2))` with `p1`, `p2` of shape
    `[..., D]`.

Raises:
    ValueError: if an argument is not a floating tensor of rank >= 1, or
        its last dimension differs from that of `x1`."""


def degenerate_sines(dtype) -> tuple[float, float]:
    """Sines at or below which an arc is reduced to its endpoints, for ``dtype``.

    ``(near, antipodal)``: ``sqrt(eps)`` when ``x1.x2 > 0`` (the arc is at most that
    long, so its endpoints are within ``eps / 2`` of the optimum), ``eps ** 0.25``
    when ``x1.x2 <= 0`` (the geodesic's plane is then ill-conditioned: the
    similarity's derivative with respect to ``x1.x2`` grows like ``1 / (4 sine^2)``,
    so a rounding error ``eps`` in the dot product moves the result by about
    ``sqrt(eps) / 4`` at the threshold). float32: ``3.5e-4`` and ``1.9e-2``;
    float64: ``1.5e-8`` and ``1.2e-4``.
    """
    eps = float(np.finfo(keras.backend.standardize_dtype(dtype)).eps)
    return float(np.sqrt(eps)), float(eps**0.25)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def eps_of(x) -> float:
    """The machine epsilon of ``x``'s dtype."""
    return float(np.finfo(dtype_name(x)).eps)


def tiny_of(x) -> float:
    """The smallest normal number of ``x``'s dtype."""
    return float(np.finfo(dtype_name(x)).tiny)


def _static_shape(t):
    """``t``'s static shape as a tuple (``None`` for unknown dimensions), or None if the rank
    is unknown."""
    try:
        return tuple(t.shape)
    except (TypeError, ValueError):  # a TensorFlow tensor of unknown rank
        return None


def _shape_str(t):
    shape = _static_shape(t)
    return "<unknown>" if shape is None else str(tuple(shape))


def _broadcast_static(a, b):
    """Broadcast of two static shapes (tuples, ``None`` for unknown dimensions).

    Raises ValueError when known dimensions do not broadcast; an unknown dimension is
    compatible with anything (it stays unknown unless the other one is known and not 1).
    """
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for da, db in zip(a, b, strict=True):
        if da == 1:
            out.append(db)
        elif db == 1:
            out.append(da)
        elif da is None:
            out.append(db)
        elif db is None or da == db:
            out.append(da)
        else:
            raise ValueError(f"Incompatible shapes: {a} and {b}")
    return tuple(out)


def _broadcast_all(tensors):
    """Broadcasts tensors to their common shape (static where known, else dynamic)."""
    shapes = [_static_shape(t) for t in tensors]
    if all(s is not None and None not in s for s in shapes):
        shape = tuple(np.broadcast_shapes(*shapes))
        return [t if s == shape else ops.broadcast_to(t, shape)
                for t, s in zip(tensors, shapes, strict=True)]
    # Unknown dimensions (TensorFlow graphs): the dynamic shape of a broadcast sum.
    zero = ops.zeros_like(tensors[0])
    for t in tensors[1:]:
        zero = zero + ops.zeros_like(t)
    shape = ops.shape(zero)
    return [ops.broadcast_to(t, shape) for t in tensors]


def _common_float_dtype(values) -> str:
    """The widest floating dtype among the arguments that carry one (float32 by default)."""
    dtypes = []
    for v in values:
        dt = getattr(v, "dtype", None)
        if dt is None:
            continue
        dt = keras.backend.standardize_dtype(dt)
        if _is_float(dt):
            dtypes.append(dt)
    if not dtypes:
        return "float32"
    for wide in ("float64", "float32"):
        if wide in dtypes:
            return wide
    return dtypes[0]


def prepare_dots(values, names):
    """Converts dot products to one compute dtype and a common (broadcast) shape."""
    dtype = _common_float_dtype(values)
    tensors = []
    for v, name in zip(values, names, strict=True):
        t = ops.convert_to_tensor(v)
        t_dtype = dtype_name(t)
        if not (_is_float(t_dtype) or _is_int(t_dtype)):
            raise ValueError(
                f"`{name}` must be a real number tensor. Received: {name}.dtype={t_dtype}"
            )
        tensors.append(ops.cast(t, compute_dtype(dtype)))
    return _broadcast_all(tensors), dtype


def _check_vectors(values, names):
    """Checks ``[..., D]`` inputs: float, rank >= 1, same last dimension, broadcastable."""
    tensors = []
    first = ops.convert_to_tensor(values[0])
    dtype = dtype_name(first)
    if not _is_float(dtype):
        raise ValueError(
            f"`{names[0]}` must have a floating dtype. Received: {names[0]}.dtype={dtype}"
        )
    for v, name in zip(values, names, strict=True):
        t = ops.convert_to_tensor(v)
        if not _is_float(dtype_name(t)):
            raise ValueError(
                f"`{name}` must have a floating dtype. "
                f"Received: {name}.dtype={ops.dtype_name(t)}"
            )
        t = ops.cast(t, dtype)
        shape = _static_shape(t)
        if shape is not None and len(shape) < 1:
            raise ValueError(
                f"`{name}` must be a tensor of vectors of shape [..., D] (rank >= 1). "
                f"Received: {name}.shape={_shape_str(t)}"
            )
        tensors.append(t)
    first_shape = _static_shape(tensors[0])
    depth = first_shape[-1] if first_shape is not None else None
    lead = first_shape[:-1] if first_shape is not None else None
    for t, name in zip(tensors[1:], names[1:], strict=True):
        shape = _static_shape(t)
        if shape is None:
            continue
        d = shape[-1]
        if depth is not None and d is not None and d != depth:
            raise ValueError(
                f"`{name}` must have the same last dimension as `{names[0]}`. "
                f"Received: {names[0]}.shape={_shape_str(tensors[0])}, "
                f"{name}.shape={_shape_str(t)}"
            )
        if lead is not None:
            try:
                lead = _broadcast_static(lead, shape[:-1])
            except ValueError as err:
                raise ValueError(
                    f"The leading dimensions of `{name}` do not broadcast with those of the "
                    f"previous arguments. Received: {name}.shape={_shape_str(t)}"
                ) from err
    return tensors, dtype


def endpoints(x1, x2, y1, y2):
    """The four ``[..., D]`` endpoints checked (:func:`_check_vectors`) and cast to the
    compute dtype; and the dtype of the results."""
    tensors, dtype = _check_vectors((x1, x2, y1, y2), ("x1", "x2", "y1", "y2"))
    cdtype = compute_dtype(dtype)
    return tuple(ops.cast(t, cdtype) for t in tensors), dtype


def dot(a, b):
    return ops.sum(a * b, axis=-1)


def safe_norm2(x, y, tiny):
    """``(sqrt(x^2 + y^2), ok)``; where the norm is not above ``tiny`` it is 1 (with no
    gradient)."""
    sq = x * x + y * y
    ok = sq > tiny * tiny
    return ops.sqrt(ops.where(ok, sq, ops.ones_like(sq))), ok


class Best:
    """Running arg-best over candidates: value, four coefficients and the candidate index."""

    def __init__(self, value, coefficients, case, maximize):
        self.value = value
        self.coefficients = list(coefficients)
        self.case = ops.full_like(value, case, dtype="int32")
        self.maximize = maximize
        # Every candidate offered: (feasible, coefficients, case), the first one included.
        self.offers = [(ops.ones_like(value, dtype="bool"), tuple(coefficients), case)]

    def offer(self, value, feasible, coefficients, case):
        self.offers.append((feasible, tuple(coefficients), case))
        better = value > self.value if self.maximize else value < self.value
        take = ops.logical_and(feasible, better)
        self.value = ops.where(take, value, self.value)
        self.coefficients = [
            ops.where(take, c, b) for c, b in zip(coefficients, self.coefficients, strict=True)
        ]
        self.case = ops.where(take, ops.convert_to_tensor(case, dtype="int32"), self.case)
