"""Closest points between two great-circle arcs, or between two segments.

These are the geometric kernels of LoOp: for a pair of positives ``(x1, x2)``
and a pair of negatives ``(y1, y2)`` of another class, the points ``p1`` on the
shorter great-circle arc ``x1 -> x2`` and ``p2`` on the arc ``y1 -> y2`` that
are closest to each other (Section 3 of the paper), or, without
l2-normalization, on the straight segments (Section 4.2 of its supplementary).

Both problems are solved in closed form from dot products only, so that a loss
can evaluate them on ``B x B`` grids of dot products without a ``D`` factor in
memory; the functions that take the vectors (:func:`arc_distance`,
:func:`segment_distance`) then measure the distance between the closest points
themselves (see "Accuracy near 0" below). Every function is elementwise over
broadcastable inputs, has no data-dependent shapes and compiles under
``jit_compile=True`` (``tf.function``, ``jax.jit``).

Arcs. With ``g = x1.x2``, ``h = y1.y2``, ``sx = sqrt(1 - g^2)`` and
``sy = sqrt(1 - h^2)``, write ``p1 = cos(a) n1 + sin(a) n2`` with
``n1 = x1``, ``n2 = (x2 - g x1) / sx``, ``a`` in ``[0, acos(g)]``, and likewise
``p2 = cos(b) n3 + sin(b) n4``. Then ``p1.p2 = u(a)^T M v(b)`` with the
``2 x 2`` matrix ``M = [[n1.n3, n1.n4], [n2.n3, n2.n4]]``, whose entries are
functions of the six dot products. The maximum of ``p1.p2`` over the box of
angles is the largest *feasible* value among the nine KKT candidates of the
paper (its Table 1 and case 0):

* the four corners ``x_i.y_j`` (always feasible);
* four edges, one end pinned at an endpoint ``p`` and the other free: the best
  free point has direction ``w = (p.n3, p.n4)``, value ``|w|``, feasible when
  ``w`` lies in the cone of the free arc;
* the interior point: the top singular pair ``(u1, v1)`` of ``M``
  (closed-form ``2 x 2`` SVD, sign chosen so that ``u1`` points into the upper
  half-plane), value ``sigma_1``, feasible when it lies in both cones.

Cone membership is tested with signs of cross products (the numerators of the
point's coefficients on the arc's endpoints), not with ``atan`` of ratios, and
every division is by a guarded quantity. Each candidate value is the objective
at the candidate point itself (``u1^T M v1`` rather than the formula for
``sigma_1``), so the result is always attained by a pair of points on the arcs.
When ``sigma_1 == sigma_2`` the singular vectors are not unique; any computed
direction then attains ``sigma_1``, and the maximizers form a curve that, if it
meets the box, also meets its boundary, where the edge candidates find them.
(The interior candidate is skipped when ``sigma_1 - sigma_2`` is within about
``eps`` of 0, which costs at most that much.)

Degenerate arcs. An arc is reduced to its two endpoints when its sine ``sx`` is
not above a threshold of the compute dtype:

* ``x1.x2 > 0`` (``x1 == x2``): ``sqrt(eps)`` (``3.5e-4`` in float32, ``1.5e-8``
  in float64). The arc is then a point up to an error of at most
  ``1 - cos(angle) <= eps / 2`` in the similarity.
* ``x1.x2 <= 0`` (``x2 == -x1``): ``eps ** 0.25`` (``1.9e-2`` in float32, about
  one degree from antipodal; ``1.2e-4`` in float64). The geodesic is undefined
  (or, just above the threshold, ill-conditioned: given only ``x1.x2``, the
  similarity moves by ``s a1 a2`` per unit of it, about ``1 / (4 sx^2)``, so a
  rounding error ``eps`` costs about ``sqrt(eps) / 4`` at the threshold), and the
  result is the best of the two endpoints ``x1`` and ``x2`` against the other
  arc.

Accuracy near 0. A distance computed from dot products cancels where it is
small: ``d^2 = 2 - 2 s`` with ``s`` a dot product of magnitude 1, known to an
absolute error ``e`` of a few ``eps`` (more where the inputs' norms differ
from 1: ``e`` is about ``1e-8`` for vectors normalized in float32 and used in
float64), and an error ``e`` in ``d^2`` is an error ``sqrt(2 e)`` in ``d`` at
``d = 0``. Arcs that share an endpoint, cross, or have an endpoint on the
other arc (distance 0) thus come out at ``5e-4`` in float32 and ``3e-4`` for
float32-normalized inputs in float64, and segments likewise (``sqrt(eps)``
times the norms). The same holds for every function of the dot products alone
(:func:`arc_similarity_from_dots`, :func:`segment_squared_distance_from_dots`,
hence the LoOp loss, which works on the ``B x B`` Gram matrix): the Gram
matrix itself carries that error, so nothing computed from it can resolve a
distance below about ``sqrt(eps)``. :func:`arc_distance` and
:func:`segment_distance` use the vectors: they measure ``||p1 - p2||`` from
the closest points, whose rounding error is that of the points (a few
``eps``), and find the points accurately (see :func:`arc_distance`). Touching
arcs and intersecting segments then give 0 (``safe_sqrt`` reads distances
below ``1e-6`` as 0) in float64 and in float32.

Gradients. The value's gradient with respect to the dot products is the one of
the selected candidate, which by the envelope theorem is the gradient of the
optimum; degenerate branches are masked with the double-``where`` pattern,
so values and gradients are finite for every input. Distances use
:func:`tfdml.ops.safe_sqrt` (value and gradient 0 at distance 0).

Half-precision inputs are computed in float32 and the results cast back.

Reference:
    Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings for
    Deep Metric Learning", ICCV 2021.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._docs import fill_doc

__all__ = [
    "arc_distance",
    "arc_similarity_from_dots",
    "segment_distance",
    "segment_squared_distance_from_dots",
]

# Indices of the candidate that attains the optimum, as returned by the private solvers.
# Arcs: corners (x_i, y_j), edges with one endpoint pinned and the other point free, interior.
_ARC_CASES = (
    "corner_x1_y1",
    "corner_x1_y2",
    "corner_x2_y1",
    "corner_x2_y2",
    "edge_x1",
    "edge_x2",
    "edge_y1",
    "edge_y2",
    "interior",
)
_ARC_DOT_NAMES = ("x1x2", "y1y2", "x1y1", "x1y2", "x2y1", "x2y2")
# Segments: the four edges (s = 0, s = 1, t = 0, t = 1; corners included) and the interior.
_SEGMENT_CASES = ("edge_x1", "edge_x2", "edge_y1", "edge_y2", "interior")
_SEGMENT_DOT_NAMES = ("x1x1", "x2x2", "x1x2", "y1y1", "y2y2", "y1y2", "x1y1", "x1y2", "x2y1",
                      "x2y2")


def _dots_doc(names):
    """The ``Args`` entries of the dot products ``names`` (``"x1y2"``: ``x1 . y2``)."""
    lines = [f"{name}: dot product `{name[:2]} . {name[2:]}`." for name in names]
    lines[0] += " Any shape; all arguments broadcast."
    return "\n".join(lines)


# The Returns and Raises of the functions that take the vectors.
_POINTS_DOC = """\
Returns:
    The distances, of the broadcast leading shape; with
    `return_points=True`, `(distance, (p1, p2))` with `p1`, `p2` of shape
    `[..., D]`.

Raises:
    ValueError: if an argument is not a floating tensor of rank >= 1, or
        its last dimension differs from that of `x1`."""


# -- helpers ---------------------------------------------------------------------------------------


def _degenerate_sines(dtype) -> tuple[float, float]:
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


def _eps(x) -> float:
    return float(np.finfo(dml.dtype_name(x)).eps)


def _tiny(x) -> float:
    return float(np.finfo(dml.dtype_name(x)).tiny)










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


def _prepare_dots(values, names):
    """Converts dot products to one compute dtype and a common (broadcast) shape."""
    dtype = _common_float_dtype(values)
    tensors = []
    for v, name in zip(values, names, strict=True):
        t = ops.convert_to_tensor(v)
        t_dtype = dml.dtype_name(t)
        if not (_is_float(t_dtype) or _is_int(t_dtype)):
            raise ValueError(
                f"`{name}` must be a real number tensor. Received: {name}.dtype={t_dtype}"
            )
        tensors.append(ops.cast(t, dml.compute_dtype(dtype)))
    return _broadcast_all(tensors), dtype


def _check_vectors(values, names):
    """Checks ``[..., D]`` inputs: float, rank >= 1, same last dimension, broadcastable."""
    tensors = []
    first = ops.convert_to_tensor(values[0])
    dtype = dml.dtype_name(first)
    if not _is_float(dtype):
        raise ValueError(
            f"`{names[0]}` must have a floating dtype. Received: {names[0]}.dtype={dtype}"
        )
    for v, name in zip(values, names, strict=True):
        t = ops.convert_to_tensor(v)
        if not _is_float(dml.dtype_name(t)):
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


def _endpoints(x1, x2, y1, y2):
    """The four ``[..., D]`` endpoints checked (:func:`_check_vectors`) and cast to the
    compute dtype; and the dtype of the results."""
    tensors, dtype = _check_vectors((x1, x2, y1, y2), ("x1", "x2", "y1", "y2"))
    cdtype = dml.compute_dtype(dtype)
    return tuple(ops.cast(t, cdtype) for t in tensors), dtype


def _dot(a, b):
    return ops.sum(a * b, axis=-1)


def _safe_norm2(x, y, tiny):
    """``(sqrt(x^2 + y^2), ok)``; where the norm is not above ``tiny`` it is 1 (with no gradient)."""
    sq = x * x + y * y
    ok = sq > tiny * tiny
    return ops.sqrt(ops.where(ok, sq, ops.ones_like(sq))), ok


class _Best:
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


# -- arcs ------------------------------------------------------------------------------------------


def _arc_sine(cos0):
    """``(cos0, sin0^2, ok)`` of an arc from its endpoints' dot product (clipped to [-1, 1]).

    ``ok`` is False where the arc is reduced to its endpoints (see
    :func:`_degenerate_sines`).
    """
    dtype = dml.dtype_name(cos0)
    near, antipodal = _degenerate_sines(dtype)
    cos0 = dml.clip(cos0, -1.0, 1.0)
    sin_sq = dml.maximum((1.0 - cos0) * (1.0 + cos0), 0.0)
    limit = ops.where(cos0 > 0, ops.convert_to_tensor(near * near, dtype=dtype),
                       ops.convert_to_tensor(antipodal * antipodal, dtype=dtype))
    return cos0, sin_sq, sin_sq > limit


def _cone_coefficients(vx, vy, cos0, sin0):
    """Coefficients ``(c1, c2)`` of the unit direction ``(vx, vy)`` on the endpoints of an arc.

    ``v = cos(b) e1 + sin(b) e2`` is ``c1 * end1 + c2 * end2`` with
    ``c1 = sin(b0 - b) / sin(b0)`` and ``c2 = sin(b) / sin(b0)``; ``v`` lies on the arc
    (``0 <= b <= b0``) exactly when both numerators are non-negative.
    """
    num1 = sin0 * vx - cos0 * vy
    num2 = vy
    inside = ops.logical_and(num1 >= 0, num2 >= 0)
    return num1 / sin0, num2 / sin0, inside


def _arc_solve(g, h, c11, c12, c21, c22, return_candidates=False):
    """Closed-form maximum of ``p1.p2`` over two arcs, from the six dot products.

    Args:
        g, h: ``x1.x2`` and ``y1.y2``.
        c11, c12, c21, c22: ``x1.y1``, ``x1.y2``, ``x2.y1``, ``x2.y2``.
        All of one float dtype and one shape.
        return_candidates: also return all nine candidates.

    Returns:
        ``(s, a1, a2, b1, b2, case)``: the maximum, the coefficients of
        ``p1 = a1 x1 + a2 x2`` and ``p2 = b1 y1 + b2 y2``, and the index into
        ``_ARC_CASES`` of the candidate that attains it; with
        ``return_candidates=True`` a seventh element, the list of
        ``(feasible, (a1, a2, b1, b2), case)`` of every candidate.
    """
    one = ops.ones_like(g)
    zero = ops.zeros_like(g)
    eps = _eps(g)

    g, sx_sq, x_ok = _arc_sine(g)
    h, sy_sq, y_ok = _arc_sine(h)
    sx = ops.sqrt(ops.where(x_ok, sx_sq, one))
    sy = ops.sqrt(ops.where(y_ok, sy_sq, one))

    # Products with the second Gram-Schmidt vectors n2 = (x2 - g x1) / sx, n4 = (y2 - h y1) / sy.
    x1n4 = (c12 - h * c11) / sy
    x2n4 = (c22 - h * c21) / sy
    n2y1 = (c21 - g * c11) / sx
    n2y2 = (c22 - g * c12) / sx
    n2n4 = ((c22 - h * c21) - g * (c12 - h * c11)) / (sx * sy)

    # Corners: always feasible, computed from the endpoints themselves.
    best = _Best(c11, (one, zero, one, zero), 0, maximize=True)
    best.offer(c12, ops.ones_like(x_ok), (one, zero, zero, one), 1)
    best.offer(c21, ops.ones_like(x_ok), (zero, one, one, zero), 2)
    best.offer(c22, ops.ones_like(x_ok), (zero, one, zero, one), 3)

    # Edges: one endpoint pinned, the other point free on its arc.
    def edge(wx, wy, cos0, sin0, ok):
        norm, norm_ok = _safe_norm2(wx, wy, eps)
        c1, c2, inside = _cone_coefficients(wx / norm, wy / norm, cos0, sin0)
        return norm, ops.logical_and(ops.logical_and(ok, norm_ok), inside), c1, c2

    value, feasible, b1, b2 = edge(c11, x1n4, h, sy, y_ok)
    best.offer(value, feasible, (one, zero, b1, b2), 4)
    value, feasible, b1, b2 = edge(c21, x2n4, h, sy, y_ok)
    best.offer(value, feasible, (zero, one, b1, b2), 5)
    value, feasible, a1, a2 = edge(c11, n2y1, g, sx, x_ok)
    best.offer(value, feasible, (a1, a2, one, zero), 6)
    value, feasible, a1, a2 = edge(c12, n2y2, g, sx, x_ok)
    best.offer(value, feasible, (a1, a2, zero, one), 7)

    # Interior: top singular pair of M = [[m00, m01], [m10, m11]]. With E, F, G, H below,
    # M = Rot(phi) diag(Q + R, Q - R) Rot(theta), Q = |E + iH|, R = |F + iG|, and the top left
    # singular vector has angle phi = (arg(F + iG) + arg(E + iH)) / 2: half the angle of z.
    m00, m01, m10, m11 = c11, x1n4, n2y1, n2n4
    e_ = 0.5 * (m00 + m11)
    f_ = 0.5 * (m00 - m11)
    g_ = 0.5 * (m10 + m01)
    h_ = 0.5 * (m10 - m01)
    zr = f_ * e_ - g_ * h_
    zi = f_ * h_ + g_ * e_
    z_abs, z_ok = _safe_norm2(zr, zi, eps * eps)
    # Half-angle direction of z, in its well-conditioned form for each half-plane.
    right = zr >= 0
    hx = ops.where(right, z_abs + zr, zi)
    hy = ops.where(right, zi, z_abs - zr)
    h_norm, h_ok = _safe_norm2(hx, hy, eps * eps)
    ux = hx / h_norm
    uy = hy / h_norm
    # Only the upper half-plane can hold a point of the arc: pick that sign of (u, v).
    flip = ops.logical_or(uy < 0, ops.logical_and(ops.equal(uy, 0), ux < 0))
    ux = ops.where(flip, -ux, ux)
    uy = ops.where(flip, -uy, uy)
    mtu_x = m00 * ux + m10 * uy
    mtu_y = m01 * ux + m11 * uy
    mtu_norm, mtu_ok = _safe_norm2(mtu_x, mtu_y, eps)
    vx = mtu_x / mtu_norm
    vy = mtu_y / mtu_norm
    a1, a2, u_inside = _cone_coefficients(ux, uy, g, sx)
    b1, b2, v_inside = _cone_coefficients(vx, vy, h, sy)
    # u^T M v at the candidate, with u and v held fixed: its gradient is the envelope gradient.
    su, sv = ops.stop_gradient(ux), ops.stop_gradient(uy)
    tu, tv = ops.stop_gradient(vx), ops.stop_gradient(vy)
    value = su * (m00 * tu + m01 * tv) + sv * (m10 * tu + m11 * tv)
    feasible = ops.logical_and(x_ok, y_ok)
    for cond in (z_ok, h_ok, mtu_ok, u_inside, v_inside):
        feasible = ops.logical_and(feasible, cond)
    best.offer(value, feasible, (a1, a2, b1, b2), 8)

    a1, a2, b1, b2 = best.coefficients
    if return_candidates:
        return best.value, a1, a2, b1, b2, best.case, best.offers
    return best.value, a1, a2, b1, b2, best.case


@fill_doc(DOTS=_dots_doc(_ARC_DOT_NAMES))
def arc_similarity_from_dots(x1x2, y1y2, x1y1, x1y2, x2y1, x2y2, return_coefficients=False):
    """Largest dot product between a point on the arc ``x1 -> x2`` and one on ``y1 -> y2``.

    `s = max p1 . p2` over `p1` on the shorter great-circle arc from `x1` to
    `x2` and `p2` on the one from `y1` to `y2`, computed from the dot products
    of the four unit vectors only (Section 3.2 of the LoOp paper, evaluated as
    the best feasible KKT candidate). The closest-point distance is
    `sqrt(2 - 2 s)`.

    Near distance 0 that distance is only as good as the dot products allow:
    `s` carries an absolute error `e` of a few `eps` (about `1e-8` when unit
    vectors normalized in float32 are passed as float64), which is an error
    of up to `sqrt(2 e)` in `sqrt(2 - 2 s)` at touching arcs: about `5e-4` in
    float32, `3e-4` for such float64 inputs, `2e-8` for float64 unit vectors.
    No function of the six dot products can do better, since they carry that
    error themselves; :func:`arc_distance`, which has the vectors, measures
    the distance between the points instead and gives 0 at touching arcs.

    An arc whose sine `sqrt(1 - (x1.x2)^2)` is not above `sqrt(eps)` (when
    `x1.x2 > 0`) or `eps ** 0.25` (when `x1.x2 <= 0`) of the compute dtype is
    reduced to its endpoints: a point for `x1 == x2`, and for `x2 == -x1`
    (geodesic undefined) the better of `x1` and `x2`.

    Args:
        {DOTS}
        return_coefficients: also return the coefficients of the optimal
            points. Defaults to `False`.

    Returns:
        `s`, of the broadcast shape and the widest input float dtype; with
        `return_coefficients=True`, `(s, (a1, a2, b1, b2))` such that
        `p1 = a1 x1 + a2 x2` and `p2 = b1 y1 + b2 y2` are unit vectors on
        their arcs (all coefficients non-negative) with `p1 . p2 = s`.

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021.
    """
    tensors, dtype = _prepare_dots((x1x2, y1y2, x1y1, x1y2, x2y1, x2y2), _ARC_DOT_NAMES)
    s, a1, a2, b1, b2, _ = _arc_solve(*tensors)
    s = ops.cast(s, dtype)
    if not return_coefficients:
        return s
    return s, tuple(ops.cast(c, dtype) for c in (a1, a2, b1, b2))


def _unit_rows(p):
    """``p / ||p||`` along the last axis (a zero vector stays zero, with finite gradients)."""
    tiny = _tiny(p)
    return p * ops.rsqrt(dml.maximum(_dot(p, p), tiny))[..., None]


def _arc_squared_gap(p1, p2):
    """``||p1 / |p1| - p2 / |p2| ||^2`` for points on the arcs, formed from the vectors.

    The difference of the two unit points, not ``2 - 2 p1.p2``: no cancellation at 0,
    so that the error at touching arcs is that of the points (a few ``eps``), not
    ``sqrt`` of the dot products' (``sqrt(eps)``). Normalizing makes the value
    invariant to the scale of the coefficients: with the coefficients held fixed its
    gradient is then the gradient of the optimum over the arcs (envelope theorem, no
    unit-norm constraint left to differentiate), and a rounding error in the inputs'
    norms moves the points along the radius, which does not count.
    """
    diff = _unit_rows(p1) - _unit_rows(p2)
    return _dot(diff, diff)


def _span_coordinates(vectors, like):
    """Coordinates of ``vectors`` in an orthonormal basis of their span.

    ``vectors``: ``[..., D]`` tensors whose leading dimensions broadcast to the shape of
    ``like``, a tensor of their dtype (the early ones may have fewer: their part of the
    work is done at their own shape). Classical Gram-Schmidt with a second
    orthogonalization pass, which keeps the basis orthonormal to rounding even when a
    vector is nearly in the span of the previous ones. Returns one ``like.shape + [k]``
    tensor per vector, ``k = len(vectors)``, the ``i``-th with zeros after position ``i``. Distances between combinations of the
    vectors are those between the same combinations of the coordinates, up to rounding
    of the size of ``eps`` times the vectors' norms: no cancellation at 0. A vector
    (numerically) in the span of the previous ones gets a basis vector made of
    rounding noise: orthogonal to the others where the dimension leaves room, and
    otherwise multiplied only by rounding-sized coordinates.
    """
    tiny = _tiny(vectors[0])
    k = len(vectors)
    basis = []
    coordinates = []
    for i, v in enumerate(vectors):
        r = [None] * k
        w = v
        for _ in range(2):
            for j, q in enumerate(basis):
                c = _dot(q, w)
                r[j] = c if r[j] is None else r[j] + c
                w = w - c[..., None] * q
        n_sq = _dot(w, w)
        ok = n_sq > tiny
        n = ops.sqrt(ops.where(ok, n_sq, ops.ones_like(n_sq)))
        r[i] = ops.where(ok, n, ops.zeros_like(n))
        basis.append(ops.where(ok[..., None], w / n[..., None], ops.zeros_like(w)))
        zero = ops.zeros_like(like)
        coordinates.append(ops.stack([zero if c is None else c + zero for c in r], axis=-1))
    return coordinates


def _refine_on_arcs(x1, x2, y1, y2, coefficients, free_x, free_y, steps=3):
    """Gauss-Newton steps on the distance of the vectors, from a candidate pair of points.

    The candidates of :func:`_arc_solve` come from dot products: where the great
    circles cross at an angle ``phi`` the interior point is located to about
    ``eps / phi^2`` along the arcs (``phi^2 / 2`` is the gap between the singular
    values), which leaves a distance of about ``eps / phi``. Each step linearizes
    ``p1 - p2`` along the unit tangents ``t1``, ``t2`` (formed from ``x2 - x1`` and
    ``y2 - y1``, no cancellation), solves the ``2 x 2`` least-squares problem for the
    angles ``(da, db)`` (only the free ones: ``free_x``, ``free_y``), and rotates the
    points along their great circles. Inputs carry no gradient.

    Returns:
        ``(a1, a2, b1, b2)``: the new coefficients; a point may have left its arc
        (a negative coefficient), which the caller checks with :func:`_on_arcs`.
    """
    a1, a2, b1, b2 = coefficients
    u = x2 - x1
    v = y2 - y1
    eps, tiny = _eps(x1), _tiny(x1)
    short = (16.0 * eps) ** 2
    zero = ops.zeros_like(a1)
    for _ in range(steps):
        # Coefficients rescaled to unit points.
        p1 = a1[..., None] * x1 + a2[..., None] * x2
        p2 = b1[..., None] * y1 + b2[..., None] * y2
        r = ops.rsqrt(dml.maximum(_dot(p1, p1), tiny))
        a1, a2, p1 = a1 * r, a2 * r, p1 * r[..., None]
        r = ops.rsqrt(dml.maximum(_dot(p2, p2), tiny))
        b1, b2, p2 = b1 * r, b2 * r, p2 * r[..., None]
        # Tangents t = u - (u.p) p, as coefficients on the endpoints: (-1 - k a1, 1 - k a2).
        k = _dot(u, p1)
        m = _dot(v, p2)
        t1 = u - k[..., None] * p1
        t2 = v - m[..., None] * p2
        n1_sq = _dot(t1, t1)
        n2_sq = _dot(t2, t2)
        # A chord within rounding of 0 (an arc shorter than about 16 eps, e.g. of two equal
        # vectors) has no usable tangent: such a point stays where it is.
        ok1 = ops.logical_and(free_x, n1_sq > short)
        ok2 = ops.logical_and(free_y, n2_sq > short)
        n1 = ops.sqrt(ops.where(ok1, n1_sq, ops.ones_like(n1_sq)))
        n2 = ops.sqrt(ops.where(ok2, n2_sq, ops.ones_like(n2_sq)))
        delta = p1 - p2
        r1 = _dot(delta, t1) / n1
        r2 = _dot(delta, t2) / n2
        c = _dot(t1, t2) / (n1 * n2)
        # min |delta + da t1 - db t2|^2: [[1, -c], [-c, 1]] (da, db) = (-r1, r2), or one
        # unknown. Tangent great circles (det = 0) have no unique solution: no step.
        det = 1.0 - c * c
        both = ops.logical_and(ops.logical_and(ok1, ok2), det > eps)
        det_s = ops.where(both, det, ops.ones_like(det))
        only_x = ops.logical_and(ok1, ops.logical_not(ok2))
        only_y = ops.logical_and(ok2, ops.logical_not(ok1))
        da = ops.where(both, (c * r2 - r1) / det_s, ops.where(only_x, -r1, zero))
        db = ops.where(both, (r2 - c * r1) / det_s, ops.where(only_y, r2, zero))
        (ca, sa), (cb, sb) = dml.cos_sin(da), dml.cos_sin(db)
        sa, sb = sa / n1, sb / n2
        a1, a2 = ca * a1 + sa * (-1.0 - k * a1), ca * a2 + sa * (1.0 - k * a2)
        b1, b2 = cb * b1 + sb * (-1.0 - m * b1), cb * b2 + sb * (1.0 - m * b2)
    return a1, a2, b1, b2


def _on_arcs(a1, a2, b1, b2):
    """Whether ``a1 x1 + a2 x2`` and ``b1 y1 + b2 y2`` are (directions of) points on the arcs.

    Non-negative coefficients, not both 0 on either arc, all finite. (Exactly antipodal
    arcs, where a positive combination can vanish, only have endpoint candidates.)
    """
    coefficients = ops.stack([a1, a2, b1, b2], axis=-1)
    ok = ops.all(ops.logical_and(coefficients >= 0, ops.isfinite(coefficients)),
                       axis=-1)
    return ops.logical_and(ok, ops.logical_and(a1 + a2 > 0, b1 + b2 > 0))


@fill_doc(POINTS=_POINTS_DOC)
def arc_distance(x1, x2, y1, y2, return_points=False):
    """Minimum Euclidean distance between the great-circle arcs ``x1 -> x2`` and ``y1 -> y2``.

    `d = min ||p1 - p2||` over `p1` on the shorter arc from `x1` to `x2` and
    `p2` on the shorter arc from `y1` to `y2`. The nine KKT candidates of
    :func:`arc_similarity_from_dots` (from the dot products) are compared by
    their distance measured from the vectors, the best one is refined against
    the vectors (Gauss-Newton steps along the great circles, kept if they
    stay on the arcs and get closer), and the result is `||p1 - p2||` of the
    chosen unit points, formed from the vectors; not `sqrt(2 - 2 s)`. Every
    candidate is a pair of points on the arcs, so the result is attained. The
    square root is :func:`tfdml.ops.safe_sqrt`: 0 with a zero gradient where
    the squared distance is not above `1e-12`, so distances up to `1e-6`
    read as 0.

    Accuracy near 0. `sqrt(2 - 2 s)` cancels: `s` is a dot product known to
    an absolute error `e` of a few `eps` (about `1e-8` for unit vectors
    normalized in float32 and passed as float64), which is an error
    `sqrt(2 e)` at `d = 0`: `5e-4` in float32, `3e-4` for such float64
    inputs, for arcs that share an endpoint or cross. Measured between the
    points, the error is the points' own:

    * arcs that share an endpoint (the same vector) give exactly 0;
    * arcs that cross, or with an endpoint on the other arc, give 0 (below
      `1e-6`) in float64, and in float32 when their great circles meet at an
      angle `phi` above about 0.01 rad. For shallower crossings the float32
      error is at most about `eps / phi` (measured: `1e-5` at `phi = 1e-3`,
      `1e-4` at `1e-4`): the crossing is only located from the dot products
      to about `eps / phi^2` along the arcs there, and the refinement's
      `2 x 2` system has determinant `sin(phi)^2`;
    * at a small non-zero distance `d` is accurate to the rounding of the
      inputs (measured: within `1e-7` in float32 for `d` from `1e-5` to
      `0.1`, where `sqrt(2 - 2 s)` is off by up to `5e-4`).

    The candidates are compared and refined in coordinates of an orthonormal
    basis of the span of the four vectors (Gram-Schmidt with a second pass,
    so that it stays orthonormal when the vectors are nearly dependent, as
    at a shared endpoint): several times the `[..., D]` work of the dot
    products (measured 5 to 10 times slower on a CPU than
    :func:`arc_similarity_from_dots` on the same vectors). Use that function
    where speed matters more than distances below `sqrt(eps)`.

    Gradients: the value is `||p1 / ||p1|| - p2 / ||p2|| ||^2` at the chosen
    coefficients held fixed (`p1 = a1 x1 + a2 x2`, `p2 = b1 y1 + b2 y2`).
    Normalizing removes the unit-norm constraint, so by the envelope theorem
    this is the gradient of the optimum; it is finite everywhere and 0 at
    touching arcs. The returned points are unit vectors and carry the
    gradients of the coefficients of :func:`arc_similarity_from_dots`.

    Args:
        x1: `[..., D]` unit vectors (assumed L2-normalized), first endpoint of
            the first arc. Leading dimensions of all arguments broadcast.
        x2: `[..., D]` unit vectors, second endpoint of the first arc.
        y1: `[..., D]` unit vectors, first endpoint of the second arc.
        y2: `[..., D]` unit vectors, second endpoint of the second arc.
        return_points: also return the closest points. Defaults to `False`.

    {POINTS}

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021.
    """
    (x1, x2, y1, y2), dtype = _endpoints(x1, x2, y1, y2)
    dots, _ = _prepare_dots((_dot(x1, x2), _dot(y1, y2), _dot(x1, y1), _dot(x1, y2),
                             _dot(x2, y1), _dot(x2, y2)), _ARC_DOT_NAMES)
    *_, candidates = _arc_solve(*dots, return_candidates=True)
    x_ok, y_ok = _arc_sine(dots[0])[2], _arc_sine(dots[1])[2]

    def points(a1, a2, b1, b2, e1, e2, f1, f2):
        return a1[..., None] * e1 + a2[..., None] * e2, b1[..., None] * f1 + b2[..., None] * f2

    # Candidates and refinements are compared in 4-D coordinates of the span of the
    # inputs (cheap, and as accurate as the vectors); the distance of the one chosen is
    # then measured from the vectors themselves.
    span = _span_coordinates([ops.stop_gradient(t) for t in (x1, x2, y1, y2)],
                             dots[0])

    def gap(coefficients):
        return _arc_squared_gap(*points(*coefficients, *span))

    # The candidates compared by their distance, not by their similarity from the dot
    # products: at touching arcs several of them are within rounding of s = 1 (an
    # endpoint shared, or near the crossing).
    best = None
    for feasible, coefficients, case in candidates:
        fixed = tuple(ops.stop_gradient(c) for c in coefficients)
        if best is None:  # corner_x1_y1, always feasible
            best = _Best(gap(fixed), coefficients, case, maximize=False)
        else:
            best.offer(gap(fixed), ops.logical_and(feasible, _on_arcs(*fixed)), coefficients,
                       case)
    # The best one refined: its own free points (edge_y1, edge_y2 and interior move p1;
    # edge_x1, edge_x2 and interior move p2), and both points (a crossing near an
    # endpoint, where an edge or a corner may have come first).
    start = tuple(best.coefficients)
    fixed = tuple(ops.stop_gradient(c) for c in start)

    def case_in(*names):
        return ops.any(
            ops.stack([ops.equal(best.case, _ARC_CASES.index(n)) for n in names], -1), -1)

    own_x = ops.logical_and(x_ok, case_in("edge_y1", "edge_y2", "interior"))
    own_y = ops.logical_and(y_ok, case_in("edge_x1", "edge_x2", "interior"))
    for free_x, free_y in ((own_x, own_y), (x_ok, y_ok)):
        refined = _refine_on_arcs(*span, fixed, free_x, free_y)
        # The returned points keep the gradients of the coefficients they started from.
        moved = tuple(c + ops.stop_gradient(r - c) for c, r in zip(start, refined, strict=True))
        best.offer(gap(refined), _on_arcs(*refined), moved, _ARC_CASES.index("interior"))
    chosen = tuple(ops.stop_gradient(c) for c in best.coefficients)
    squared = _arc_squared_gap(*points(*chosen, x1, x2, y1, y2))
    distance = ops.cast(dml.safe_sqrt(dml.maximum(squared, ops.zeros_like(squared))), dtype)
    if not return_points:
        return distance
    p1, p2 = (_unit_rows(p) for p in points(*best.coefficients, x1, x2, y1, y2))
    return distance, (ops.cast(p1, dtype), ops.cast(p2, dtype))


# -- segments --------------------------------------------------------------------------------------


def _segment_solve(uu, vv, uv, uw, vw, ww):
    """Closed-form minimum of ``f(s, t) = ||w + s u - t v||^2`` over ``[0, 1]^2``.

    ``u = x2 - x1``, ``v = y2 - y1``, ``w = x1 - y1``; the arguments are their dot
    products. ``f`` is a convex quadratic: its minimum is the stationary point when
    that lies in the box, else the best of the four edges, each a clamped 1-D
    quadratic. A stationary point outside the box is clamped and evaluated too, so
    every candidate value is attained and the minimum is never underestimated.
    Segments with ``|u|^2 <= eps^2 (|u|^2 + |v|^2 + |w|^2)`` are points, and
    segments with ``uu vv - uv^2 <= eps uu vv`` are parallel (no stationary point).

    Returns:
        ``(f_min, s, t, case)``; ``f_min`` is evaluated at ``(s, t)`` held fixed
        (envelope gradient), ``case`` indexes ``_SEGMENT_CASES``.
    """
    one = ops.ones_like(uu)
    zero = ops.zeros_like(uu)
    eps = _eps(uu)
    uu = dml.maximum(uu, 0.0)
    vv = dml.maximum(vv, 0.0)
    scale = uu + vv + dml.maximum(ww, 0.0)
    u_ok = uu > eps * eps * scale
    v_ok = vv > eps * eps * scale
    uu_s = ops.where(u_ok, uu, one)
    vv_s = ops.where(v_ok, vv, one)

    def f(s, t):
        s = ops.stop_gradient(s)
        t = ops.stop_gradient(t)
        return ww + s * s * uu + t * t * vv + 2.0 * s * uw - 2.0 * t * vw - 2.0 * s * t * uv

    def clamp(x):
        return dml.clip(x, 0.0, 1.0)

    den = uu * vv - uv * uv
    den_ok = ops.logical_and(ops.logical_and(u_ok, v_ok), den > eps * uu * vv)

    def clamped_ratio(num):
        """``clip(num / den, 0, 1)`` where ``den_ok``, else 0.

        The quotient is formed with ``den`` only where it is not clamped (``den > 0``
        there, so the clamp follows from the signs of ``num`` and ``den - num``), so that
        its zero gradient stays finite: for a tiny ``den`` JAX differentiates
        ``num / den`` as ``num * den**-2``, which overflows.
        """
        below = num < 0
        above = num > den
        den_s = ops.where(ops.logical_and(den_ok, ops.logical_not(
            ops.logical_or(below, above))), den, one)
        ratio = ops.where(below, zero, ops.where(above, one, num / den_s))
        return ops.where(den_ok, ratio, zero)

    s_i = clamped_ratio(uv * vw - vv * uw)
    t_i = clamped_ratio(uu * vw - uv * uw)
    best = _Best(f(s_i, t_i), (s_i, t_i, zero, zero), 4, maximize=False)
    # The interior is only meaningful when the stationary point exists; otherwise it is
    # replaced by any edge (all of them are at least as good as the corner (0, 0)).
    best.value = ops.where(den_ok, best.value, ops.full_like(uu, np.inf))

    always = ops.ones_like(u_ok)
    t0 = ops.where(v_ok, clamp(vw / vv_s), zero)
    best.offer(f(zero, t0), always, (zero, t0, zero, zero), 0)
    t1 = ops.where(v_ok, clamp((vw + uv) / vv_s), zero)
    best.offer(f(one, t1), always, (one, t1, zero, zero), 1)
    s0 = ops.where(u_ok, clamp(-uw / uu_s), zero)
    best.offer(f(s0, zero), always, (s0, zero, zero, zero), 2)
    s1 = ops.where(u_ok, clamp((uv - uw) / uu_s), zero)
    best.offer(f(s1, one), always, (s1, one, zero, zero), 3)
    s, t = best.coefficients[:2]
    return dml.maximum(best.value, zero), s, t, best.case


@fill_doc(DOTS=_dots_doc(_SEGMENT_DOT_NAMES))
def segment_squared_distance_from_dots(
    x1x1, x2x2, x1x2, y1y1, y2y2, y1y2, x1y1, x1y2, x2y1, x2y2, return_coefficients=False
):
    """Squared minimum distance between the segments ``[x1, x2]`` and ``[y1, y2]``.

    `min ||p1 - p2||^2` over `p1 = x1 + s (x2 - x1)` and
    `p2 = y1 + t (y2 - y1)`, `s, t` in `[0, 1]` (the variant of the LoOp
    paper without l2-normalization, Section 4.2 of its supplementary),
    computed from the ten dot products of the four vectors: the stationary
    point of the quadratic when it lies in the unit square, else the best of
    the four edges (each a clamped 1-D quadratic). Parallel and zero-length
    segments are handled without division by zero.

    The differences `x2 - x1` etc. are formed from dot products, so the result
    carries a rounding error of about `eps` times the squared norms of the
    inputs: its square root is off by about `sqrt(eps)` times the norms at
    intersecting segments (`3e-4` to `9e-4` in float32 for norms near 1).
    :func:`segment_distance` works from the vectors and avoids it.

    Args:
        {DOTS}
        return_coefficients: also return the coefficients of the closest
            points. Defaults to `False`.

    Returns:
        The squared distance (non-negative), of the broadcast shape; with
        `return_coefficients=True`, `(squared_distance, (a1, a2, b1, b2))`
        with `p1 = a1 x1 + a2 x2`, `p2 = b1 y1 + b2 y2`, `a1 = 1 - s`,
        `a2 = s`, `b1 = 1 - t`, `b2 = t`.

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021 (supplementary, Section 4.2).
    """
    tensors, dtype = _prepare_dots(
        (x1x1, x2x2, x1x2, y1y1, y2y2, y1y2, x1y1, x1y2, x2y1, x2y2), _SEGMENT_DOT_NAMES
    )
    x1x1, x2x2, x1x2, y1y1, y2y2, y1y2, x1y1, x1y2, x2y1, x2y2 = tensors
    uu = x2x2 - 2.0 * x1x2 + x1x1
    vv = y2y2 - 2.0 * y1y2 + y1y1
    uv = x2y2 - x2y1 - x1y2 + x1y1
    uw = x1x2 - x2y1 - x1x1 + x1y1
    vw = x1y2 - y1y2 - x1y1 + y1y1
    ww = x1x1 - 2.0 * x1y1 + y1y1
    sq, s, t, _ = _segment_solve(uu, vv, uv, uw, vw, ww)
    sq = ops.cast(sq, dtype)
    if not return_coefficients:
        return sq
    return sq, tuple(ops.cast(c, dtype) for c in (1.0 - s, s, 1.0 - t, t))


@fill_doc(POINTS=_POINTS_DOC)
def segment_distance(x1, x2, y1, y2, return_points=False):
    """Minimum Euclidean distance between the segments ``[x1, x2]`` and ``[y1, y2]``.

    `d = min ||p1 - p2||` over `p1 = x1 + s (x2 - x1)` and
    `p2 = y1 + t (y2 - y1)`, `s, t` in `[0, 1]` (LoOp without
    l2-normalization), solved as in
    :func:`segment_squared_distance_from_dots` but from the differences of the
    vectors themselves (no cancellation of large dot products). The distance
    is measured between the two closest points with a guarded square root
    (:func:`tfdml.ops.safe_sqrt`: 0 with a zero gradient for intersecting
    segments; squared distances below `1e-12` count as 0).

    Args:
        x1: `[..., D]` vectors, first endpoint of the first segment. Leading
            dimensions of all arguments broadcast.
        x2: `[..., D]` vectors, second endpoint of the first segment.
        y1: `[..., D]` vectors, first endpoint of the second segment.
        y2: `[..., D]` vectors, second endpoint of the second segment.
        return_points: also return the closest points. Defaults to `False`.

    {POINTS}

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021 (supplementary, Section 4.2).
    """
    (x1, x2, y1, y2), dtype = _endpoints(x1, x2, y1, y2)
    u = x2 - x1
    v = y2 - y1
    w = x1 - y1
    _, s, t, _ = _segment_solve(_dot(u, u), _dot(v, v), _dot(u, v), _dot(u, w), _dot(v, w),
                                _dot(w, w))
    # The parameters are held fixed: the distance at fixed (s, t) has the envelope gradient.
    s_fixed = ops.stop_gradient(s)[..., None]
    t_fixed = ops.stop_gradient(t)[..., None]
    diff = w + s_fixed * u - t_fixed * v
    distance = ops.cast(dml.safe_sqrt(_dot(diff, diff)), dtype)
    if not return_points:
        return distance
    p1 = x1 + s[..., None] * u
    p2 = y1 + t[..., None] * v
    return distance, (ops.cast(p1, dtype), ops.cast(p2, dtype))
