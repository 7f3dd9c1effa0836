"""ThresholdConsistentMarginLoss, IntraPairVarianceLoss and RankedListLoss against NumPy
references and pytorch-metric-learning 2.9 (float64: values to 1e-9, gradients to 1e-7).

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from their entries in tests/loss_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import reference_gradient, to_numpy, value_and_grad
from harness import slow_beyond
from pml_data import BATCHES, DATA, recorded, uneven_batch

from tfdml.losses import (
    IntraPairVarianceLoss,
    RankedListLoss,
    ThresholdConsistentMarginLoss,
    intra_pair_variance_loss,
    ranked_list_loss,
    threshold_consistent_margin_loss,
)
from tfdml.miners import TripletMiner

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

PML = {  # recorded case -> the tfdml loss with pml's arguments
    "tcm": lambda: ThresholdConsistentMarginLoss(dtype="float64"),
    "tcm_args": lambda: ThresholdConsistentMarginLoss(0.5, 2.0, 0.8, 0.2, dtype="float64"),
    "ipv": lambda: IntraPairVarianceLoss(dtype="float64"),
    "ipv_eps": lambda: IntraPairVarianceLoss(0.1, 0.05, dtype="float64"),
}


def _value_and_grad(loss, labels, x):
    return value_and_grad(lambda e: loss(labels, e), x)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", sorted(PML))
def test_tcm_and_ipv_are_pytorch_metric_learning(case, batch):
    labels, x, (want_value, want_grad) = recorded(case, batch)
    value, grad = _value_and_grad(PML[case](), labels, x)
    np.testing.assert_allclose(value, want_value, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_the_references_are_pytorch_metric_learning(batch):
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    for case, value in (
            ("tcm", ref.threshold_consistent_margin_loss(labels, x)),
            ("tcm_args", ref.threshold_consistent_margin_loss(labels, x, 0.5, 2.0, 0.8, 0.2)),
            ("ipv", ref.intra_pair_variance_loss(labels, x)),
            ("ipv_eps", ref.intra_pair_variance_loss(labels, x, 0.1, 0.05))):
        np.testing.assert_allclose(value, DATA[f"{case}/{batch}/value"], rtol=1e-9, atol=1e-15)


def test_ipv_averages_all_pairs_of_each_kind_not_the_nonzero_ones():
    """pml's IPV takes its default MeanReducer (zeros included); "halves" would differ."""
    labels, x, (want, _) = recorded("ipv", "uneven")
    nonzero = to_numpy(IntraPairVarianceLoss(average="halves", dtype="float64")(labels, x))
    np.testing.assert_allclose(nonzero, ref.intra_pair_variance_loss(labels, x, nonzero=True),
                               rtol=1e-12)
    assert nonzero > 1.5 * want


def test_ipv_gradient_flows_through_the_batch_means():
    labels, x = uneven_batch(2)
    loss = IntraPairVarianceLoss(0.05, 0.05, dtype="float64")
    value, grad = _value_and_grad(loss, labels, x)

    def want(e):
        return ref.intra_pair_variance_loss(labels, e, 0.05, 0.05)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-7, atol=1e-10)


# -- ranked list loss ---------------------------------------------------------------------------

RLL = {"rll": dict(margin=0.4, tn=10.0),
       "rll_args": dict(margin=0.5, tn=5.0, imbalance=0.3, alpha=1.1, tp=2.0)}


# The references are Python loops differentiated entry by entry (the P x K batch, 24 x 16, takes
# most of this file's time): on every commit each case once and each batch but P x K once; the
# other combinations in the slow tier.
@pytest.mark.parametrize("case,batch", slow_beyond(
    [pytest.param(case, *batch.values, marks=batch.marks, id=f"{case}-{batch.values[0]}")
     for batch in BATCHES for case in sorted(RLL)], {"rll-pairs", "rll_args-uneven"}))
def test_ranked_list_loss_is_the_paper_and_pml_reading_differs_exactly(case, batch):
    """tfdml follows the paper; pml adds 1e-5 per reference sample to each normalizer (and
    leaves out pairs at distance 0). The reference with pml's reading gives pml's value and
    gradient; tfdml gives the paper's reference."""
    labels, x, (want_value, want_grad) = recorded(case, batch)
    args = RLL[case]
    value, grad = _value_and_grad(RankedListLoss(**args, dtype="float64"), labels, x)

    def paper(e):
        return ref.ranked_list_loss(labels, e, **args)

    def pml(e):
        return ref.ranked_list_loss(labels, e, **args, pml=True)

    np.testing.assert_allclose(value, paper(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(paper, x), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(pml(x), want_value, rtol=1e-9)
    np.testing.assert_allclose(reference_gradient(pml, x), want_grad, rtol=1e-6, atol=1e-9)
    if batch != "pairs":  # there the pml offsets cancel to 4e-10
        assert abs(float(value) - float(want_value)) > 1e-6


def test_ranked_list_loss_keeps_negatives_at_distance_zero():
    """A negative on top of its anchor violates the boundary most; pml leaves it out."""
    labels, x = uneven_batch(5)
    x[3] = x[0]  # labels 0 and 1: a negative at distance 0
    value = to_numpy(RankedListLoss(0.4, 10.0, dtype="float64")(labels, x))
    np.testing.assert_allclose(value, ref.ranked_list_loss(labels, x, 0.4, 10.0), rtol=1e-12)
    pml = ref.ranked_list_loss(labels, x, 0.4, 10.0, pml=True)
    assert value - pml > 1e-2


def test_ranked_list_loss_large_temperatures_do_not_overflow():
    labels, x = uneven_batch(6)
    value, grad = _value_and_grad(RankedListLoss(0.4, 1e4, tp=1e4, dtype="float64"), labels, x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    value32 = to_numpy(RankedListLoss(0.4, 500.0)(labels, x.astype(np.float32)))
    assert np.isfinite(value32)


def test_ranked_list_loss_needs_margin_and_tn():
    with pytest.raises(TypeError):
        RankedListLoss()
    labels, x = uneven_batch()
    np.testing.assert_allclose(to_numpy(ranked_list_loss(labels, x, 0.4, 10.0)),
                               ref.ranked_list_loss(labels, x, 0.4, 10.0), rtol=1e-12)


# -- shared --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make,functional", [
    (lambda: ThresholdConsistentMarginLoss(0.7, 1.3, 0.8, 0.3, dtype="float64"),
     lambda y, e: threshold_consistent_margin_loss(y, e, 0.7, 1.3, 0.8, 0.3)),
    (lambda: IntraPairVarianceLoss(0.1, 0.2, dtype="float64"),
     lambda y, e: intra_pair_variance_loss(y, e, 0.1, 0.2)),
    (lambda: RankedListLoss(0.3, 4.0, 0.6, dtype="float64"),
     lambda y, e: ranked_list_loss(y, e, 0.3, 4.0, 0.6)),
], ids=["tcm", "ipv", "rll"])
def test_functional_form_equals_the_class(make, functional):
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(to_numpy(functional(labels, x)), to_numpy(make()(labels, x)),
                               rtol=1e-12)


@pytest.mark.parametrize("make", [ThresholdConsistentMarginLoss, IntraPairVarianceLoss])
def test_a_miner_restricts_the_pairs(make):
    labels, x = uneven_batch(3)
    every = to_numpy(make(dtype="float64")(labels, x))
    mined = to_numpy(make(miner=TripletMiner("hard", "hard"), dtype="float64")(labels, x))
    assert np.isfinite(mined) and mined != every


@pytest.mark.parametrize("make", [
    lambda **kw: ThresholdConsistentMarginLoss(0.5, 2.0, 0.8, 0.2, **kw),
    lambda **kw: RankedListLoss(0.5, 5.0, 0.3, 1.1, 2.0, **kw)], ids=["tcm", "rll"])
def test_blocks_equal_the_dense_loss(make):
    labels, x = uneven_batch(4)
    dense = _value_and_grad(make(dtype="float64"), labels, x)
    blocked = _value_and_grad(make(block_size=5, dtype="float64"), labels, x)
    np.testing.assert_allclose(blocked[0], dense[0], rtol=1e-12)
    np.testing.assert_allclose(blocked[1], dense[1], rtol=1e-9, atol=1e-12)


def test_ipv_cannot_run_in_blocks():
    with pytest.raises(ValueError, match="block_size"):
        IntraPairVarianceLoss(block_size=4)


@pytest.mark.parametrize("make,kwargs,match", [
    (ThresholdConsistentMarginLoss, {"lambda_plus": -1.0}, "lambda_plus"),
    (ThresholdConsistentMarginLoss, {"lambda_minus": float("inf")}, "lambda_minus"),
    (ThresholdConsistentMarginLoss, {"margin_plus": 1.5}, "margin_plus"),
    (ThresholdConsistentMarginLoss, {"margin_minus": None}, "margin_minus"),
    (ThresholdConsistentMarginLoss, {"miner": 3}, "miner"),
    (IntraPairVarianceLoss, {"pos_eps": -0.1}, "pos_eps"),
    (IntraPairVarianceLoss, {"neg_eps": float("nan")}, "neg_eps"),
    (IntraPairVarianceLoss, {"miner": "hard"}, "miner"),
    (RankedListLoss, {"margin": -0.1, "tn": 1.0}, "margin"),
    (RankedListLoss, {"margin": 0.4, "tn": -1.0}, "tn"),
    (RankedListLoss, {"margin": 0.4, "tn": 1.0, "imbalance": 1.5}, "imbalance"),
    (RankedListLoss, {"margin": 0.4, "tn": 1.0, "alpha": "1"}, "alpha"),
    (RankedListLoss, {"margin": 0.4, "tn": 1.0, "tp": float("inf")}, "tp"),
    (RankedListLoss, {"margin": 0.4, "tn": 1.0, "average": "halves"}, "halves"),
])
def test_bad_arguments_are_value_errors_naming_them(make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_nan_in_gives_nan_out_and_one_class_is_finite():
    labels, x = uneven_batch()
    bad = x.copy()
    bad[2, 1] = np.nan
    for loss in (ThresholdConsistentMarginLoss(dtype="float64"),
                 IntraPairVarianceLoss(dtype="float64"),
                 RankedListLoss(0.4, 10.0, dtype="float64")):
        assert np.isnan(to_numpy(loss(labels, bad)))
        value, grad = _value_and_grad(loss, np.zeros(5, np.int64), x[:5])
        assert np.isfinite(value) and np.all(np.isfinite(grad))


def test_tcm_similarity_exactly_at_a_margin_is_where_pml_differs():
    """pml's means count the pairs with ``S >= m-`` (ties included, at cost 0); tfdml's
    ``average="halves"`` those that cost something. Orthogonal negatives, ``m- = 0``."""
    labels = np.array([0, 0, 1, 1])
    x = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0], [0.6, 0.0, 0.8]])
    value = to_numpy(ThresholdConsistentMarginLoss(margin_minus=0.0, dtype="float64")(labels, x))
    np.testing.assert_allclose(value, ref.threshold_consistent_margin_loss(
        labels, x, margin_minus=0.0), rtol=1e-12)
    np.testing.assert_allclose(value, 0.2 + 0.48, rtol=1e-12)  # positives: (0.3 + 0.1) / 2
    pml = ref.threshold_consistent_margin_loss(labels, x, margin_minus=0.0, pml=True)
    np.testing.assert_allclose(pml, 0.2 + 0.24, rtol=1e-12)  # four ties at 0 counted


@pytest.mark.parametrize("kwargs,match", [
    (dict(margin_plus=0.5, margin_minus=0.9), "margin_minus=0.9, margin_plus=0.5"),
    (dict(margin_plus=-1.0, margin_minus=1.0), "margin_minus=1.0, margin_plus=-1.0"),
    (dict(lambda_plus=0.0, lambda_minus=0), "lambda_plus=0.0, lambda_minus=0"),
])
def test_tcm_refuses_inverted_margins_and_zero_weights_in_both_forms(kwargs, match):
    """Inverted margins are satisfied with overlapping positive and negative pairs (a
    positive pair at 0.7 and a negative one at 0.7 both cost nothing with m+ = 0.5,
    m- = 0.9); with both weights 0 no pair ever costs."""
    labels, x = uneven_batch(1)
    with pytest.raises(ValueError, match=match):
        ThresholdConsistentMarginLoss(**kwargs)
    with pytest.raises(ValueError, match=match):
        threshold_consistent_margin_loss(labels, x, **kwargs)


def test_tcm_equal_margins_and_one_zero_weight_are_accepted():
    labels, x = uneven_batch(1)
    sim = x @ x.T / np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(x, axis=1))
    same = labels[:, None] == labels[None, :]
    positive, negative = same & ~np.eye(len(labels), dtype=bool), ~same
    for m in (-1.0, 0.4, 1.0):
        for lp, lm in ((1.0, 1.0), (0.0, 1.0), (1.0, 0.0)):
            hinge_p = lp * np.maximum(m - sim[positive], 0)
            hinge_n = lm * np.maximum(sim[negative] - m, 0)
            want = sum(h[h > 0].mean() if np.any(h > 0) else 0.0 for h in (hinge_p, hinge_n))
            got = threshold_consistent_margin_loss(labels, x, lp, lm, m, m)
            np.testing.assert_allclose(to_numpy(got), want, rtol=1e-10, atol=1e-15,
                                       err_msg=f"m={m}, lambdas=({lp}, {lm})")
