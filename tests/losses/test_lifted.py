"""GeneralizedLiftedStructureLoss against a NumPy reference and pytorch-metric-learning 2.9.

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from its entries in tests/loss_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import reference_gradient, to_numpy, value_and_grad
from pml_data import BATCHES, recorded, uneven_batch

from tfdml.losses import GeneralizedLiftedStructureLoss, generalized_lifted_structure_loss
from tfdml.miners import MultiSimilarityMiner

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]


@pytest.mark.parametrize("neg_margin,pos_margin,average", [
    (1.0, 0.0, "anchors"), (0.4, 0.1, "anchors"), (1.0, 0.0, "batch")])
def test_values_and_gradients_match_the_reference(neg_margin, pos_margin, average):
    labels, x = uneven_batch()
    loss = GeneralizedLiftedStructureLoss(neg_margin, pos_margin, average=average,
                                          dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)

    def reference(e):
        return ref.generalized_lifted_structure_loss(labels, e, neg_margin, pos_margin,
                                                     average=average)

    np.testing.assert_allclose(value, reference(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(reference, x), rtol=1e-8, atol=1e-10)


def test_functional_form_equals_the_class():
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(
        to_numpy(generalized_lifted_structure_loss(labels, x, 0.7)),
        to_numpy(GeneralizedLiftedStructureLoss(0.7, dtype="float64")(labels, x)), rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_equals_pytorch_metric_learning_where_every_anchor_has_a_positive(batch):
    """On P x K batches the values and gradients are pytorch-metric-learning's. On the uneven
    batch (singletons) they differ by exactly the singletons' terms, which pml computes from
    an empty log-sum-exp read as 0: the reference with pml's reading gives pml's numbers."""
    labels, x, (want_value, want_grad) = recorded("generalized_lifted", batch)
    everyone = all(np.sum(labels == c) > 1 for c in labels)
    assert everyone == (batch != "uneven")
    loss = GeneralizedLiftedStructureLoss(dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    if everyone:
        np.testing.assert_allclose(value, want_value, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-7, atol=1e-10)
        return
    assert abs(float(value) - float(want_value)) > 1e-3
    np.testing.assert_allclose(value, ref.generalized_lifted_structure_loss(labels, x),
                               rtol=1e-12)

    def pml_reading(e):
        return ref.generalized_lifted_structure_loss(labels, e, empty="pml")

    np.testing.assert_allclose(pml_reading(x), want_value, rtol=1e-12)
    np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-7,
                               atol=1e-10)


def test_a_miner_restricts_the_pairs():
    labels, x = uneven_batch(2)
    every = to_numpy(GeneralizedLiftedStructureLoss(dtype="float64")(labels, x))
    mined = to_numpy(GeneralizedLiftedStructureLoss(
        miner=MultiSimilarityMiner(epsilon=0.0), dtype="float64")(labels, x))
    assert np.isfinite(mined) and mined != every


@pytest.mark.parametrize("kwargs,match", [
    ({"neg_margin": float("nan")}, "neg_margin"), ({"pos_margin": float("inf")}, "pos_margin"),
    ({"neg_margin": "1"}, "neg_margin"), ({"miner": "hard"}, "miner")])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GeneralizedLiftedStructureLoss(**kwargs)
    with pytest.raises(ValueError, match=match):
        generalized_lifted_structure_loss(np.zeros(4, np.int64), np.ones((4, 3)), **kwargs)
