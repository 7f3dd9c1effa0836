"""InstanceLoss against a NumPy reference and pytorch-metric-learning 2.9.

pml's InstanceLoss targets column ``rank(y_a)`` of the batch (the rank of the anchor's label
among the sorted unique labels), which is the anchor itself only for distinct labels in
ascending batch order (``arange(B)``); tfdml targets every sample of the anchor's class, the anchor included. The
contract tests come from the ``instance`` entry of tests/loss_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import BACKEND, reference_gradient, to_numpy, value_and_grad
from pml_data import DATA, uneven_batch

from tfdml.losses import InstanceLoss, instance_loss

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

GAMMAS = {"instance": 64.0, "instance_16": 16.0}
ONE_BATCH = pytest.mark.skipif(BACKEND == "jax", reason="JAX: one batch (each shape compiles)")


def _value_and_grad(labels, x, gamma):
    loss = InstanceLoss(gamma, dtype="float64")
    return value_and_grad(lambda e: loss(labels, e), x)


@pytest.mark.parametrize("gamma", [16.0, 3.0])
def test_values_and_gradients_match_the_reference(gamma):
    labels, x = uneven_batch()
    value, grad = _value_and_grad(labels, x, gamma)

    def want(e):
        return ref.instance_loss(labels, e, gamma)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-7, atol=1e-11)


def test_functional_form_equals_the_class():
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(to_numpy(instance_loss(labels, x, 8.0)),
                               to_numpy(InstanceLoss(8.0, dtype="float64")(labels, x)),
                               rtol=1e-12)


@pytest.mark.parametrize("case", sorted(GAMMAS))
def test_equals_pytorch_metric_learning_for_labels_arange(case):
    """Labels 0..B-1 in batch order: pml's target column is the anchor itself. At gamma 64
    the loss is 5e-10, which pml's ``lse - logit`` has to about 2e-8 relative (tfdml's
    ``softplus(lse_others - lse_own)`` has no cancellation)."""
    labels, x = DATA["instance_arange/labels"], DATA["instance_arange/embeddings"]
    assert np.array_equal(labels, np.arange(len(labels)))
    value, grad = _value_and_grad(labels, x, GAMMAS[case])
    want, want_grad = DATA[f"{case}/instance_arange/value"], DATA[f"{case}/instance_arange/grad"]
    rtol = 1e-9 if case == "instance_16" else 1e-7
    np.testing.assert_allclose(value, want, rtol=rtol)
    np.testing.assert_allclose(grad, want_grad, rtol=max(rtol, 1e-7),
                               atol=1e-7 * np.abs(want_grad).max())


@pytest.mark.parametrize("batch", ["uneven", pytest.param("instance_distinct", marks=ONE_BATCH)])
@pytest.mark.parametrize("case", sorted(GAMMAS))
def test_differs_from_pytorch_metric_learning_by_its_target_column(case, batch):
    """Elsewhere pml's target is the sample in column ``rank(y_a)``, another sample (of any
    class): a NumPy reference of that reading gives pml's values and gradients exactly."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    gamma = GAMMAS[case]
    want, want_grad = DATA[f"{case}/{batch}/value"], DATA[f"{case}/{batch}/grad"]

    def pml_reading(e):
        return ref.pml_instance_loss(labels, e, gamma)

    np.testing.assert_allclose(pml_reading(x), want, rtol=1e-12)
    np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-7,
                               atol=1e-9)
    value, _ = _value_and_grad(labels, x, gamma)
    np.testing.assert_allclose(value, ref.instance_loss(labels, x, gamma), rtol=1e-9)
    assert float(want) - float(value) > 10.0


def test_distinct_labels_in_any_order_are_instances():
    """Any distinct labels: each anchor's one target is itself (pml needs 0..B-1 in order)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 5))
    labels = rng.permutation(9) * 7 + 2
    value = to_numpy(InstanceLoss(16.0, dtype="float64")(labels, x))
    np.testing.assert_allclose(value, ref.pml_instance_loss(np.arange(9), x, 16.0), rtol=1e-9)
    assert abs(value - ref.pml_instance_loss(labels, x, 16.0)) > 1.0


def test_a_reference_set():
    labels, x = uneven_batch(4)
    rng = np.random.default_rng(4)
    memory, memory_labels = rng.normal(size=(6, 7)), np.array([0, 1, 1, 7, 7, 3])
    got = to_numpy(instance_loss(labels, x, 16.0, ref_embeddings=memory,
                                 ref_labels=memory_labels))
    # Anchors whose class is not in the reference set have no target: left out.
    np.testing.assert_allclose(got, ref.instance_loss(labels, x, 16.0, memory, memory_labels),
                               rtol=1e-10)


def test_degenerate_batches():
    labels, x = uneven_batch(2)
    value, grad = _value_and_grad(np.zeros(12, np.int64), x, 64.0)
    assert value == 0.0 and np.all(grad == 0.0)  # one class: every sample a target
    x[4] = x[3]  # duplicates of different classes
    value, grad = _value_and_grad(labels, x, 64.0)
    assert np.isfinite(value) and value > 0 and np.all(np.isfinite(grad))


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("nan"), float("inf"), "64"])
def test_bad_gamma_is_a_value_error(gamma):
    with pytest.raises(ValueError, match="gamma"):
        InstanceLoss(gamma)
    with pytest.raises(ValueError, match="gamma"):
        instance_loss(np.zeros(3), np.eye(3), gamma)
