"""tfdml's losses against values recorded from TensorFlow Similarity 0.17.1.

``tests/fixtures/tfsim_0.17.npz`` holds per-example values, their mean and the gradient of
the mean, recorded by ``tests/fixtures/make_tfsim_fixtures.py`` (TensorFlow 2.15.1; float32;
L2-normalized embeddings for the cosine losses, which TensorFlow Similarity expects). Where
the definitions agree, tfdml (``normalize=False`` on those unit vectors, so that gradients
are comparable) gives the same values and gradients; where they differ, the tests state the
difference exactly (docs/losses.md, "Migrating from TensorFlow Similarity"):

* semi-hard mining: an anchor without a negative at least as far as its positive is left out
  by tfdml; TensorFlow Similarity takes the farthest negative instead;
* an anchor without a positive: left out by tfdml; TensorFlow Similarity still gives it a value;
* soft nearest neighbour: TensorFlow Similarity computes ``-log(1e-9 + ratio)``;
* circle: TensorFlow Similarity adds 1 inside each log-sum-exp, ``log(1 + P) + log(1 + N)``,
  where Sun et al. (and tfdml) have ``log(1 + P N)``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import references as ref
from backends import to_numpy, value_and_grad

from tfdml.losses import (
    CircleLoss,
    MultiSimilarityLoss,
    PNLoss,
    SoftNearestNeighborLoss,
    TripletMarginLoss,
    TripletNCALoss,
    multiple_negatives_ranking_loss,
)
from tfdml.miners import TripletMiner

FIXTURES = np.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tfsim_0.17.npz"))


def _case(case):
    batch = str(FIXTURES[f"case/{case}/batch"])
    labels = FIXTURES[f"batch/{batch}/labels"]
    x = FIXTURES[f"batch/{batch}/embeddings"]
    return labels, x, FIXTURES[f"case/{case}/values"], FIXTURES[f"case/{case}/grad"]


def _per_anchor(loss, labels, x):
    return to_numpy(loss(labels, x)).astype(np.float64)


# Same definition: values per anchor and the gradient of the mean over the batch.
SAME = [
    ("snn_default", lambda **kw: SoftNearestNeighborLoss(**kw)),
    ("pn_easy_hard", lambda **kw: PNLoss(normalize=False, miner=TripletMiner("easy", "hard"),
                                         **kw)),
    ("triplet_easy_easy", lambda **kw: TripletNCALoss(1, 1.0, TripletMiner("easy", "easy"),
                                                      normalize=False, **kw)),
    ("multisim_default", lambda **kw: MultiSimilarityLoss(2.0, 40.0, 0.5, normalize=False,
                                                          average="batch", **kw)),
]


@pytest.mark.parametrize("case,make", [
    pytest.param(*case, id=case[0], marks=pytest.mark.multibackend) if case[0] in (
        "snn_default", "pn_easy_hard") else pytest.param(*case, id=case[0]) for case in SAME])
def test_same_definition_same_values_and_gradients(case, make):
    labels, x, want, want_grad = _case(case)
    got = _per_anchor(make(reduction="none"), labels, x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    loss = make()
    value, grad = value_and_grad(lambda y, e: loss(y, e), labels, x, argnums=1)
    np.testing.assert_allclose(value, want.mean(), rtol=2e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=2e-6)
    assert np.abs(want_grad).max() > 1e-3


@pytest.mark.parametrize("case,hinge", [
    ("pn_default", lambda m, **kw: PNLoss(None, normalize=False, miner=m, **kw)),
    ("pn_margin_0.5", lambda m, **kw: PNLoss(0.5, normalize=False, miner=m, **kw)),
    ("triplet_default", lambda m, **kw: TripletNCALoss(1, 1.0, m, normalize=False, **kw)),
    ("triplet_margin_0.2", lambda m, **kw: TripletMarginLoss(0.2, "cosine", m,
                                                             normalize=False, **kw)),
])
def test_semihard_fallback_is_the_only_difference(case, hinge):
    """Anchors that tfdml mines a semi-hard negative for have TensorFlow Similarity's value;
    the others (left out by tfdml) have the value with their farthest negative."""
    labels, x, want, _ = _case(case)
    semihard = _per_anchor(hinge(TripletMiner("hard", "semihard"), reduction="none"), labels, x)
    farthest = _per_anchor(hinge(TripletMiner("hard", "easy"), reduction="none"), labels, x)
    has_semihard = semihard != 0.0
    assert 0 < has_semihard.sum() < len(labels)  # both kinds of anchor in the batch
    np.testing.assert_allclose(np.where(has_semihard, semihard, farthest), want, rtol=2e-5,
                               atol=1e-6)
    np.testing.assert_array_less(1e-3, np.abs(want - semihard)[~has_semihard])


def test_anchors_without_positive_are_left_out():
    """Two singletons: tfdml gives them 0 and TensorFlow Similarity a value; the other
    anchors agree."""
    labels, x, want, _ = _case("pn_singletons")
    got = _per_anchor(PNLoss(normalize=False, miner=TripletMiner("hard", "hard"),
                             reduction="none"), labels, x)
    singleton = np.array([np.sum(labels == c) == 1 for c in labels])
    assert singleton.sum() == 2
    np.testing.assert_allclose(got[~singleton], want[~singleton], rtol=2e-5, atol=1e-6)
    assert np.all(got[singleton] == 0.0) and np.all(want[singleton] > 0.1)


def test_soft_nearest_neighbor_epsilon_and_batch_average():
    """TensorFlow Similarity's ``-log(1e-9 + ratio)``: the difference shows where the ratio
    is small (values near 17); its mean over the batch counts the singletons as 0, which is
    ``average="batch"``."""
    labels, x, want, want_grad = _case("snn_t0.5_singletons")
    got = _per_anchor(SoftNearestNeighborLoss(0.5, reduction="none"), labels, x)
    with_eps = np.where(got > 0, -np.log(1e-9 + np.exp(-got)), 0.0)
    np.testing.assert_allclose(with_eps, want, rtol=2e-5, atol=1e-6)
    assert np.abs(got - want).max() > 1e-2
    loss = SoftNearestNeighborLoss(0.5, average="batch")
    np.testing.assert_allclose(to_numpy(loss(labels, x)), got.mean(), rtol=1e-6)
    # d/dL of -log(1e-9 + e^-L) is e^-L / (1e-9 + e^-L): TensorFlow Similarity's gradient is
    # tfdml's with each anchor weighted by that factor (0.97 for the values near 17).
    ratio = np.exp(-got)
    weights = np.where(got > 0, ratio / (1e-9 + ratio), 0.0) / len(labels)
    assert weights.min() * len(labels) < 0.98
    summed = SoftNearestNeighborLoss(0.5, reduction="sum")
    _, grad = value_and_grad(lambda y, e, w: summed(y, e, sample_weight=w), labels, x,
                             weights.astype(np.float32), argnums=1)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=2e-6)


def test_soft_nearest_neighbor_far_apart_is_finite():
    """Rows whose exponentials underflow: TensorFlow Similarity gives NaN (0 / 0) or
    ``-log(1e-9)``; tfdml the value of the definition."""
    labels, x, want, _ = _case("snn_far_apart")
    assert np.isnan(want[1]) and np.isnan(want[3])
    np.testing.assert_allclose(want[[0, 2]], -np.log(1e-9), rtol=1e-6)
    got = _per_anchor(SoftNearestNeighborLoss(reduction="none"), labels, x)
    _, terms = ref.soft_nearest_neighbor_loss(labels, x.astype(np.float64))
    # Differences of two log-sum-exps near -100 in float32: 1e-5 absolute.
    np.testing.assert_allclose(got, [terms[a][0] for a in range(4)], rtol=1e-5, atol=2e-5)
    assert np.all(np.isfinite(got)) and got[0] > 50.0


def test_circle_adds_one_inside_each_log_sum_exp():
    labels, x, want, _ = _case("circle_default")
    x64 = x.astype(np.float64)
    alphas = ref.circle_alphas(x64, 0.4, normalize=False)
    _, terms = ref.circle_loss(labels, x64, margin=0.4, gamma=80.0, normalize=False,
                               alphas=alphas)
    s = x64 @ x64.T
    tfsim = np.zeros(len(labels))
    for a in terms:
        pos = [j for j in range(len(labels)) if labels[j] == labels[a] and j != a]
        neg = [j for j in range(len(labels)) if labels[j] != labels[a]]
        log_p = ref.logsumexp([-80.0 * max(1.4 - s[a, j], 0.0) * (s[a, j] - 0.6) for j in pos])
        log_n = ref.logsumexp([80.0 * max(s[a, j] + 0.4, 0.0) * (s[a, j] - 0.4) for j in neg])
        tfsim[a] = np.logaddexp(0.0, log_p) + np.logaddexp(0.0, log_n)
        np.testing.assert_allclose(terms[a][0], np.logaddexp(0.0, log_p + log_n), rtol=1e-12)
    np.testing.assert_allclose(tfsim, want, rtol=1e-5)
    got = _per_anchor(CircleLoss(normalize=False, reduction="none"), labels, x)
    assert np.abs(got - want).max() > 1e-2


@pytest.mark.multibackend
def test_multiple_negatives_ranking_with_add_one_is_tfsims():
    queries, keys = FIXTURES["batch/pairs/queries"], FIXTURES["batch/pairs/keys"]
    want = FIXTURES["case/multineg_default/mean"]
    value, (grad_q, grad_k) = value_and_grad(
        lambda q, k: multiple_negatives_ranking_loss(q, k, add_one=True), queries, keys,
        argnums=(0, 1))
    np.testing.assert_allclose(value, want, rtol=2e-5)
    np.testing.assert_allclose(grad_q, FIXTURES["case/multineg_default/grad_queries"],
                               rtol=1e-3, atol=2e-6)
    np.testing.assert_allclose(grad_k, FIXTURES["case/multineg_default/grad_keys"],
                               rtol=1e-3, atol=2e-6)
    # Without the 1 (Henderson et al.'s softmax): the mean cross-entropy.
    s = 20.0 * queries.astype(np.float64) @ keys.astype(np.float64).T
    plain = np.mean([ref.logsumexp(s[i]) - s[i, i] for i in range(len(s))])
    np.testing.assert_allclose(to_numpy(multiple_negatives_ranking_loss(queries, keys)), plain,
                               rtol=1e-5)
