"""Proxy Anchor and Proxy-NCA (tfdml.losses.proxies): what the shared class-vector tests of
tests/losses/test_class_vectors.py do not cover, on its data and cases."""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import to_numpy
from test_class_vectors import BY_ID, F32_RTOL, LABELS, W2, B, C, X, _with_sample_weight

from tfdml.losses import ProxyAnchorLoss

pytestmark = pytest.mark.multibackend


def test_proxy_anchor_has_no_per_sample_reduction():
    for reduction in ("none", None):
        with pytest.raises(ValueError, match="reduction"):
            ProxyAnchorLoss(num_classes=C, reduction=reduction)


@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_proxy_anchor_sample_weight():
    """A weight multiplies the sample's exponentials: ones are the unweighted loss; a zero
    drops the sample (here the only sample of class 3, which then leaves P+)."""
    x32 = X.astype(np.float32)
    loss = BY_ID["proxy_anchor"].make()
    loss.class_vectors.assign(W2.astype(np.float32))
    unweighted = float(to_numpy(loss(LABELS, x32)))
    np.testing.assert_allclose(unweighted, ref.proxy_anchor_loss(LABELS, X, W2), rtol=F32_RTOL)
    weighted = _with_sample_weight(loss)
    ones = np.ones(B, np.float32)
    np.testing.assert_allclose(weighted(LABELS, x32, ones), unweighted, rtol=1e-6)
    weights = np.array([1.0, 0.5, 2.0, 0.0, 1.0, 3.0, 0.25, 1.0, 0.0], np.float32)
    kept = weights > 0
    dropped = ref.proxy_anchor_loss(LABELS[kept], X[kept], W2)
    assert abs(dropped - unweighted) > 1e-2
    got = weighted(LABELS, x32, weights)
    np.testing.assert_allclose(got, ref.proxy_anchor_loss(LABELS, X, W2, sample_weight=weights),
                               rtol=F32_RTOL)
    binary = kept.astype(np.float32)
    np.testing.assert_allclose(weighted(LABELS, x32, binary), dropped, rtol=F32_RTOL)
    for reduction in ("sum", "mean_with_sample_weight"):  # a sum over proxies: all the same
        other = BY_ID["proxy_anchor"].make(reduction=reduction)
        other.class_vectors.assign(W2.astype(np.float32))
        np.testing.assert_allclose(_with_sample_weight(other)(LABELS, x32, weights), got,
                                   rtol=1e-6)

