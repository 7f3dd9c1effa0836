"""The references of the self-supervised losses: Barlow Twins, SimSiam, BYOL and MoCo.

Written from the papers (and the authors' code where the paper leaves a choice open), with
loops and float64. The targets of SimSiam and BYOL and the keys and queue of MoCo are
constants of the gradient (stop-gradient): a finite-difference gradient of these functions
with respect to the predictions / queries is the gradient the losses must have; with
respect to the targets / keys it must be zero.
"""

from __future__ import annotations

import math

import numpy as np

from .core import dot, l2_normalize, logsumexp, norm

#: SimSiam's comparisons of a prediction with its target (TensorFlow Similarity's names).
SIMSIAM_PROJECTIONS = ("negative_cosine_sim", "cosine_distance", "angular_distance")


def _floats(x):
    return np.array(x, dtype=np.float64, copy=True)


# -- Barlow Twins -------------------------------------------------------------------------------


def barlow_standardize(z, eps=1e-5):
    """Each column of ``[N, D]`` minus its mean, divided by ``sqrt(population variance +
    eps)`` (BatchNorm1d without affine parameters, in training mode)."""
    z = _floats(z)
    n, d = z.shape
    out = np.zeros_like(z)
    for k in range(d):
        mean = sum(z[i, k] for i in range(n)) / n
        variance = sum((z[i, k] - mean) ** 2 for i in range(n)) / n
        for i in range(n):
            out[i, k] = (z[i, k] - mean) / math.sqrt(variance + eps)
    return out


def barlow_cross_correlation(za, zb, eps=1e-5):
    """``C = std(Za)^T std(Zb) / N``, ``[D, D]``."""
    a, b = barlow_standardize(za, eps), barlow_standardize(zb, eps)
    n, d = a.shape
    c = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            c[i, j] = sum(a[r, i] * b[r, j] for r in range(n)) / n
    return c


def barlow_twins_loss(za, zb, lambda_=5e-3, eps=1e-5):
    """Barlow Twins (Zbontar et al. 2021): ``sum_i (1 - C_ii)^2 + lambda sum_{i != j}
    C_ij^2``."""
    c = barlow_cross_correlation(za, zb, eps)
    on = off = 0.0
    for i in range(len(c)):
        for j in range(len(c)):
            if i == j:
                on += (1.0 - c[i, i]) ** 2
            else:
                off += c[i, j] ** 2
    return on + lambda_ * off


# -- SimSiam and BYOL ---------------------------------------------------------------------------


def cosine(u, v):
    """``cos(u, v)``; 0 when either is the zero vector."""
    nu, nv = norm(u), norm(v)
    if nu == 0.0 or nv == 0.0:
        return 0.0
    return dot(u, v) / (nu * nv)


def simsiam_values(p, z, projection_type="negative_cosine_sim"):
    """SimSiam (Chen & He 2021) per row ``[N]``: ``-cos``, ``1 - cos`` or ``arccos(cos) /
    pi`` of prediction ``p_i`` and target ``z_i``."""
    p, z = _floats(p), _floats(z)
    values = np.zeros(len(p))
    for i in range(len(p)):
        c = cosine(p[i], z[i])
        if projection_type == "negative_cosine_sim":
            values[i] = -c
        elif projection_type == "cosine_distance":
            values[i] = 1.0 - c
        elif projection_type == "angular_distance":
            values[i] = math.acos(min(1.0, max(-1.0, c))) / math.pi
        else:
            raise ValueError(projection_type)
    return values


def simsiam_loss(p, z, projection_type="negative_cosine_sim"):
    """The mean over rows of :func:`simsiam_values`."""
    return float(np.mean(simsiam_values(p, z, projection_type)))


def byol_values(p, z):
    """BYOL (Grill et al. 2020, eq. 2) per row: ``|p_i / |p_i| - z_i / |z_i||^2``, that is
    ``2 - 2 cos(p_i, z_i)``."""
    p, z = _floats(p), _floats(z)
    values = np.zeros(len(p))
    for i in range(len(p)):
        values[i] = 2.0 - 2.0 * cosine(p[i], z[i])
    return values


def byol_loss(p, z):
    """The mean over rows of :func:`byol_values`."""
    return float(np.mean(byol_values(p, z)))


# -- MoCo ---------------------------------------------------------------------------------------


def moco_values(queries, keys, queue=None, temperature=0.2):
    """MoCo's InfoNCE per query ``[2N]``.

    ``queries`` and ``keys`` are ``[view1; view2]`` (``[2N, D]``). Query ``a`` of sample
    ``i`` has as positive the key of the other view of sample ``i``; its negatives are the
    rows of ``queue`` or, without one (MoCo v3), the keys of the other view of the other
    samples. Everything L2-normalized; ``logsumexp(logits) - positive logit`` with logits
    ``q . k / T``.
    """
    q, k = l2_normalize(queries), l2_normalize(keys)
    rows = len(q)
    half = rows // 2
    past = None if queue is None else l2_normalize(queue)
    values = np.zeros(rows)
    for a in range(rows):
        other = (a + half) % rows  # the other view of the same sample
        positive = dot(q[a], k[other]) / temperature
        if past is not None:
            negatives = [dot(q[a], u) / temperature for u in past]
        else:
            view = range(half, rows) if a < half else range(half)
            negatives = [dot(q[a], k[j]) / temperature for j in view if j != other]
        values[a] = logsumexp([positive, *negatives]) - positive
    return values


def moco_loss(queries, keys, queue=None, temperature=0.2):
    """The mean over the queries of :func:`moco_values`."""
    return float(np.mean(moco_values(queries, keys, queue, temperature)))
