"""The references of InstanceLoss and VICRegLoss."""

from __future__ import annotations

import numpy as np

from .core import l2_normalize


def _lse(values):
    values = np.asarray(values, np.float64)
    top = values.max()
    return float(top + np.log(np.sum(np.exp(values - top))))


def instance_loss(labels, x, gamma=64.0, ref=None, ref_labels=None):
    """tfdml's InstanceLoss by loops: per anchor ``-log sum_{j: y_j = y_a} softmax_j(gamma
    s_aj)`` over the reference set (the batch by default), the mean over the anchors with
    a target."""
    x = l2_normalize(np.asarray(x, np.float64))
    ref = x if ref is None else l2_normalize(np.asarray(ref, np.float64))
    ref_labels = labels if ref_labels is None else ref_labels
    losses = []
    for a in range(len(labels)):
        logits = gamma * (ref @ x[a])
        targets = np.asarray(ref_labels) == labels[a]
        if targets.all():
            losses.append(0.0)
        elif targets.any():  # log(1 + e^{lse_others - lse_own}), exact for tiny losses
            losses.append(float(np.logaddexp(0.0, _lse(logits[~targets]) - _lse(logits[targets]))))
    return float(np.mean(losses)) if losses else 0.0


def pml_instance_loss(labels, x, gamma=64.0):
    """pytorch-metric-learning 2.9's reading: the cross-entropy of ``gamma s_a.`` with target
    column ``rank(y_a)`` among the sorted unique labels, averaged over the batch."""
    x = l2_normalize(np.asarray(x, np.float64))
    _, target = np.unique(labels, return_inverse=True)
    logits = gamma * (x @ x.T)
    return float(np.mean([_lse(logits[a]) - logits[a, target[a]] for a in range(len(x))]))


def vicreg_loss(z1, z2, invariance_lambda=25.0, variance_mu=25.0, covariance_v=1.0, eps=1e-4):
    """VICReg (Bardes et al.) as the authors' code computes it: the mean squared difference,
    the hinge on the standard deviations (each view's mean halved) and the squared
    off-diagonal covariances over D, per view; a batch of one has variance 0."""
    z1, z2 = np.asarray(z1, np.float64), np.asarray(z2, np.float64)
    n, d = z1.shape
    invariance = np.mean((z1 - z2) ** 2)
    variance = covariance = 0.0
    for z in (z1, z2):
        centered = z - z.mean(axis=0)
        cov = centered.T @ centered / max(n - 1, 1)
        std = np.sqrt(np.diag(cov) + eps)
        variance += np.mean(np.maximum(1.0 - std, 0.0)) / 2
        covariance += (np.sum(cov ** 2) - np.sum(np.diag(cov) ** 2)) / d
    return invariance_lambda * invariance + variance_mu * variance + covariance_v * covariance
