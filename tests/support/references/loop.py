"""The references of the LoOp losses (optimal hard negatives between pairs) and their
HPHN / lifted-structure baselines."""

from __future__ import annotations

import numpy as np


def _arc_points(a, b, count):
    """``count`` points of the shorter great-circle arc from unit vector ``a`` to ``b``."""
    cos = float(np.clip(a @ b, -1.0, 1.0))
    angle = np.arccos(cos)
    ortho = b - cos * a
    norm = np.linalg.norm(ortho)
    if norm < 1e-12:  # a point (a == b) or undefined (a == -b): the two endpoints only
        return np.stack([a, b])
    ortho = ortho / norm
    t = np.linspace(0.0, angle, count)[:, None]
    return np.cos(t) * a + np.sin(t) * ortho


def brute_force_arc_distance(x1, x2, y1, y2, count=801):
    """Minimum distance between two arcs: dense sampling, then a bounded local refinement."""
    from scipy.optimize import minimize

    def point(a, b, t):
        cos = float(np.clip(a @ b, -1.0, 1.0))
        ortho = b - cos * a
        norm = np.linalg.norm(ortho)
        if norm < 1e-12:
            return a if t < 0.5 else b
        return np.cos(t * np.arccos(cos)) * a + np.sin(t * np.arccos(cos)) * ortho / norm

    p, q = _arc_points(x1, x2, count), _arc_points(y1, y2, count)
    d = np.linalg.norm(p[:, None, :] - q[None, :, :], axis=-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    best = d[i, j]
    if len(p) > 2 and len(q) > 2:
        start = (i / (len(p) - 1), j / (len(q) - 1))
        res = minimize(lambda z: np.linalg.norm(point(x1, x2, z[0]) - point(y1, y2, z[1])),
                       start, bounds=[(0, 1), (0, 1)], method="L-BFGS-B",
                       options={"ftol": 1e-15, "gtol": 1e-12})
        best = min(best, float(res.fun))
    return best


def brute_force_segment_distance(x1, x2, y1, y2, count=801):
    """Minimum distance between two straight segments, by dense sampling + refinement."""
    from scipy.optimize import minimize

    t = np.linspace(0.0, 1.0, count)[:, None]
    p, q = x1 + t * (x2 - x1), y1 + t * (y2 - y1)
    d = np.linalg.norm(p[:, None, :] - q[None, :, :], axis=-1)
    i, j = np.unravel_index(np.argmin(d), d.shape)
    res = minimize(lambda z: np.linalg.norm(x1 + z[0] * (x2 - x1) - y1 - z[1] * (y2 - y1)),
                   (t[i, 0], t[j, 0]), bounds=[(0, 1), (0, 1)], method="L-BFGS-B",
                   options={"ftol": 1e-15, "gtol": 1e-12})
    return min(float(d[i, j]), float(res.fun))


def label_pairs(labels):
    """Disjoint same-class pairs: per class, in batch order, (1st, 2nd), (3rd, 4th), ..."""
    labels = np.asarray(labels).reshape(-1)
    pairs = []
    for c in sorted(set(labels.tolist())):
        members = [i for i in range(len(labels)) if labels[i] == c]
        pairs += [(members[t], members[t + 1]) for t in range(0, len(members) - 1, 2)]
    return pairs


def loop_losses(labels, embeddings, base, margin, normalized=True, alpha=2.0, beta=50.0,
                epsilon=0.1, loop=True):
    """The LoOp losses (and, with ``loop=False``, the HPHN / lifted-structure baselines).

    Loops over positive pairs and negative pairs; the LoOp distance is the
    brute-force minimum between the arcs (or segments). Returns ``(value, per_key)``
    where ``per_key`` maps a pair's first sample (a sample, for MS) to its loss.
    """
    labels = np.asarray(labels).reshape(-1)
    x = np.asarray(embeddings, np.float64)
    if normalized:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    n = len(labels)
    d = np.array([[np.linalg.norm(x[i] - x[k]) for k in range(n)] for i in range(n)])
    pairs = label_pairs(labels)
    between = brute_force_arc_distance if normalized else brute_force_segment_distance
    loop_d = {}
    for (i, j) in pairs:
        for (k, m) in pairs:
            if labels[k] != labels[i]:
                loop_d[(i, j), (k, m)] = between(x[i], x[j], x[k], x[m])
    per_key = {}
    if base == "multi_similarity":
        sim = 1.0 - d**2 / 2.0
        for (i, j) in pairs:
            negs = [q for q in pairs if labels[q[0]] != labels[i]]
            for a in (i, j):
                same = [k for k in range(n) if k != a and labels[k] == labels[a]]
                other = [k for k in range(n) if labels[k] != labels[a]]
                if not same or not other:
                    continue
                pos = [sim[a, k] for k in same if sim[a, k] - epsilon < max(sim[a, o] for o in other)]
                neg = [1.0 - loop_d[(i, j), q] ** 2 / 2.0 for q in negs]
                neg = [s for s in neg if s > min(sim[a, k] for k in same) - epsilon]
                if not pos or not neg:
                    continue
                per_key[a] = (np.log1p(sum(np.exp(-alpha * (s - margin)) for s in pos)) / alpha
                              + np.log1p(sum(np.exp(beta * (s - margin)) for s in neg)) / beta)
    else:
        for (i, j) in pairs:
            negs = [q for q in pairs if labels[q[0]] != labels[i]]
            if loop:
                if not negs:
                    continue
                loop_values = [loop_d[(i, j), q] for q in negs]
                closest = min(loop_values)
            else:
                others = [d[a, k] for a in (i, j) for k in range(n) if labels[k] != labels[a]]
                if not others:
                    continue
                closest = min(others)
            if base == "triplet":
                per_key[i] = sum(max(d[i, j] - v + margin, 0.0) for v in loop_values)
            elif base == "hphn_triplet":
                far = max(d[a, k] for a in (i, j) for k in range(n) if labels[k] == labels[a])
                per_key[i] = max(far + margin - closest, 0.0)
            elif base == "lifted_structure":
                per_key[i] = max(d[i, j] + margin - closest, 0.0)
            else:
                raise ValueError(base)
    value = float(np.mean(list(per_key.values()))) if per_key else 0.0
    return value, per_key
