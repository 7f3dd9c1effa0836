"""MultiSimilarityLoss / multi_similarity_loss (Wang et al. 2019) against tests/references.py.

Values must match to 1e-5 (float32); float32 gradients are compared with central finite
differences of the float64 reference with the mined pairs held fixed (the miner's output
is recorded and checked against the reference miner first). The tests marked
``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import references as ref
from backends import CAN_COMPILE, gradient_check, to_numpy
from harness import assert_compiled_values_equal_eager
from keras import ops
from recorded_mining import (
    RecordingMiner,
    as_f32,
    checked_pairs,
    reference_set_arguments,
    run_recorded,
)

from tfdml.losses import MultiSimilarityLoss, multi_similarity_loss
from tfdml.miners import MultiSimilarityMiner, TripletMiner

VALUE_TOL = 1e-5
GRAD_ATOL = 2e-5
GRAD_RTOL = 1e-4
MB = pytest.mark.multibackend


def run_ms(labels, x, miner, alpha=2.0, beta=50.0, base=0.5, ref_set=None, functional=False,
           grad=True, normalize=True):
    x32, x64 = as_f32(x)
    kwargs, ref_kwargs, ref_labels, ref_offset = reference_set_arguments(ref_set)
    y = ops.convert_to_tensor(labels)

    def loss_value(recorder, xt):
        if functional:
            return multi_similarity_loss(y, xt, alpha=alpha, beta=beta, base=base,
                                         miner=recorder, normalize=normalize, **kwargs)
        assert ref_set is None
        loss = MultiSimilarityLoss(alpha=alpha, beta=beta, base=base, miner=recorder,
                                   normalize=normalize)
        return loss(y, xt)

    value, got_grad, recorder = run_recorded(loss_value, miner, x32, grad=grad)
    assert value.dtype == np.float32 and value.shape == ()
    pos, neg, _ = checked_pairs(recorder, labels, ref_labels, ref_offset)

    def reference(e):
        return ref.multi_similarity_loss(e, pos, neg, alpha, beta, base, normalize,
                                         **ref_kwargs)

    want, per_anchor = reference(x64)
    np.testing.assert_allclose(value, want, rtol=0, atol=VALUE_TOL)
    if grad:
        fd = ref.finite_difference_gradient(lambda e: reference(e)[0], x64)
        assert np.all(np.isfinite(got_grad))
        np.testing.assert_allclose(got_grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    return want, per_anchor


BATCH_A = ref.make_batch([4, 3, 2, 2, 1], 7, seed=0)  # B=12, D=7
BATCH_B = ref.make_batch([3, 3, 2, 1, 1], 16, seed=1)  # B=10, D=16
BATCH_C = ref.make_batch([5, 4, 4, 3], 3, seed=2)  # B=16, D=3: similarities spread widely

MINERS = {
    "ms_hard": lambda: MultiSimilarityMiner(0.1, "hard"),
    "ms_easy": lambda: MultiSimilarityMiner(0.1, "easy"),
    "ms_all": lambda: MultiSimilarityMiner(0.1, "all"),
    "ms_hard_eps0": lambda: MultiSimilarityMiner(0.0, "hard"),
    "ms_easy_eps0.5": lambda: MultiSimilarityMiner(0.5, "easy"),
    "easy_semihard": lambda: TripletMiner("easy", "semihard"),
    "all_hard": lambda: TripletMiner("all", "hard"),
    "all_all": lambda: TripletMiner("all", "all"),
    "random_random": lambda: TripletMiner("random", "random", seed=4),
    "dw_easy": lambda: TripletMiner("easy", "distance_weighted", seed=1),
}


def _params(names, multibackend):
    """``names`` as pytest params; those in ``multibackend`` also run under JAX and PyTorch
    (a few per test: eager JAX compiles every op for each new shape)."""
    return [pytest.param(n, marks=MB) if n in multibackend else n for n in names]


@pytest.mark.parametrize("miner", _params(sorted(MINERS), ["ms_hard"]))
def test_class_form_matches_reference(miner):
    want, per_anchor = run_ms(*BATCH_A, MINERS[miner]())
    assert want > 0 and per_anchor
    run_ms(*BATCH_B, MINERS[miner](), alpha=1.0, beta=20.0, base=1.0, grad=False)
    run_ms(*BATCH_C, MINERS[miner](), grad=False)


def test_default_miner_is_wang_et_al():
    loss = MultiSimilarityLoss()
    assert isinstance(loss.miner, MultiSimilarityMiner)
    assert (loss.miner.epsilon, loss.miner.positive) == (0.1, "hard")
    assert (loss.alpha, loss.beta, loss.base) == (2.0, 50.0, 0.5)
    labels, x = BATCH_C
    x = np.asarray(x, np.float32)
    value = to_numpy(loss(labels, x))
    x64 = x.astype(np.float64)
    pos, neg = ref.multi_similarity_pairs(ref.nca_scores(x64), labels, epsilon=0.1,
                                          positive="hard")
    np.testing.assert_allclose(value, ref.multi_similarity_loss(x64, pos, neg)[0],
                               atol=VALUE_TOL)


@pytest.mark.parametrize("alpha,beta,base", [(2.0, 50.0, 1.0),
                                             pytest.param(0.5, 10.0, 0.0, marks=MB),
                                             (4.0, 40.0, 0.3)])
def test_hyperparameters(alpha, beta, base):
    run_ms(*BATCH_C, MultiSimilarityMiner(0.1, "easy"), alpha=alpha, beta=beta, base=base)


def test_without_normalization():
    labels, x = BATCH_A
    run_ms(labels, 0.3 * x, MultiSimilarityMiner(0.2, "all"), normalize=False)


@MB
def test_anchors_need_a_positive_and_a_negative_pair():
    """Anchors with only one kind of pair are left out of the mean, not counted as 0."""
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    miner = MultiSimilarityMiner(0.0, "hard")
    per_anchor = to_numpy(MultiSimilarityLoss(miner=miner, reduction="none")(labels, x))
    pos, neg = ref.multi_similarity_pairs(ref.nca_scores(x.astype(np.float64)), labels,
                                          epsilon=0.0, positive="hard")
    value, want = ref.multi_similarity_loss(x.astype(np.float64), pos, neg)
    kept = sorted(want)
    assert 0 < len(kept) < len(labels)  # some anchors are left out
    np.testing.assert_allclose(per_anchor[kept], [want[a] for a in kept], atol=VALUE_TOL)
    assert np.all(per_anchor[[a for a in range(len(labels)) if a not in want]] == 0)
    np.testing.assert_allclose(to_numpy(MultiSimilarityLoss(miner=miner)(labels, x)), value,
                               atol=VALUE_TOL)


# -- reference sets --------------------------------------------------------------------------------

REF_LABELS, REF_X = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)  # R=14, D=5
REF_MINERS = ["ms_hard", "ms_easy", "ms_all", "all_all", "easy_semihard"]


@pytest.mark.parametrize("miner", _params(REF_MINERS, ["ms_easy"]))
def test_functional_reference_set_with_offset(miner):
    labels, x = REF_LABELS[3:9], REF_X[3:9]
    run_ms(labels, x, MINERS[miner](), ref_set=(REF_X, REF_LABELS, 3), functional=True)


@pytest.mark.parametrize("miner", REF_MINERS)
def test_functional_reference_set_without_offset(miner):
    rng = np.random.default_rng(21)
    x = rng.normal(size=(6, 5))
    labels = np.array([1, 4, 7, 100, 1, 16], np.int32)  # 100 has no positive
    run_ms(labels, x, MINERS[miner](), ref_set=(REF_X, REF_LABELS, None), functional=True,
           base=1.0)


# -- float64 and finite differences ---------------------------------------------------------------


@pytest.mark.multibackend
@pytest.mark.parametrize("make_miner", [lambda: MultiSimilarityMiner(0.1, "hard"),
                                        lambda: MultiSimilarityMiner(0.3, "easy"),
                                        lambda: TripletMiner("all", "all")])
def test_float64_compute_gradient(make_miner, float64):
    labels_np, x = BATCH_C
    x = x[:8]
    labels_np = labels_np[:8]
    labels = ops.convert_to_tensor(labels_np)

    def loss_fn(e):
        return multi_similarity_loss(labels, e, alpha=2.0, beta=10.0, base=0.5,
                                     miner=make_miner())

    value = loss_fn(ops.convert_to_tensor(x))
    assert to_numpy(value).dtype == np.float64
    recorder = RecordingMiner(make_miner())
    multi_similarity_loss(labels, ops.convert_to_tensor(x), beta=10.0, miner=recorder)
    pos, neg, _ = checked_pairs(recorder, labels_np, None, 0)
    want = ref.multi_similarity_loss(x, pos, neg, 2.0, 10.0, 0.5)[0]
    assert want > 0
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-12, atol=1e-12)
    theoretical, numerical = gradient_check(loss_fn, x, delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-6, atol=1e-8)


# -- the published formula --------------------------------------------------------------------------


@MB
def test_hand_example_matches_wang_et_al():
    """Eq. 12 of Wang et al. on four unit vectors in the plane, worked out by hand.

    Angles 0 and 90 degrees (class 0), 45 and 135 degrees (class 1); c = cos 45 = 0.7071.
      a0 (0):   positive 90 (S = 0); negatives 45 (c), 135 (-c).
      a1 (90):  positive 0 (S = 0); negatives 45 (c), 135 (c).
      a2 (45):  positive 135 (S = 0); negatives 0 (c), 90 (c).
      a3 (135): positive 45 (S = 0); negatives 0 (-c), 90 (c).
    Mining (epsilon 0.1): negatives kept if S_an + 0.1 > min S_ap = 0, i.e. S_an = c only;
    hard positives kept if 0 - 0.1 < max S_an = c: all kept.
    """
    x = np.array([[1, 0], [0, 1], [1, 1], [-1, 1]], np.float32)
    labels = np.array([0, 0, 1, 1], np.int32)
    c = math.sqrt(0.5)
    alpha, beta, lam = 2.0, 50.0, 0.5

    def anchor_loss(s_pos, s_neg):
        pull = math.log(1 + sum(math.exp(-alpha * (s - lam)) for s in s_pos)) / alpha
        push = math.log(1 + sum(math.exp(beta * (s - lam)) for s in s_neg)) / beta
        return pull + push

    per_anchor = [anchor_loss([0.0], [c]), anchor_loss([0.0], [c, c]),
                  anchor_loss([0.0], [c, c]), anchor_loss([0.0], [c])]
    want = sum(per_anchor) / 4
    loss = MultiSimilarityLoss(alpha=alpha, beta=beta, base=lam)
    np.testing.assert_allclose(to_numpy(loss(labels, x)), want, rtol=1e-6)
    got = MultiSimilarityLoss(alpha=alpha, beta=beta, base=lam, reduction="none")(labels, x)
    np.testing.assert_allclose(to_numpy(got), per_anchor, rtol=1e-6)
    # With all pairs kept, the negative at -c adds to anchors 0 and 3 (a visible change).
    everything = MultiSimilarityLoss(alpha=alpha, beta=beta, base=lam,
                                     miner=TripletMiner("all", "all"), reduction="none")
    np.testing.assert_allclose(to_numpy(everything(labels, x))[0], anchor_loss([0.0], [c, -c]),
                               rtol=1e-6)
    # The class-collapse paper's lambda = 1.
    np.testing.assert_allclose(
        to_numpy(MultiSimilarityLoss(base=1.0)(labels, x)),
        sum(math.log(1 + math.exp(2.0)) / 2 + math.log(1 + k * math.exp(50 * (c - 1))) / 50
            for k in (1, 2, 2, 1)) / 4,
        rtol=1e-6)


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    (dict(alpha=0.0), "alpha"), (dict(alpha=-1.0), "alpha"), (dict(alpha="2"), "alpha"),
    (dict(beta=0.0), "beta"), (dict(beta=True), "beta"), (dict(base="0.5"), "base"),
    (dict(base=None), "base"), (dict(miner="hard"), "miner"),
])
@MB
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiSimilarityLoss(**kwargs)
    labels, x = BATCH_A
    with pytest.raises(ValueError, match=match):
        multi_similarity_loss(labels, x, **kwargs)


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager values.

    (Not marked multibackend: tests/losses/test_loss_base.py compares jax.jit with eager JAX.)"""
    labels, x = BATCH_C
    x = np.asarray(x, np.float32)
    assert_compiled_values_equal_eager(
        (MultiSimilarityLoss(),
         MultiSimilarityLoss(miner=TripletMiner("all", "all"), reduction="none")), labels, x)
