"""LoOp losses and the HPHN / lifted-structure baselines against NumPy loop references.

The references loop over positive pairs and negative pairs and take the LoOp distance
from a brute-force minimum between the arcs (dense sampling + bounded refinement). The
tests marked ``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    compiled,
    enable_float64,
    gradient_check,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import slow_beyond
from keras import ops

from tfdml.losses import (
    HPHNTripletLoss,
    LiftedStructureLoss,
    LoOpLoss,
    hphn_triplet_loss,
    lifted_structure_loss,
    loop_loss,
)
from tfdml.losses.loop import BASES
from tfdml.losses.loop_pairs import label_pairs

# Classes of 4, 3 (one unpaired), 2, 2 and a singleton; shuffled; B=12 != D=5.
LABELS = ref.make_labels([4, 3, 2, 2, 1], seed=3)
X = np.random.default_rng(11).normal(size=(12, 5))
# Two per class: HPHN and lifted structure coincide.
TWO_LABELS = ref.make_labels([2, 2, 2, 2], seed=4)
TWO_X = np.random.default_rng(12).normal(size=(8, 6))
MB = pytest.mark.multibackend


def _memoized(between):
    """``between`` (a brute-force distance between two arcs or segments) computed once for
    each set of end points."""
    cache = {}

    def once(*ends):
        key = tuple(np.asarray(e, np.float64).tobytes() for e in ends)
        if key not in cache:
            cache[key] = between(*ends)
        return cache[key]

    return once


@pytest.fixture(scope="module", autouse=True)
def _brute_force_once():
    """The brute-force distances between pairs are most of the time of ``ref.loop_losses``
    (about a second a batch), and every base, margin and baseline of a batch asks for the
    same ones: in this module each is computed once."""
    import references.loop as loop_reference

    patch = pytest.MonkeyPatch()
    for name in ("brute_force_arc_distance", "brute_force_segment_distance"):
        patch.setattr(loop_reference, name, _memoized(getattr(loop_reference, name)))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _float64():
    """float64 tensors exist (JAX: ``jax_enable_x64``) in every test of this module."""
    with enable_float64():
        yield


def _f32(x):
    return ops.convert_to_tensor(np.asarray(x, np.float32))


def _value_and_per_anchor(loss, labels, x):
    value = to_numpy(loss(labels, _f32(x)))
    terms = loss.per_anchor(labels, _f32(x))
    return value, to_numpy(terms.total), to_numpy(terms.active)


def _check_against_reference(loss, labels, x, want, per_key):
    value, losses, valid = _value_and_per_anchor(loss, labels, x)
    np.testing.assert_allclose(value, want, rtol=0, atol=2e-5)
    assert sorted(np.flatnonzero(valid).tolist()) == sorted(per_key)
    for key, expected in per_key.items():
        np.testing.assert_allclose(losses[key], expected, rtol=0, atol=2e-5)
    assert np.all(losses[~valid] == 0.0)


# -- pairing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [pytest.param(0, marks=MB), 1, 2, 3, 4])
def test_label_pairs_match_reference(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=int(rng.integers(1, 15))) * 1000 + 7
    first, second, valid = to_numpy(label_pairs(ops.convert_to_tensor(labels)))
    got = sorted((int(a), int(b)) for a, b, v in zip(first, second, valid, strict=True) if v)
    assert got == sorted(ref.label_pairs(labels))
    assert sorted(first.tolist()) == list(range(len(labels)))  # one slot per sample


@MB
def test_label_pairs_need_no_order_and_leave_odd_samples_out():
    labels = np.array([5, 9, 5, 9, 5, 2])
    first, second, valid = to_numpy(label_pairs(labels))
    got = {(int(a), int(b)) for a, b, v in zip(first, second, valid, strict=True) if v}
    assert got == {(0, 2), (1, 3)}  # sample 4 (third 5) and the singleton 2 stay unpaired


@MB
def test_label_pairs_under_xla():
    labels = ops.convert_to_tensor(LABELS)
    eager = to_numpy(label_pairs(labels))
    jit = to_numpy(compiled(label_pairs)(labels))
    for a, b in zip(eager, jit, strict=True):
        np.testing.assert_array_equal(a, b)


# -- parity -------------------------------------------------------------------------------------


def _some_multibackend(names, params, multibackend):
    """``pytest.param``s of ``params`` (tuples) named by ``names(*p)``, those in
    ``multibackend`` also run under every backend."""
    return [pytest.param(*p, id=names(*p), marks=[MB] if p in multibackend else [])
            for p in params]


def _loop_id(base, normalized):
    return f"{base}-{'arcs' if normalized else 'segments'}"


_LOOP_PARAMS = [(b, n) for n in (True, False) for b in BASES]

# The NumPy references take brute-force minima between arcs (about a second a batch, once per
# batch: _brute_force_once): on every commit each base once and each geometry (arcs, segments)
# twice; the other four configurations in the slow tier.
_LOOP_FAST = {"triplet-arcs", "multi_similarity-arcs", "hphn_triplet-segments",
              "lifted_structure-segments"}


@pytest.mark.parametrize("base,normalized", slow_beyond(_some_multibackend(
    _loop_id, _LOOP_PARAMS, {("triplet", True), ("multi_similarity", True),
                             ("hphn_triplet", False), ("lifted_structure", False)}),
    _LOOP_FAST))
def test_loop_loss_matches_reference(base, normalized):
    margin = 0.4 if base == "multi_similarity" else 0.3
    options = {"epsilon": 0.2} if base == "multi_similarity" else {}
    x = X if normalized else X * 0.4
    loss = LoOpLoss(base, margin=margin, normalize=normalized, **options)
    want, per_key = ref.loop_losses(LABELS, x, base, margin, normalized, **options)
    assert per_key, "the test batch must give the loss something to do"
    _check_against_reference(loss, LABELS, x, want, per_key)
    functional = loop_loss(LABELS, _f32(x), base, margin, normalize=normalized, **options)
    np.testing.assert_allclose(to_numpy(functional), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("make,base,normalize", slow_beyond(_some_multibackend(
    lambda make, base, normalize: f"{base}-{normalize}",
    [(make, base, n) for n in (True, False) for make, base in (
        (HPHNTripletLoss, "hphn_triplet"), (LiftedStructureLoss, "lifted_structure"))],
    {(HPHNTripletLoss, "hphn_triplet", True), (LiftedStructureLoss, "lifted_structure", False)}),
    {"hphn_triplet-True", "lifted_structure-False"}))  # each loss and each normalization once
def test_baselines_match_reference(make, base, normalize):
    want, per_key = ref.loop_losses(LABELS, X, base, 0.5, normalize, loop=False)
    assert per_key
    _check_against_reference(make(margin=0.5, normalize=normalize), LABELS, X, want, per_key)
    functional = (hphn_triplet_loss if base == "hphn_triplet" else lifted_structure_loss)(
        LABELS, _f32(X), margin=0.5, normalize=normalize)
    np.testing.assert_allclose(to_numpy(functional), want, rtol=0, atol=2e-5)


def test_hphn_equals_lifted_structure_with_two_per_class():
    for loop in (False, True):
        if loop:
            a, b = LoOpLoss("hphn_triplet", 0.3), LoOpLoss("lifted_structure", 0.3)
        else:
            a, b = HPHNTripletLoss(0.3), LiftedStructureLoss(0.3)
        np.testing.assert_allclose(to_numpy(a(TWO_LABELS, TWO_X)),
                                   to_numpy(b(TWO_LABELS, TWO_X)), rtol=1e-6)
    # ...but not with more samples per class.
    assert not np.isclose(to_numpy(HPHNTripletLoss(0.3)(LABELS, X)),
                          to_numpy(LiftedStructureLoss(0.3)(LABELS, X)))


@pytest.mark.parametrize("base", ["hphn_triplet", "lifted_structure"])
def test_loop_negative_is_at_least_as_hard_as_the_endpoints(base):
    """With every sample paired, the LoOp distance never exceeds the distances between the
    pairs' endpoints, so the LoOp loss is never below its baseline, pair by pair."""
    labels = ref.make_labels([4, 2, 4, 2], seed=9)  # even counts: every sample is paired
    x = np.random.default_rng(13).normal(size=(12, 5))
    plain_loss = LiftedStructureLoss(0.3) if base == "lifted_structure" else HPHNTripletLoss(0.3)
    loop_terms = LoOpLoss(base, 0.3).per_anchor(labels, x)
    plain_terms = plain_loss.per_anchor(labels, x)
    loop, loop_valid = to_numpy(loop_terms.total), to_numpy(loop_terms.active)
    plain, plain_valid = to_numpy(plain_terms.total), to_numpy(plain_terms.active)
    np.testing.assert_array_equal(loop_valid, plain_valid)
    assert np.all(loop >= plain - 1e-6)
    assert np.any(loop > plain + 1e-4)  # and the arcs do find closer negatives


# -- gradients ----------------------------------------------------------------------------------


def _value_and_grad(fn, x):
    """``(value, gradient)`` of ``fn(x)`` as NumPy; under JAX compiled (eager JAX
    differentiates the loss op by op, several times slower than compiling it)."""
    if BACKEND == "jax":
        return to_numpy(value_and_grad_function(fn, jit_compile=True)(x))
    return value_and_grad(fn, x)


# What finite differences check here beyond autodiff of each base's formula is the gradient
# through the solvers (the envelope of the closest points), the same for every base: on every
# commit each geometry once, each with another base (every base's values against the
# references: test_loop_loss_matches_reference; finite gradients for every base:
# test_gradients_finite_on_degenerate_pairs).
@pytest.mark.parametrize("base,normalized", slow_beyond(_some_multibackend(
    _loop_id, _LOOP_PARAMS, {("triplet", True), ("multi_similarity", False)}),
    {"triplet-arcs", "multi_similarity-segments"}))
def test_float64_gradients_match_finite_differences(base, normalized):
    labels = np.array([0, 1, 0, 1, 2, 2, 1, 1])
    x = np.random.default_rng(5).normal(size=(8, 4))
    options = {"epsilon": 0.3} if base == "multi_similarity" else {}
    loss = LoOpLoss(base, margin=0.45, normalize=normalized, dtype="float64", **options)

    def value(e):
        return loss(labels, e)

    theoretical, numerical = gradient_check(value, x)
    assert np.all(np.isfinite(theoretical))
    assert np.abs(theoretical).max() > 0
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("base,normalized", slow_beyond(_some_multibackend(
    _loop_id, _LOOP_PARAMS, {("multi_similarity", True), ("triplet", False)}),
    {"multi_similarity-arcs", "triplet-segments", "hphn_triplet-arcs",
     "lifted_structure-segments"}))  # each base once, each geometry twice
def test_gradients_finite_on_degenerate_pairs(base, normalized):
    """Duplicate pairs (arcs that are points), antipodal pairs, intersecting arcs."""
    e = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0],
                  [0, 0, 1.0], [0, 0, -1.0], [1.0, 0, 0], [0, 1.0, 0]])
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    loss = LoOpLoss(base, normalize=normalized)
    value, grad = _value_and_grad(lambda xt: loss(labels, xt), e.astype(np.float32))
    assert np.isfinite(value) and np.all(np.isfinite(grad)), (base, normalized)


# -- behaviour ----------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [pytest.param(b, marks=MB) if b == "multi_similarity" else b
                                  for b in BASES])
def test_no_positive_pair_gives_zero(base):
    for labels in (np.arange(8), np.zeros(8, int)):  # all singletons; one class
        value, grad = _value_and_grad(lambda x, labels=labels: LoOpLoss(base)(labels, x),
                                      X[:8].astype(np.float32))
        assert value == 0.0
        assert np.all(grad == 0.0)


# The pairs are made from the labels before any base sees them: one base on every commit.
@pytest.mark.parametrize("base", slow_beyond(BASES, {"triplet"}))
def test_shuffled_batch_matches_reference(base):
    """Pairs come from the labels: any batch order works (classes need not be consecutive)."""
    perm = np.random.default_rng(0).permutation(len(LABELS))
    labels, x = LABELS[perm], X[perm]
    want, _ = ref.loop_losses(labels, x, base, LoOpLoss(base).margin)
    np.testing.assert_allclose(to_numpy(LoOpLoss(base)(labels, x)), want, atol=2e-5)


def test_options_and_config():
    loss = LoOpLoss("multi_similarity", margin=0.6, epsilon=-0.02, alpha=3.0, beta=40.0)
    config = loss.get_config()
    assert config["epsilon"] == -0.02 and config["alpha"] == 3.0 and config["normalize"]
    clone = LoOpLoss.from_config(config)
    np.testing.assert_allclose(to_numpy(clone(LABELS, X)), to_numpy(loss(LABELS, X)), rtol=1e-6)
    assert LoOpLoss().margin == 0.2 and LoOpLoss("multi_similarity").margin == 0.5


def test_the_former_name_normalized_is_refused():
    with pytest.raises(ValueError, match="normalized"):
        LoOpLoss("triplet", normalized=False)
    with pytest.raises(ValueError, match="normalized"):
        loop_loss(LABELS, X, "triplet", normalized=False)


@MB
@pytest.mark.parametrize("make,match", [
    (lambda: LoOpLoss("npair"), r"`base`.*Received: base='npair'"),
    (lambda: LoOpLoss("triplet", epsilon=0.1), r"no option\(s\) \['epsilon'\]"),
    (lambda: LoOpLoss("multi_similarity", gamma=1.0), r"no option\(s\) \['gamma'\]"),
    (lambda: LoOpLoss("multi_similarity", alpha=0), r"`alpha`.*Received: alpha=0"),
    (lambda: LoOpLoss("triplet", margin=-0.1), r"`margin`.*Received: margin=-0\.1"),
    (lambda: LoOpLoss()(LABELS, X[:, :, None]), r"`y_pred`"),
    (lambda: LoOpLoss()(LABELS[:5], X), r"`y_true`"),
    (lambda: LoOpLoss().per_anchor(LABELS, X, ref_embeddings=X, ref_labels=LABELS),
     r"no reference set"),
    (lambda: HPHNTripletLoss(margin="0.2"), r"`margin`"),
])
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- the computation: pair layout, envelope gradient ---------------------------------------------


@MB
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_layout_puts_each_label_pair_at_t_and_s_plus_t(seed):
    from tfdml.losses.loop_pairs import pair_layout

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=int(rng.integers(2, 17)))
    perm, valid = to_numpy(pair_layout(ops.convert_to_tensor(labels)))
    half = len(labels) // 2
    assert sorted(perm.tolist()) == list(range(len(labels)))  # a permutation
    assert valid.shape == (half,) and not np.any(valid[1:] & ~valid[:-1])  # valid ones first
    got = sorted((int(perm[t]), int(perm[half + t])) for t in np.flatnonzero(valid))
    assert got == sorted(ref.label_pairs(labels))


@MB
def test_envelope_gradient_is_the_solvers_own():
    """LoOp differentiates the arc solver by the envelope theorem (a few products of the
    optimal points' coefficients): the same value and, up to rounding, the same gradient
    as differentiating the solver itself."""
    from tfdml.geometry import arc_similarity_from_dots
    from tfdml.losses.loop_pairs import _arc_similarity

    rng = np.random.default_rng(21)

    def unit(v):
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    x1, y1 = unit(rng.normal(size=(7, 5))), unit(rng.normal(size=(6, 5)))
    x2 = unit(x1 + rng.uniform(0.2, 1.5, size=(7, 1)) * rng.normal(size=(7, 5)))
    y2 = unit(y1 + rng.uniform(0.2, 1.5, size=(6, 1)) * rng.normal(size=(6, 5)))
    shape = (7, 6)
    dots = np.stack([np.broadcast_to(np.sum(x1 * x2, -1)[:, None], shape),
                     np.broadcast_to(np.sum(y1 * y2, -1)[None, :], shape),
                     x1 @ y1.T, x1 @ y2.T, x2 @ y1.T, x2 @ y2.T])
    weights = ops.convert_to_tensor(rng.uniform(0.5, 1.5, size=shape))

    def total(solve):
        return lambda d: ops.sum(weights * solve(*(d[k] for k in range(6))))

    value, grad = _value_and_grad(total(_arc_similarity), dots)
    want_value, want_grad = _value_and_grad(total(arc_similarity_from_dots), dots)
    assert value == want_value
    assert np.abs(grad).max() > 0.1
    np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)
