"""The closed-form solver of the arcs: the best feasible KKT candidate, from dot products.

With ``g = x1.x2``, ``h = y1.y2``, ``sx = sqrt(1 - g^2)`` and ``sy = sqrt(1 - h^2)``,
the point ``p1 = cos(a) n1 + sin(a) n2`` (``n1 = x1``, ``n2 = (x2 - g x1) / sx``, ``a`` in
``[0, acos(g)]``) and likewise ``p2 = cos(b) n3 + sin(b) n4`` give
``p1.p2 = u(a)^T M v(b)`` with ``M = [[n1.n3, n1.n4], [n2.n3, n2.n4]]``. The maximum is
the largest feasible value among nine candidates (:data:`ARC_CASES`): four corners,
four edges (one endpoint pinned, the other point free on its arc) and the interior
point (the top singular pair of ``M``). See :mod:`tfdml.geometry` for the conditions.
"""

from __future__ import annotations

from keras import ops

from tfdml import ops as dml
from tfdml._shims import dtype_name
from tfdml.geometry._common import Best, degenerate_sines, eps_of, safe_norm2

__all__ = ["ARC_CASES", "ARC_DOT_NAMES", "arc_sine", "arc_solve"]

# Indices of the candidate that attains the optimum, as returned by arc_solve.
# Arcs: corners (x_i, y_j), edges with one endpoint pinned and the other point free, interior.
ARC_CASES = (
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
ARC_DOT_NAMES = ("x1x2", "y1y2", "x1y1", "x1y2", "x2y1", "x2y2")


def arc_sine(cos0):
    """``(cos0, sin0^2, ok)`` of an arc from its endpoints' dot product (clipped to [-1, 1]).

    ``ok`` is False where the arc is reduced to its endpoints (see
    :func:`degenerate_sines`).
    """
    dtype = dtype_name(cos0)
    near, antipodal = degenerate_sines(dtype)
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


def arc_solve(g, h, c11, c12, c21, c22, return_candidates=False):
    """Closed-form maximum of ``p1.p2`` over two arcs, from the six dot products.

    Args:
        g, h: ``x1.x2`` and ``y1.y2``.
        c11, c12, c21, c22: ``x1.y1``, ``x1.y2``, ``x2.y1``, ``x2.y2``.
        All of one float dtype and one shape.
        return_candidates: also return all nine candidates.

    Returns:
        ``(s, a1, a2, b1, b2, case)``: the maximum, the coefficients of
        ``p1 = a1 x1 + a2 x2`` and ``p2 = b1 y1 + b2 y2``, and the index into
        ``ARC_CASES`` of the candidate that attains it; with
        ``return_candidates=True`` a seventh element, the list of
        ``(feasible, (a1, a2, b1, b2), case)`` of every candidate.
    """
    one = ops.ones_like(g)
    zero = ops.zeros_like(g)
    g, sx_sq, x_ok = arc_sine(g)
    h, sy_sq, y_ok = arc_sine(h)
    sx = ops.sqrt(ops.where(x_ok, sx_sq, one))
    sy = ops.sqrt(ops.where(y_ok, sy_sq, one))
    x_arc, y_arc = (g, sx, x_ok), (h, sy, y_ok)

    # Products with the second Gram-Schmidt vectors n2 = (x2 - g x1) / sx, n4 = (y2 - h y1) / sy.
    x1n4 = (c12 - h * c11) / sy
    x2n4 = (c22 - h * c21) / sy
    n2y1 = (c21 - g * c11) / sx
    n2y2 = (c22 - g * c12) / sx
    n2n4 = ((c22 - h * c21) - g * (c12 - h * c11)) / (sx * sy)

    # Corners: always feasible, computed from the endpoints themselves.
    best = Best(c11, (one, zero, one, zero), 0, maximize=True)
    best.offer(c12, ops.ones_like(x_ok), (one, zero, zero, one), 1)
    best.offer(c21, ops.ones_like(x_ok), (zero, one, one, zero), 2)
    best.offer(c22, ops.ones_like(x_ok), (zero, one, zero, one), 3)
    _offer_edges(best, (c11, c12, c21), (x1n4, x2n4, n2y1, n2y2), x_arc, y_arc, (one, zero))
    value, feasible, coefficients = _interior(((c11, x1n4), (n2y1, n2n4)), x_arc, y_arc)
    best.offer(value, feasible, coefficients, 8)

    a1, a2, b1, b2 = best.coefficients
    if return_candidates:
        return best.value, a1, a2, b1, b2, best.case, best.offers
    return best.value, a1, a2, b1, b2, best.case


def _offer_edges(best, corners, products, x_arc, y_arc, one_zero):
    """Offers ``best`` the four edge candidates: one endpoint pinned, the other point free.

    Against a pinned endpoint ``p`` the best free point has the direction ``w``, the
    components of ``p`` on the free arc's orthonormal pair (``(p.n3, p.n4)`` for the
    arc of ``y``), and the value ``|w|``; it is feasible when ``w`` lies in the cone of
    the free arc.

    Args:
        best: the :class:`Best` of the candidates so far (maximizing).
        corners: ``(x1.y1, x1.y2, x2.y1)``.
        products: ``(x1.n4, x2.n4, n2.y1, n2.y2)``, with the second Gram-Schmidt
            vectors ``n2`` of the arc of ``x`` and ``n4`` of the arc of ``y``.
        x_arc: ``(cos0, sin0, ok)`` of the arc of ``x`` (:func:`arc_sine`).
        y_arc: the same for the arc of ``y``.
        one_zero: tensors of ones and zeros of the candidates' shape.
    """
    c11, c12, c21 = corners
    x1n4, x2n4, n2y1, n2y2 = products
    one, zero = one_zero
    eps = eps_of(c11)

    def edge(wx, wy, arc):
        cos0, sin0, ok = arc
        norm, norm_ok = safe_norm2(wx, wy, eps)
        c1, c2, inside = _cone_coefficients(wx / norm, wy / norm, cos0, sin0)
        return norm, ops.logical_and(ops.logical_and(ok, norm_ok), inside), c1, c2

    value, feasible, b1, b2 = edge(c11, x1n4, y_arc)
    best.offer(value, feasible, (one, zero, b1, b2), 4)
    value, feasible, b1, b2 = edge(c21, x2n4, y_arc)
    best.offer(value, feasible, (zero, one, b1, b2), 5)
    value, feasible, a1, a2 = edge(c11, n2y1, x_arc)
    best.offer(value, feasible, (a1, a2, one, zero), 6)
    value, feasible, a1, a2 = edge(c12, n2y2, x_arc)
    best.offer(value, feasible, (a1, a2, zero, one), 7)


def _interior(m, x_arc, y_arc):
    """The interior candidate: the top singular pair ``(u, v)`` of ``M``, ``u^T M v``.

    With E, F, G, H below, ``M = Rot(phi) diag(Q + R, Q - R) Rot(theta)``,
    ``Q = |E + iH|``, ``R = |F + iG|``, and the top left singular vector has angle
    ``phi = (arg(F + iG) + arg(E + iH)) / 2``: half the angle of ``z``.

    Args:
        m: ``((m00, m01), (m10, m11))``, the entries of ``M``.
        x_arc: ``(cos0, sin0, ok)`` of the arc of ``x`` (:func:`arc_sine`).
        y_arc: the same for the arc of ``y``.

    Returns:
        ``(value, feasible, (a1, a2, b1, b2))``.
    """
    (m00, m01), (m10, m11) = m
    g, sx, x_ok = x_arc
    h, sy, y_ok = y_arc
    eps = eps_of(m00)
    e_ = 0.5 * (m00 + m11)
    f_ = 0.5 * (m00 - m11)
    g_ = 0.5 * (m10 + m01)
    h_ = 0.5 * (m10 - m01)
    zr = f_ * e_ - g_ * h_
    zi = f_ * h_ + g_ * e_
    z_abs, z_ok = safe_norm2(zr, zi, eps * eps)
    # Half-angle direction of z, in its well-conditioned form for each half-plane.
    right = zr >= 0
    hx = ops.where(right, z_abs + zr, zi)
    hy = ops.where(right, zi, z_abs - zr)
    h_norm, h_ok = safe_norm2(hx, hy, eps * eps)
    ux = hx / h_norm
    uy = hy / h_norm
    # Only the upper half-plane can hold a point of the arc: pick that sign of (u, v).
    flip = ops.logical_or(uy < 0, ops.logical_and(ops.equal(uy, 0), ux < 0))
    ux = ops.where(flip, -ux, ux)
    uy = ops.where(flip, -uy, uy)
    mtu_x = m00 * ux + m10 * uy
    mtu_y = m01 * ux + m11 * uy
    mtu_norm, mtu_ok = safe_norm2(mtu_x, mtu_y, eps)
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
    return value, feasible, (a1, a2, b1, b2)
