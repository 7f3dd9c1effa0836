"""The classification losses (tfdml.losses.classification): what the shared class-vector
tests of tests/losses/test_class_vectors.py do not cover, on its data and cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    compiled,
    to_numpy,
    traced,
    value_and_grad,
    value_and_grad_function,
)
from keras import ops
from test_class_vectors import BY_ID, LABELS, W2, W3, B, C, X

from tfdml.losses import (
    cosface_loss,
    large_margin_softmax_loss,
    normalized_softmax_loss,
    soft_triple_loss,
)
from tfdml.losses.large_margin import _multiple_angle_target

pytestmark = pytest.mark.multibackend


def test_arcface_batch_reaches_both_branches():
    """The batch has targets on both sides of theta_y = pi - m (checked on the reference)."""
    for weights, margin in ((W2, 0.5), (W3, 0.4)):
        cos = ref.class_cosines(X, weights)
        cos_y = [max(np.atleast_1d(cos[b][LABELS[b]])) for b in range(B)]
        past = [math.acos(c) > math.pi - margin for c in cos_y]
        assert any(past) and not all(past)


# -- arguments that would give NaN, and large angle multipliers ---------------------------------


@pytest.mark.parametrize("case_id,kwargs,match", [
    ("large_margin_softmax", dict(margin=129), "margin=129"),
    ("large_margin_softmax", dict(margin=10**6), "margin=1000000"),
    ("sphereface", dict(margin=200), "margin=200"),
    ("large_margin_softmax", dict(scale=1e39), "scale=1e\\+39"),
    ("sphereface", dict(scale=2e6), "scale=2000000.0"),
    ("cosface", dict(scale=1e10), "scale=10000000000.0"),
    ("arcface", dict(scale=1e39), "scale=1e\\+39"),
    ("subcenter_arcface", dict(scale=1e7), "scale=10000000.0"),
    ("normalized_softmax", dict(temperature=1e-39), "temperature=1e-39"),
    ("normalized_softmax", dict(temperature=1e-7), "temperature=1e-07"),
    ("soft_triple", dict(gamma=1e-10), "gamma=1e-10"),
    ("soft_triple", dict(la=1e39), "la=1e\\+39"),
    ("cosface", dict(margin=1e8), "margin=100000000.0"),
    ("soft_triple", dict(margin=2.5), "margin=2.5"),
])
def test_arguments_that_overflow_float32_logits_are_refused(case_id, kwargs, match):
    """Both forms refuse them, naming the argument and the value. Beyond 3.4e38 (float32's
    range) every value was NaN; compiled, logits of about 1e9 already made the softmax Inf or
    NaN (CosFace with scale=1e10 or margin=1e8, SoftTriple with gamma=1e-9 under jax.jit);
    a cosine margin above 2 can never be met; L-Softmax
    margins above 128 gave finite values that float32 cosines cannot resolve."""
    case = BY_ID[case_id]
    with pytest.raises(ValueError, match=match):
        case.functional(LABELS, X, case.weights, **{**case.kwargs, **kwargs})
    with pytest.raises(ValueError, match=match):
        case.cls(num_classes=C, **{**case.kwargs, **case.class_kwargs, **kwargs})


def test_the_extreme_values_accepted_are_the_same_compiled():
    x, w2, w3 = (a.astype(np.float32) for a in (X, W2, W3))

    def values(x, w, w3):
        return ops.stack([normalized_softmax_loss(LABELS, x, w, temperature=1e-6),
                          cosface_loss(LABELS, x, w, scale=1e6),
                          soft_triple_loss(LABELS, x, w3, la=1e6, gamma=1e-6),
                          large_margin_softmax_loss(LABELS, x, w, margin=128)])

    # Under JAX "eager" is jitted too (eagerly it compiles every op).
    eager = to_numpy((traced(values) if BACKEND == "jax" else values)(x, w2, w3))
    assert np.all(np.isfinite(eager)) and np.all(eager[:3] > 1e5)
    np.testing.assert_allclose(to_numpy(compiled(values)(x, w2, w3)), eager, rtol=1e-5)


@pytest.mark.parametrize("margin", [1, 4, 20, 64, 128])
def test_psi_is_accurate_in_float32_up_to_the_largest_margin(margin):
    """``(-1)^k cos(m theta) - 2k`` of float32 cosines, the ends included, against float64
    ``cos(m arccos c)`` at the same cosines: within ``m^2`` rounding errors. The sum of the
    multiple-angle formula was off by 150 at m = 64 and NaN from m = 132."""
    cos = np.concatenate([np.linspace(-1.0, 1.0, 2001), 1.0 - np.arange(50) * 2.0**-24,
                          -1.0 + np.arange(50) * 2.0**-23]).astype(np.float32)
    got, grad = value_and_grad(lambda c: _multiple_angle_target(c, margin), cos)
    want = np.array([ref._psi(float(c), margin) for c in cos])
    np.testing.assert_allclose(got, want, rtol=0, atol=max(2e-8 * margin**2, 1e-6))
    assert np.all(np.isfinite(grad))
    # d psi / d cos = m sin(m theta) / sin(theta) (-1)^k: m^2 at theta = 0.
    np.testing.assert_allclose(grad[cos == 1.0], margin**2, rtol=1e-5)


@pytest.mark.parametrize("margin", [20, 128])
def test_large_margin_softmax_with_a_large_margin_is_its_reference(margin):
    x, w = X.astype(np.float32), W2.astype(np.float32)
    value, grad = to_numpy(value_and_grad_function(
        lambda e: large_margin_softmax_loss(LABELS, e, w, margin=margin),
        jit_compile=BACKEND == "jax")(x))
    want = ref.large_margin_softmax_loss(LABELS, X, W2, margin=margin)[0]
    np.testing.assert_allclose(float(value), want, rtol=1e-4)
    assert np.all(np.isfinite(grad))
