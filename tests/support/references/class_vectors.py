"""The references of the proxy and classification losses: learned class vectors.

Every loss here compares the L2-normalized embedding x_b with L2-normalized class vectors
(one per class, [C, D], or k per class, [C, k, D]) by their cosine, loops over samples and
classes, and returns ``(value, per_sample)`` with ``value`` the mean of the list
``per_sample`` (Proxy Anchor, a sum over proxies, returns its value only).
"""

from __future__ import annotations

import math

import numpy as np

from .core import cross_entropy, dot, l2_normalize, logsumexp, plain_mean, squared_distance

# -- class vectors --------------------------------------------------------------------------------


def unit_class_vectors(weights):
    """``[C, D]`` or ``[C, k, D]`` class vectors, each vector L2-normalized (float64)."""
    w = np.asarray(weights, dtype=np.float64)
    flat = l2_normalize(w.reshape(-1, w.shape[-1]))
    return flat.reshape(w.shape)


def class_cosines(embeddings, weights):
    """``cos[b][c]`` (``[C, D]`` weights) or ``cos[b][c][j]`` (``[C, k, D]``), nested lists."""
    x = l2_normalize(embeddings).tolist()
    w = unit_class_vectors(weights)
    out = []
    for b in range(len(x)):
        row = []
        for c in range(w.shape[0]):
            if w.ndim == 2:
                row.append(dot(x[b], w[c]))
            else:
                row.append([dot(x[b], w[c, j]) for j in range(w.shape[1])])
        out.append(row)
    return out


def _class_ids(labels):
    return [int(v) for v in np.asarray(labels).reshape(-1)]


def _mean_of_samples(per_sample):
    return plain_mean(per_sample), per_sample


# -- proxy losses ---------------------------------------------------------------------------------


def proxy_anchor_loss(labels, embeddings, proxies, margin=0.1, alpha=32.0, sample_weight=None):
    """Proxy Anchor loss (Kim et al. 2020). Returns the value.

    Per proxy ``c``: ``pos_c = log(1 + sum_{b: y_b = c} w_b exp(-alpha (cos_bc - margin)))``
    and ``neg_c = log(1 + sum_{b: y_b != c} w_b exp(alpha (cos_bc + margin)))``; the
    value is ``sum_c pos_c / #(classes with a sample) + sum_c neg_c / C``. ``w_b`` is
    the sample weight (1 without); a sample of weight 0 is left out altogether.
    """
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, proxies)
    num_classes = np.asarray(proxies).shape[0]
    weights = [1.0] * len(labels) if sample_weight is None else [
        float(w) for w in np.asarray(sample_weight).reshape(-1)]
    positive_total, present, negative_total = 0.0, 0, 0.0
    for c in range(num_classes):
        pull, push, has_sample = 0.0, 0.0, False
        for b in range(len(labels)):
            if weights[b] == 0.0:
                continue
            if labels[b] == c:
                pull += weights[b] * math.exp(-alpha * (cos[b][c] - margin))
                has_sample = True
            else:
                push += weights[b] * math.exp(alpha * (cos[b][c] + margin))
        if has_sample:
            positive_total += math.log1p(pull)
            present += 1
        negative_total += math.log1p(push)
    return (positive_total / present if present else 0.0) + negative_total / num_classes


def proxy_nca_loss(labels, embeddings, proxies, scale=1.0):
    """Proxy-NCA: per sample ``-log softmax_y(-scale |x - p_c|^2)`` over all ``C`` proxies."""
    labels = _class_ids(labels)
    x = l2_normalize(embeddings)
    p = unit_class_vectors(proxies)
    per_sample = []
    for b in range(len(labels)):
        logits = [-scale * squared_distance(x[b], p[c]) for c in range(p.shape[0])]
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


# -- softmax losses with margins ------------------------------------------------------------------


def normalized_softmax_loss(labels, embeddings, weights, temperature=0.05):
    """Normalized softmax: per sample the cross-entropy of ``cos_c / temperature``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, weights)
    per_sample = [cross_entropy([c / temperature for c in cos[b]], labels[b])
                  for b in range(len(labels))]
    return _mean_of_samples(per_sample)


def _target_margin_loss(labels, cos, scale, target_logit):
    """Cross-entropy of ``scale * cos_c``, the target column ``scale * target_logit(cos_y)``."""
    per_sample = []
    for b in range(len(labels)):
        y = labels[b]
        logits = [scale * target_logit(cos[b][c]) if c == y else scale * cos[b][c]
                  for c in range(len(cos[b]))]
        per_sample.append(cross_entropy(logits, y))
    return _mean_of_samples(per_sample)


def cosface_loss(labels, embeddings, weights, margin=0.35, scale=64.0):
    """CosFace: target logit ``scale (cos_y - margin)``, the others ``scale cos_c``."""
    return _target_margin_loss(_class_ids(labels), class_cosines(embeddings, weights), scale,
                               lambda cos_y: cos_y - margin)


def arcface_target(cos_y, margin):
    """``cos(theta + m)`` with ``theta = arccos(cos_y)`` if ``theta <= pi - m``, else
    ``cos_y - m sin(m)``."""
    theta = math.acos(min(max(cos_y, -1.0), 1.0))
    if theta <= math.pi - margin:
        return math.cos(theta + margin)
    return cos_y - margin * math.sin(margin)


def arcface_loss(labels, embeddings, weights, margin=0.5, scale=64.0):
    """ArcFace: target logit ``scale * arcface_target(cos_y)``, the others ``scale cos_c``."""
    return _target_margin_loss(_class_ids(labels), class_cosines(embeddings, weights), scale,
                               lambda cos_y: arcface_target(cos_y, margin))


def subcenter_arcface_loss(labels, embeddings, weights, margin=0.5, scale=64.0):
    """Sub-centre ArcFace: ``cos_c`` = the largest cosine of class ``c``'s ``k`` sub-centres."""
    nearest = [[max(centres) for centres in row] for row in class_cosines(embeddings, weights)]
    return _target_margin_loss(_class_ids(labels), nearest, scale,
                               lambda cos_y: arcface_target(cos_y, margin))


def soft_triple_loss(labels, embeddings, centers, la=20.0, gamma=0.1, margin=0.01):
    """SoftTriple: ``S_c = sum_j softmax_j(cos_cj / gamma) cos_cj``; per sample the
    cross-entropy of ``la (S_c - margin [c = y])``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, centers)
    per_sample = []
    for b in range(len(labels)):
        logits = []
        for c, centres in enumerate(cos[b]):
            log_z = logsumexp([v / gamma for v in centres])
            similarity = sum(math.exp(v / gamma - log_z) * v for v in centres)
            logits.append(la * (similarity - (margin if c == labels[b] else 0.0)))
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


def p2s_grad_loss(labels, embeddings, weights):
    """P2SGrad as a loss: per sample ``1/2 sum_c (cos_c - [c = y])^2``."""
    labels = _class_ids(labels)
    cos = class_cosines(embeddings, weights)
    per_sample = [0.5 * sum((cos[b][c] - (1.0 if c == labels[b] else 0.0)) ** 2
                            for c in range(len(cos[b]))) for b in range(len(labels))]
    return _mean_of_samples(per_sample)


def large_margin_psi(cos, margin):
    """L-Softmax's ``(-1)^k cos(m theta) - 2k`` for ``theta`` in ``[k pi/m, (k+1) pi/m]``."""
    theta = math.acos(min(max(cos, -1.0), 1.0))
    k = math.floor(theta * margin / math.pi)
    return (-1) ** k * math.cos(margin * theta) - 2 * k


def large_margin_softmax_loss(labels, embeddings, weights, margin=4, scale=1.0,
                              weight_norms=True):
    """L-Softmax (Liu et al. 2016): logits ``scale |w_c| |x| cos``, the target's with
    ``psi`` instead of ``cos``. ``weight_norms=False``: SphereFace (unit weights)."""
    labels = _class_ids(labels)
    x = np.asarray(embeddings, np.float64)
    w = np.asarray(weights, np.float64)
    cos = class_cosines(x, w)
    per_sample = []
    for b in range(len(labels)):
        logits = []
        for c in range(w.shape[0]):
            magnitude = np.linalg.norm(x[b]) * (np.linalg.norm(w[c]) if weight_norms else 1.0)
            f = large_margin_psi(cos[b][c], margin) if c == labels[b] else cos[b][c]
            logits.append(scale * magnitude * f)
        per_sample.append(cross_entropy(logits, labels[b]))
    return _mean_of_samples(per_sample)


def sphereface_loss(labels, embeddings, weights, margin=4, scale=1.0):
    """SphereFace (Liu et al. 2017): L-Softmax with unit class weights."""
    return large_margin_softmax_loss(labels, embeddings, weights, margin, scale,
                                     weight_norms=False)
