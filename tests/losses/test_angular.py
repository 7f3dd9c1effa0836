"""AngularLoss and TupletMarginLoss against NumPy references and pytorch-metric-learning 2.9.

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from their entries in tests/loss_cases.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import references as ref
from backends import reference_gradient, to_numpy, value_and_grad
from harness import slow_beyond
from pml_data import BATCHES, recorded, uneven_batch

from tfdml.losses import AngularLoss, TupletMarginLoss, angular_loss, tuplet_margin_loss
from tfdml.miners import TripletMiner

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

LOSSES = {
    "angular": (AngularLoss, angular_loss, ref.angular_loss),
    "tuplet_margin": (TupletMarginLoss, tuplet_margin_loss, ref.tuplet_margin_loss),
}


# The defaults of each loss on every commit; other values of the same arguments in the slow
# tier.
@pytest.mark.parametrize("name,args", slow_beyond([
    pytest.param("angular", (), id="angular-args0"),
    pytest.param("angular", (math.radians(55),), id="angular-args1"),
    pytest.param("tuplet_margin", (), id="tuplet_margin-args2"),
    pytest.param("tuplet_margin", (0.3, 16.0), id="tuplet_margin-args3")],
    {"angular-args0", "tuplet_margin-args2"}))
def test_values_and_gradients_match_the_reference(name, args):
    cls, _, reference = LOSSES[name]
    labels, x = uneven_batch()
    loss = cls(*args, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)

    def want(e):
        return reference(labels, e, *args)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_functional_form_equals_the_class(name):
    cls, function, _ = LOSSES[name]
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(to_numpy(function(labels, x)),
                               to_numpy(cls(dtype="float64")(labels, x)), rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_tuplet_margin_loss_equals_pytorch_metric_learning(batch):
    labels, x, (want_value, want_grad) = recorded("tuplet_margin", batch)
    loss = TupletMarginLoss(dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    np.testing.assert_allclose(value, want_value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-7, atol=1e-10)


# The pk batch (slow tier) is the same reading on a larger batch; uneven and pairs run on
# every commit.
@pytest.mark.parametrize("batch", slow_beyond(BATCHES, {"uneven", "pairs"}))
def test_angular_loss_differs_from_pytorch_metric_learning_by_its_unnormalized_negatives(batch):
    """pytorch-metric-learning 2.9 normalizes the anchor and the positive but multiplies
    their sum by the negatives' embeddings as given; the paper (and tfdml) L2-normalizes
    every embedding. The reference with pml's reading gives pml's numbers exactly."""
    labels, x, (want_value, want_grad) = recorded("angular", batch)
    value, _ = value_and_grad(lambda e: AngularLoss(dtype="float64")(labels, e), x)
    np.testing.assert_allclose(value, ref.angular_loss(labels, x), rtol=1e-12)
    assert abs(float(value) - float(want_value)) > 1.0

    def pml_reading(e):
        return ref.angular_loss(labels, e, raw_negatives=True)

    np.testing.assert_allclose(pml_reading(x), want_value, rtol=1e-12)
    np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-7,
                               atol=1e-9)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_duplicates_and_a_batch_without_negatives_are_finite(name):
    labels, x = uneven_batch(2)
    x[4] = x[3]  # a positive pair at angle 0
    cls = LOSSES[name][0]
    value, grad = value_and_grad(lambda e: cls(dtype="float64")(labels, e), x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    one_class = np.zeros(6, np.int64)
    value, grad = value_and_grad(lambda e: cls(dtype="float64")(one_class, e), x[:6])
    assert value == 0.0 and np.all(grad == 0.0)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_miner_restricts_the_pairs(name):
    labels, x = uneven_batch(3)
    cls = LOSSES[name][0]
    every = to_numpy(cls(dtype="float64")(labels, x))
    mined = to_numpy(cls(miner=TripletMiner("hard", "hard"), dtype="float64")(labels, x))
    assert np.isfinite(mined) and mined != every


@pytest.mark.parametrize("make,match", [
    (lambda: AngularLoss(alpha=0.0), "alpha"), (lambda: AngularLoss(alpha=math.pi / 2), "alpha"),
    (lambda: AngularLoss(alpha=40), "alpha"), (lambda: AngularLoss(miner="x"), "miner"),
    (lambda: TupletMarginLoss(margin=float("nan")), "margin"),
    (lambda: TupletMarginLoss(margin=5.73), "margin"),
    (lambda: TupletMarginLoss(scale=0.0), "scale"), (lambda: TupletMarginLoss(scale="64"), "scale")])
def test_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()
