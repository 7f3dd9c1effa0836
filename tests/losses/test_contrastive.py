"""ContrastiveLoss / contrastive_loss against the naive references of tests/references.py.

Values must match to 1e-5 (float32); float32 gradients are compared with central finite
differences of the float64 reference with the pairs held fixed (all pairs without a miner;
otherwise the miner's recorded output, checked against the reference miner first).
The tests marked ``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import CAN_COMPILE, gradient_check, to_numpy, value_and_grad
from harness import assert_compiled_values_equal_eager, slow_beyond
from keras import ops
from recorded_mining import (
    RecordingMiner,
    as_f32,
    checked_pairs,
    reference_set_arguments,
    run_recorded,
)

from tfdml.losses import ContrastiveLoss, contrastive_loss
from tfdml.miners import MultiSimilarityMiner, TripletMiner

VALUE_TOL = 1e-5
GRAD_ATOL = 1e-5
GRAD_RTOL = 1e-4
MB = pytest.mark.multibackend


def run_contrastive(labels, x, miner=None, positive_margin=0.0, negative_margin=0.5,
                    distance="l2", ref_set=None, functional=False, grad=True, normalize=True):
    x32, x64 = as_f32(x)
    kwargs, ref_kwargs, ref_labels, ref_offset = reference_set_arguments(ref_set)
    y = ops.convert_to_tensor(labels)

    def loss_value(recorder, xt):
        if functional:
            return contrastive_loss(y, xt, positive_margin=positive_margin,
                                    negative_margin=negative_margin, distance=distance,
                                    miner=recorder, normalize=normalize, **kwargs)
        assert ref_set is None
        loss = ContrastiveLoss(positive_margin=positive_margin, negative_margin=negative_margin,
                               distance=distance, miner=recorder, normalize=normalize)
        return loss(y, xt)

    value, got_grad, recorder = run_recorded(loss_value, miner, x32, grad=grad)
    assert value.dtype == np.float32 and value.shape == ()
    if recorder is None:
        pos, neg = ref.label_masks(labels, ref_labels, ref_offset)
    else:
        pos, neg, _ = checked_pairs(recorder, labels, ref_labels, ref_offset)

    def reference(e):
        return ref.contrastive_loss(e, pos, neg, positive_margin, negative_margin, distance,
                                    normalize, **ref_kwargs)

    want, per_anchor = reference(x64)
    np.testing.assert_allclose(value, want, rtol=0, atol=VALUE_TOL)
    if grad:
        fd = ref.finite_difference_gradient(lambda e: reference(e)[0], x64)
        assert np.all(np.isfinite(got_grad))
        np.testing.assert_allclose(got_grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    return want, per_anchor


BATCH_A = ref.make_batch([4, 3, 2, 2, 1], 7, seed=0)  # B=12, D=7
BATCH_B = ref.make_batch([3, 3, 2, 1, 1], 16, seed=1)  # B=10, D=16

MINERS = {
    "none": lambda: None,
    "ms_hard": lambda: MultiSimilarityMiner(0.1, "hard"),
    "ms_easy": lambda: MultiSimilarityMiner(0.1, "easy"),
    "easy_hard": lambda: TripletMiner("easy", "hard"),
    "all_semihard": lambda: TripletMiner("all", "semihard"),
    "all_all": lambda: TripletMiner("all", "all"),
    "dw_easy": lambda: TripletMiner("easy", "distance_weighted", seed=2),
    "random_random": lambda: TripletMiner("random", "random", seed=3),
}


def _params(names, multibackend):
    """``names`` as pytest params; those in ``multibackend`` also run under JAX and PyTorch
    (a few per test: eager JAX compiles every op for each new shape)."""
    return [pytest.param(n, marks=MB) if n in multibackend else n for n in names]


# On every commit: no miner, a pair miner and triplet miners (hardest, distance weighted);
# the other miners, whose pairs reach the loss the same way, in the slow tier.
@pytest.mark.parametrize("miner", slow_beyond(_params(sorted(MINERS), ["none", "dw_easy"]),
                                              {"none", "ms_hard", "easy_hard", "dw_easy"}))
def test_class_form_matches_reference(miner):
    want, per_anchor = run_contrastive(*BATCH_A, MINERS[miner](), negative_margin=1.4)
    assert want > 0 and per_anchor
    run_contrastive(*BATCH_B, MINERS[miner](), positive_margin=0.8, negative_margin=1.3,
                    grad=False)


DISTANCES_AND_MARGINS = [("squared_l2", (0.0, 2.0)), ("squared_l2", (0.5, 1.5)),
                         ("cosine", (0.2, 0.9)), ("l2", (0.9, 1.3))]


# On every commit each distance and margins once and each kind of miner; the other pairs in
# the slow tier.
@pytest.mark.parametrize("miner,distance,margins", slow_beyond(
    [pytest.param(m, d, margins, id=f"{m}-{d}-margins{i}")
     for i, (d, margins) in enumerate(DISTANCES_AND_MARGINS)
     for m in ("none", "ms_easy", "all_semihard")],
    {"none-squared_l2-margins0", "ms_easy-squared_l2-margins1",
     "all_semihard-cosine-margins2", "none-l2-margins3"}))
def test_distances_and_margins(miner, distance, margins):
    want, _ = run_contrastive(*BATCH_A, MINERS[miner](), *margins, distance=distance)
    assert want > 0


def test_without_normalization():
    labels, x = BATCH_A
    want, _ = run_contrastive(labels, 0.5 * x, None, 0.5, 2.0, normalize=False)
    assert want > 0


@MB
def test_positive_margin_stops_the_pull():
    """Positive pairs closer than positive_margin contribute 0 (and no gradient)."""
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    loss = ContrastiveLoss(positive_margin=2.5, negative_margin=0.0)  # every d <= 2 < 2.5
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    assert value == 0.0
    assert np.all(grad == 0.0)


# -- reference sets --------------------------------------------------------------------------------

REF_LABELS, REF_X = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)  # R=14, D=5


# The triplet miners easy_hard and all_all take the reference set as dw_easy does: slow tier.
@pytest.mark.parametrize("miner", slow_beyond(["none", "ms_hard", "easy_hard", "all_all",
                                               "dw_easy"], {"none", "ms_hard", "dw_easy"}))
def test_functional_reference_set_with_offset(miner):
    labels, x = REF_LABELS[3:9], REF_X[3:9]
    run_contrastive(labels, x, MINERS[miner](), 0.2, 1.3, ref_set=(REF_X, REF_LABELS, 3),
                    functional=True)


# all_semihard takes the reference set as dw_easy does: slow tier.
@pytest.mark.parametrize("miner", slow_beyond(["none", "ms_easy", "all_semihard", "dw_easy"],
                                              {"none", "ms_easy", "dw_easy"}))
def test_functional_reference_set_without_offset(miner):
    rng = np.random.default_rng(21)
    x = rng.normal(size=(6, 5))
    labels = np.array([1, 4, 7, 100, 1, 16], np.int32)  # 100 has no positive
    run_contrastive(labels, x, MINERS[miner](), 0.0, 1.2, ref_set=(REF_X, REF_LABELS, None),
                    functional=True)


@MB
def test_anchor_with_negatives_only_counts_without_miner():
    """Without a miner an anchor with no positive still has its negative pairs."""
    labels, x = BATCH_A
    singleton = [a for a in range(len(labels)) if np.sum(labels == labels[a]) == 1]
    assert singleton
    per_anchor = ContrastiveLoss(negative_margin=1.4, reduction="none", average="anchors")(
        labels, np.asarray(x, np.float32))
    per_anchor = to_numpy(per_anchor)
    pos, neg = ref.label_masks(labels)
    _, want = ref.contrastive_loss(np.asarray(x, np.float32).astype(np.float64), pos, neg,
                                   0.0, 1.4)
    assert set(want) == set(range(len(labels)))
    np.testing.assert_allclose(per_anchor, [want[a] for a in range(len(labels))],
                               atol=VALUE_TOL)
    assert per_anchor[singleton[0]] > 0


# -- float64 and finite differences ---------------------------------------------------------------

SMALL_LABELS = np.array([2, 5, 2, 5, 2, 9], np.int32)


# A triplet miner's pairs (slow tier) reach the float64 gradient as the pair miner's do.
@pytest.mark.multibackend
@pytest.mark.parametrize("make_miner,distance", slow_beyond([
    pytest.param(lambda: None, "l2", id="none-l2"),
    pytest.param(lambda: None, "squared_l2", id="none-squared_l2"),
    pytest.param(lambda: MultiSimilarityMiner(0.3, "easy"), "cosine", id="ms_easy-cosine"),
    pytest.param(lambda: TripletMiner("easy", "hard"), "l2", id="easy_hard-l2"),
], {"none-l2", "none-squared_l2", "ms_easy-cosine"}))
def test_float64_compute_gradient(make_miner, distance, float64):
    x = np.random.default_rng(4).normal(size=(6, 4))
    labels = ops.convert_to_tensor(SMALL_LABELS)

    def loss_fn(e):
        return contrastive_loss(labels, e, positive_margin=0.1, negative_margin=1.1,
                                distance=distance, miner=make_miner())

    value = loss_fn(ops.convert_to_tensor(x))
    assert to_numpy(value).dtype == np.float64
    miner = make_miner()
    if miner is None:
        pos, neg = ref.label_masks(SMALL_LABELS)
    else:
        recorder = RecordingMiner(miner)
        contrastive_loss(labels, ops.convert_to_tensor(x), distance=distance, miner=recorder)
        pos, neg, _ = checked_pairs(recorder, SMALL_LABELS, None, 0)
    want = ref.contrastive_loss(x, pos, neg, 0.1, 1.1, distance)[0]
    assert want > 0
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-12, atol=1e-12)
    theoretical, numerical = gradient_check(loss_fn, x, delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-6, atol=1e-8)


# -- the published formula --------------------------------------------------------------------------


@MB
def test_squared_l2_equals_class_collapse_paper_section_3():
    """L_con(x_i, x_j) = delta D + (1 - delta) (alpha - D)_+ with D = ||f(x_i) - f(x_j)||^2.

    Points (not normalized): x0 = (0, 0), x1 = (1, 0) of class 0; x2 = (0, 1), x3 = (2, 0)
    of class 1; alpha = 1.5. D01 = 1, D02 = 1, D03 = 4, D12 = 2, D13 = 1, D23 = 5.
      a0: pos x1: 1; neg x2: 0.5; neg x3: 0       -> 1.5 / 3
      a1: pos x0: 1; neg x2: 0;   neg x3: 0.5     -> 1.5 / 3
      a2: pos x3: 5; neg x0: 0.5; neg x1: 0       -> 5.5 / 3
      a3: pos x2: 5; neg x0: 0;   neg x1: 0.5     -> 5.5 / 3
    Mean over anchors: 14 / 12. The paper's O_con = (1/n^2) sum_{i,j} L_con (self pairs add
    0) = 14 / 16, i.e. the loss times (n - 1) / n.
    """
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]], np.float32)
    labels = np.array([0, 0, 1, 1], np.int32)
    loss = ContrastiveLoss(positive_margin=0.0, negative_margin=1.5, distance="squared_l2",
                           normalize=False)
    value = to_numpy(loss(labels, x))
    np.testing.assert_allclose(value, 14 / 12, rtol=1e-6)
    np.testing.assert_allclose(value * 3 / 4, 14 / 16, rtol=1e-6)
    per_anchor = ContrastiveLoss(negative_margin=1.5, distance="squared_l2", normalize=False,
                                 reduction="none", average="anchors")(labels, x)
    per_anchor = to_numpy(per_anchor)
    np.testing.assert_allclose(per_anchor, [0.5, 0.5, 5.5 / 3, 5.5 / 3], rtol=1e-6)
    # Averaged over pairs (the default), an anchor's value is the sum of its pairs.
    sums = ContrastiveLoss(negative_margin=1.5, distance="squared_l2", normalize=False,
                           reduction="none")(labels, x)
    sums = to_numpy(sums)
    np.testing.assert_allclose(sums, [1.5, 1.5, 5.5, 5.5], rtol=1e-6)
    # The same from the paper's formula written out pair by pair.
    paper = 0.0
    for i in range(4):
        for j in range(4):
            d = float(np.sum((x[i] - x[j]) ** 2))
            paper += d if labels[i] == labels[j] else max(1.5 - d, 0.0)
    np.testing.assert_allclose(value * 3 / 4, paper / 16, rtol=1e-6)


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    (dict(positive_margin=-0.1), "positive_margin"),
    (dict(negative_margin=-1.0), "negative_margin"),
    (dict(negative_margin="0.5"), "negative_margin"),
    (dict(positive_margin=None), "positive_margin"),
    (dict(distance="manhattan"), "distance"),
    (dict(miner="all"), "miner"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ContrastiveLoss(**kwargs)
    labels, x = BATCH_A
    with pytest.raises(ValueError, match=match):
        contrastive_loss(labels, x, **kwargs)


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager values.

    (Not marked multibackend: tests/losses/test_loss_base.py compares jax.jit with eager JAX.)"""
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    losses = [ContrastiveLoss(positive_margin=0.1, negative_margin=1.2),
              ContrastiveLoss(miner=MultiSimilarityMiner(0.1, "easy"), distance="squared_l2",
                              negative_margin=1.5, reduction="none")]
    assert_compiled_values_equal_eager(losses, labels, x)
