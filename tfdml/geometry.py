"""Closest points between two great-circle arcs, or between two segments.

These are the geometric kernels of LoOp: for a pair of positives ``(x1, x2)``
and a pair of negatives ``(y1, y2)`` of another class, the points ``p1`` on the
shorter great-circle arc ``x1 -> x2`` and ``p2`` on the arc ``y1 -> y2`` that
are closest to each other (Section 3 of the paper), or, without
l2-normalization, on the straight segments (Section 4.2 of its supplementary).

Both problems are solved in closed form from dot products only, so that a loss
can evaluate them on ``B x B`` grids of dot products without a ``D`` factor in
memory. Every function is elementwise over broadcastable inputs, has no
data-dependent shapes and compiles under ``tf.function(jit_compile=True)``.

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

Gradients. The value's gradient with respect to the dot products is the one of
the selected candidate, which by the envelope theorem is the gradient of the
optimum; degenerate branches are masked with the double-``tf.where`` pattern,
so values and gradients are finite for every input. Distances use
:func:`tfdml.ops.safe_sqrt` (value and gradient 0 at distance 0).

Half-precision inputs are computed in float32 and the results cast back.

Reference:
    Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings for
    Deep Metric Learning", ICCV 2021.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdml import ops

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
# Segments: the four edges (s = 0, s = 1, t = 0, t = 1; corners included) and the interior.
_SEGMENT_CASES = ("edge_x1", "edge_x2", "edge_y1", "edge_y2", "interior")


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
    eps = float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).eps)
    return float(np.sqrt(eps)), float(eps**0.25)


def _common_float_dtype(values) -> tf.DType:
    """The widest floating dtype among the arguments that carry one (float32 by default)."""
    dtypes = []
    for v in values:
        dt = getattr(v, "dtype", None)
        if dt is None:
            continue
        dt = tf.as_dtype(dt)
        if dt.is_floating:
            dtypes.append(dt)
    if not dtypes:
        return tf.float32
    for wide in (tf.float64, tf.float32):
        if wide in dtypes:
            return wide
    return dtypes[0]


def _prepare_dots(values, names):
    """Converts dot products to one compute dtype and a common (broadcast) shape."""
    dtype = _common_float_dtype(values)
    tensors = []
    for v, name in zip(values, names, strict=True):
        t = tf.convert_to_tensor(v)
        if not (t.dtype.is_floating or t.dtype.is_integer):
            raise ValueError(
                f"`{name}` must be a real number tensor. Received: {name}.dtype={t.dtype.name}"
            )
        tensors.append(tf.cast(t, ops.compute_dtype(dtype)))
    shape = tf.shape(tensors[0])
    for t in tensors[1:]:
        shape = tf.broadcast_dynamic_shape(shape, tf.shape(t))
    tensors = [tf.broadcast_to(t, shape) for t in tensors]
    return tensors, dtype


def _check_vectors(values, names):
    """Checks ``[..., D]`` inputs: float, rank >= 1, same last dimension, broadcastable."""
    tensors = []
    first = tf.convert_to_tensor(values[0])
    dtype = first.dtype
    if not dtype.is_floating:
        raise ValueError(
            f"`{names[0]}` must have a floating dtype. Received: {names[0]}.dtype={dtype.name}"
        )
    for v, name in zip(values, names, strict=True):
        t = tf.convert_to_tensor(v)
        if not t.dtype.is_floating:
            raise ValueError(
                f"`{name}` must have a floating dtype. Received: {name}.dtype={t.dtype.name}"
            )
        t = tf.cast(t, dtype)
        if t.shape.rank is not None and t.shape.rank < 1:
            raise ValueError(
                f"`{name}` must be a tensor of vectors of shape [..., D] (rank >= 1). "
                f"Received: {name}.shape={t.shape}"
            )
        tensors.append(t)
    depth = tensors[0].shape[-1] if tensors[0].shape.rank is not None else None
    lead = tensors[0].shape[:-1] if tensors[0].shape.rank is not None else None
    for t, name in zip(tensors[1:], names[1:], strict=True):
        if t.shape.rank is None:
            continue
        d = t.shape[-1]
        if depth is not None and d is not None and d != depth:
            raise ValueError(
                f"`{name}` must have the same last dimension as `{names[0]}`. "
                f"Received: {names[0]}.shape={tensors[0].shape}, {name}.shape={t.shape}"
            )
        if lead is not None:
            try:
                lead = tf.broadcast_static_shape(lead, t.shape[:-1])
            except ValueError as err:
                raise ValueError(
                    f"The leading dimensions of `{name}` do not broadcast with those of the "
                    f"previous arguments. Received: {name}.shape={t.shape}"
                ) from err
    return tensors, dtype


def _dot(a, b):
    return tf.reduce_sum(a * b, axis=-1)


def _safe_norm2(x, y, tiny):
    """``(sqrt(x^2 + y^2), ok)``; where the norm is not above ``tiny`` it is 1 (with no gradient)."""
    sq = x * x + y * y
    ok = sq > tiny * tiny
    return tf.sqrt(tf.where(ok, sq, tf.ones_like(sq))), ok


class _Best:
    """Running arg-best over candidates: value, four coefficients and the candidate index."""

    def __init__(self, value, coefficients, case, maximize):
        self.value = value
        self.coefficients = list(coefficients)
        self.case = tf.fill(tf.shape(value), tf.constant(case, tf.int32))
        self.maximize = maximize

    def offer(self, value, feasible, coefficients, case):
        better = value > self.value if self.maximize else value < self.value
        take = tf.logical_and(feasible, better)
        self.value = tf.where(take, value, self.value)
        self.coefficients = [
            tf.where(take, c, b) for c, b in zip(coefficients, self.coefficients, strict=True)
        ]
        self.case = tf.where(take, tf.constant(case, tf.int32), self.case)


# -- arcs ------------------------------------------------------------------------------------------


def _cone_coefficients(vx, vy, cos0, sin0):
    """Coefficients ``(c1, c2)`` of the unit direction ``(vx, vy)`` on the endpoints of an arc.

    ``v = cos(b) e1 + sin(b) e2`` is ``c1 * end1 + c2 * end2`` with
    ``c1 = sin(b0 - b) / sin(b0)`` and ``c2 = sin(b) / sin(b0)``; ``v`` lies on the arc
    (``0 <= b <= b0``) exactly when both numerators are non-negative.
    """
    num1 = sin0 * vx - cos0 * vy
    num2 = vy
    inside = tf.logical_and(num1 >= 0, num2 >= 0)
    return num1 / sin0, num2 / sin0, inside


def _arc_solve(g, h, c11, c12, c21, c22):
    """Closed-form maximum of ``p1.p2`` over two arcs, from the six dot products.

    Args:
        g, h: ``x1.x2`` and ``y1.y2``.
        c11, c12, c21, c22: ``x1.y1``, ``x1.y2``, ``x2.y1``, ``x2.y2``.
        All of one float dtype and one shape.

    Returns:
        ``(s, a1, a2, b1, b2, case)``: the maximum, the coefficients of
        ``p1 = a1 x1 + a2 x2`` and ``p2 = b1 y1 + b2 y2``, and the index into
        ``_ARC_CASES`` of the candidate that attains it.
    """
    dtype = g.dtype
    one = tf.ones_like(g)
    zero = tf.zeros_like(g)
    eps = float(np.finfo(dtype.as_numpy_dtype).eps)
    near, antipodal = _degenerate_sines(dtype)

    g = tf.clip_by_value(g, -1.0, 1.0)
    h = tf.clip_by_value(h, -1.0, 1.0)
    sx_sq = tf.maximum((1.0 - g) * (1.0 + g), 0.0)
    sy_sq = tf.maximum((1.0 - h) * (1.0 + h), 0.0)
    near_sq = tf.fill(tf.shape(g), tf.constant(near * near, dtype))
    antipodal_sq = tf.fill(tf.shape(g), tf.constant(antipodal * antipodal, dtype))
    x_ok = sx_sq > tf.where(g > 0, near_sq, antipodal_sq)
    y_ok = sy_sq > tf.where(h > 0, near_sq, antipodal_sq)
    sx = tf.sqrt(tf.where(x_ok, sx_sq, one))
    sy = tf.sqrt(tf.where(y_ok, sy_sq, one))

    # Products with the second Gram-Schmidt vectors n2 = (x2 - g x1) / sx, n4 = (y2 - h y1) / sy.
    x1n4 = (c12 - h * c11) / sy
    x2n4 = (c22 - h * c21) / sy
    n2y1 = (c21 - g * c11) / sx
    n2y2 = (c22 - g * c12) / sx
    n2n4 = ((c22 - h * c21) - g * (c12 - h * c11)) / (sx * sy)

    # Corners: always feasible, computed from the endpoints themselves.
    best = _Best(c11, (one, zero, one, zero), 0, maximize=True)
    best.offer(c12, tf.ones_like(x_ok), (one, zero, zero, one), 1)
    best.offer(c21, tf.ones_like(x_ok), (zero, one, one, zero), 2)
    best.offer(c22, tf.ones_like(x_ok), (zero, one, zero, one), 3)

    # Edges: one endpoint pinned, the other point free on its arc.
    def edge(wx, wy, cos0, sin0, ok):
        norm, norm_ok = _safe_norm2(wx, wy, eps)
        c1, c2, inside = _cone_coefficients(wx / norm, wy / norm, cos0, sin0)
        return norm, tf.logical_and(tf.logical_and(ok, norm_ok), inside), c1, c2

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
    hx = tf.where(right, z_abs + zr, zi)
    hy = tf.where(right, zi, z_abs - zr)
    h_norm, h_ok = _safe_norm2(hx, hy, eps * eps)
    ux = hx / h_norm
    uy = hy / h_norm
    # Only the upper half-plane can hold a point of the arc: pick that sign of (u, v).
    flip = tf.logical_or(uy < 0, tf.logical_and(tf.equal(uy, 0), ux < 0))
    ux = tf.where(flip, -ux, ux)
    uy = tf.where(flip, -uy, uy)
    mtu_x = m00 * ux + m10 * uy
    mtu_y = m01 * ux + m11 * uy
    mtu_norm, mtu_ok = _safe_norm2(mtu_x, mtu_y, eps)
    vx = mtu_x / mtu_norm
    vy = mtu_y / mtu_norm
    a1, a2, u_inside = _cone_coefficients(ux, uy, g, sx)
    b1, b2, v_inside = _cone_coefficients(vx, vy, h, sy)
    # u^T M v at the candidate, with u and v held fixed: its gradient is the envelope gradient.
    su, sv = tf.stop_gradient(ux), tf.stop_gradient(uy)
    tu, tv = tf.stop_gradient(vx), tf.stop_gradient(vy)
    value = su * (m00 * tu + m01 * tv) + sv * (m10 * tu + m11 * tv)
    feasible = tf.logical_and(x_ok, y_ok)
    for cond in (z_ok, h_ok, mtu_ok, u_inside, v_inside):
        feasible = tf.logical_and(feasible, cond)
    best.offer(value, feasible, (a1, a2, b1, b2), 8)

    a1, a2, b1, b2 = best.coefficients
    return best.value, a1, a2, b1, b2, best.case


def arc_similarity_from_dots(x1x2, y1y2, x1y1, x1y2, x2y1, x2y2, return_coefficients=False):
    """Largest dot product between a point on the arc ``x1 -> x2`` and one on ``y1 -> y2``.

    `s = max p1 . p2` over `p1` on the shorter great-circle arc from `x1` to
    `x2` and `p2` on the one from `y1` to `y2`, computed from the dot products
    of the four unit vectors only (Section 3.2 of the LoOp paper, evaluated as
    the best feasible KKT candidate). The closest-point distance is
    `sqrt(2 - 2 s)`.

    An arc whose sine `sqrt(1 - (x1.x2)^2)` is not above `sqrt(eps)` (when
    `x1.x2 > 0`) or `eps ** 0.25` (when `x1.x2 <= 0`) of the compute dtype is
    reduced to its endpoints: a point for `x1 == x2`, and for `x2 == -x1`
    (geodesic undefined) the better of `x1` and `x2`.

    Args:
        x1x2: dot product `x1 . x2`. Any shape; all arguments broadcast.
        y1y2: dot product `y1 . y2`.
        x1y1: dot product `x1 . y1`.
        x1y2: dot product `x1 . y2`.
        x2y1: dot product `x2 . y1`.
        x2y2: dot product `x2 . y2`.
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
    names = ("x1x2", "y1y2", "x1y1", "x1y2", "x2y1", "x2y2")
    tensors, dtype = _prepare_dots((x1x2, y1y2, x1y1, x1y2, x2y1, x2y2), names)
    s, a1, a2, b1, b2, _ = _arc_solve(*tensors)
    s = tf.cast(s, dtype)
    if not return_coefficients:
        return s
    return s, tuple(tf.cast(c, dtype) for c in (a1, a2, b1, b2))


def arc_distance(x1, x2, y1, y2, return_points=False):
    """Minimum Euclidean distance between the great-circle arcs ``x1 -> x2`` and ``y1 -> y2``.

    `d = min ||p1 - p2|| = sqrt(2 - 2 s)` with `s` from
    :func:`arc_similarity_from_dots`, over `p1` on the shorter arc from `x1`
    to `x2` and `p2` on the shorter arc from `y1` to `y2`. The square root is
    :func:`tfdml.ops.safe_sqrt`: the distance of intersecting arcs is 0 with a
    zero gradient (squared distances below `1e-12` count as 0).

    Args:
        x1: `[..., D]` unit vectors (assumed L2-normalized), first endpoint of
            the first arc. Leading dimensions of all arguments broadcast.
        x2: `[..., D]` unit vectors, second endpoint of the first arc.
        y1: `[..., D]` unit vectors, first endpoint of the second arc.
        y2: `[..., D]` unit vectors, second endpoint of the second arc.
        return_points: also return the closest points. Defaults to `False`.

    Returns:
        The distances, of the broadcast leading shape; with
        `return_points=True`, `(distance, (p1, p2))` with `p1`, `p2` of shape
        `[..., D]`.

    Raises:
        ValueError: if an argument is not a floating tensor of rank >= 1, or
            its last dimension differs from that of `x1`.

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021.
    """
    (x1, x2, y1, y2), dtype = _check_vectors((x1, x2, y1, y2), ("x1", "x2", "y1", "y2"))
    cdtype = ops.compute_dtype(dtype)
    x1, x2, y1, y2 = (tf.cast(t, cdtype) for t in (x1, x2, y1, y2))
    s, (a1, a2, b1, b2) = arc_similarity_from_dots(
        _dot(x1, x2), _dot(y1, y2), _dot(x1, y1), _dot(x1, y2), _dot(x2, y1), _dot(x2, y2),
        return_coefficients=True,
    )
    sq = tf.maximum(2.0 - 2.0 * s, tf.zeros_like(s))
    distance = tf.cast(ops.safe_sqrt(sq), dtype)
    if not return_points:
        return distance
    p1 = a1[..., None] * x1 + a2[..., None] * x2
    p2 = b1[..., None] * y1 + b2[..., None] * y2
    return distance, (tf.cast(p1, dtype), tf.cast(p2, dtype))


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
    dtype = uu.dtype
    one = tf.ones_like(uu)
    zero = tf.zeros_like(uu)
    eps = float(np.finfo(dtype.as_numpy_dtype).eps)
    uu = tf.maximum(uu, 0.0)
    vv = tf.maximum(vv, 0.0)
    scale = uu + vv + tf.maximum(ww, 0.0)
    u_ok = uu > eps * eps * scale
    v_ok = vv > eps * eps * scale
    uu_s = tf.where(u_ok, uu, one)
    vv_s = tf.where(v_ok, vv, one)

    def f(s, t):
        s = tf.stop_gradient(s)
        t = tf.stop_gradient(t)
        return ww + s * s * uu + t * t * vv + 2.0 * s * uw - 2.0 * t * vw - 2.0 * s * t * uv

    def clamp(x):
        return tf.clip_by_value(x, 0.0, 1.0)

    den = uu * vv - uv * uv
    den_ok = tf.logical_and(tf.logical_and(u_ok, v_ok), den > eps * uu * vv)
    den_s = tf.where(den_ok, den, one)
    s_i = tf.where(den_ok, clamp((uv * vw - vv * uw) / den_s), zero)
    t_i = tf.where(den_ok, clamp((uu * vw - uv * uw) / den_s), zero)
    best = _Best(f(s_i, t_i), (s_i, t_i, zero, zero), 4, maximize=False)
    # The interior is only meaningful when the stationary point exists; otherwise it is
    # replaced by any edge (all of them are at least as good as the corner (0, 0)).
    best.value = tf.where(den_ok, best.value, tf.fill(tf.shape(uu), tf.constant(np.inf, dtype)))

    always = tf.ones_like(u_ok)
    t0 = tf.where(v_ok, clamp(vw / vv_s), zero)
    best.offer(f(zero, t0), always, (zero, t0, zero, zero), 0)
    t1 = tf.where(v_ok, clamp((vw + uv) / vv_s), zero)
    best.offer(f(one, t1), always, (one, t1, zero, zero), 1)
    s0 = tf.where(u_ok, clamp(-uw / uu_s), zero)
    best.offer(f(s0, zero), always, (s0, zero, zero, zero), 2)
    s1 = tf.where(u_ok, clamp((uv - uw) / uu_s), zero)
    best.offer(f(s1, one), always, (s1, one, zero, zero), 3)
    s, t = best.coefficients[:2]
    return tf.maximum(best.value, zero), s, t, best.case


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
    inputs; :func:`segment_distance` works from the vectors and avoids it.

    Args:
        x1x1: dot product `x1 . x1`. Any shape; all arguments broadcast.
        x2x2: dot product `x2 . x2`.
        x1x2: dot product `x1 . x2`.
        y1y1: dot product `y1 . y1`.
        y2y2: dot product `y2 . y2`.
        y1y2: dot product `y1 . y2`.
        x1y1: dot product `x1 . y1`.
        x1y2: dot product `x1 . y2`.
        x2y1: dot product `x2 . y1`.
        x2y2: dot product `x2 . y2`.
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
    names = ("x1x1", "x2x2", "x1x2", "y1y1", "y2y2", "y1y2", "x1y1", "x1y2", "x2y1", "x2y2")
    tensors, dtype = _prepare_dots(
        (x1x1, x2x2, x1x2, y1y1, y2y2, y1y2, x1y1, x1y2, x2y1, x2y2), names
    )
    x1x1, x2x2, x1x2, y1y1, y2y2, y1y2, x1y1, x1y2, x2y1, x2y2 = tensors
    uu = x2x2 - 2.0 * x1x2 + x1x1
    vv = y2y2 - 2.0 * y1y2 + y1y1
    uv = x2y2 - x2y1 - x1y2 + x1y1
    uw = x1x2 - x2y1 - x1x1 + x1y1
    vw = x1y2 - y1y2 - x1y1 + y1y1
    ww = x1x1 - 2.0 * x1y1 + y1y1
    sq, s, t, _ = _segment_solve(uu, vv, uv, uw, vw, ww)
    sq = tf.cast(sq, dtype)
    if not return_coefficients:
        return sq
    return sq, tuple(tf.cast(c, dtype) for c in (1.0 - s, s, 1.0 - t, t))


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

    Returns:
        The distances, of the broadcast leading shape; with
        `return_points=True`, `(distance, (p1, p2))` with `p1`, `p2` of shape
        `[..., D]`.

    Raises:
        ValueError: if an argument is not a floating tensor of rank >= 1, or
            its last dimension differs from that of `x1`.

    Reference:
        Vasudeva et al., "LoOp: Looking for Optimal Hard Negative Embeddings
        for Deep Metric Learning", ICCV 2021 (supplementary, Section 4.2).
    """
    (x1, x2, y1, y2), dtype = _check_vectors((x1, x2, y1, y2), ("x1", "x2", "y1", "y2"))
    cdtype = ops.compute_dtype(dtype)
    x1, x2, y1, y2 = (tf.cast(t, cdtype) for t in (x1, x2, y1, y2))
    u = x2 - x1
    v = y2 - y1
    w = x1 - y1
    _, s, t, _ = _segment_solve(_dot(u, u), _dot(v, v), _dot(u, v), _dot(u, w), _dot(v, w),
                                _dot(w, w))
    # The parameters are held fixed: the distance at fixed (s, t) has the envelope gradient.
    s_fixed = tf.stop_gradient(s)[..., None]
    t_fixed = tf.stop_gradient(t)[..., None]
    diff = w + s_fixed * u - t_fixed * v
    distance = tf.cast(ops.safe_sqrt(_dot(diff, diff)), dtype)
    if not return_points:
        return distance
    p1 = x1 + s[..., None] * u
    p2 = y1 + t[..., None] * v
    return distance, (tf.cast(p1, dtype), tf.cast(p2, dtype))
