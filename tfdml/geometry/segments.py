"""Closest points between two straight segments (LoOp without l2-normalization):
:func:`segment_squared_distance_from_dots` from the ten dot products,
:func:`segment_distance` from the vectors."""

from __future__ import annotations

import numpy as np
from keras import ops

from tfdml import ops as dml
from tfdml._docs import fill_doc
from tfdml.geometry._common import POINTS_DOC, Best, dot, dots_doc, endpoints, eps_of, prepare_dots

__all__ = ["segment_distance", "segment_squared_distance_from_dots"]

# Segments: the four edges (s = 0, s = 1, t = 0, t = 1; corners included) and the interior.
_SEGMENT_CASES = ("edge_x1", "edge_x2", "edge_y1", "edge_y2", "interior")
_SEGMENT_DOT_NAMES = ("x1x1", "x2x2", "x1x2", "y1y1", "y2y2", "y1y2", "x1y1", "x1y2", "x2y1",
                      "x2y2")


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
    eps = eps_of(uu)
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
    best = Best(f(s_i, t_i), (s_i, t_i, zero, zero), 4, maximize=False)
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


@fill_doc(DOTS=dots_doc(_SEGMENT_DOT_NAMES))
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
    tensors, dtype = prepare_dots(
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


@fill_doc(POINTS=POINTS_DOC)
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
    (x1, x2, y1, y2), dtype = endpoints(x1, x2, y1, y2)
    u = x2 - x1
    v = y2 - y1
    w = x1 - y1
    _, s, t, _ = _segment_solve(dot(u, u), dot(v, v), dot(u, v), dot(u, w), dot(v, w),
                                dot(w, w))
    # The parameters are held fixed: the distance at fixed (s, t) has the envelope gradient.
    s_fixed = ops.stop_gradient(s)[..., None]
    t_fixed = ops.stop_gradient(t)[..., None]
    diff = w + s_fixed * u - t_fixed * v
    distance = ops.cast(dml.safe_sqrt(dot(diff, diff)), dtype)
    if not return_points:
        return distance
    p1 = x1 + s[..., None] * u
    p2 = y1 + t[..., None] * v
    return distance, (ops.cast(p1, dtype), ops.cast(p2, dtype))
