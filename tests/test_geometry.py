"""tfdml.geometry (closest points on two arcs / two segments) against a brute force.

The brute force evaluates the objective on a dense grid over both curves' parameters
(65 x 65, endpoints included), then refines from the three best local maxima of the grid
by repeated zooming (9 x 9 windows shrunk threefold, 12 times, clipped to the parameter
box) and projected Newton steps with a line search (only improving steps are taken).
Every point it evaluates is feasible, so it bounds the true optimum from one side; the
solver must never be worse than it (beyond the rounding that the conditioning of the
problem allows) and must match it to 1e-4.

Arc points are parametrized from the vectors (spherical interpolation between the
endpoints), independent of the solver's Gram-Schmidt / SVD machinery; arcs whose sine is
not above sqrt(eps) are reduced to their two endpoints, the solver's documented
convention. Case sets (dimensions 3, 8, 64, 512): random arcs, short arcs, arcs built so
that each of the nine KKT candidates is the optimum, isoclinic arcs (sigma_1 == sigma_2),
x1 == x2, y1 == y2, both, x2 == -x1, y2 == -y1, both, intersecting arcs, coplanar
overlapping and disjoint arcs, tiny arcs and nearly antipodal arcs. Segments get the
analogous sets (parallel, collinear overlapping / disjoint, zero-length, nearly parallel).

Touching arcs (a shared endpoint, a crossing, an endpoint on the other arc) and arcs at a
known small distance are checked in float64, in float32, and in float64 with inputs that
were normalized in float32: there ``sqrt(2 - 2 s)`` from the dot products is off by
``sqrt(eps)``-sized amounts, and ``arc_distance`` must not be.

The tests marked ``multibackend`` (values and gradients against the brute force and the
envelope formulas in 8 dimensions, compiled gradients at touching arcs, bad input) also
run under JAX and PyTorch; float64 is enabled for JAX in every test of the module.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
from backends import (
    BACKEND,
    compiled,
    enable_float64,
    to_numpy,
    traced,
    value_and_grad,
    value_and_grad_function,
)
from harness import slow_beyond
from keras import ops

import tfdml.geometry  # noqa: F401  (the package may not export the module yet)
from tfdml import geometry
from tfdml.geometry._arc_solver import ARC_CASES, arc_solve
from tfdml.geometry._common import degenerate_sines

DIMS = (3, 8, 64, 512)
EPS64 = np.finfo(np.float64).eps
NEAR64, ANTIPODAL64 = degenerate_sines("float64")
MB = pytest.mark.multibackend


def _mb(*values):
    """Parameters of which the first is also run under every backend (``multibackend``)."""
    return [pytest.param(v, marks=MB) if i == 0 else v for i, v in enumerate(values)]


@pytest.fixture(autouse=True)
def _float64():
    """float64 tensors exist (JAX: ``jax_enable_x64``) in every test of this module."""
    with enable_float64():
        yield


def _t(v, dtype=None):
    """A backend tensor of the NumPy value ``v`` (converted to ``dtype`` first if given)."""
    return ops.convert_to_tensor(np.asarray(v, dtype) if dtype is not None else v)


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


# -- case construction -----------------------------------------------------------------------------


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _orth_unit(p, rng):
    """Random unit vectors orthogonal to the unit vectors ``p`` ([N, D])."""
    t = rng.normal(size=p.shape)
    t -= np.sum(t * p, axis=-1, keepdims=True) * p
    return _unit(t)


def _rotate(p, t, angle):
    """``cos(angle) p + sin(angle) t`` for orthonormal ``p``, ``t``."""
    angle = np.asarray(angle)[..., None]
    return np.cos(angle) * p + np.sin(angle) * t


def _random_frames(n, d, k, rng):
    """Random orthonormal k-frames [N, D, k] (the first k columns of random rotations)."""
    q, r = np.linalg.qr(rng.normal(size=(n, d, k)))
    return q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]


def _embed(points, d, rng):
    """Maps 4-D points [N, k, 4] (only the first min(d, 4) coordinates used) by random
    isometries into D dimensions."""
    m = min(d, 4)
    frames = _random_frames(points.shape[0], d, m, rng)
    return np.einsum("nij,nkj->nki", frames, points[..., :m])


def _kind_arcs(n, d, rng, x_mode=None, y_mode=None):
    """Arcs whose optimum is a chosen KKT candidate.

    x-arc: cos(a) e1 + sin(a) e2, a in [a_lo, a_hi]; y-arc: cos(b) c + sin(b) e3 with
    c = cos(phi) e1 + sin(phi) e4 (phi = 0 in 3-D). p1.p2 = cos(a) cos(b) cos(phi), so the
    optimum is at the parameter nearest 0 on each arc: an interior point when the range holds
    0, the first endpoint when the range is positive, the second when it is negative.
    """
    def ranges(mode, size):
        lo = rng.uniform(0.05, 0.6, size)
        length = rng.uniform(0.1, 0.8, size)
        inner = rng.uniform(0.1, 0.9, size)
        mode = np.asarray(mode)
        a_lo = np.where(mode == 0, -inner * length, np.where(mode == 1, lo, -lo - length))
        a_hi = np.where(mode == 0, (1 - inner) * length, np.where(mode == 1, lo + length, -lo))
        # mode 2: from -lo - length to -lo, the second endpoint is nearest 0.
        return a_lo, a_hi

    x_mode = rng.integers(0, 3, n) if x_mode is None else np.full(n, x_mode)
    y_mode = rng.integers(0, 3, n) if y_mode is None else np.full(n, y_mode)
    a_lo, a_hi = ranges(x_mode, n)
    b_lo, b_hi = ranges(y_mode, n)
    phi = rng.uniform(0.1, 1.2, n) if d >= 4 else np.zeros(n)
    e = np.eye(4)
    c = np.cos(phi)[:, None] * e[0] + np.sin(phi)[:, None] * e[3]

    def xa(a):
        return np.cos(a)[:, None] * e[0] + np.sin(a)[:, None] * e[1]

    def yb(b):
        return np.cos(b)[:, None] * c + np.sin(b)[:, None] * e[2]

    pts = np.stack([xa(a_lo), xa(a_hi), yb(b_lo), yb(b_hi)], axis=1)
    out = _embed(pts, d, rng)
    return [out[:, i] for i in range(4)]


def _isoclinic_arcs(n, d, rng):
    """4-D arcs with p1.p2 = cos(phi) cos(a -+ b): M is a scaled rotation or reflection."""
    e = np.eye(4)
    phi = rng.uniform(0.0, 1.2, n)
    sign = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    a = np.sort(rng.uniform(-1.2, 1.2, (n, 2)), axis=1)
    b = np.sort(rng.uniform(-1.2, 1.2, (n, 2)), axis=1)

    def xa(t):
        return np.cos(t)[:, None] * e[0] + np.sin(t)[:, None] * e[1]

    def yb(t):
        ct, st = np.cos(t)[:, None], (sign * np.sin(t))[:, None]
        return (np.cos(phi)[:, None] * (ct * e[0] + st * e[1])
                + np.sin(phi)[:, None] * (ct * e[2] + st * e[3]))

    pts = np.stack([xa(a[:, 0]), xa(a[:, 1]), yb(b[:, 0]), yb(b[:, 1])], axis=1)
    out = _embed(pts, d, rng)
    return [out[:, i] for i in range(4)]


def _great_circle(n, d, rng):
    p = _unit(rng.normal(size=(n, d)))
    return p, _orth_unit(p, rng)


def make_arc_cases(d, n_random=200, seed=0):
    """Dict group -> (x1, x2, y1, y2), each [N, D] float64 unit vectors."""
    rng = np.random.default_rng(seed + 1000 * d)
    cases = {}

    def rand(n):
        return _unit(rng.normal(size=(n, d)))

    def arc_from(p, angle):
        return _rotate(p, _orth_unit(p, rng), angle)

    n = n_random
    cases["random"] = (rand(n), rand(n), rand(n), rand(n))
    x1, y1 = rand(n), rand(n)
    y1 = _unit(x1 + rng.uniform(0.2, 1.5, (n, 1)) * y1)
    cases["short"] = (x1, arc_from(x1, rng.uniform(0.01, 0.6, n)), y1,
                      arc_from(y1, rng.uniform(0.01, 0.6, n)))
    for xm in range(3):
        for ym in range(3):
            cases[f"kind_{xm}{ym}"] = tuple(_kind_arcs(max(n // 8, 12), d, rng, xm, ym))
    cases["kind_mixed"] = tuple(_kind_arcs(n // 2, d, rng))
    if d >= 4:
        cases["isoclinic"] = tuple(_isoclinic_arcs(n // 4, d, rng))
    m = max(n // 8, 12)
    x1, x2, y1, y2 = rand(m), rand(m), rand(m), rand(m)
    cases["x_point"] = (x1, x1.copy(), y1, y2)
    cases["y_point"] = (x1, x2, y1, y1.copy())
    cases["both_points"] = (x1, x1.copy(), y1, y1.copy())
    cases["x_antipodal"] = (x1, -x1, y1, y2)
    cases["y_antipodal"] = (x1, x2, y1, -y1)
    cases["both_antipodal"] = (x1, -x1, y1, -y1)
    cases["point_antipodal"] = (x1, x1.copy(), y1, -y1)
    # Intersecting arcs: a common point inside (or at the end of) both arcs.
    p = rand(m)
    tx, ty = _orth_unit(p, rng), _orth_unit(p, rng)
    ax, bx = rng.uniform(0, 1.4, m), rng.uniform(0, 1.4, m)
    ay, by = rng.uniform(0, 1.4, m), rng.uniform(0, 1.4, m)
    ax[: m // 4] = 0.0  # the common point is an endpoint of the x-arc
    cases["intersecting"] = (_rotate(p, tx, -ax), _rotate(p, tx, bx), _rotate(p, ty, -ay),
                             _rotate(p, ty, by))
    # Coplanar arcs on one great circle, overlapping or disjoint.
    p, t = _great_circle(m, d, rng)
    a = np.sort(rng.uniform(-1.4, 1.4, (m, 2)), axis=1)
    common = a[:, 0] + rng.uniform(0, 1, m) * (a[:, 1] - a[:, 0])
    b = np.stack([common - rng.uniform(0.05, 1.4, m), common + rng.uniform(0.05, 1.4, m)], 1)
    cases["coplanar_overlap"] = (_rotate(p, t, a[:, 0]), _rotate(p, t, a[:, 1]),
                                 _rotate(p, t, b[:, 1]), _rotate(p, t, b[:, 0]))
    a0 = rng.uniform(-1.5, -0.2, m)
    cases["coplanar_disjoint"] = (_rotate(p, t, a0 - rng.uniform(0.1, 1.4, m)),
                                  _rotate(p, t, a0), _rotate(p, t, a0 + rng.uniform(0.1, 0.5, m)),
                                  _rotate(p, t, a0 + rng.uniform(0.6, 1.6, m)))
    cases["identical"] = (x1, x2, x1.copy(), x2.copy())
    cases["reversed"] = (x1, x2, x2.copy(), x1.copy())
    # Nearly degenerate: tiny arcs and nearly antipodal arcs.
    tiny = np.array([1e-9, 1e-7, 1e-5, 1e-3] * (m // 4 + 1))[:m]
    cases["tiny"] = (x1, arc_from(x1, tiny), y1, arc_from(y1, tiny[::-1]))
    # Above the float64 antipodal threshold (1.2e-4) they are solved; below, endpoints only.
    near = np.pi - np.array([1e-7, 1e-5, 3e-4, 1e-3, 1e-2] * (m // 5 + 1))[:m]
    cases["near_antipodal"] = (x1, arc_from(x1, near), y1, y2)
    cases["both_near_antipodal"] = (x1, arc_from(x1, near), y1, arc_from(y1, near[::-1]))
    return cases


def _concat(cases, groups=None):
    groups = list(cases) if groups is None else groups
    arrays = [np.concatenate([cases[g][i] for g in groups]) for i in range(4)]
    labels = np.concatenate([[g] * len(cases[g][0]) for g in groups])
    return arrays, labels


# -- brute force ---------------------------------------------------------------------------------


def _newton_refine(fun, derivatives, tau, rho, fixed_x, fixed_y, iters=12):
    """Projected Newton ascent on [0, 1]^2 with a line search, for arrays of problems.

    ``derivatives(tau, rho)`` gives (g_x, g_y, h_xx, h_xy, h_yy); ``fixed_*`` marks
    coordinates that never move (degenerate curves). A step is taken only if it improves.
    """
    ts = 0.5 ** np.arange(30)
    for _ in range(iters):
        value = fun(tau[..., None], rho[..., None])[..., 0, 0]
        gx, gy, hxx, hxy, hyy = derivatives(tau, rho)
        fx = fixed_x | ((tau <= 0) & (gx <= 0)) | ((tau >= 1) & (gx >= 0))
        fy = fixed_y | ((rho <= 0) & (gy <= 0)) | ((rho >= 1) & (gy >= 0))
        det = hxx * hyy - hxy * hxy
        both = ~fx & ~fy & (hxx < 0) & (det > 0)
        safe_det = np.where(both, det, 1.0)
        nx = -(hyy * gx - hxy * gy) / safe_det
        ny = -(hxx * gy - hxy * gx) / safe_det
        cx = np.where(hxx < 0, -gx / np.where(hxx < 0, hxx, -1.0), gx)
        cy = np.where(hyy < 0, -gy / np.where(hyy < 0, hyy, -1.0), gy)
        dx = np.where(fx, 0.0, np.where(both, nx, cx))
        dy = np.where(fy, 0.0, np.where(both, ny, cy))
        cand_x = np.clip(tau[..., None] + ts * dx[..., None], 0.0, 1.0)
        cand_y = np.clip(rho[..., None] + ts * dy[..., None], 0.0, 1.0)
        vals = np.diagonal(fun(cand_x, cand_y), axis1=-2, axis2=-1)
        best = np.argmax(vals, axis=-1)
        take = np.take_along_axis(vals, best[..., None], -1)[..., 0] > value
        tau = np.where(take, np.take_along_axis(cand_x, best[..., None], -1)[..., 0], tau)
        rho = np.where(take, np.take_along_axis(cand_y, best[..., None], -1)[..., 0], rho)
    return tau, rho


def _zoom_maximize(fun, n, k0=65, starts=3, iters=12, refine=None):
    """Maximizes ``fun(tau, rho)`` over [0, 1]^2 for N problems at once.

    ``fun`` maps tau [N, L, K1] and rho [N, L, K2] to values [N, L, K1, K2]. A k0 x k0 grid
    is followed by zooming from the ``starts`` best local maxima of the grid, then by
    ``refine(tau, rho)`` (local Newton steps), if given.
    Returns (best value [N], tau [N], rho [N]).
    """
    grid = np.linspace(0.0, 1.0, k0)
    coarse = fun(np.broadcast_to(grid, (n, 1, k0)), np.broadcast_to(grid, (n, 1, k0)))[:, 0]
    padded = np.pad(coarse, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    is_max = np.ones_like(coarse, dtype=bool)
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if di or dj:
                shifted = padded[:, 1 + di: 1 + di + k0, 1 + dj: 1 + dj + k0]
                is_max &= coarse >= shifted
    ranked = np.where(is_max, coarse, -np.inf).reshape(n, -1)
    top = np.argsort(-ranked, axis=1)[:, :starts]
    tau = grid[top // k0]
    rho = grid[top % k0]
    width = 2.0 / (k0 - 1)
    offsets = np.linspace(-1.0, 1.0, 9)
    for _ in range(iters):
        taus = np.clip(tau[..., None] + width * offsets, 0.0, 1.0)
        rhos = np.clip(rho[..., None] + width * offsets, 0.0, 1.0)
        vals = fun(taus, rhos).reshape(n, starts, -1)
        idx = np.argmax(vals, axis=-1)
        tau = np.take_along_axis(taus, (idx // 9)[..., None], -1)[..., 0]
        rho = np.take_along_axis(rhos, (idx % 9)[..., None], -1)[..., 0]
        width /= 3.0
    if refine is not None:
        tau, rho = refine(tau, rho)
    final = fun(tau[..., None], rho[..., None])[..., 0, 0]
    best = np.argmax(final, axis=1)
    pick = lambda a: np.take_along_axis(a, best[:, None], 1)[:, 0]  # noqa: E731
    return pick(final), pick(tau), pick(rho)


def _arc_coefficients(tau, angle, sine, degenerate, order=0):
    """Slerp coefficients of the point at fraction ``tau`` of an arc (or their derivative in
    ``tau`` for ``order=1``); nearest endpoint if the arc is degenerate."""
    extra = tau.ndim - 1
    angle, sine, degenerate = (a.reshape(a.shape + (1,) * extra)
                               for a in (angle, sine, degenerate))
    safe = np.where(degenerate, 1.0, sine)
    if order == 1:
        c1 = -angle * np.cos(angle * (1.0 - tau)) / safe
        c2 = angle * np.cos(angle * tau) / safe
        return np.where(degenerate, 0.0, c1), np.where(degenerate, 0.0, c2)
    c1 = np.sin(angle * (1.0 - tau)) / safe
    c2 = np.sin(angle * tau) / safe
    first = tau < 0.5
    return np.where(degenerate, first, c1), np.where(degenerate, ~first, c2)


def _degenerate64(c):
    """The solver's convention (float64 thresholds) for an arc with endpoint dot ``c``."""
    sine = np.sqrt(np.maximum(1 - c * c, 0))
    return sine, sine <= np.where(c > 0, NEAR64, ANTIPODAL64)


def _arc_setup(x1, x2, y1, y2):
    dots = {k: np.sum(a * b, axis=-1) for k, (a, b) in {
        "x1x2": (x1, x2), "y1y2": (y1, y2), "x1y1": (x1, y1), "x1y2": (x1, y2),
        "x2y1": (x2, y1), "x2y2": (x2, y2)}.items()}
    g, h = (np.clip(dots[k], -1.0, 1.0) for k in ("x1x2", "y1y2"))
    return dots, (np.arccos(g), *_degenerate64(g)), (np.arccos(h), *_degenerate64(h))


def brute_arc(x1, x2, y1, y2):
    """(max similarity, tau, rho, degenerate_x, degenerate_y) by grid + zoom + Newton."""
    dots, xarc, yarc = _arc_setup(x1, x2, y1, y2)
    c11, c12, c21, c22 = (dots[k] for k in ("x1y1", "x1y2", "x2y1", "x2y2"))

    def bilinear(a, b):
        """a^T C b for coefficient pairs a [N, ..., K1] and b [N, ..., K2]."""
        a1, a2 = a[0][..., :, None], a[1][..., :, None]
        b1, b2 = b[0][..., None, :], b[1][..., None, :]
        cs = [c.reshape(c.shape + (1,) * (a1.ndim - 1)) for c in (c11, c12, c21, c22)]
        return a1 * (b1 * cs[0] + b2 * cs[1]) + a2 * (b1 * cs[2] + b2 * cs[3])

    def fun(tau, rho):
        return bilinear(_arc_coefficients(tau, *xarc), _arc_coefficients(rho, *yarc))

    def derivatives(tau, rho):
        t, r = tau[..., None], rho[..., None]
        a, da = _arc_coefficients(t, *xarc), _arc_coefficients(t, *xarc, order=1)
        b, db = _arc_coefficients(r, *yarc), _arc_coefficients(r, *yarc, order=1)
        value = bilinear(a, b)[..., 0, 0]
        ax, ay = (v.reshape(v.shape + (1,) * (tau.ndim - 1)) ** 2 for v in (xarc[0], yarc[0]))
        return (bilinear(da, b)[..., 0, 0], bilinear(a, db)[..., 0, 0], -ax * value,
                bilinear(da, db)[..., 0, 0], -ay * value)

    def refine(tau, rho):
        fixed_x = np.broadcast_to(xarc[2][:, None], tau.shape)
        fixed_y = np.broadcast_to(yarc[2][:, None], tau.shape)
        return _newton_refine(fun, derivatives, tau, rho, fixed_x, fixed_y)

    s, tau, rho = _zoom_maximize(fun, len(x1), refine=refine)
    return s, tau, rho, xarc[2], yarc[2]


def _end_kind(u, degenerate):
    """0 / 1 for the first / second endpoint, 2 for interior, -1 when ambiguous."""
    kind = np.where(u <= 1e-9, 0, np.where(u >= 1 - 1e-9, 1, -1))
    kind = np.where((u > 1e-5) & (u < 1 - 1e-5), 2, kind)
    return np.where(degenerate, -1, kind)


def kind_names(tau, rho, deg_x, deg_y):
    """The ``ARC_CASES`` name of the brute-force optimum, or '' when ambiguous."""
    kx, ky = _end_kind(tau, deg_x), _end_kind(rho, deg_y)
    names = []
    for a, b in zip(kx, ky, strict=True):
        if a < 0 or b < 0:
            names.append("")
        elif a < 2 and b < 2:
            names.append(f"corner_x{a + 1}_y{b + 1}")
        elif a < 2:
            names.append(f"edge_x{a + 1}")
        elif b < 2:
            names.append(f"edge_y{b + 1}")
        else:
            names.append("interior")
    return np.array(names)


def _intended_kind(x_mode, y_mode):
    """Kind name of the constructed cases: mode 0 interior, 1 first end, 2 second end."""
    end = {0: 2, 1: 0, 2: 1}
    names = kind_names(np.array([0.0, 1.0, 0.5])[[end[x_mode]]],
                       np.array([0.0, 1.0, 0.5])[[end[y_mode]]], np.zeros(1, bool),
                       np.zeros(1, bool))
    return names[0]


@functools.cache
def arc_data(d, n_random=200, seed=0):
    cases = make_arc_cases(d, n_random, seed)
    (x1, x2, y1, y2), labels = _concat(cases)
    s_bf, tau, rho, deg_x, deg_y = brute_arc(x1, x2, y1, y2)
    dist_bf = np.sqrt(np.maximum(2 - 2 * s_bf, 0))
    return dict(x1=x1, x2=x2, y1=y1, y2=y2, labels=labels, s_bf=s_bf, dist_bf=dist_bf,
                tau=tau, rho=rho, deg_x=deg_x, deg_y=deg_y)


def _arc_dots(x1, x2, y1, y2):
    return [np.sum(a * b, -1) for a, b in ((x1, x2), (y1, y2), (x1, y1), (x1, y2), (x2, y1),
                                           (x2, y2))]


def _solve_arc_np(x1, x2, y1, y2, dtype="float64"):
    dots = [_t(v, dtype) for v in _arc_dots(x1, x2, y1, y2)]
    return [to_numpy(t) for t in arc_solve(*dots)]


# -- arcs: values against the brute force ------------------------------------------------------


def _arc_tolerance(data):
    """1e-8 plus the effect on d of the conditioning of s in the dot products.

    s moves by about eps (1 / sx^2 + 1 / sy^2 + 1 / (sx sy)) under rounding of the dot
    products (sx, sy: the arcs' sines; its derivative in x1.x2 is -s a1 a2, and a1 a2 is
    about 1 / (4 sx^2) mid-arc near antipodal). d = sqrt(2 - 2 s) turns an error e in s into
    at most sqrt(d^2 + 2 e) - d. Both the solver and the brute force see such rounding.
    """
    sines = [np.where(deg, 1.0, _degenerate64(np.sum(a * b, -1))[0])
             for deg, (a, b) in ((data["deg_x"], (data["x1"], data["x2"])),
                                 (data["deg_y"], (data["y1"], data["y2"])))]
    ill = 10 * EPS64 * (1 / sines[0] ** 2 + 1 / sines[1] ** 2 + 1 / (sines[0] * sines[1]))
    d = data["dist_bf"]
    return 1e-8 + np.sqrt(d * d + 2 * ill) - d


def _check_arc_against_brute(data):
    d_solver, (p1, p2) = to_numpy(geometry.arc_distance(
        *(_t(data[k]) for k in ("x1", "x2", "y1", "y2")), return_points=True))
    excess = d_solver - data["dist_bf"]
    # Conditioning: given rounded dot products, s moves by about eps / (4 sine^2) per arc
    # near antipodal (its derivative in x1.x2 is -s a1 a2); d = sqrt(2 - 2 s) turns an error e
    # in s into e / d. Both the solver and the brute force see such rounding.
    tol = _arc_tolerance(data)
    # Never worse than the brute force (whose points are all feasible) ...
    worst = np.argmax(excess - tol)
    assert excess[worst] <= tol[worst], (data["labels"][worst], excess[worst], tol[worst])
    # ... and no better than it by more than its resolution.
    worst = np.argmax(np.abs(excess))
    assert np.max(np.abs(excess)) <= 1e-4, (data["labels"][worst], excess[worst])
    return np.abs(excess), p1, p2, d_solver


@pytest.mark.parametrize("d", _mb(8, 3, 64, 512))
def test_arc_distance_matches_brute_force(d):
    data = arc_data(d)
    dev, *_ = _check_arc_against_brute(data)
    assert len(dev) >= 700
    assert np.all(np.isfinite(dev))
    # Every degenerate group is present and within tolerance (checked above) in each dimension.
    for group in ("x_point", "both_points", "x_antipodal", "both_antipodal", "intersecting",
                  "coplanar_overlap", "tiny", "near_antipodal"):
        assert np.any(data["labels"] == group)


@pytest.mark.slow
@pytest.mark.parametrize("d", DIMS)
def test_arc_distance_matches_brute_force_many(d):
    _check_arc_against_brute(arc_data(d, n_random=2000, seed=7))


def test_arc_candidate_kinds_all_occur_and_agree():
    """Every one of the nine KKT candidates is the brute-force optimum of some case, and the
    solver picks that candidate whenever the brute-force optimum is unambiguous."""
    seen = set()
    agree = total = 0
    for d in DIMS:
        data = arc_data(d)
        generic = np.array([lab.startswith(("random", "short", "kind")) for lab in data["labels"]])
        names = kind_names(data["tau"], data["rho"], data["deg_x"], data["deg_y"])
        case = _solve_arc_np(*(data[k] for k in ("x1", "x2", "y1", "y2")))[-1]
        solver_names = np.array(ARC_CASES)[case]
        mask = generic & (names != "")
        seen |= set(names[mask])
        agree += np.sum(solver_names[mask] == names[mask])
        total += np.sum(mask)
        # Constructed cases: the intended kind is what the brute force finds.
        for xm in range(3):
            for ym in range(3):
                sel = data["labels"] == f"kind_{xm}{ym}"
                want = _intended_kind(xm, ym)
                if d == 3 and want == "interior":
                    continue  # 3-D interior optima are intersections (ambiguous kind): skipped.
                assert np.all(names[sel] == want), (d, want, names[sel])
    assert seen == set(ARC_CASES), seen
    assert agree >= 0.99 * total, (agree, total)


# -- arcs: closest points --------------------------------------------------------------------------


@pytest.mark.parametrize("d", (3, 64))
def test_arc_points_lie_on_arcs(d):
    data = arc_data(d)
    x1, x2, y1, y2 = (data[k] for k in ("x1", "x2", "y1", "y2"))
    _, p1, p2, dist = _check_arc_against_brute(data)
    # The dot products as arc_distance computes them (ties pick the same candidate).
    dots = [ops.sum(_t(a) * _t(b), -1)
            for a, b in ((x1, x2), (y1, y2), (x1, y1), (x1, y2), (x2, y1), (x2, y2))]
    s, a1, a2, b1, b2, _ = (to_numpy(t) for t in arc_solve(*dots))
    unique, _ = _unique_mask(data)
    assert np.sum(unique) >= 100
    for p, c1, c2, e1, e2 in ((p1, a1, a2, x1, x2), (p2, b1, b2, y1, y2)):
        np.testing.assert_allclose(np.linalg.norm(p, axis=-1), 1.0, atol=1e-9)
        assert np.all(c1 >= 0) and np.all(c2 >= 0)
        # A unique optimum is the solver's candidate (refined against the vectors by
        # rounding only); ties and touching arcs may return another pair as close.
        np.testing.assert_allclose(p[unique], (c1[:, None] * e1 + c2[:, None] * e2)[unique],
                                   atol=1e-9)
        angle = np.arccos(np.clip(np.sum(e1 * e2, -1), -1, 1))
        from_1 = np.arccos(np.clip(np.sum(p * e1, -1), -1, 1))
        from_2 = np.arccos(np.clip(np.sum(p * e2, -1), -1, 1))
        assert np.all(from_1 <= angle + 1e-7)
        # On the arc: the angles to both endpoints add up to the arc's angle.
        np.testing.assert_allclose(from_1 + from_2, angle, atol=1e-6)
    # The distance is measured between the returned points (below 1e-6 it reads 0) ...
    gap = np.linalg.norm(p1 - p2, axis=-1)
    np.testing.assert_allclose(gap[dist > 0], dist[dist > 0], rtol=1e-9, atol=1e-12)
    assert np.all(gap[dist == 0] <= 1e-6)
    # ... which are never farther apart than the solver's candidate.
    assert np.all(np.sum(p1 * p2, -1) >= s - 1e-9)


def test_arc_intersecting_and_overlapping_give_zero():
    data = arc_data(8)
    groups = ("intersecting", "coplanar_overlap", "identical", "reversed")
    sel = np.isin(data["labels"], groups)  # one call (the problems are independent)
    dist = to_numpy(geometry.arc_distance(*(_t(data[k][sel]) for k in ("x1", "x2", "y1", "y2"))))
    for group in groups:
        np.testing.assert_allclose(dist[data["labels"][sel] == group], 0.0, atol=1e-7,
                                   err_msg=group)


# -- arcs: touching arcs ---------------------------------------------------------------------------

# "float64_from_float32": unit vectors normalized in float32, then computed in float64 (their
# norms differ from 1 by about 1e-8, as embeddings produced in float32 do).
PRECISIONS = ("float64", "float64_from_float32", "float32")
EPS32 = float(np.finfo(np.float32).eps)


def _as_inputs(vectors, precision):
    if precision == "float64":
        return [_t(v) for v in vectors]
    v32 = [v.astype(np.float32) for v in vectors]
    v32 = [v / np.linalg.norm(v, axis=-1, keepdims=True) for v in v32]
    if precision == "float32":
        return [_t(v) for v in v32]
    return [_t(v.astype(np.float64)) for v in v32]


def _touching_arcs(kind, n, d, seed, angles=(0.05, np.pi / 2)):
    """Arcs (float64 unit vectors [N, D]) at distance 0.

    ``"shared"``: an endpoint in common (the same vector, each of the four pairings), arc
    lengths from 1e-3 to 3 rad. ``"crossing"``: the arcs cross at an interior point of
    both, their great circles at an angle drawn from ``angles``. ``"through"``: the first
    endpoint of the x-arc is an interior point of the y-arc, same angles.
    """
    rng = np.random.default_rng(seed + 100 * d + 10_000 * ("shared", "crossing",
                                                           "through").index(kind))
    p = _unit(rng.normal(size=(n, d)))
    tx = _orth_unit(p, rng)
    if kind == "shared":
        ty = _orth_unit(p, rng)
        length_x, length_y = np.exp(rng.uniform(np.log(1e-3), np.log(3.0), (2, n)))
        x_other, y_other = _rotate(p, tx, length_x), _rotate(p, ty, length_y)
        first_x = (np.arange(n) % 2 == 0)[:, None]
        first_y = (np.arange(n) % 4 < 2)[:, None]
        x1, x2 = np.where(first_x, p, x_other), np.where(first_x, x_other, p)
        y1, y2 = np.where(first_y, p.copy(), y_other), np.where(first_y, y_other, p.copy())
        return x1, x2, y1, y2
    # A unit vector orthogonal to p and tx (in 3-D: +-their cross product).
    w = rng.normal(size=p.shape)
    for e in (p, tx, p, tx):
        w -= np.sum(w * e, -1, keepdims=True) * e
    w = _unit(w)
    phi = rng.uniform(*angles, n)[:, None]
    ty = np.cos(phi) * tx + np.sin(phi) * w
    length_x, length_y = rng.uniform(0.05, 2.5, (2, n))
    f = np.zeros(n) if kind == "through" else rng.uniform(0.1, 0.9, n)
    g = rng.uniform(0.1, 0.9, n)
    return (_rotate(p, tx, -f * length_x), _rotate(p, tx, (1 - f) * length_x),
            _rotate(p, ty, -g * length_y), _rotate(p, ty, (1 - g) * length_y))


TOUCHING_KINDS = ("shared", "crossing", "through")
# Every kind in every precision on every commit, in 3 or in 8 dimensions by turns (each kind
# and each precision sees both); the other dimension in the slow tier.
_TOUCHING = [pytest.param(precision, kind, d, id=f"{d}-{kind}-{precision}")
             for d in (3, 8) for kind in TOUCHING_KINDS for precision in PRECISIONS]
_TOUCHING_FAST = {f"{(3, 8)[(TOUCHING_KINDS.index(kind) + PRECISIONS.index(precision)) % 2]}"
                  f"-{kind}-{precision}" for kind in TOUCHING_KINDS for precision in PRECISIONS}


@pytest.mark.parametrize("precision,kind,d", slow_beyond(_TOUCHING, _TOUCHING_FAST))
def test_arc_touching_is_zero(precision, kind, d):
    """Shared endpoints, crossing arcs and an endpoint on the other arc: distance 0 (below
    the 1e-6 that safe_sqrt reads as 0), in float32 too, not sqrt(eps) ~ 3e-4 to 5e-4 as
    sqrt(2 - 2 s) from the dot products gives."""
    # Three seeds of 120 arcs each, in one call (the problems are independent, row by row).
    seeds = [_touching_arcs(kind, 120, d, seed) for seed in range(3)]
    vectors = [np.concatenate(parts) for parts in zip(*seeds, strict=True)]
    dist, (p1, p2) = to_numpy(geometry.arc_distance(*_as_inputs(vectors, precision),
                                                    return_points=True))
    gap = np.linalg.norm(p1 - p2, axis=-1)
    for seed, (d_seed, gap_seed) in enumerate(zip(dist.reshape(3, 120), gap.reshape(3, 120),
                                                  strict=True)):
        assert np.max(d_seed) <= 1e-6, (seed, np.max(d_seed))
        assert np.max(gap_seed) <= 1e-6
    # Against the brute force as well (float64 only; it has the same optimum).
    vectors = _touching_arcs(kind, 40, d, 9)
    s_bf = brute_arc(*vectors)[0]
    assert np.all(np.sqrt(np.maximum(2 - 2 * s_bf, 0)) <= 1e-4)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_arc_shallow_crossing_within_documented_bound(precision):
    """Great circles crossing at a small angle phi: the crossing is located from the dot
    products to about eps / phi^2 along the arcs, and refined against the vectors; the
    documented float32 bound is eps / phi (float64: below 1e-6)."""
    phis = (1e-3, 3e-3, 1e-2)
    for d in (3, 8, 64):
        # The three angles in one call (the problems are independent, row by row).
        parts = [_touching_arcs("crossing", 100, d, 0, angles=(phi, phi)) for phi in phis]
        vectors = [np.concatenate(group) for group in zip(*parts, strict=True)]
        dists = to_numpy(geometry.arc_distance(*_as_inputs(vectors, precision))).reshape(3, 100)
        for phi, dist in zip(phis, dists, strict=True):
            bound = EPS32 / phi if precision == "float32" else 1e-6
            assert np.max(dist) <= bound, (d, phi, np.max(dist), bound)


_ARGS4 = (0, 1, 2, 3)


# Eagerly in both precisions on every commit; compiled in float32 on every commit, and in
# float64 (the same program in another dtype: one more XLA compilation) in the slow tier.
_TOUCHING_GRADIENTS = [pytest.param("float32", True, marks=MB, id="float32"),
                       pytest.param("float64_from_float32", False, id="float64_from_float32"),
                       pytest.param("float64_from_float32", True,
                                    id="float64_from_float32-compiled")]


@pytest.mark.parametrize("precision,jit", slow_beyond(
    _TOUCHING_GRADIENTS, {"float32", "float64_from_float32"}))
def test_arc_touching_gradients_finite_and_zero(precision, jit):
    """At distance 0 the gradient is safe_sqrt's: 0, finite (eagerly and compiled)."""

    def points(*xs):
        _, (p1, p2) = geometry.arc_distance(*xs, return_points=True)
        return ops.sum(p1) + ops.sum(p2)

    # In 8 dimensions (values in 3 and 8: test_arc_touching_is_zero); the three kinds in one
    # batch (the problems are independent, row by row), so one call and one compiled program.
    kinds = [_touching_arcs(kind, 60, 8, 4) for kind in ("shared", "crossing", "through")]
    xs = _as_inputs([np.concatenate(parts) for parts in zip(*kinds, strict=True)], precision)
    dist, grads = value_and_grad(geometry.arc_distance, *xs, argnums=_ARGS4)
    grads = list(grads)
    if jit:
        dist_and_grad = value_and_grad_function(geometry.arc_distance, argnums=_ARGS4,
                                                jit_compile=True)
        dist_jit, grads_jit = to_numpy(dist_and_grad(*xs))
        np.testing.assert_allclose(dist_jit, dist, atol=1e-6)
        grads += list(grads_jit)
    for gr in grads:
        assert np.all(np.isfinite(gr))
        np.testing.assert_array_equal(gr, 0.0)
    _, point_grads = value_and_grad(points, *xs, argnums=_ARGS4)
    for gr in point_grads:  # the points' gradients are finite too
        assert np.all(np.isfinite(gr))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_arc_near_miss_distance_is_accurate(precision):
    """Arcs at a known small distance delta (x-arc around e1 in the (e1, e2) plane, y-arc
    around cos(psi) e1 + sin(psi) e4 along e3: d = 2 sin(psi / 2)), embedded by random
    isometries. Measured between the closest points, d is accurate to rounding of the
    vectors; sqrt(2 - 2 s) in float32 is off by up to sqrt(2 eps) ~ 5e-4."""
    rng = np.random.default_rng(11)
    e = np.eye(4)
    n = 60
    deltas = (1e-5, 1e-4, 1e-3, 1e-2)
    tol = 1e-9 if precision == "float64" else 1e-6
    for d in (4, 8, 64):
        parts = []
        for delta in deltas:
            psi = 2 * np.arcsin(delta / 2)
            c = np.cos(psi) * e[0] + np.sin(psi) * e[3]
            a = np.stack([-rng.uniform(0.05, 1.0, n), rng.uniform(0.05, 1.0, n)], 1)
            b = np.stack([-rng.uniform(0.05, 1.0, n), rng.uniform(0.05, 1.0, n)], 1)
            pts = np.stack([np.cos(a[:, i, None]) * e[0] + np.sin(a[:, i, None]) * e[1]
                            for i in range(2)]
                           + [np.cos(b[:, i, None]) * c + np.sin(b[:, i, None]) * e[2]
                              for i in range(2)], axis=1)
            parts.append(np.moveaxis(_embed(pts, d, rng), 1, 0))
        # The four distances in one call (the problems are independent, row by row).
        vectors = list(np.concatenate(parts, axis=1))
        dists = to_numpy(geometry.arc_distance(*_as_inputs(vectors, precision)))
        for delta, dist in zip(deltas, dists.reshape(len(deltas), n), strict=True):
            assert np.max(np.abs(dist - delta)) <= tol, (d, delta, np.max(np.abs(dist - delta)))


def test_arc_antipodal_uses_endpoints():
    rng = np.random.default_rng(3)
    x1, y1, y2 = (_unit(rng.normal(size=(20, 5))) for _ in range(3))
    got = to_numpy(geometry.arc_distance(_t(x1), _t(-x1), _t(y1), _t(y2)))
    to_x1 = to_numpy(geometry.arc_distance(_t(x1), _t(x1), _t(y1), _t(y2)))
    to_x2 = to_numpy(geometry.arc_distance(_t(-x1), _t(-x1), _t(y1), _t(y2)))
    np.testing.assert_allclose(got, np.minimum(to_x1, to_x2), atol=1e-12)


def test_arc_isoclinic_tie_is_covered_by_edges():
    """sigma_1 == sigma_2 (M a scaled rotation or reflection): the singular vectors are not
    unique and the interior candidate's direction is arbitrary, but it is only used when
    feasible and valued at its own point (where every direction attains sigma_1), and the
    maximizers form a curve that reaches the box boundary, where the edges find them."""
    for d in (8, 64):
        data = arc_data(d)
        sel = data["labels"] == "isoclinic"
        vecs = [data[k][sel] for k in ("x1", "x2", "y1", "y2")]
        s, a1, a2, b1, b2, _ = _solve_arc_np(*vecs)
        np.testing.assert_allclose(s, data["s_bf"][sel], atol=1e-12)
        p1 = a1[:, None] * vecs[0] + a2[:, None] * vecs[1]
        p2 = b1[:, None] * vecs[2] + b2[:, None] * vecs[3]
        np.testing.assert_allclose(np.sum(p1 * p2, -1), s, atol=1e-12)
        # The construction really has sigma_1 == sigma_2 (up to rounding).
        g, h, c11, c12, c21, c22 = _arc_dots(*vecs)
        sx, sy = np.sqrt(1 - g * g), np.sqrt(1 - h * h)
        m = np.stack([np.stack([c11, (c12 - h * c11) / sy], -1),
                      np.stack([(c21 - g * c11) / sx,
                                ((c22 - h * c21) - g * (c12 - h * c11)) / (sx * sy)], -1)], -2)
        sv = np.linalg.svd(m, compute_uv=False)
        np.testing.assert_allclose(sv[:, 0], sv[:, 1], atol=1e-9)


# -- arcs: gradients -------------------------------------------------------------------------------


def _arc_dot_grads(dots):
    def similarity(*dots):
        return geometry.arc_similarity_from_dots(*dots)

    s, grads = value_and_grad(similarity, *dots, argnums=tuple(range(6)))
    _, coeffs = geometry.arc_similarity_from_dots(*(_t(v) for v in dots),
                                                  return_coefficients=True)
    return s, [to_numpy(c) for c in coeffs], list(grads)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_arc_gradients_finite_everywhere(dtype):
    def total_from_vectors(*xs):
        dist, (p1, p2) = geometry.arc_distance(*xs, return_points=True)
        return ops.sum(dist) + ops.sum(p1) + ops.sum(p2)

    def total_from_dots(*dots):
        s, coeffs = geometry.arc_similarity_from_dots(*dots, return_coefficients=True)
        return ops.sum(s) + sum(ops.sum(c) for c in coeffs)

    for d in (3, 8):
        data = arc_data(d)
        xs = [_t(data[k], dtype) for k in ("x1", "x2", "y1", "y2")]
        for gr in value_and_grad(total_from_vectors, *xs, argnums=_ARGS4)[1]:
            assert np.all(np.isfinite(gr))
    # The dot products of both dimensions in one call (the problems are independent).
    dots = [np.concatenate(parts) for parts in zip(*(
        _arc_dots(*(arc_data(d)[k] for k in ("x1", "x2", "y1", "y2"))) for d in (3, 8)),
        strict=True)]
    for gr in value_and_grad(total_from_dots, *(_t(v, dtype) for v in dots),
                             argnums=tuple(range(6)))[1]:
        assert np.all(np.isfinite(gr))


def _unique_mask(data):
    """Cases with a unique, well-separated minimizer (generic groups, no near ties)."""
    x1, x2, y1, y2 = (data[k] for k in ("x1", "x2", "y1", "y2"))
    generic = np.array([lab.startswith(("random", "short", "kind")) for lab in data["labels"]])
    names = kind_names(data["tau"], data["rho"], data["deg_x"], data["deg_y"])
    return generic & (names != "") & (data["dist_bf"] > 1e-3), (x1, x2, y1, y2)


@pytest.mark.parametrize("d", _mb(8, 3, 64, 512))
def test_arc_dot_gradients_envelope(d):
    """d s / d(x_i.y_j) = a_i b_j, d s / d(x1.x2) = -s a1 a2, d s / d(y1.y2) = -s b1 b2.

    (Lagrangian of max sum a_i b_j x_i.y_j subject to a^T Gx a = 1, b^T Gy b = 1; the
    multiplier of each norm constraint is s / 2.)
    """
    data = arc_data(d)
    mask, vecs = _unique_mask(data)
    dots = [v[mask] for v in _arc_dots(*vecs)]
    s, (a1, a2, b1, b2), grads = _arc_dot_grads(dots)
    want = [-s * a1 * a2, -s * b1 * b2, a1 * b1, a1 * b2, a2 * b1, a2 * b2]
    for got, exp in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, exp, atol=1e-7)


def _central_differences(fun, arrays, h=1e-6):
    """d sum(fun(*arrays)) / d arrays[i], elementwise problems, all coordinates at once.

    The problems are independent row by row, so every perturbed copy (each coordinate of
    each argument, plus and minus ``h``) goes into one batch: one call of ``fun``.
    """
    n = arrays[0].shape[0]
    batches = [[] for _ in arrays]
    shifts = []  # (argument, coordinate) of each block of n rows, plus then minus
    for i, arr in enumerate(arrays):
        flat = arr.reshape(n, -1)
        for j in range(flat.shape[1]):
            for sign in (1.0, -1.0):
                moved = flat.copy()
                moved[:, j] += sign * h
                for k, other in enumerate(arrays):
                    batches[k].append(moved.reshape(arr.shape) if k == i else other)
            shifts.append((i, j))
    values = np.asarray(fun(*(np.concatenate(b) for b in batches))).reshape(-1, 2, n)
    grads = [np.zeros((n, arr.reshape(n, -1).shape[1])) for arr in arrays]
    for (i, j), (plus, minus) in zip(shifts, values, strict=True):
        grads[i][:, j] = (plus - minus) / (2 * h)
    return [g.reshape(arr.shape) for g, arr in zip(grads, arrays, strict=True)]


def _for_one_call(fn):
    """``fn`` for the one call of :func:`_central_differences`: eager (a trace costs more than
    the call), traced under JAX (whose eager calls compile every op)."""
    return traced(fn) if BACKEND == "jax" else fn


def test_arc_gradients_match_finite_differences():
    data = arc_data(8)
    mask, vecs = _unique_mask(data)
    idx = np.flatnonzero(mask)[::4][:60]
    xs = [v[idx] for v in vecs]

    dist_fn = _for_one_call(geometry.arc_distance)

    def dist_np(*a):
        return to_numpy(dist_fn(*(_t(v) for v in a)))

    _, grads = value_and_grad(geometry.arc_distance, *xs, argnums=_ARGS4)
    fds = _central_differences(dist_np, xs)
    for got, fd in zip(grads, fds, strict=True):
        np.testing.assert_allclose(got, fd, atol=1e-6, rtol=1e-5)

    dots = _arc_dots(*xs)

    s_fn = _for_one_call(geometry.arc_similarity_from_dots)

    def s_np(*a):
        return to_numpy(s_fn(*(_t(v) for v in a)))

    _, _, grads = _arc_dot_grads(dots)
    fds = _central_differences(s_np, dots)
    for got, fd in zip(grads, fds, strict=True):
        np.testing.assert_allclose(got, fd, atol=1e-6, rtol=1e-5)


def test_arc_gradient_at_zero_distance_is_finite():
    data = arc_data(8)
    sel = np.isin(data["labels"], ["intersecting", "coplanar_overlap", "identical"])
    xs = [data[k][sel] for k in ("x1", "x2", "y1", "y2")]
    for gr in value_and_grad(geometry.arc_distance, *xs, argnums=_ARGS4)[1]:
        assert np.all(np.isfinite(gr))


# -- arcs: float32 and XLA -------------------------------------------------------------------------


def test_arc_float32_and_xla_match_float64():
    data = arc_data(64)
    # Nearly antipodal arcs are ill-conditioned (error ~ eps / sine): compared separately.
    keep = ~np.isin(data["labels"], ["near_antipodal", "both_near_antipodal"])
    xs32 = [data[k][keep].astype(np.float32) for k in ("x1", "x2", "y1", "y2")]
    dots32 = [_t(v) for v in _arc_dots(*xs32)]
    dots64 = [_t(v) for v in _arc_dots(*(x.astype(np.float64) for x in xs32))]
    s64 = to_numpy(geometry.arc_similarity_from_dots(*dots64))
    s32 = geometry.arc_similarity_from_dots(*dots32)
    assert _dtype(s32) == "float32"
    np.testing.assert_allclose(to_numpy(s32), s64, atol=2e-6)
    jit = compiled(functools.partial(geometry.arc_similarity_from_dots,
                                     return_coefficients=True))
    s_jit, coeffs = to_numpy(jit(*dots32))
    np.testing.assert_allclose(s_jit, s64, atol=2e-6)
    assert all(np.all(c >= 0) for c in coeffs)

    d64 = np.sqrt(np.maximum(2 - 2 * s64, 0))

    dist_and_grad = value_and_grad_function(geometry.arc_distance, argnums=_ARGS4,
                                            jit_compile=True)

    tens32 = [_t(v) for v in xs32]
    d32 = to_numpy(geometry.arc_distance(*tens32))
    d_jit, grads = to_numpy(dist_and_grad(*tens32))
    # d = sqrt(2 - 2 s): an error e in s is sqrt(2 e) at d = 0.
    np.testing.assert_allclose(d32, d64, atol=1e-3)
    np.testing.assert_allclose(d_jit, d64, atol=1e-3)
    far = d64 > 0.05
    np.testing.assert_allclose(d_jit[far], d64[far], rtol=1e-4, atol=2e-5)
    for gr in grads:
        assert np.all(np.isfinite(gr))

    # Nearly antipodal (all within the float32 threshold of 1.9e-2 rad): float32 reduces them
    # to endpoints, a subset of the arc, so it can only be lower than float64 (up to rounding).
    sel = ~keep
    xs32 = [data[k][sel].astype(np.float32) for k in ("x1", "x2", "y1", "y2")]
    s32 = to_numpy(geometry.arc_similarity_from_dots(*(_t(v) for v in _arc_dots(*xs32))))
    s64 = to_numpy(geometry.arc_similarity_from_dots(
        *(_t(v.astype(np.float64)) for v in _arc_dots(*xs32))))
    assert np.all(np.isfinite(s32))
    assert np.all(s32 <= s64 + 1e-6)


def test_arc_half_precision_computes_in_float32():
    dots = [_t([0.5], "float16"), _t([0.3], "float16")] + [_t([0.1], "float16")] * 4
    s = geometry.arc_similarity_from_dots(*dots)
    assert _dtype(s) == "float16"
    s32 = geometry.arc_similarity_from_dots(*(ops.cast(t, "float32") for t in dots))
    np.testing.assert_allclose(to_numpy(s).astype(np.float32), to_numpy(s32), atol=1e-3)


# -- arcs: shapes and bad input ------------------------------------------------------------------


def test_arc_broadcasts_on_grids():
    rng = np.random.default_rng(5)
    b, d = 6, 5
    x1, x2, y1, y2 = (_unit(rng.normal(size=(b, d))) for _ in range(4))
    grid = geometry.arc_distance(x1[:, None], x2[:, None], y1[None], y2[None])
    assert tuple(grid.shape) == (b, b)
    grid = to_numpy(grid)
    # Row by row: the b x b pairs as b * b separate problems, in one call.
    rows = geometry.arc_distance(np.repeat(x1, b, 0), np.repeat(x2, b, 0), np.tile(y1, (b, 1)),
                                 np.tile(y2, (b, 1)))
    rows = to_numpy(rows).reshape(b, b)
    for i in range(b):
        np.testing.assert_allclose(grid[i], rows[i], atol=1e-12)
    # Dots of different (broadcastable) shapes: [B, 1] for the positives, [1, B] for the
    # negatives, [B, B] for the cross terms.
    s = geometry.arc_similarity_from_dots(
        np.sum(x1 * x2, -1)[:, None], np.sum(y1 * y2, -1)[None], x1 @ y1.T, x1 @ y2.T,
        x2 @ y1.T, x2 @ y2.T)
    assert tuple(s.shape) == (b, b)
    np.testing.assert_allclose(np.sqrt(np.maximum(2 - 2 * to_numpy(s), 0)), grid, atol=1e-7)


@MB
def test_arc_bad_input():
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="`y2`"):
        geometry.arc_distance(x, x, x, np.ones((2, 4)))
    with pytest.raises(ValueError, match="`x2`"):
        geometry.arc_distance(x, np.ones((2, 4)), x, x)
    with pytest.raises(ValueError, match="`x1`.*rank"):
        geometry.arc_distance(np.float64(1.0), x, x, x)
    with pytest.raises(ValueError, match="`y1`.*rank"):
        geometry.arc_distance(x, x, _t(1.0, "float64"), x)
    with pytest.raises(ValueError, match="`x1`.*floating"):
        geometry.arc_distance(np.ones((2, 3), np.int32), x, x, x)
    with pytest.raises(ValueError, match="`y1`"):
        geometry.arc_distance(x, x, np.ones((3, 3)), x)
    with pytest.raises(ValueError, match="`x1`.*rank"):
        geometry.segment_distance(np.float64(1.0), x, x, x)
    with pytest.raises(ValueError, match="`x2`"):
        geometry.segment_distance(x, np.ones((2, 4)), x, x)
    with pytest.raises(ValueError, match="`x1x2`.*real number"):
        geometry.arc_similarity_from_dots(np.array([True]), *[np.ones(1)] * 5)


# -- segments ----------------------------------------------------------------------------------------


def _seg_kind_cases(n, d, rng, x_mode=None, y_mode=None):
    """Segments a e1 (a in [a_lo, a_hi]) and c e3 + b e2 (b in [b_lo, b_hi]):
    |p1 - p2|^2 = a^2 + b^2 + c^2, minimal at the parameter nearest 0 on each."""
    def ranges(mode):
        lo = rng.uniform(0.05, 1.0, n)
        length = rng.uniform(0.1, 2.0, n)
        inner = rng.uniform(0.1, 0.9, n)
        a_lo = np.where(mode == 0, -inner * length, np.where(mode == 1, lo, -lo - length))
        a_hi = np.where(mode == 0, (1 - inner) * length, np.where(mode == 1, lo + length, -lo))
        return a_lo, a_hi

    x_mode = rng.integers(0, 3, n) if x_mode is None else np.full(n, x_mode)
    y_mode = rng.integers(0, 3, n) if y_mode is None else np.full(n, y_mode)
    a_lo, a_hi = ranges(x_mode)
    b_lo, b_hi = ranges(y_mode)
    c = rng.uniform(0.1, 1.0, n)
    e = np.eye(4)
    pts = np.stack([a_lo[:, None] * e[0], a_hi[:, None] * e[0],
                    c[:, None] * e[2] + b_lo[:, None] * e[1],
                    c[:, None] * e[2] + b_hi[:, None] * e[1]], axis=1)
    out = _embed(pts, d, rng) * rng.uniform(0.2, 5.0, (n, 1, 1)) + rng.normal(size=(n, 1, d))
    return [out[:, i] for i in range(4)]


def make_segment_cases(d, n_random=200, seed=0):
    rng = np.random.default_rng(seed + 77 + 1000 * d)
    cases = {}
    scale = 1.0 / np.sqrt(d)
    n = n_random

    def rand(m, s=1.0):
        return rng.normal(size=(m, d)) * scale * s

    cases["random"] = (rand(n), rand(n), rand(n), rand(n))
    base = rand(n)
    cases["short"] = (base, base + rand(n, 0.2), base + rand(n, 0.5), base + rand(n, 0.7))
    cases["scaled"] = tuple(v * 30.0 for v in (rand(n // 4), rand(n // 4), rand(n // 4),
                                                 rand(n // 4)))
    for xm in range(3):
        for ym in range(3):
            cases[f"kind_{xm}{ym}"] = tuple(_seg_kind_cases(max(n // 8, 12), d, rng, np.int64(xm),
                                                             np.int64(ym)))
    m = max(n // 8, 12)
    x1, x2, y1, y2 = rand(m), rand(m), rand(m), rand(m)
    cases["x_point"] = (x1, x1.copy(), y1, y2)
    cases["y_point"] = (x1, x2, y1, y1.copy())
    cases["both_points"] = (x1, x1.copy(), y1, y1.copy())
    cases["same_point"] = (x1, x1.copy(), x1.copy(), x1.copy())
    u = rand(m)
    off = rand(m)
    t = rng.uniform(-2, 2, (m, 4))
    cases["parallel"] = (x1 + t[:, :1] * u, x1 + t[:, 1:2] * u, x1 + off + t[:, 2:3] * u,
                         x1 + off + t[:, 3:4] * u)
    lo = rng.uniform(-1, 0, (m, 1))
    cases["collinear_overlap"] = (x1 + lo * u, x1 + (lo + 1.0) * u, x1 + (lo + 0.5) * u,
                                  x1 + (lo + rng.uniform(0.6, 2, (m, 1))) * u)
    cases["collinear_disjoint"] = (x1, x1 + u, x1 + rng.uniform(1.1, 2, (m, 1)) * u,
                                   x1 + rng.uniform(2.1, 3, (m, 1)) * u)
    cases["identical"] = (x1, x2, x1.copy(), x2.copy())
    cases["reversed"] = (x1, x2, x2.copy(), x1.copy())
    # Intersecting: a common point inside (or at an end of) both.
    p = rand(m)
    dx, dy = rand(m), rand(m)
    ax, bx, ay, by = (rng.uniform(0, 1, (m, 1)) for _ in range(4))
    ax[: m // 4] = 0.0
    cases["intersecting"] = (p - ax * dx, p + bx * dx, p - ay * dy, p + by * dy)
    # Nearly parallel: direction perturbed by a tiny angle.
    tilt = np.array([1e-9, 1e-7, 1e-5, 1e-3] * (m // 4 + 1))[:m, None]
    cases["nearly_parallel"] = (x1, x1 + u, x1 + off, x1 + off + u + tilt * rand(m))
    cases["tiny"] = (x1, x1 + tilt * rand(m), y1, y1 + tilt[::-1] * rand(m))
    return cases


def brute_segment(x1, x2, y1, y2):
    u, v, w = x2 - x1, y2 - y1, x1 - y1
    uu, vv, uv, uw, vw, ww = (np.sum(a * b, -1)[:, None, None, None] for a, b in (
        (u, u), (v, v), (u, v), (u, w), (v, w), (w, w)))

    def neg_f(s, t):
        s, t = s[..., :, None], t[..., None, :]
        return -(ww + s * s * uu + t * t * vv + 2 * s * uw - 2 * t * vw - 2 * s * t * uv)

    def derivatives(s, t):
        q = [c[:, 0, 0, 0] for c in (uu, vv, uv, uw, vw)]
        q = [c.reshape(c.shape + (1,) * (s.ndim - 1)) for c in q]
        uu_, vv_, uv_, uw_, vw_ = q
        return (-(2 * s * uu_ + 2 * uw_ - 2 * t * uv_), -(2 * t * vv_ - 2 * vw_ - 2 * s * uv_),
                -2 * uu_ + 0 * s, 2 * uv_ + 0 * s, -2 * vv_ + 0 * s)

    def refine(s, t):
        never = np.zeros(s.shape, bool)
        return _newton_refine(neg_f, derivatives, s, t, never, never)

    value, s, t = _zoom_maximize(neg_f, len(x1), starts=1, refine=refine)
    diff = w + s[:, None] * u - t[:, None] * v
    return np.linalg.norm(diff, axis=-1), s, t


@functools.cache
def segment_data(d, n_random=200, seed=0):
    cases = make_segment_cases(d, n_random, seed)
    (x1, x2, y1, y2), labels = _concat(cases)
    dist_bf, s, t = brute_segment(x1, x2, y1, y2)
    return dict(x1=x1, x2=x2, y1=y1, y2=y2, labels=labels, dist_bf=dist_bf, s=s, t=t)


def _seg_dots(x1, x2, y1, y2):
    pairs = ((x1, x1), (x2, x2), (x1, x2), (y1, y1), (y2, y2), (y1, y2), (x1, y1), (x1, y2),
             (x2, y1), (x2, y2))
    return [np.sum(a * b, -1) for a, b in pairs]


def _check_segment_against_brute(data):
    xs = [_t(data[k]) for k in ("x1", "x2", "y1", "y2")]
    dist, (p1, p2) = to_numpy(geometry.segment_distance(*xs, return_points=True))
    scale = 1.0 + np.max(np.abs(np.stack([data[k] for k in ("x1", "x2", "y1", "y2")])),
                         axis=(0, 2))
    excess = dist - data["dist_bf"]
    assert np.max(excess / scale) <= 1e-7, data["labels"][np.argmax(excess)]
    worst = np.argmax(np.abs(excess) / scale)
    assert np.max(np.abs(excess) / scale) <= 1e-4, (data["labels"][worst], excess[worst])
    return np.abs(excess), dist, p1, p2


@pytest.mark.parametrize("d", _mb(8, 3, 64, 512))
def test_segment_distance_matches_brute_force(d):
    data = segment_data(d)
    dev, dist, p1, p2 = _check_segment_against_brute(data)
    assert len(dev) >= 600
    sq, (a1, a2, b1, b2) = to_numpy(geometry.segment_squared_distance_from_dots(
        *(_t(v) for v in _seg_dots(*(data[k] for k in ("x1", "x2", "y1", "y2")))),
        return_coefficients=True))
    # From the dot products the differences cancel: error ~ eps * |x|^2.
    norms = np.max([np.sum(data[k] ** 2, -1) for k in ("x1", "x2", "y1", "y2")], axis=0)
    assert np.all(sq >= 0)
    assert np.all(np.abs(sq - dist ** 2) <= 1e-9 * (1 + norms))
    for c in (a1, a2, b1, b2):
        assert np.all(c >= 0) and np.all(c <= 1)
    x1, x2, y1, y2 = (data[k] for k in ("x1", "x2", "y1", "y2"))
    q1 = a1[:, None] * x1 + a2[:, None] * x2
    q2 = b1[:, None] * y1 + b2[:, None] * y2
    np.testing.assert_allclose(np.sum((q1 - q2) ** 2, -1), sq, atol=1e-9, rtol=1e-7)
    # Returned points: on their segments, at the returned distance.
    np.testing.assert_allclose(np.linalg.norm(p1 - p2, axis=-1), dist, atol=1e-9)
    for p, e1, e2 in ((p1, x1, x2), (p2, y1, y2)):
        length = np.linalg.norm(e2 - e1, axis=-1)
        along = np.linalg.norm(p - e1, axis=-1) + np.linalg.norm(e2 - p, axis=-1)
        np.testing.assert_allclose(along, length, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("d", DIMS)
def test_segment_distance_matches_brute_force_many(d):
    _check_segment_against_brute(segment_data(d, n_random=2000, seed=7))


def test_segment_kinds_all_occur():
    seen = set()
    for d in DIMS:
        data = segment_data(d)
        generic = np.array([lab.startswith(("random", "short", "kind")) for lab in data["labels"]])
        no_deg = np.zeros(len(generic), bool)
        names = kind_names(data["s"], data["t"], no_deg, no_deg)
        seen |= set(names[generic & (names != "")])
        for xm in range(3):
            for ym in range(3):
                sel = data["labels"] == f"kind_{xm}{ym}"
                want = _intended_kind(xm, ym)
                assert np.all(names[sel] == want), (d, want, names[sel])
    assert seen == set(ARC_CASES), seen


def test_segment_degenerate_values():
    data = segment_data(8)
    for group in ("intersecting", "collinear_overlap", "identical", "reversed", "same_point"):
        sel = data["labels"] == group
        dist = geometry.segment_distance(*(_t(data[k][sel]) for k in ("x1", "x2", "y1", "y2")))
        np.testing.assert_allclose(to_numpy(dist), 0.0, atol=1e-7)
    sel = data["labels"] == "both_points"
    dist = geometry.segment_distance(*(_t(data[k][sel]) for k in ("x1", "x2", "y1", "y2")))
    np.testing.assert_allclose(to_numpy(dist), np.linalg.norm(data["x1"][sel] - data["y1"][sel],
                                                              axis=-1), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_segment_gradients_finite_everywhere(dtype):
    def total_from_vectors(*xs):
        dist, (p1, p2) = geometry.segment_distance(*xs, return_points=True)
        return ops.sum(dist) + ops.sum(p1) + ops.sum(p2)

    def total_from_dots(*dots):
        sq, coeffs = geometry.segment_squared_distance_from_dots(*dots,
                                                                 return_coefficients=True)
        return ops.sum(sq) + sum(ops.sum(c) for c in coeffs)

    for d in (3, 8):
        data = segment_data(d)
        xs = [_t(data[k], dtype) for k in ("x1", "x2", "y1", "y2")]
        for gr in value_and_grad(total_from_vectors, *xs, argnums=_ARGS4)[1]:
            assert np.all(np.isfinite(gr))
        dots = [_t(v, dtype) for v in _seg_dots(*(data[k] for k in ("x1", "x2", "y1", "y2")))]
        for gr in value_and_grad(total_from_dots, *dots, argnums=tuple(range(10)))[1]:
            assert np.all(np.isfinite(gr))


def _seg_unique(data):
    generic = np.array([lab.startswith(("random", "short", "kind")) for lab in data["labels"]])
    no_deg = np.zeros(len(generic), bool)
    names = kind_names(data["s"], data["t"], no_deg, no_deg)
    return generic & (names != "") & (data["dist_bf"] > 1e-3)


@pytest.mark.parametrize("d", _mb(8, 3, 64, 512))
def test_segment_dot_gradients_envelope(d):
    """f = |a1 x1 + a2 x2 - b1 y1 - b2 y2|^2 at the optimum; the box does not depend on the
    dots, so df/d(x_i.x_j) and df/d(x_i.y_j) are those of f at fixed coefficients."""
    data = segment_data(d)
    mask = _seg_unique(data)
    dots = [v[mask] for v in _seg_dots(*(data[k] for k in ("x1", "x2", "y1", "y2")))]
    _, grads = value_and_grad(geometry.segment_squared_distance_from_dots, *dots,
                              argnums=tuple(range(10)))
    _, coeffs = geometry.segment_squared_distance_from_dots(*(_t(v) for v in dots),
                                                            return_coefficients=True)
    a1, a2, b1, b2 = to_numpy(coeffs)
    want = [a1 * a1, a2 * a2, 2 * a1 * a2, b1 * b1, b2 * b2, 2 * b1 * b2,
            -2 * a1 * b1, -2 * a1 * b2, -2 * a2 * b1, -2 * a2 * b2]
    for got, exp in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, exp, atol=1e-7)


@MB
def test_segment_gradients_match_finite_differences():
    data = segment_data(8)
    idx = np.flatnonzero(_seg_unique(data))[::4][:60]
    xs = [data[k][idx] for k in ("x1", "x2", "y1", "y2")]

    dist_fn = _for_one_call(geometry.segment_distance)

    def dist_np(*a):
        return to_numpy(dist_fn(*(_t(v) for v in a)))

    _, grads = value_and_grad(geometry.segment_distance, *xs, argnums=_ARGS4)
    for got, fd in zip(grads, _central_differences(dist_np, xs), strict=True):
        np.testing.assert_allclose(got, fd, atol=1e-6, rtol=1e-5)


def test_segment_float32_and_xla_match_float64():
    data = segment_data(64)
    xs32 = [data[k].astype(np.float32) for k in ("x1", "x2", "y1", "y2")]
    d64 = to_numpy(geometry.segment_distance(*(_t(v.astype(np.float64)) for v in xs32)))
    scale = 1.0 + np.max(np.abs(np.stack(xs32)), axis=(0, 2))
    tens = [_t(v) for v in xs32]
    d32 = geometry.segment_distance(*tens)
    assert _dtype(d32) == "float32"
    assert np.max(np.abs(to_numpy(d32) - d64) / scale) < 1e-4
    jit = compiled(functools.partial(geometry.segment_distance, return_points=True))
    d_jit, (p1, p2) = to_numpy(jit(*tens))
    assert np.max(np.abs(d_jit - d64) / scale) < 1e-4
    dots32 = [_t(v) for v in _seg_dots(*xs32)]
    sq_jit = to_numpy(compiled(geometry.segment_squared_distance_from_dots)(*dots32))
    norms = np.max([np.sum(v.astype(np.float64) ** 2, -1) for v in xs32], axis=0)
    assert np.all(np.abs(sq_jit - d64 ** 2) <= 1e-5 * (1 + norms))
