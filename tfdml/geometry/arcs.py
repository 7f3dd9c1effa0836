"""Closest points between two great-circle arcs: :func:`arc_similarity_from_dots` from
the six dot products, :func:`arc_distance` from the vectors (the candidates of the
closed-form solver compared by their distance and refined against the vectors)."""

from __future__ import annotations

from keras import ops

from tfdml import ops as dml
from tfdml._docs import fill_doc
from tfdml.geometry._arc_solver import ARC_CASES, ARC_DOT_NAMES, arc_sine, arc_solve
from tfdml.geometry._common import (
    POINTS_DOC,
    Best,
    dot,
    dots_doc,
    endpoints,
    eps_of,
    prepare_dots,
    tiny_of,
)

__all__ = ["arc_distance", "arc_similarity_from_dots"]


@fill_doc(DOTS=dots_doc(ARC_DOT_NAMES))
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
    tensors, dtype = prepare_dots((x1x2, y1y2, x1y1, x1y2, x2y1, x2y2), ARC_DOT_NAMES)
    s, a1, a2, b1, b2, _ = arc_solve(*tensors)
    s = ops.cast(s, dtype)
    if not return_coefficients:
        return s
    return s, tuple(ops.cast(c, dtype) for c in (a1, a2, b1, b2))


def _unit_rows(p):
    """``p / ||p||`` along the last axis (a zero vector stays zero, with finite gradients)."""
    tiny = tiny_of(p)
    return p * ops.rsqrt(dml.maximum(dot(p, p), tiny))[..., None]


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
    return dot(diff, diff)


def _span_coordinates(vectors, like):
    """Coordinates of ``vectors`` in an orthonormal basis of their span.

    ``vectors``: ``[..., D]`` tensors whose leading dimensions broadcast to the shape of
    ``like``, a tensor of their dtype (the early ones may have fewer: their part of the
    work is done at their own shape). Classical Gram-Schmidt with a second
    orthogonalization pass, which keeps the basis orthonormal to rounding even when a
    vector is nearly in the span of the previous ones. Returns one ``like.shape + [k]``
    tensor per vector, ``k = len(vectors)``, the ``i``-th with zeros after position ``i``.
    Distances between combinations of the vectors are those between the same
    combinations of the coordinates, up to rounding of the size of ``eps`` times the
    vectors' norms: no cancellation at 0. A vector
    (numerically) in the span of the previous ones gets a basis vector made of
    rounding noise: orthogonal to the others where the dimension leaves room, and
    otherwise multiplied only by rounding-sized coordinates.
    """
    tiny = tiny_of(vectors[0])
    k = len(vectors)
    basis = []
    coordinates = []
    for i, v in enumerate(vectors):
        r = [None] * k
        w = v
        for _ in range(2):
            for j, q in enumerate(basis):
                c = dot(q, w)
                r[j] = c if r[j] is None else r[j] + c
                w = w - c[..., None] * q
        n_sq = dot(w, w)
        ok = n_sq > tiny
        n = ops.sqrt(ops.where(ok, n_sq, ops.ones_like(n_sq)))
        r[i] = ops.where(ok, n, ops.zeros_like(n))
        basis.append(ops.where(ok[..., None], w / n[..., None], ops.zeros_like(w)))
        zero = ops.zeros_like(like)
        coordinates.append(ops.stack([zero if c is None else c + zero for c in r], axis=-1))
    return coordinates


def _refine_on_arcs(x1, x2, y1, y2, coefficients, free_x, free_y, steps=3):
    """Gauss-Newton steps on the distance of the vectors, from a candidate pair of points.

    The candidates of :func:`arc_solve` come from dot products: where the great
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
    eps, tiny = eps_of(x1), tiny_of(x1)
    short = (16.0 * eps) ** 2
    zero = ops.zeros_like(a1)
    for _ in range(steps):
        # Coefficients rescaled to unit points.
        p1 = a1[..., None] * x1 + a2[..., None] * x2
        p2 = b1[..., None] * y1 + b2[..., None] * y2
        r = ops.rsqrt(dml.maximum(dot(p1, p1), tiny))
        a1, a2, p1 = a1 * r, a2 * r, p1 * r[..., None]
        r = ops.rsqrt(dml.maximum(dot(p2, p2), tiny))
        b1, b2, p2 = b1 * r, b2 * r, p2 * r[..., None]
        # Tangents t = u - (u.p) p, as coefficients on the endpoints: (-1 - k a1, 1 - k a2).
        k = dot(u, p1)
        m = dot(v, p2)
        t1 = u - k[..., None] * p1
        t2 = v - m[..., None] * p2
        n1_sq = dot(t1, t1)
        n2_sq = dot(t2, t2)
        # A chord within rounding of 0 (an arc shorter than about 16 eps, e.g. of two equal
        # vectors) has no usable tangent: such a point stays where it is.
        ok1 = ops.logical_and(free_x, n1_sq > short)
        ok2 = ops.logical_and(free_y, n2_sq > short)
        n1 = ops.sqrt(ops.where(ok1, n1_sq, ops.ones_like(n1_sq)))
        n2 = ops.sqrt(ops.where(ok2, n2_sq, ops.ones_like(n2_sq)))
        delta = p1 - p2
        r1 = dot(delta, t1) / n1
        r2 = dot(delta, t2) / n2
        c = dot(t1, t2) / (n1 * n2)
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


@fill_doc(POINTS=POINTS_DOC)
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
    (x1, x2, y1, y2), dtype = endpoints(x1, x2, y1, y2)
    dots, _ = prepare_dots((dot(x1, x2), dot(y1, y2), dot(x1, y1), dot(x1, y2),
                             dot(x2, y1), dot(x2, y2)), ARC_DOT_NAMES)
    *_, candidates = arc_solve(*dots, return_candidates=True)
    x_ok, y_ok = arc_sine(dots[0])[2], arc_sine(dots[1])[2]

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
            best = Best(gap(fixed), coefficients, case, maximize=False)
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
            ops.stack([ops.equal(best.case, ARC_CASES.index(n)) for n in names], -1), -1)

    own_x = ops.logical_and(x_ok, case_in("edge_y1", "edge_y2", "interior"))
    own_y = ops.logical_and(y_ok, case_in("edge_x1", "edge_x2", "interior"))
    for free_x, free_y in ((own_x, own_y), (x_ok, y_ok)):
        refined = _refine_on_arcs(*span, fixed, free_x, free_y)
        # The returned points keep the gradients of the coefficients they started from.
        moved = tuple(c + ops.stop_gradient(r - c) for c, r in zip(start, refined, strict=True))
        best.offer(gap(refined), _on_arcs(*refined), moved, ARC_CASES.index("interior"))
    chosen = tuple(ops.stop_gradient(c) for c in best.coefficients)
    squared = _arc_squared_gap(*points(*chosen, x1, x2, y1, y2))
    distance = ops.cast(dml.safe_sqrt(dml.maximum(squared, ops.zeros_like(squared))), dtype)
    if not return_points:
        return distance
    p1, p2 = (_unit_rows(p) for p in points(*best.coefficients, x1, x2, y1, y2))
    return distance, (ops.cast(p1, dtype), ops.cast(p2, dtype))
