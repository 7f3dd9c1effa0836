"""The classification losses (tfdml.losses.classification): what the shared class-vector
tests of tests/losses/test_class_weights.py do not cover, on its data and cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import references as ref
from test_class_weights import LABELS, W2, W3, B, X

pytestmark = pytest.mark.multibackend


def test_arcface_batch_reaches_both_branches():
    """The batch has targets on both sides of theta_y = pi - m (checked on the reference)."""
    for weights, margin in ((W2, 0.5), (W3, 0.4)):
        cos = ref.class_cosines(X, weights)
        cos_y = [max(np.atleast_1d(cos[b][LABELS[b]])) for b in range(B)]
        past = [math.acos(c) > math.pi - margin for c in cos_y]
        assert any(past) and not all(past)
