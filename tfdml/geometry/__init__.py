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

from tfdml.geometry.arcs import arc_distance, arc_similarity_from_dots
from tfdml.geometry.segments import segment_distance, segment_squared_distance_from_dots

__all__ = [
    "arc_distance",
    "arc_similarity_from_dots",
    "segment_distance",
    "segment_squared_distance_from_dots",
]
