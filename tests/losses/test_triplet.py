"""TripletNCALoss / TripletMarginLoss against the naive references of tests/references.py.

Values must match to 1e-5 (float32). Gradients (float32, under any Keras backend) are
compared with central finite differences of the float64 reference, h = 1e-6, to
``atol=1e-5, rtol=1e-4``. The finite differences hold the mined triplets fixed (the
triplets the miner chose, once checked against the reference), which is the same
function locally since random inputs have no ties.

The tests marked ``multibackend`` also run under JAX and PyTorch (a subset of the
strategy combinations, to keep those runs short).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import references as ref
from backends import CAN_COMPILE, compiled, gradient_check, to_numpy, value_and_grad
from harness import slow_beyond
from keras import ops
from recorded_mining import as_f32, run_recorded

import tfdml
from tfdml.miners import TripletMiner

POSITIVES = ("easy", "hard", "random", "all")
NEGATIVES = ("hard", "semihard", "easy", "random", "all")
COMBOS = [(p, n) for p in POSITIVES for n in NEGATIVES]
SINGLE_COMBOS = [(p, n) for p in POSITIVES if p != "all" for n in NEGATIVES if n != "all"]

VALUE_TOL = 1e-5
GRAD_ATOL = 1e-5
GRAD_RTOL = 1e-4
MB = pytest.mark.multibackend


def _params(cases, multibackend, fast=None):
    """``cases`` (tuples) as pytest params; those in ``multibackend`` also run under JAX and
    PyTorch (a few cases per test: eager JAX compiles every op for each new shape).

    With ``fast`` (cases), the others are marked ``slow`` (:func:`harness.slow_beyond`); the
    params are then named by their values joined with ``-``.
    """
    if fast is None:
        return [pytest.param(*c, marks=MB) if c in multibackend else c for c in cases]
    return slow_beyond([pytest.param(*c, marks=[MB] if c in multibackend else [], id=_id(c))
                        for c in cases], {_id(c) for c in fast})


def _id(case):
    flat = [w for v in case for w in (v if isinstance(v, tuple) else (v,))]
    return "-".join(str(v) for v in flat)


# Batches: B != D, several classes of varying sizes including a singleton.
BATCH_A = ref.make_batch([4, 3, 2, 2, 1], 7, seed=0)  # B=12, D=7: values and gradients
BATCH_B = ref.make_batch([3, 3, 2, 1, 1], 16, seed=1)  # B=10, D=16: values


def _run(kind, labels, x, params, positive, negative, disjoint=False, normalize=True,
         ref_set=None, grad=True, seed=7):
    """Runs the loss and the reference on the same inputs and compares them.

    ``kind``: "nca" (params: order, temperature) or "margin" (params: margin, distance).
    ``ref_set``: None (class form, batch as reference set) or
    ``(ref_embeddings, ref_labels, ref_offset)`` (functional form).
    Returns the reference value.
    """
    x32, x64 = as_f32(x)
    ref_kwargs = {}
    tensor_ref_kwargs = {}
    if ref_set is not None:
        r32, r64 = as_f32(ref_set[0])
        ref_kwargs = dict(ref_embeddings=r64, ref_labels=ref_set[1], ref_offset=ref_set[2])
        tensor_ref_kwargs = dict(ref_embeddings=ops.convert_to_tensor(r32),
                                 ref_labels=ops.convert_to_tensor(ref_set[1]),
                                 ref_offset=ref_set[2])
    y = ops.convert_to_tensor(labels)

    def loss_value(recorder, xt):
        if kind == "nca":
            order, temperature = params
            if ref_set is None:
                loss = tfdml.losses.TripletNCALoss(order=order, temperature=temperature,
                                                   miner=recorder, normalize=normalize)
                return loss(y, xt)
            return tfdml.losses.triplet_nca_loss(
                y, xt, order=order, temperature=temperature, miner=recorder,
                normalize=normalize, **tensor_ref_kwargs)
        margin, distance = params
        if ref_set is None:
            loss = tfdml.losses.TripletMarginLoss(margin=margin, distance=distance,
                                                  miner=recorder, normalize=normalize)
            return loss(y, xt)
        return tfdml.losses.triplet_margin_loss(
            y, xt, margin=margin, distance=distance, miner=recorder, normalize=normalize,
            **tensor_ref_kwargs)

    miner = TripletMiner(positive, negative, disjoint=disjoint, seed=seed)
    value, got_grad, recorder = run_recorded(loss_value, miner, x32, grad=grad)
    assert value.dtype == np.float32 and value.shape == ()

    pos, neg, mask = recorder.mined
    got_triplets = ref.triplet_set(pos, neg, mask)
    chooser = ref.chooser_from(pos, neg, mask, disjoint=disjoint)

    def reference(emb, triplets=None):
        common = dict(positive=positive, negative=negative, disjoint=disjoint,
                      normalize=normalize, chooser=chooser, triplets=triplets, **ref_kwargs)
        if kind == "nca":
            return ref.nca_loss(labels, emb, order=params[0], temperature=params[1], **common)
        return ref.margin_loss(labels, emb, margin=params[0], distance_kind=params[1], **common)

    want, want_triplets = reference(x64)
    assert got_triplets == want_triplets
    np.testing.assert_allclose(value, want, rtol=0, atol=VALUE_TOL)

    if grad:
        fd = ref.finite_difference_gradient(lambda e: reference(e, want_triplets)[0], x64)
        assert np.all(np.isfinite(got_grad))
        np.testing.assert_allclose(got_grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    return want


# -- every strategy combination ------------------------------------------------------------------

# The miners are checked against the reference miner combination by combination in
# tests/miners/test_miners.py. Here, on every commit, each loss sees every positive and every
# negative strategy, single choices and "all" on both sides; the other combinations run in the
# slow tier.
NCA_FAST = [("easy", "hard"), ("hard", "semihard"), ("random", "semihard"), ("random", "easy"),
            ("all", "random"), ("easy", "all"), ("all", "all")]
MARGIN_FAST = [("easy", "semihard"), ("hard", "easy"), ("random", "random"), ("all", "hard"),
               ("all", "semihard"), ("hard", "all")]
NCA_DISJOINT_FAST = [("easy", "hard"), ("hard", "random"), ("random", "semihard"),
                     ("easy", "easy")]
MARGIN_DISJOINT_FAST = [("hard", "hard"), ("random", "easy"), ("easy", "semihard"),
                        ("random", "random")]


@pytest.mark.parametrize("positive,negative",
                         _params(COMBOS, [("random", "semihard")], NCA_FAST))
def test_nca_strategies(positive, negative):
    want = _run("nca", *BATCH_A, (1, 1.0), positive, negative)
    assert want > 0
    _run("nca", *BATCH_B, (2, 2.0), positive, negative, grad=False)


@pytest.mark.parametrize("positive,negative",
                         _params(COMBOS, [("all", "semihard")], MARGIN_FAST))
def test_margin_strategies(positive, negative):
    _run("margin", *BATCH_A, (0.2, "squared_l2"), positive, negative)
    _run("margin", *BATCH_B, (0.3, "cosine"), positive, negative, grad=False)


@pytest.mark.parametrize("positive,negative",
                         _params(SINGLE_COMBOS, [("hard", "random")], NCA_DISJOINT_FAST))
def test_nca_disjoint(positive, negative):
    want = _run("nca", *BATCH_A, (2, 1.0), positive, negative, disjoint=True)
    assert want > 0


@pytest.mark.parametrize("positive,negative", _params(SINGLE_COMBOS, [], MARGIN_DISJOINT_FAST))
def test_margin_disjoint(positive, negative):
    _run("margin", *BATCH_A, (0.5, "l2"), positive, negative, disjoint=True, grad=False)
    _run("margin", *BATCH_B, (0.2, "squared_l2"), positive, negative, disjoint=True, grad=False)


# -- orders, temperatures, distances, normalization ----------------------------------------------


# On every commit each order once and each distance once (the temperature and the margin are
# factors in the same code); the other combinations in the slow tier.
@pytest.mark.parametrize("order,temperature", _params(
    list(itertools.product([1, 2], [0.1, 1.0, 2.0])), [(2, 0.1)], [(1, 2.0), (2, 0.1)]))
def test_nca_order_and_temperature(order, temperature):
    _run("nca", *BATCH_A, (order, temperature), "easy", "hard")
    _run("nca", *BATCH_B, (order, temperature), "easy", "semihard", grad=False)


@pytest.mark.parametrize("positive,negative,distance", _params(
    [(p, n, d) for p, n in [("all", "semihard"), ("easy", "hard"), ("hard", "easy")]
     for d in ["squared_l2", "l2", "cosine"]], [("easy", "hard", "l2")],
    [("all", "semihard", "squared_l2"), ("easy", "hard", "l2"), ("hard", "easy", "cosine")]))
def test_margin_distances(distance, positive, negative):
    want = _run("margin", *BATCH_A, (0.4, distance), positive, negative)
    assert want > 0  # some hinges are active, so the gradient check means something


@pytest.mark.parametrize("order", [1, 2])
def test_nca_without_normalization(order):
    labels, x = BATCH_A
    _run("nca", labels, 0.4 * x, (order, 1.0), "easy", "hard", normalize=False)
    _run("nca", labels, 0.4 * x, (order, 0.5), "all", "semihard", normalize=False)


@pytest.mark.parametrize("distance", ["squared_l2", "l2", "cosine"])
def test_margin_without_normalization(distance):
    labels, x = BATCH_A
    want = _run("margin", labels, 0.5 * x, (1.0, distance), "all", "semihard", normalize=False)
    assert want > 0


def test_raw_scores_differ_from_normalized():
    """normalize=False really uses raw embeddings (scaling a row changes the loss)."""
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    scaled = x * np.linspace(0.5, 2.0, len(x), dtype=np.float32)[:, None]
    raw = tfdml.losses.triplet_nca_loss(labels, scaled, normalize=False)
    normed = tfdml.losses.triplet_nca_loss(labels, scaled)
    want_raw = ref.nca_loss(labels, scaled.astype(np.float64), normalize=False)[0]
    want_normed = ref.nca_loss(labels, x.astype(np.float64))[0]
    np.testing.assert_allclose(to_numpy([raw, normed]), [want_raw, want_normed],
                               atol=VALUE_TOL)
    assert abs(want_raw - want_normed) > 1e-2


# -- reference sets ------------------------------------------------------------------------------

REF_LABELS, REF_X = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)  # R=14, D=5
REF_MINERS = [("easy", "hard", False), ("all", "semihard", False), ("all", "all", False),
              ("random", "semihard", True), ("hard", "random", True)]


def _ref_params(losses, multibackend):
    """Every miner of REF_MINERS with every loss of ``losses``; on every commit each miner
    once and each loss at least once (miner i with loss i mod 3), the rest in the slow tier."""
    cases = [(*loss, *m) for m in REF_MINERS for loss in losses]
    fast = [(*losses[i % len(losses)], *m) for i, m in enumerate(REF_MINERS)]
    return _params(cases, multibackend, fast)


@pytest.mark.parametrize("kind,params,positive,negative,disjoint", _ref_params(
    [("nca", (1, 1.0)), ("nca", (2, 0.5)), ("margin", (0.3, "l2"))],
    [("nca", (2, 0.5), "hard", "random", True)]))
def test_reference_set_with_offset(kind, params, positive, negative, disjoint):
    # The batch is rows 3..8 of the reference set.
    labels, x = REF_LABELS[3:9], REF_X[3:9]
    _run(kind, labels, x, params, positive, negative, disjoint=disjoint,
         ref_set=(REF_X, REF_LABELS, 3))


@pytest.mark.parametrize("kind,params,positive,negative,disjoint", _ref_params(
    [("nca", (2, 2.0)), ("margin", (0.2, "squared_l2")), ("margin", (0.2, "cosine"))],
    [("margin", (0.2, "cosine"), "all", "all", False)]))
def test_reference_set_without_offset(kind, params, positive, negative, disjoint):
    # Anchors outside the reference set; label 100 has no positive there.
    rng = np.random.default_rng(21)
    x = rng.normal(size=(6, 5))
    labels = np.array([1, 4, 7, 100, 1, 16], np.int32)
    _run(kind, labels, x, params, positive, negative, disjoint=disjoint,
         ref_set=(REF_X, REF_LABELS, None))


def test_offset_excludes_only_the_anchor_itself():
    """ref_offset=None with the batch inside the reference set makes each anchor its own
    (perfect) easy positive; ref_offset=3 does not."""
    labels, x = REF_LABELS[3:9], REF_X[3:9].astype(np.float32)
    kwargs = dict(ref_embeddings=REF_X.astype(np.float32), ref_labels=REF_LABELS)
    with_offset = tfdml.losses.triplet_nca_loss(labels, x, ref_offset=3, **kwargs)
    without = tfdml.losses.triplet_nca_loss(labels, x, ref_offset=None, **kwargs)
    r64 = REF_X.astype(np.float32).astype(np.float64)
    x64 = x.astype(np.float64)
    want_with = ref.nca_loss(labels, x64, ref_embeddings=r64, ref_labels=REF_LABELS,
                             ref_offset=3)[0]
    want_without, triplets = ref.nca_loss(labels, x64, ref_embeddings=r64,
                                          ref_labels=REF_LABELS, ref_offset=None)
    assert all(p == a + 3 for a, p, _ in triplets)
    np.testing.assert_allclose(to_numpy([with_offset, without]),
                               [want_with, want_without], atol=VALUE_TOL)
    assert abs(want_with - want_without) > 1e-2


# -- float64 and finite differences ---------------------------------------------------------------

SMALL_LABELS = np.array([2, 5, 2, 5, 2, 9], np.int32)  # B=6, D=4, one singleton


def _small_x():
    return np.random.default_rng(4).normal(size=(6, 4))


FLOAT64_CASES = [
    ("nca", (1, 1.0), "easy", "hard"),
    ("nca", (2, 0.5), "easy", "semihard"),
    ("nca", (2, 1.0), "all", "all"),
    ("margin", (0.25, "squared_l2"), "all", "semihard"),
    ("margin", (0.5, "l2"), "easy", "hard"),
    ("margin", (0.25, "cosine"), "hard", "easy"),
]


# On every commit each loss with single choices and with "all"; float32 checks every order
# and distance (test_nca_order_and_temperature, test_margin_distances).
@pytest.mark.multibackend
@pytest.mark.parametrize("kind,params,positive,negative", _params(
    FLOAT64_CASES, [], [FLOAT64_CASES[i] for i in (0, 2, 3, 5)]))
def test_float64_compute_gradient(kind, params, positive, negative, float64):
    x = _small_x()
    labels = ops.convert_to_tensor(SMALL_LABELS)
    miner = TripletMiner(positive, negative)

    def loss_fn(e):
        if kind == "nca":
            return tfdml.losses.triplet_nca_loss(labels, e, order=params[0],
                                                 temperature=params[1], miner=miner)
        return tfdml.losses.triplet_margin_loss(labels, e, margin=params[0],
                                                distance=params[1], miner=miner)

    value = loss_fn(ops.convert_to_tensor(x))
    assert to_numpy(value).dtype == np.float64  # computed in float64 for float64 input
    common = dict(positive=positive, negative=negative)
    if kind == "nca":
        want = ref.nca_loss(SMALL_LABELS, x, order=params[0], temperature=params[1],
                            **common)[0]
    else:
        want = ref.margin_loss(SMALL_LABELS, x, margin=params[0], distance_kind=params[1],
                               **common)[0]
    assert want > 0
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-12, atol=1e-12)

    theoretical, numerical = gradient_check(loss_fn, x, delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind,param", [("nca", 0.1), ("margin", 0.3)])
def test_float64_hyperparameters_keep_float64_precision(kind, param):
    """In float64 the loss should use the float64 value of the margin and temperature."""
    x = _small_x()
    if kind == "nca":
        value = tfdml.losses.triplet_nca_loss(SMALL_LABELS, x, temperature=param)
        want = ref.nca_loss(SMALL_LABELS, x, temperature=param)[0]
    else:
        value = tfdml.losses.triplet_margin_loss(SMALL_LABELS, x, margin=param)
        want = ref.margin_loss(SMALL_LABELS, x, margin=param)[0]
    assert to_numpy(value).dtype == np.float64 and want > 0
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-12, atol=1e-12)


# -- degenerate batches and label formats --------------------------------------------------------


NO_TRIPLET_LABELS = {"one_class": np.zeros(6, np.int32),
                     "singletons": np.arange(6, dtype=np.int32)}
NO_TRIPLET_LOSSES = {
    "nca": lambda: tfdml.losses.TripletNCALoss(order=2),
    "margin": lambda: tfdml.losses.TripletMarginLoss(),
    "margin_all": lambda: tfdml.losses.TripletMarginLoss(miner=TripletMiner("all", "all")),
}


@pytest.mark.parametrize("loss_name,labels_name", _params(
    list(itertools.product(NO_TRIPLET_LOSSES, NO_TRIPLET_LABELS)), [("margin_all", "singletons")]))
def test_no_triplet_gives_zero(loss_name, labels_name):
    """One class only (no negatives) or all singletons (no positives): 0, zero gradients."""
    labels = NO_TRIPLET_LABELS[labels_name]
    loss = NO_TRIPLET_LOSSES[loss_name]()
    value, grad = value_and_grad(lambda x: loss(labels, x), _small_x().astype(np.float32))
    assert value == 0.0
    assert np.all(grad == 0.0)
    assert ref.nca_loss(labels, _small_x())[0] == 0.0


def test_label_formats():
    """[B, 1] and float labels give the same loss as [B] int labels."""
    labels, x = BATCH_A
    x = ops.convert_to_tensor(np.asarray(x, np.float32))
    loss = tfdml.losses.TripletNCALoss(order=2)
    base = to_numpy(loss(labels, x))
    assert to_numpy(loss(labels[:, None], x)) == base
    assert to_numpy(loss(labels.astype(np.float32)[:, None], x)) == base
    want = ref.nca_loss(labels, to_numpy(x).astype(np.float64), order=2)[0]
    np.testing.assert_allclose(base, want, atol=VALUE_TOL)


def test_random_miner_same_seed_same_loss():
    labels, x = BATCH_A
    x = ops.convert_to_tensor(np.asarray(x, np.float32))
    values = [
        tfdml.losses.TripletNCALoss(miner=TripletMiner("random", "random", seed=5))(labels, x)
        for _ in range(2)
    ]
    assert to_numpy(values[0]) == to_numpy(values[1])


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager values.

    (Not marked multibackend: tests/losses/test_loss_base.py compares jax.jit with eager JAX.)"""
    labels, x = BATCH_A
    x = np.asarray(x, np.float32)
    y = ops.convert_to_tensor(labels)
    losses = [tfdml.losses.TripletNCALoss(order=2),
              tfdml.losses.TripletMarginLoss(distance="l2",
                                             miner=TripletMiner("all", "semihard"))]

    def both(e):
        return ops.stack([loss(y, e) for loss in losses])

    eager = to_numpy(both(x))
    np.testing.assert_allclose(to_numpy(compiled(both)(x)), eager, rtol=1e-5, atol=1e-6)
    assert np.all(eager > 0)
