"""SNRContrastiveLoss against a NumPy reference and pytorch-metric-learning 2.9.

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from its entries in tests/loss_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import reference_gradient, to_numpy, value_and_grad
from pml_data import BATCHES, DATA, uneven_batch

from tfdml.losses import SNRContrastiveLoss, snr_contrastive_loss
from tfdml.losses.contrastive import snr_distance
from tfdml.miners import TripletMiner

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]


def test_snr_distance_is_the_ratio_of_variances():
    x, y = (np.random.default_rng(s).normal(size=(n, 6)) for s, n in ((1, 4), (2, 5)))
    want = np.array([[np.var(b - a, ddof=1) / np.var(a, ddof=1) for b in y] for a in x])
    np.testing.assert_allclose(to_numpy(snr_distance(x, y)), want, rtol=1e-12)
    # A constant anchor (zero variance) gives large finite distances, not NaN.
    got = to_numpy(snr_distance(np.ones((2, 6)), y))
    assert np.all(np.isfinite(got)) and np.all(got > 1e6)


@pytest.mark.parametrize("pos_margin,neg_margin,average", [
    (0.0, 1.0, "terms"), (0.3, 1.5, "terms"), (0.0, 1.0, "nonzero")])
def test_values_and_gradients_match_the_reference(pos_margin, neg_margin, average):
    labels, x = uneven_batch()
    loss = SNRContrastiveLoss(pos_margin, neg_margin, average=average, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)

    def want(e):
        return ref.snr_contrastive_loss(labels, e, pos_margin, neg_margin, average)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-7, atol=1e-9)


def test_functional_form_equals_the_class():
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(
        to_numpy(snr_contrastive_loss(labels, x, 0.1, 0.9)),
        to_numpy(SNRContrastiveLoss(0.1, 0.9, dtype="float64")(labels, x)), rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_pytorch_metric_learning_adds_separately_averaged_halves(batch):
    """pml averages the positive and the negative pairs each over their non-zero terms and
    adds the means; tfdml averages all pairs. The reference with pml's reduction gives pml's
    value and gradient; tfdml gives the reference's own."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    want_value, want_grad = (DATA[f"snr_contrastive/{batch}/{k}"] for k in ("value", "grad"))

    def pml_reading(e):
        return ref.snr_contrastive_loss(labels, e, halves=True)

    np.testing.assert_allclose(pml_reading(x), want_value, rtol=1e-9)
    np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-6,
                               atol=1e-9)
    value = to_numpy(SNRContrastiveLoss(dtype="float64")(labels, x))
    np.testing.assert_allclose(value, ref.snr_contrastive_loss(labels, x), rtol=1e-12)
    assert abs(float(value) - float(want_value)) > 1e-3


@pytest.mark.parametrize("batch", BATCHES)
def test_halves_is_pytorch_metric_learning(batch):
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    loss = SNRContrastiveLoss(0.0, 1.0, average="halves", dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    np.testing.assert_allclose(value, DATA[f"snr_contrastive/{batch}/value"], rtol=1e-9)
    np.testing.assert_allclose(grad, DATA[f"snr_contrastive/{batch}/grad"], rtol=1e-7,
                               atol=1e-10)
    np.testing.assert_allclose(to_numpy(snr_contrastive_loss(labels, x, average="halves")),
                               DATA[f"snr_contrastive/{batch}/value"], rtol=1e-9)


def test_halves_in_blocks_and_trimmed_equal_the_dense_loss():
    labels, x = uneven_batch(4)
    dense = SNRContrastiveLoss(0.1, 0.9, average="halves", dtype="float64")
    blocked = SNRContrastiveLoss(0.1, 0.9, average="halves", block_size=5, dtype="float64")
    (v1, g1), (v2, g2) = (value_and_grad(lambda e, f=f: f(labels, e), x)
                          for f in (dense, blocked))
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    np.testing.assert_allclose(g2, g1, rtol=1e-9, atol=1e-12)
    assert to_numpy(blocked.compute_terms(labels, x).total).shape == (12, 2)
    from tfdml.losses import TrimmedLoss
    untrimmed = TrimmedLoss(dense, trim=0.0, dtype="float64")
    np.testing.assert_allclose(to_numpy(untrimmed(labels, x)), v1, rtol=1e-12)
    trimmed = to_numpy(TrimmedLoss(dense, trim=0.3, dtype="float64")(labels, x))
    assert np.isfinite(trimmed) and trimmed != v1


def test_halves_only_for_losses_whose_terms_split():
    from tfdml.losses import TripletMarginLoss, triplet_margin_loss
    with pytest.raises(ValueError, match="halves"):
        TripletMarginLoss(average="halves")
    labels, x = uneven_batch()
    with pytest.raises(ValueError, match="halves"):
        triplet_margin_loss(labels, x, average="halves")


def test_a_miner_restricts_the_pairs():
    labels, x = uneven_batch(3)
    every = to_numpy(SNRContrastiveLoss(dtype="float64")(labels, x))
    mined = to_numpy(SNRContrastiveLoss(miner=TripletMiner("hard", "hard"),
                                        dtype="float64")(labels, x))
    assert np.isfinite(mined) and mined != every


@pytest.mark.parametrize("kwargs,match", [
    ({"pos_margin": -0.1}, "pos_margin"), ({"neg_margin": float("inf")}, "neg_margin"),
    ({"neg_margin": None}, "neg_margin"), ({"miner": 3}, "miner")])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SNRContrastiveLoss(**kwargs)
