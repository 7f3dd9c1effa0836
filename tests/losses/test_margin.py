"""MarginLoss / margin_loss (Wu et al. 2017) against the naive references of tests/references.py.

Values must match to 1e-5 (float32). Gradients (float32, under any Keras backend) are
compared with central finite differences of the float64 reference (h = 1e-6) with the
mined pairs or triplets held fixed: the miner's output is recorded and first checked
against the reference miner (for random miners: that every choice is a valid candidate).
The tests marked ``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import CAN_COMPILE, compiled, gradient_check, to_numpy, value_and_grad
from harness import slow_beyond
from keras import ops
from recorded_mining import (
    RecordingMiner,
    as_f32,
    checked_mined,
    reference_set_arguments,
    run_recorded,
)

import tfdml
from tfdml.losses import MarginLoss, margin_loss
from tfdml.miners import AllPairsMiner, MultiSimilarityMiner, TripletMiner
from tfdml.models import MetricModel

pytestmark = pytest.mark.filterwarnings("ignore:Loss .* has learned variables")

VALUE_TOL = 1e-5
GRAD_ATOL = 1e-5
GRAD_RTOL = 1e-4
MB = pytest.mark.multibackend


def reference_margin(labels, emb, mined, margin, beta, distance, normalize=True,
                     ref_embeddings=None):
    if mined[0] == "pairs":
        return ref.margin_pair_loss(labels, emb, mined[1], mined[2], margin, beta, distance,
                                    normalize, ref_embeddings)
    return ref.margin_triplet_input_loss(labels, emb, mined[1], margin, beta, distance,
                                         normalize, ref_embeddings)


def run_margin(labels, x, miner, margin=0.2, beta=1.2, distance="l2", num_classes=None,
               ref_set=None, functional=False, grad=True, normalize=True):
    """Runs the loss and the reference on the same float32 inputs; returns the reference
    value and the mining result. ``ref_set``: ``(ref_embeddings, ref_labels, ref_offset)``."""
    x32, x64 = as_f32(x)
    kwargs, ref_kwargs, ref_labels, ref_offset = reference_set_arguments(ref_set)
    y = ops.convert_to_tensor(labels)

    def loss_value(recorder, xt):
        if functional:
            return margin_loss(y, xt, margin=margin, beta=beta, distance=distance,
                               miner=recorder, normalize=normalize, **kwargs)
        assert ref_set is None
        loss = MarginLoss(margin=margin, beta=beta, learn_beta=False, num_classes=num_classes,
                          miner=recorder, distance=distance, normalize=normalize)
        return loss(y, xt)

    value, got_grad, recorder = run_recorded(loss_value, miner, x32, grad=grad)
    assert value.dtype == np.float32 and value.shape == ()
    mined = checked_mined(recorder, labels, ref_labels, ref_offset)
    beta_ref = beta if np.ndim(beta) == 0 else list(np.asarray(beta, np.float64))
    want, _ = reference_margin(labels, x64, mined, margin, beta_ref, distance, normalize,
                               **ref_kwargs)
    np.testing.assert_allclose(value, want, rtol=0, atol=VALUE_TOL)
    if grad:
        fd = ref.finite_difference_gradient(
            lambda e: reference_margin(labels, e, mined, margin, beta_ref, distance, normalize,
                                       **ref_kwargs)[0], x64)
        assert np.all(np.isfinite(got_grad))
        np.testing.assert_allclose(got_grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    return want, mined


BATCH_A = ref.make_batch([4, 3, 2, 2, 1], 7, seed=0)  # B=12, D=7
BATCH_B = ref.make_batch([3, 3, 2, 1, 1], 16, seed=1)  # B=10, D=16


MINERS = {
    "dw_easy": lambda: TripletMiner("easy", "distance_weighted", seed=1),
    "dw_random": lambda: TripletMiner("random", "distance_weighted", seed=2),
    "dw_all": lambda: TripletMiner("all", "distance_weighted", seed=3),
    "easy_semihard": lambda: TripletMiner("easy", "semihard"),
    "all_hard": lambda: TripletMiner("all", "hard"),
    "all_all": lambda: TripletMiner("all", "all"),
    "random_random": lambda: TripletMiner("random", "random", seed=4),
    "disjoint_easy_hard": lambda: TripletMiner("easy", "hard", disjoint=True),
    "ms_hard": lambda: MultiSimilarityMiner(0.1, "hard"),
    "ms_easy": lambda: MultiSimilarityMiner(0.1, "easy"),
    "ms_all": lambda: MultiSimilarityMiner(0.3, "all"),
}


def _params(names, multibackend):
    """``names`` as pytest params; those in ``multibackend`` also run under JAX and PyTorch
    (a few per test: eager JAX compiles every op for each new shape)."""
    return [pytest.param(n, marks=MB) if n in multibackend else n for n in names]


# On every commit: distance weighted, all triplets, disjoint triplets and a pair miner; the
# other strategies, whose triplets or pairs reach the loss the same way, in the slow tier.
@pytest.mark.parametrize("miner", slow_beyond(_params(sorted(MINERS), ["dw_easy"]),
                                              {"dw_easy", "all_all", "disjoint_easy_hard",
                                               "ms_hard"}))
def test_class_form_matches_reference(miner):
    want, mined = run_margin(*BATCH_A, MINERS[miner]())
    assert want > 0
    assert len(mined[1]) > 0
    run_margin(*BATCH_B, MINERS[miner](), margin=0.1, beta=1.0, grad=False)


# Each distance, with triplets and with pairs, on every commit; the other pairs in the slow
# tier.
@pytest.mark.parametrize("miner,distance", slow_beyond(
    [pytest.param(m, d, id=f"{m}-{d}")
     for m in ["dw_easy", "all_all", "ms_easy"] for d in ["squared_l2", "cosine"]],
    {"dw_easy-squared_l2", "all_all-cosine", "ms_easy-cosine"}))
def test_other_distances(miner, distance):
    want, _ = run_margin(*BATCH_A, MINERS[miner](), margin=0.3, beta=0.9, distance=distance)
    assert want > 0


def test_default_miner_is_random_positive_distance_weighted():
    """The class-collapse paper's Dist-Margin sampling, averaged over non-zero pair terms."""
    labels, x = BATCH_A
    loss = MarginLoss(learn_beta=False)
    assert isinstance(loss.miner, TripletMiner)
    assert loss.average == "nonzero"
    assert (loss.miner.positive, loss.miner.negative) == ("random", "distance_weighted")
    assert (loss.miner.lower_cutoff, loss.miner.upper_cutoff) == (0.5, 1.4)
    recorder = RecordingMiner(loss.miner)
    loss.miner = recorder
    value = loss(labels, np.asarray(x, np.float32))
    mined = checked_mined(recorder, labels, None, 0)
    want, _ = reference_margin(labels, np.asarray(x, np.float32).astype(np.float64), mined,
                               0.2, 1.2, "l2")
    np.testing.assert_allclose(to_numpy(value), want, atol=VALUE_TOL)


def test_without_normalization():
    labels, x = BATCH_A
    want, _ = run_margin(labels, 0.6 * x, MINERS["all_hard"](), margin=0.3, beta=1.5,
                         normalize=False)
    assert want > 0


# -- reference sets --------------------------------------------------------------------------------

REF_LABELS, REF_X = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)  # R=14, D=5
REF_MINERS = ["dw_easy", "dw_all", "easy_semihard", "all_all", "ms_hard", "ms_easy",
              "disjoint_easy_hard"]
#: On every commit: distance weighted and disjoint triplets and a pair miner over the reference
#: set; the other strategies (the same way into the loss) in the slow tier.
REF_FAST = {"dw_easy", "ms_hard", "disjoint_easy_hard"}


@pytest.mark.parametrize("miner", slow_beyond(_params(REF_MINERS, ["dw_easy"]), REF_FAST))
def test_functional_reference_set_with_offset(miner):
    labels, x = REF_LABELS[3:9], REF_X[3:9]
    run_margin(labels, x, MINERS[miner](), ref_set=(REF_X, REF_LABELS, 3), functional=True)


@pytest.mark.parametrize("miner", slow_beyond(REF_MINERS, REF_FAST))
def test_functional_reference_set_without_offset(miner):
    rng = np.random.default_rng(21)
    x = rng.normal(size=(6, 5))
    labels = np.array([1, 4, 7, 100, 1, 16], np.int32)  # 100 has no positive
    run_margin(labels, x, MINERS[miner](), ref_set=(REF_X, REF_LABELS, None), functional=True,
               margin=0.25, beta=1.1, distance="squared_l2")


def test_functional_equals_class_form():
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    for make in (lambda: TripletMiner("all", "semihard"), lambda: MultiSimilarityMiner()):
        a = margin_loss(labels, x, margin=0.3, beta=1.1, miner=make())
        b = MarginLoss(margin=0.3, beta=1.1, learn_beta=False, miner=make())(labels, x)
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-6)


# -- per-class beta --------------------------------------------------------------------------------

CLASS_LABELS = ref.make_labels([4, 3, 3, 2, 2], seed=7, values=[0, 1, 2, 3, 4])
CLASS_X = np.random.default_rng(8).normal(size=(14, 6))
CLASS_BETA = [0.8, 1.2, 1.5, 1.0, 1.35]


# dw_easy and ms_all (slow tier) index beta by the anchor's class as all_hard and ms_hard do.
@pytest.mark.parametrize("miner", slow_beyond(
    _params(["dw_easy", "all_hard", "ms_hard", "ms_all"], ["all_hard"]), {"all_hard", "ms_hard"}))
def test_per_class_beta_matches_reference(miner):
    want, _ = run_margin(CLASS_LABELS, CLASS_X, MINERS[miner](), beta=CLASS_BETA,
                         num_classes=5)
    assert want > 0
    run_margin(CLASS_LABELS, CLASS_X, MINERS[miner](), beta=CLASS_BETA, functional=True,
               grad=False)


def test_per_class_beta_indexes_by_anchor_class():
    """Per-anchor values ("none" reduction) use the beta of the anchor's own class."""
    x = np.asarray(CLASS_X, np.float32)
    miner = TripletMiner("all", "all")
    loss = MarginLoss(beta=CLASS_BETA, num_classes=5, learn_beta=False, miner=miner,
                      reduction="none", average="anchors")
    got = to_numpy(loss(CLASS_LABELS, x))
    triplets = ref.mine_triplets(ref.margin_scores(x.astype(np.float64), distance_kind="l2"),
                                 CLASS_LABELS, positive="all", negative="all")
    _, per_anchor = ref.margin_triplet_input_loss(CLASS_LABELS, x.astype(np.float64), triplets,
                                                  beta=CLASS_BETA)
    np.testing.assert_allclose(got, [per_anchor[a] for a in range(14)], atol=VALUE_TOL)
    # Each anchor's value equals the scalar-beta loss with its class's beta.
    for cls, b in enumerate(CLASS_BETA):
        scalar = MarginLoss(beta=b, learn_beta=False, miner=miner, reduction="none",
                            average="anchors")
        rows = CLASS_LABELS == cls
        np.testing.assert_allclose(got[rows], to_numpy(scalar(CLASS_LABELS, x))[rows],
                                   rtol=1e-6)
    # A beta indexed by anything else (e.g. position in the batch) would differ.
    permuted = MarginLoss(beta=CLASS_BETA[::-1], num_classes=5, learn_beta=False, miner=miner,
                          reduction="none")
    assert np.abs(to_numpy(permuted(CLASS_LABELS, x)) - got).max() > 1e-2


@MB
def test_per_class_beta_as_tensor_in_functional_form():
    """A beta tensor (e.g. a ``keras.Variable``'s value) is differentiated."""
    beta = np.asarray(CLASS_BETA, np.float32)
    x = ops.convert_to_tensor(np.asarray(CLASS_X, np.float32))
    miner = MultiSimilarityMiner(0.2, "all")
    value, grad = value_and_grad(lambda b: margin_loss(CLASS_LABELS, x, beta=b, miner=miner),
                                 beta)
    want = margin_loss(CLASS_LABELS, x, beta=CLASS_BETA, miner=miner)
    np.testing.assert_allclose(value, to_numpy(want), rtol=1e-6)
    assert np.abs(grad).max() > 1e-3
    variable = keras.Variable(beta)
    np.testing.assert_allclose(
        to_numpy(margin_loss(CLASS_LABELS, x, beta=variable, miner=miner)), value, rtol=1e-6)


def _variable_gradient(loss, variable, call):
    """``(value, d value / d variable)`` of ``call()``, the variable swapped for a tensor."""
    def with_value(v):
        with keras.StatelessScope(state_mapping=[(variable, v)]):
            return call()

    return value_and_grad(with_value, to_numpy(variable.value))


@MB
@pytest.mark.parametrize("per_class", [False, True])
def test_beta_gradient_matches_finite_differences(per_class):
    labels, x = CLASS_LABELS, np.asarray(CLASS_X, np.float32)
    beta = CLASS_BETA if per_class else 1.1
    # A deterministic miner: random draws differ between backends, and with a scalar beta
    # (averaged over the non-zero terms) some draws make the gradient cancel exactly.
    recorder = RecordingMiner(TripletMiner("easy", "hard"))
    loss = MarginLoss(beta=beta, num_classes=5 if per_class else None, miner=recorder)
    assert len(loss.trainable_variables) == 1
    value, grad = _variable_gradient(loss, loss.trainable_variables[0],
                                     lambda: loss(labels, x))
    mined = checked_mined(recorder, labels, None, 0)
    x64 = x.astype(np.float64)
    b0 = np.asarray(beta, np.float64)

    def f(b):
        return reference_margin(labels, x64, mined, 0.2, float(b) if b.ndim == 0 else list(b),
                                "l2")[0]

    np.testing.assert_allclose(value, f(b0), atol=VALUE_TOL)
    fd = ref.finite_difference_gradient(f, b0)
    np.testing.assert_allclose(grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    assert np.abs(fd).max() > 1e-2


@MB
def test_beta_lr_multiplier_keeps_the_value():
    labels, x = CLASS_LABELS, np.asarray(CLASS_X, np.float32)
    miner = TripletMiner("all", "hard")
    plain = MarginLoss(beta=CLASS_BETA, num_classes=5, miner=miner)
    scaled = MarginLoss(beta=CLASS_BETA, num_classes=5, miner=miner, beta_lr_multiplier=10.0)
    np.testing.assert_allclose(to_numpy(scaled.beta), CLASS_BETA, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(scaled.trainable_variables[0].value),
                               np.asarray(CLASS_BETA) / 10.0, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(scaled(labels, x)), to_numpy(plain(labels, x)),
                               rtol=1e-6)


def test_learn_beta_false_is_a_constant():
    labels, x = CLASS_LABELS, np.asarray(CLASS_X, np.float32)
    miner = TripletMiner("all", "hard")
    fixed = MarginLoss(beta=CLASS_BETA, num_classes=5, learn_beta=False, miner=miner)
    learned = MarginLoss(beta=CLASS_BETA, num_classes=5, miner=miner)
    assert fixed.trainable_variables == [] and len(learned.trainable_variables) == 1
    np.testing.assert_allclose(to_numpy(fixed.beta), CLASS_BETA, rtol=1e-6)
    value, grad = value_and_grad(lambda e: fixed(labels, e), x)
    assert np.abs(grad).max() > 0
    np.testing.assert_allclose(value, to_numpy(learned(labels, x)), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(fixed.beta), CLASS_BETA, rtol=1e-6)  # unchanged
    # A MetricModel with the fixed loss gains no variable.
    model = MetricModel(keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)]), fixed)
    assert len(model.trainable_variables) == 2


# -- float64 and finite differences ------------------------------------------------------------------

SMALL_LABELS = np.array([2, 0, 2, 0, 2, 1], np.int32)  # B=6, D=4, one singleton


# On every commit triplets with a scalar beta and pairs with a beta per class; the other two
# (the same float64 gradient paths) in the slow tier.
@pytest.mark.multibackend
@pytest.mark.parametrize("make_miner,beta,distance", slow_beyond([
    pytest.param(lambda: TripletMiner("easy", "hard"), 1.2, "l2", id="easy_hard-1.2-l2"),
    pytest.param(lambda: TripletMiner("all", "all"), [1.0, 0.7, 1.3], "l2",
                 id="all_all-per_class-l2"),
    pytest.param(lambda: MultiSimilarityMiner(0.3, "all"), 0.9, "squared_l2",
                 id="ms_all-0.9-squared_l2"),
    pytest.param(lambda: MultiSimilarityMiner(0.2, "easy"), [1.0, 0.7, 1.3], "cosine",
                 id="ms_easy-per_class-cosine"),
], {"easy_hard-1.2-l2", "ms_easy-per_class-cosine"}))
def test_float64_compute_gradient(make_miner, beta, distance, float64):
    x = np.random.default_rng(4).normal(size=(6, 4))
    labels = ops.convert_to_tensor(SMALL_LABELS)

    def loss_fn(e):
        return margin_loss(labels, e, margin=0.2, beta=beta, distance=distance,
                           miner=make_miner())

    value = loss_fn(ops.convert_to_tensor(x))
    assert to_numpy(value).dtype == np.float64
    recorder = RecordingMiner(make_miner())
    margin_loss(labels, ops.convert_to_tensor(x), beta=beta, distance=distance, miner=recorder)
    mined = checked_mined(recorder, SMALL_LABELS, None, 0)
    want = reference_margin(SMALL_LABELS, x, mined, 0.2, beta, distance)[0]
    assert want > 0
    # (A scalar beta is rounded to float32 first: see test_float64_keeps_scalar_beta_precision.)
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-7, atol=1e-12)
    theoretical, numerical = gradient_check(loss_fn, x, delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("beta", [1.2, [1.0, 0.7, 1.1]])
def test_float64_keeps_scalar_beta_precision(beta):
    """With float64 embeddings the functional loss should use the float64 value of beta and
    margin (as triplet_margin_loss does for its margin)."""
    x = np.random.default_rng(4).normal(size=(6, 4))
    miner = TripletMiner("all", "all")
    value = margin_loss(SMALL_LABELS, x, margin=0.3, beta=beta, miner=miner)
    triplets = ref.mine_triplets(ref.margin_scores(x, distance_kind="l2"), SMALL_LABELS,
                                 positive="all", negative="all")
    want = ref.margin_triplet_input_loss(SMALL_LABELS, x, triplets, 0.3, beta)[0]
    assert to_numpy(value).dtype == np.float64 and want > 0
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-12, atol=1e-12)


# -- the published formula --------------------------------------------------------------------------

# Section 3 of the class-collapse paper, with D the squared Euclidean distance:
#   L(x_a, x) = delta (D - beta_a + alpha)_+ + (1 - delta) (beta_a - D + alpha)_+.
# Points (not normalized): x0 = (0, 0), x1 = (1, 0) of class 0; x2 = (0, 1), x3 = (2, 0)
# of class 1. D01 = 1, D02 = 1, D03 = 4, D12 = 2, D13 = 1, D23 = 5.
HAND_X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]], np.float32)
HAND_LABELS = np.array([0, 0, 1, 1], np.int32)


def _all_pairs_miner():
    return MultiSimilarityMiner(epsilon=100.0, positive="all")  # keeps every pair


@MB
def test_margin_loss_on_all_pairs_equals_paper_formula():
    # alpha = 0.2, beta = 1.2. Per anchor (mean over its 3 pairs):
    #   a0: pos x1: (1 - 1.2 + .2)+ = 0; neg x2: (1.2 - 1 + .2)+ = 0.4; neg x3: 0 -> 0.4/3
    #   a1: pos x0: 0; neg x2: (1.2 - 2 + .2)+ = 0; neg x3: 0.4                    -> 0.4/3
    #   a2: pos x3: (5 - 1.2 + .2) = 4; neg x0: 0.4; neg x1: 0                     -> 4.4/3
    #   a3: pos x2: 4; neg x0: 0; neg x1: 0.4                                      -> 4.4/3
    # Sum 9.6 over 6 non-zero pair terms (the default, Wu et al.'s code): 1.6.
    # Mean over anchors: 9.6 / 12 = 0.8. The paper's O_margin = (1/n^2) sum_{i,j} L
    # (self pairs add 0) = 9.6 / 16 = 0.6 = 0.8 * (n - 1) / n.
    for miner in (_all_pairs_miner(), AllPairsMiner(), None):
        loss = MarginLoss(margin=0.2, beta=1.2, learn_beta=False, miner=miner,
                          distance="squared_l2", normalize=False)
        np.testing.assert_allclose(to_numpy(loss(HAND_LABELS, HAND_X)), 1.6, rtol=1e-6)
    loss = MarginLoss(margin=0.2, beta=1.2, learn_beta=False, miner=_all_pairs_miner(),
                      distance="squared_l2", normalize=False, average="anchors")
    value = to_numpy(loss(HAND_LABELS, HAND_X))
    np.testing.assert_allclose(value, 0.8, rtol=1e-6)
    np.testing.assert_allclose(value * 3 / 4, 0.6, rtol=1e-6)
    # Per-class beta (0: 1.2, 1: 0.5): anchors 2 and 3 become (4.7 + 0 + 0) / 3 each:
    # (0.4 + 0.4 + 4.7 + 4.7) / 12 = 0.85; 10.2 over 4 non-zero terms = 2.55.
    for average, want in (("anchors", 0.85), ("nonzero", 2.55)):
        per_class = MarginLoss(margin=0.2, beta=[1.2, 0.5], num_classes=2, learn_beta=False,
                               miner=_all_pairs_miner(), distance="squared_l2",
                               normalize=False, average=average)
        np.testing.assert_allclose(to_numpy(per_class(HAND_LABELS, HAND_X)), want, rtol=1e-6)


def test_margin_loss_on_triplets_hand_example():
    # Easy positive, hard negative (by distance), alpha = 0.2, beta = 1.2; each triplet is
    # worth the mean of its two pair terms:
    #   a0: p = x1 (D 1), n = x2 (D 1): (0 + 0.4) / 2 = 0.2
    #   a1: p = x0 (D 1), n = x3 (D 1): 0.2
    #   a2: p = x3 (D 5), n = x0 (D 1): (4 + 0.4) / 2 = 2.2
    #   a3: p = x2 (D 5), n = x1 (D 1): 2.2                      -> mean 1.2
    # Over the non-zero pair terms (default): 9.6 / 6 = 1.6; over all 8 terms: 1.2.
    for average, want in (("anchors", 1.2), ("terms", 1.2), ("nonzero", 1.6), ("batch", 1.2)):
        loss = MarginLoss(margin=0.2, beta=1.2, learn_beta=False,
                          miner=TripletMiner("easy", "hard"), distance="squared_l2",
                          normalize=False, average=average)
        np.testing.assert_allclose(to_numpy(loss(HAND_LABELS, HAND_X)), want, rtol=1e-6)


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    (dict(margin=-0.1), "margin"),
    (dict(margin="0.2"), "margin"),
    (dict(distance="euclidean"), "distance"),
    (dict(num_classes=0), "num_classes"),
    (dict(num_classes=-2), "num_classes"),
    (dict(num_classes=2.5), "num_classes"),
    (dict(num_classes=True), "num_classes"),
    (dict(beta=[1.0, 1.2]), "num_classes"),
    (dict(beta=[1.0, 1.2], num_classes=3), "num_classes"),
    (dict(beta=float("nan")), "beta"),
    (dict(beta=[[1.0, 1.2]], num_classes=2), "beta"),
    (dict(beta="big"), "beta"),
    (dict(beta_lr_multiplier=0.0), "beta_lr_multiplier"),
    (dict(miner="hard"), "miner"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MarginLoss(**kwargs)


def test_functional_invalid_arguments():
    labels, x = BATCH_A
    for kwargs, match in [(dict(margin=-1.0), "margin"), (dict(distance="l1"), "distance"),
                          (dict(beta=[1.0, float("inf")]), "beta"),
                          (dict(miner=object()), "miner")]:
        with pytest.raises(ValueError, match=match):
            margin_loss(labels, x, **kwargs)


@pytest.mark.parametrize("labels", [[0, 1, 2, 3, 0, 1],
                                    pytest.param([0, 1, -1, 2, 0, 1], marks=MB)])
def test_class_ids_out_of_range_raise_eagerly(labels):
    loss = MarginLoss(num_classes=3, learn_beta=False, miner=TripletMiner("easy", "hard"))
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="num_classes"):
        loss(np.array(labels, np.int32), x)
    loss(np.array([0, 1, 2, 2, 0, 1], np.int32), x)  # in range: fine


def test_functional_per_class_beta_class_ids_out_of_range_raise_eagerly():
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    miner = TripletMiner("easy", "hard")
    with pytest.raises(ValueError, match="per-class `beta` of length 3"):
        margin_loss(np.array([0, 1, 2, 3, 0, 1], np.int32), x, beta=[1.0, 1.1, 1.2], miner=miner)
    margin_loss(np.array([0, 1, 2, 2, 0, 1], np.int32), x, beta=[1.0, 1.1, 1.2], miner=miner)


@MB
@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_per_class_beta_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager value; an out-of-range
    class id, which cannot raise there, makes the loss NaN."""
    x = np.asarray(CLASS_X, np.float32)
    loss = MarginLoss(beta=CLASS_BETA, num_classes=5, learn_beta=False,
                      miner=TripletMiner("all", "hard"), reduction="none", average="anchors")
    fn = compiled(lambda y, e: loss(y, e))
    np.testing.assert_allclose(to_numpy(fn(CLASS_LABELS, x)), to_numpy(loss(CLASS_LABELS, x)),
                               rtol=1e-5, atol=1e-6)
    for bad in (9, 5, -1):
        high = np.where(CLASS_LABELS == 4, bad, CLASS_LABELS).astype(np.int32)
        assert np.isnan(to_numpy(fn(high, x))).all(), bad


def test_margin_loss_is_exported():
    assert tfdml.losses.MarginLoss is MarginLoss and tfdml.losses.margin_loss is margin_loss
