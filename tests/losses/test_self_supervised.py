"""BarlowTwinsLoss, SimSiamLoss, BYOLLoss and MoCoLoss against their NumPy references.

Values and gradients in float64 against tests/support/references/self_supervised.py (its
finite differences), on asymmetric unnormalized batches (N != D); the stop-gradient of the
targets (SimSiam, BYOL) and keys (MoCo); functional == class; per-row values and sample
weights; MoCo's queue; config and .keras round trips; non-finite inputs (eager and
compiled); degenerate valid batches; low precision; bad arguments. The contract suite
(tests/losses/test_loss_base.py) runs Barlow Twins as a two-view case; SimSiam, BYOL and
MoCo are exempt there (their ``y_true`` are targets or keys, not class ids) and checked
here only.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    CAN_COMPILE,
    assert_close_grad,
    compiled,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import assert_config_roundtrip, assert_keras_save_load, slow_beyond

from tfdml.losses import (
    BarlowTwinsLoss,
    BYOLLoss,
    KeyQueue,
    MoCoLoss,
    SimSiamLoss,
    barlow_twins_loss,
    byol_loss,
    moco_loss,
    simsiam_loss,
)

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

#: Keras 3.15 reduces a ``keras.losses.Loss`` with ``ops.divide_no_nan``, which under
#: PyTorch promotes float64 with a Python float to float32: the reduced value of SimSiamLoss,
#: BYOLLoss and MoCoLoss with ``dtype="float64"`` is a float32 there (see
#: test_reduced_float64_values_are_float64). Their per-row values are float64 everywhere.
REDUCED_RTOL = 1e-6 if BACKEND == "torch" else 1e-12
GRAD_RTOL = 1e-7


#: One shape for every family's [N, D] arrays (N != D): JAX compiles each primitive once per
#: shape and dtype, so shared shapes keep its eager runs short.
ROWS, DIM = 6, 5


def _pair(seed, n=ROWS, dim=DIM, noise=0.6):
    """Two correlated unnormalized ``[n, dim]`` arrays with uneven column scales."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, dim)) * np.linspace(0.3, 2.0, dim)
    return a, a + noise * rng.normal(size=(n, dim)) * np.linspace(1.5, 0.5, dim)


def _check_grad(got, fun, x, rtol=GRAD_RTOL):
    assert_close_grad(got, reference_gradient(fun, x), rtol)


_COMPILED = {}


def _compiled_once(key, make):
    """``compiled(make())``, made once per key: the non-finite tests call it on many inputs
    of one shape, and XLA compiles it once."""
    if key not in _COMPILED:
        _COMPILED[key] = compiled(make())
    return _COMPILED[key]


# ==============================================================================================
# Barlow Twins
# ==============================================================================================

ZA, ZB = _pair(0)  # N = 6 samples, D = 5
BARLOW_STACKED = np.concatenate([ZA, ZB])
BARLOW_N = len(ZA)


@pytest.mark.parametrize("args", [(), (0.02, 1e-3), (0.0, 0.5)])
def test_barlow_values_and_gradients_match_the_reference(args):
    loss = BarlowTwinsLoss(*args, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), BARLOW_STACKED)

    def want(e):
        return ref.barlow_twins_loss(e[:BARLOW_N], e[BARLOW_N:], *args)

    np.testing.assert_allclose(value, want(BARLOW_STACKED), rtol=1e-12)
    _check_grad(grad, want, BARLOW_STACKED)
    # The functional form, the two views apart.
    value, (grad_a, grad_b) = value_and_grad(lambda a, b: barlow_twins_loss(a, b, *args), ZA, ZB,
                                             argnums=(0, 1))
    np.testing.assert_allclose(value, want(BARLOW_STACKED), rtol=1e-12)
    np.testing.assert_allclose(np.concatenate([grad_a, grad_b]), grad, rtol=1e-10, atol=1e-12)


def test_barlow_reference_is_the_normalized_cross_correlation_of_the_paper():
    """With eps -> 0 the standardized columns give the paper's eq. (2): C_ij is the cosine of
    the centred columns i of Za and j of Zb."""
    c = ref.barlow_cross_correlation(ZA, ZB, eps=1e-300)
    a, b = ZA - ZA.mean(0), ZB - ZB.mean(0)
    paper = a.T @ b / np.outer(np.linalg.norm(a, axis=0), np.linalg.norm(b, axis=0))
    np.testing.assert_allclose(c, paper, rtol=1e-12)


def test_barlow_functional_equals_class_and_ignores_labels():
    want = to_numpy(barlow_twins_loss(ZA, ZB, 0.01, 1e-4))
    assert want.dtype == np.float64
    for labels in (None, np.zeros(2 * BARLOW_N, np.int64), np.arange(BARLOW_N)):
        got = to_numpy(BarlowTwinsLoss(0.01, 1e-4, dtype="float64")(labels, BARLOW_STACKED))
        np.testing.assert_allclose(got, want, rtol=1e-14)


def test_barlow_batch_of_one_pair_is_d_with_zero_gradient():
    """N = 1: every column standardizes to 0, C = 0 and L = D; nothing trains."""
    y = np.array([[0.3, -1.0, 2.0, 0.5, 0.0], [0.5, -0.5, 1.0, -2.0, 7.0]])
    value, grad = value_and_grad(lambda e: BarlowTwinsLoss(dtype="float64")(None, e), y)
    assert value == 5.0 == ref.barlow_twins_loss(y[:1], y[1:])
    np.testing.assert_array_equal(grad, np.zeros_like(y))


@pytest.mark.parametrize("kind", ["identical_views", "constant_column", "zero_batch"])
def test_barlow_degenerate_batches_are_finite(kind):
    if kind == "identical_views":
        y = np.concatenate([ZA, ZA])
    elif kind == "constant_column":
        y = BARLOW_STACKED.copy()
        y[:BARLOW_N, 2] = 1.5  # a constant column in the first view
    else:
        y = np.zeros((ROWS, DIM))

    def want(e):
        return ref.barlow_twins_loss(e[:len(e) // 2], e[len(e) // 2:])

    value, grad = value_and_grad(lambda e: BarlowTwinsLoss(dtype="float64")(None, e), y)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(value, want(y), rtol=1e-12)
    _check_grad(grad, want, y, rtol=1e-6)
    if kind == "identical_views":  # C_ii = Var / (Var + eps): only the off-diagonal terms
        on_diagonal = to_numpy(BarlowTwinsLoss(lambda_=0.0, dtype="float64")(None, y))
        assert 0 < on_diagonal < 1e-5


# On every commit each view and each bad value once; the other pairs in the slow tier.
@pytest.mark.parametrize("row,bad", slow_beyond(
    [pytest.param(row, bad, id=f"{view}-{bad}") for bad in (np.nan, np.inf, -np.inf, 1e200)
     for view, row in (("view1", 2), ("view2", BARLOW_N + 4))],
    {"view1-nan", "view2-inf", "view1--inf", "view2-1e+200"}))
def test_barlow_nonfinite_embeddings_give_nan(bad, row):
    y = BARLOW_STACKED.copy()
    y[row, 1] = bad
    assert np.isnan(to_numpy(BarlowTwinsLoss(dtype="float64")(None, y)))
    assert np.isnan(to_numpy(barlow_twins_loss(y[:BARLOW_N], y[BARLOW_N:])))
    with np.errstate(over="ignore"):
        f32 = y.astype(np.float32)
    barlow = _compiled_once("barlow", lambda: lambda e: BarlowTwinsLoss()(None, e))
    assert np.isnan(to_numpy(barlow(f32)))


def test_barlow_compiled_equals_eager():
    y = BARLOW_STACKED.astype(np.float32)
    value, grad = to_numpy(value_and_grad_function(lambda e: BarlowTwinsLoss()(None, e),
                                                   jit_compile=True)(y))
    want, want_grad = value_and_grad(lambda e: BarlowTwinsLoss()(None, e), y)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_barlow_low_precision_inputs_are_computed_in_float32(dtype):
    y = keras.ops.cast(BARLOW_STACKED, dtype)
    as_float = to_numpy(keras.ops.cast(y, "float64"))
    want = ref.barlow_twins_loss(as_float[:BARLOW_N], as_float[BARLOW_N:])
    value = BarlowTwinsLoss()(None, y)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-4)
    low = barlow_twins_loss(y[:BARLOW_N], y[BARLOW_N:])
    assert keras.backend.standardize_dtype(low.dtype) == dtype
    np.testing.assert_allclose(to_numpy(keras.ops.cast(low, "float64")), want, rtol=1e-2)


def test_barlow_odd_rows_and_mismatched_views_are_value_errors():
    with pytest.raises(ValueError, match="two views"):
        BarlowTwinsLoss()(None, BARLOW_STACKED[:-1])
    with pytest.raises(ValueError, match="same shape"):
        barlow_twins_loss(ZA, ZB[:-1])
    with pytest.raises(ValueError, match="same shape"):
        barlow_twins_loss(ZA, ZB[:, :-1])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a dynamic batch size: TensorFlow graphs")
def test_barlow_odd_rows_are_nan_in_a_graph_with_a_dynamic_batch():
    import tensorflow as tf

    fn = tf.function(lambda e: BarlowTwinsLoss()(None, e),
                     input_signature=[tf.TensorSpec([None, ZA.shape[1]], tf.float32)])
    assert np.isnan(fn(BARLOW_STACKED[:-1].astype(np.float32)).numpy())
    np.testing.assert_allclose(fn(BARLOW_STACKED.astype(np.float32)).numpy(),
                               ref.barlow_twins_loss(ZA, ZB), rtol=1e-5)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_barlow_config_round_trips(dtype):
    loss = BarlowTwinsLoss(0.01, 1e-4, name="bt", dtype=dtype)
    clone = assert_config_roundtrip(loss)
    assert clone.arguments == {"lambda_": 0.01, "eps": 1e-4} and clone.name == "bt"
    assert clone.dtype == (dtype or keras.config.floatx())
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(restored, BarlowTwinsLoss) and restored.dtype == clone.dtype
    np.testing.assert_allclose(to_numpy(clone(None, BARLOW_STACKED)),
                               to_numpy(loss(None, BARLOW_STACKED)), rtol=1e-12)


def test_barlow_keras_round_trip(tmp_path):
    features = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    assert_keras_save_load(BarlowTwinsLoss(0.01), tmp_path, np.zeros(8, np.int64), features)


@pytest.mark.parametrize("make,match", [
    (lambda: BarlowTwinsLoss(lambda_=-1.0), "lambda_"),
    (lambda: BarlowTwinsLoss(lambda_=float("nan")), "lambda_"),
    (lambda: BarlowTwinsLoss(lambda_="0.1"), "lambda_"),
    (lambda: BarlowTwinsLoss(eps=0.0), "eps"),
    (lambda: BarlowTwinsLoss(eps=-1e-5), "eps"),
    (lambda: barlow_twins_loss(ZA, ZB, lambda_=-0.1), "lambda_"),
    (lambda: barlow_twins_loss(ZA, ZB, eps=0.0), "eps"),
    (lambda: barlow_twins_loss(ZA[0], ZB[0]), "za"),
    (lambda: BarlowTwinsLoss()(None, BARLOW_STACKED, sample_weight=np.ones(2 * BARLOW_N)),
     "sample_weight"),
    (lambda: BarlowTwinsLoss()(None, BARLOW_STACKED[0]), "y_pred"),
    (lambda: BarlowTwinsLoss()(None, np.zeros((4, 3), np.int32)), "y_pred"),
])
def test_barlow_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ==============================================================================================
# SimSiam and BYOL: predictions against stopped targets, row by row
# ==============================================================================================

P, Z = _pair(1)  # M = 6 rows, D = 5: predictions P, targets Z
M = len(P)


class TargetCase:
    """A loss of predictions against targets: its class, functional form and reference."""

    def __init__(self, name, make, functional, values):
        self.name, self.make, self.functional, self.values = name, make, functional, values

    def __repr__(self):
        return self.name


def _simsiam_case(projection):
    return TargetCase(
        f"simsiam_{projection}",
        lambda **kw: SimSiamLoss(projection, **kw),
        lambda p, z: simsiam_loss(p, z, projection),
        lambda p, z: ref.simsiam_values(p, z, projection))


TARGET_CASES = [*(_simsiam_case(t) for t in ref.SIMSIAM_PROJECTIONS),
                TargetCase("byol", lambda **kw: BYOLLoss(**kw), byol_loss, ref.byol_values)]
TARGET_IDS = [case.name for case in TARGET_CASES]


@pytest.mark.parametrize("case", TARGET_CASES, ids=TARGET_IDS)
def test_target_losses_values_and_gradients_match_the_reference(case):
    rtol, grad_rtol = 1e-12, GRAD_RTOL
    want_rows = case.values(P, Z)
    # Per row: reduction="none"; the gradient is that of the sum of the rows.
    loss = case.make(reduction="none", dtype="float64")
    rows, (grad_z, grad_p) = value_and_grad(lambda z, p: loss(z, p), Z, P, argnums=(0, 1))
    assert rows.shape == (M,) and rows.dtype == np.float64
    np.testing.assert_allclose(rows, want_rows, rtol=rtol)
    _check_grad(grad_p, lambda p: float(np.sum(case.values(p, Z))), P, grad_rtol)
    np.testing.assert_array_equal(grad_z, np.zeros_like(Z))  # the stop-gradient
    # The functional form: the mean over the rows.
    value, (grad_p, grad_z) = value_and_grad(case.functional, P, Z, argnums=(0, 1))
    assert value.dtype == np.float64
    np.testing.assert_allclose(value, np.mean(want_rows), rtol=rtol)
    _check_grad(grad_p, lambda p: float(np.mean(case.values(p, Z))), P, grad_rtol)
    np.testing.assert_array_equal(grad_z, np.zeros_like(Z))
    # The class, reduced by its default (the mean): the functional form's value.
    value = to_numpy(case.make(dtype="float64")(Z, P))
    np.testing.assert_allclose(value, np.mean(want_rows), rtol=max(rtol, REDUCED_RTOL))


@pytest.mark.parametrize("case", TARGET_CASES, ids=TARGET_IDS)
def test_target_losses_reductions_and_sample_weights(case):
    rtol = REDUCED_RTOL
    rows = case.values(P, Z)
    weights = np.linspace(0.0, 2.0, M)
    loss = case.make(dtype="float64")
    # Keras' "sum_over_batch_size": the weighted sum over the number of rows.
    np.testing.assert_allclose(to_numpy(loss(Z, P, sample_weight=weights)),
                               np.sum(weights * rows) / M, rtol=rtol)
    np.testing.assert_allclose(to_numpy(case.make(reduction="sum", dtype="float64")(Z, P)),
                               np.sum(rows), rtol=rtol)
    none = to_numpy(case.make(reduction="none", dtype="float64")(Z, P, sample_weight=weights))
    np.testing.assert_allclose(none, weights * rows,
                               rtol=1e-12)
    # The symmetric loss of two views: one call on stacked rows, the mean of the directions.
    p2, z2 = _pair(2)
    symmetric = to_numpy(loss(np.concatenate([z2, Z]), np.concatenate([P, p2])))
    np.testing.assert_allclose(symmetric, (np.mean(case.values(P, z2))
                                           + np.mean(case.values(p2, Z))) / 2, rtol=rtol)


def test_simsiam_projections_differ_as_documented():
    cos = np.array([ref.cosine(p, z) for p, z in zip(P, Z, strict=True)])
    negative, distance, angular = (to_numpy(SimSiamLoss(t, reduction="none", dtype="float64")(Z, P))
                                   for t in ref.SIMSIAM_PROJECTIONS)
    np.testing.assert_allclose(negative, -cos, rtol=1e-12)
    np.testing.assert_allclose(distance, 1.0 - cos, rtol=1e-12)
    np.testing.assert_allclose(np.cos(np.pi * angular), cos, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(BYOLLoss(reduction="none", dtype="float64")(Z, P)),
                               np.sum((ref.l2_normalize(P) - ref.l2_normalize(Z)) ** 2, axis=1),
                               rtol=1e-12)


@pytest.mark.parametrize("case", TARGET_CASES, ids=TARGET_IDS)
def test_target_losses_zero_rows_have_cosine_zero(case):
    p, z = P.copy(), Z.copy()
    p[1] = 0.0  # a zero prediction
    z[3] = 0.0  # a zero target
    loss = case.make(reduction="none", dtype="float64")
    rows, grad = value_and_grad(lambda zz, pp: loss(zz, pp), z, p, argnums=1)
    zero = case.values(np.ones((1, DIM)), np.zeros((1, DIM)))[0]  # the value at cos 0
    assert rows[1] == rows[3] == zero
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[[1, 3]], 0.0)  # cos = 0 whatever the prediction
    rtol = 1e-12
    np.testing.assert_allclose(rows, case.values(p, z), rtol=rtol)


PARALLEL_CASES = [
    pytest.param(case, dtype, id=f"{case.name}-{dtype}")
    for case in TARGET_CASES for dtype in ("float32", "float64")]


@pytest.mark.parametrize("case,dtype", PARALLEL_CASES)
def test_target_losses_parallel_rows_are_finite(case, dtype):
    """p = z (the optimum) and p = -z: cosine +-1, where arccos has an infinite slope."""
    p = P.astype(dtype)
    for z, cos in ((p, 1.0), (-3.0 * p, -1.0)):
        rows, grad = value_and_grad(
            lambda zz, pp: case.make(reduction="none", dtype=dtype)(zz, pp), z, p, argnums=1)
        assert np.all(np.isfinite(rows)) and np.all(np.isfinite(grad)), (cos, rows, grad)
        want = case.values(np.ones((1, 1)), np.full((1, 1), cos))[0]
        np.testing.assert_allclose(rows, want, atol=1e-3 if dtype == "float32" else 1e-7)
        # At the optimum (and at the opposite point) the gradient vanishes.
        np.testing.assert_allclose(grad, 0.0, atol=1e-3 if dtype == "float32" else 1e-7)


def test_simsiam_angular_distance_is_computed_in_float64():
    # An angle of about 1e-5: 1 - cos = 5e-11, 1.0 in float32.
    p, z = P[:1], P[:1] + 1e-5 * np.linalg.norm(P[0]) * np.eye(1, DIM, 1)
    value = to_numpy(simsiam_loss(p, z, "angular_distance"))
    want = ref.simsiam_values(p, z, "angular_distance")[0]
    assert 1e-6 < want < 1e-5
    np.testing.assert_allclose(value, want, rtol=1e-4)


# On every commit: each loss with a NaN prediction, and each of NaN, Inf and -Inf in the
# targets or predictions of some loss; the other combinations in the slow tier.
@pytest.mark.parametrize("case,where,bad", slow_beyond(
    [pytest.param(case, where, bad, id=f"{case.name}-{where}-{bad}")
     for bad in (np.nan, np.inf, -np.inf) for where in ("predictions", "targets")
     for case in TARGET_CASES],
    {*(f"{name}-predictions-nan" for name in TARGET_IDS), "byol-targets-inf",
     "simsiam_angular_distance-targets--inf", "simsiam_cosine_distance-targets-nan",
     "simsiam_negative_cosine_sim-predictions--inf"}))
def test_target_losses_nonfinite_inputs_give_nan(case, where, bad):
    p, z = P.copy(), Z.copy()
    (p if where == "predictions" else z)[2, 1] = bad
    assert np.isnan(to_numpy(case.make(dtype="float64")(z, p)))
    assert np.isnan(to_numpy(case.functional(p, z)))
    step = _compiled_once(case.name, lambda: lambda zz, pp: case.make()(zz, pp))
    assert np.isnan(to_numpy(step(z.astype(np.float32), p.astype(np.float32))))


@pytest.mark.parametrize("case", TARGET_CASES[::2] + TARGET_CASES[-1:],
                         ids=TARGET_IDS[::2] + TARGET_IDS[-1:])
def test_target_losses_compiled_equal_eager(case):
    p, z = P.astype(np.float32), Z.astype(np.float32)
    step = value_and_grad_function(lambda zz, pp: case.make()(zz, pp), argnums=1,
                                   jit_compile=True)
    value, grad = to_numpy(step(z, p))
    want, want_grad = value_and_grad(lambda zz, pp: case.make()(zz, pp), z, p, argnums=1)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", TARGET_CASES, ids=TARGET_IDS)
def test_target_losses_low_precision_inputs_are_computed_in_float32(case, dtype):
    p, z = keras.ops.cast(P, dtype), keras.ops.cast(Z, dtype)
    want = np.mean(case.values(to_numpy(keras.ops.cast(p, "float64")),
                               to_numpy(keras.ops.cast(z, "float64"))))
    value = case.make()(z, p)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-5)
    low = case.functional(p, z)
    assert keras.backend.standardize_dtype(low.dtype) == dtype
    np.testing.assert_allclose(to_numpy(keras.ops.cast(low, "float64")), want, rtol=1e-2)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_target_losses_config_round_trips(dtype):
    for loss, attrs in (
            (SimSiamLoss("angular_distance", reduction="sum", name="ss", dtype=dtype),
             {"projection_type": "angular_distance"}),
            (SimSiamLoss(dtype=dtype), {"projection_type": "negative_cosine_sim"}),
            (BYOLLoss(reduction="none", name="b", dtype=dtype), {})):
        clone = assert_config_roundtrip(loss)
        assert clone.name == loss.name and clone.reduction == loss.reduction
        assert clone.dtype == (dtype or keras.config.floatx())
        for key, value in attrs.items():
            assert getattr(clone, key) == value
        restored = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(loss))
        assert type(restored) is type(loss) and restored.dtype == clone.dtype
        np.testing.assert_allclose(to_numpy(clone(Z, P)), to_numpy(loss(Z, P)), rtol=1e-12)


def test_target_losses_keras_round_trips(tmp_path):
    rng = np.random.default_rng(3)
    features = rng.normal(size=(8, 6)).astype(np.float32)
    targets = rng.normal(size=(8, 4)).astype(np.float32)  # the model's outputs are [8, 4]
    assert_keras_save_load(SimSiamLoss("cosine_distance"), tmp_path, targets, features)
    assert_keras_save_load(BYOLLoss(), tmp_path, targets, features)


@pytest.mark.parametrize("make,match", [
    (lambda: SimSiamLoss("cosine"), "projection_type"),
    (lambda: SimSiamLoss(projection_type=None), "projection_type"),
    (lambda: simsiam_loss(P, Z, "negative_cosine"), "projection_type"),
    (lambda: SimSiamLoss()(Z[:-1], P), "same shape"),
    (lambda: simsiam_loss(P, Z[:, :-1]), "same shape"),
    (lambda: BYOLLoss()(Z, P[:-1]), "same shape"),
    (lambda: byol_loss(P, Z[:-2]), "same shape"),
    (lambda: SimSiamLoss()(Z[0], P[0]), "y_pred"),
])
def test_target_losses_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.xfail(BACKEND == "torch", strict=True,
                   reason="Keras 3.15 under PyTorch: a Loss's reduction (ops.divide_no_nan) "
                          "returns float32 for float64 values")
@pytest.mark.parametrize("make", [lambda: SimSiamLoss(dtype="float64"),
                                  lambda: BYOLLoss(dtype="float64"),
                                  lambda: MoCoLoss(queue_size=0, dtype="float64")],
                         ids=["simsiam", "byol", "moco"])
def test_reduced_float64_values_are_float64(make):
    loss = make()
    value = loss(np.concatenate([Z, P]), np.concatenate([P, Z]))
    assert keras.backend.standardize_dtype(value.dtype) == "float64"


# ==============================================================================================
# MoCo: queries against the momentum encoder's keys
# ==============================================================================================

HALF = ROWS // 2  # N = 3 samples (2N = 6 queries), D = 5
Q, K = _pair(4)  # queries [view1; view2], keys [view1; view2]
QUEUE = np.random.default_rng(5).normal(size=(10, DIM)) * 3.0  # unnormalized past keys


def _moco_batch(seed):
    return _pair(seed)


@pytest.mark.parametrize("temperature", [0.2, 1.0])
@pytest.mark.parametrize("queue", [False, True], ids=["v3", "queue"])
def test_moco_values_and_gradients_match_the_reference(queue, temperature):
    past = QUEUE if queue else None
    want_rows = ref.moco_values(Q, K, past, temperature)
    # The functional form: the mean over the 2N queries; no gradient w.r.t. the keys or queue.
    argnums = (0, 1, 2) if queue else (0, 1)
    value, grads = value_and_grad(
        lambda q, k, *rest: moco_loss(q, k, rest[0] if rest else None, temperature),
        Q, K, *([past] if queue else []), argnums=argnums)
    assert value.dtype == np.float64
    np.testing.assert_allclose(value, np.mean(want_rows), rtol=1e-12)
    _check_grad(grads[0], lambda q: ref.moco_loss(q, K, past, temperature), Q)
    for g, x in zip(grads[1:], (K, past), strict=False):
        np.testing.assert_array_equal(g, np.zeros_like(x))
    # The class, per query: the queue is its state, read before this call writes into it.
    loss = MoCoLoss(temperature, queue_size=10 if queue else 0, seed=0, embedding_dim=DIM,
                    reduction="none", dtype="float64")
    if queue:
        loss.state.keys.assign(QUEUE.astype(np.float32))
        past = QUEUE.astype(np.float32).astype(np.float64)
        want_rows = ref.moco_values(Q, K, past, temperature)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX: the queue of a traced call, owned by no model
        rows, (grad_k, grad_q) = value_and_grad(lambda k, q: loss(k, q, training=False), K, Q,
                                                argnums=(0, 1))
    assert rows.shape == (2 * HALF,)
    np.testing.assert_allclose(rows, want_rows, rtol=1e-12)
    _check_grad(grad_q, lambda q: float(np.sum(ref.moco_values(q, K, past, temperature))), Q)
    np.testing.assert_array_equal(grad_k, np.zeros_like(K))


def test_moco_reference_is_the_cross_entropy_of_the_papers():
    """Vectorized: logits [q . k+, q . k-] / T, label 0 (MoCo's pseudocode)."""
    q, k = ref.l2_normalize(Q), ref.l2_normalize(K)
    positives = np.concatenate([k[HALF:], k[:HALF]])
    negatives = ref.l2_normalize(QUEUE)
    logits = np.concatenate([np.sum(q * positives, 1, keepdims=True), q @ negatives.T], 1) / 0.2
    ce = np.log(np.sum(np.exp(logits), 1)) - logits[:, 0]
    np.testing.assert_allclose(ref.moco_values(Q, K, QUEUE, 0.2), ce, rtol=1e-12)
    # v3: the other view's keys of the batch, the positive on the diagonal.
    got = ref.moco_values(Q, K, None, 1.0)
    for rows, q_view, k_view in ((slice(0, HALF), q[:HALF], k[HALF:]),
                                 (slice(HALF, None), q[HALF:], k[:HALF])):
        logits = q_view @ k_view.T
        np.testing.assert_allclose(got[rows], np.log(np.sum(np.exp(logits), 1))
                                   - np.diag(logits), rtol=1e-12)


def test_moco_functional_equals_class_and_sample_weights():
    for temperature in (0.2, 0.7):
        want = to_numpy(moco_loss(Q, K, temperature=temperature))
        got = to_numpy(MoCoLoss(temperature, queue_size=0, dtype="float64")(K, Q))
        np.testing.assert_allclose(got, want, rtol=REDUCED_RTOL)
    rows = ref.moco_values(Q, K, None, 0.2)
    weights = np.linspace(0.0, 2.0, 2 * HALF)
    np.testing.assert_allclose(
        to_numpy(MoCoLoss(queue_size=0, dtype="float64")(K, Q, sample_weight=weights)),
        np.sum(weights * rows) / (2 * HALF), rtol=REDUCED_RTOL)
    np.testing.assert_allclose(
        to_numpy(MoCoLoss(queue_size=0, reduction="none", dtype="float64")(
            K, Q, sample_weight=weights)), weights * rows, rtol=1e-12)
    np.testing.assert_allclose(
        to_numpy(MoCoLoss(queue_size=0, reduction="sum", dtype="float64")(K, Q)),
        np.sum(rows), rtol=REDUCED_RTOL)


def test_moco_queue_writes_the_keys_and_wraps_around():
    loss = MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM, reduction="none", dtype="float64")
    assert isinstance(loss.state, KeyQueue) and loss.state.built
    initial = to_numpy(loss.state.keys).astype(np.float64)
    assert to_numpy(loss.state.position) == 0
    q1, k1 = _moco_batch(10)
    q2, k2 = _moco_batch(11)
    q3, k3 = _moco_batch(12)
    # First call: its value uses the initial queue; then its 6 keys go to rows 0..5.
    rows = to_numpy(loss(k1, q1, training=True))
    np.testing.assert_allclose(rows, ref.moco_values(q1, k1, initial), rtol=1e-12)
    after1 = to_numpy(loss.state.keys).astype(np.float64)
    np.testing.assert_allclose(after1[:6], ref.l2_normalize(k1), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(after1[6:], initial[6:])
    assert to_numpy(loss.state.position) == 6
    # Second call: the queue of the first; 6 keys to rows 6..9, then 0..1 (wrapping).
    rows = to_numpy(loss(k2, q2))  # training=True by default
    np.testing.assert_allclose(rows, ref.moco_values(q2, k2, after1), rtol=1e-12)
    after2 = to_numpy(loss.state.keys).astype(np.float64)
    normalized = ref.l2_normalize(k2)
    np.testing.assert_allclose(after2[6:], normalized[:4], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(after2[:2], normalized[4:], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(after2[2:6], after1[2:6])
    assert to_numpy(loss.state.position) == 2
    # training=False: the queue is read, not written.
    rows = to_numpy(loss(k3, q3, training=False))
    np.testing.assert_allclose(rows, ref.moco_values(q3, k3, after2), rtol=1e-12)
    np.testing.assert_array_equal(to_numpy(loss.state.keys), after2.astype(np.float32))
    assert to_numpy(loss.state.position) == 2


def test_moco_queue_is_built_on_first_call_and_takes_a_batch_at_most():
    loss = MoCoLoss(queue_size=6, seed=1)
    assert not loss.state.built
    loss(K.astype(np.float32), Q.astype(np.float32))  # 2N = 6 keys: as many as it holds
    assert tuple(loss.state.keys.shape) == (6, DIM)
    assert to_numpy(loss.state.position) == 0  # wrapped around exactly
    np.testing.assert_allclose(to_numpy(loss.state.keys), ref.l2_normalize(K), rtol=1e-6,
                               atol=1e-7)
    with pytest.raises(ValueError, match="queue_size"):
        MoCoLoss(queue_size=4, embedding_dim=DIM)(K, Q)


def test_moco_without_queue_has_no_state():
    loss = MoCoLoss(queue_size=0, embedding_dim=DIM)
    assert loss.state is None and loss.build_state(DIM) is None
    loss(K, Q, training=True)  # nothing to write
    assert loss.state is None


def test_moco_initial_queue_is_unit_vectors_from_the_seed():
    keys = to_numpy(MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM).state.keys)
    assert keys.shape == (10, DIM) and keys.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(keys, axis=1), 1.0, rtol=1e-6)
    assert np.unique(keys, axis=0).shape[0] == 10
    same = to_numpy(MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM).state.keys)
    np.testing.assert_array_equal(keys, same)
    other = to_numpy(MoCoLoss(queue_size=10, seed=1, embedding_dim=DIM).state.keys)
    assert not np.allclose(keys, other)


@pytest.mark.skipif(not CAN_COMPILE, reason="PyTorch runs `compiled` eagerly")
def test_moco_queue_cannot_be_created_inside_a_compiled_step():
    loss = MoCoLoss(queue_size=8)
    with pytest.raises(ValueError, match="compiled"):
        compiled(lambda k, q: loss(k, q, training=False))(K.astype(np.float32),
                                                          Q.astype(np.float32))


def test_moco_a_batch_with_a_nonfinite_key_is_not_written_into_the_queue():
    """The NaN batch's loss is NaN; the queue keeps its keys and position, so the next
    finite batch's loss is finite."""
    loss = MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM, dtype="float64")
    before = to_numpy(loss.state.keys).copy()
    k = K.copy()
    k[1, 2] = np.nan
    assert np.isnan(to_numpy(loss(k, Q)))
    np.testing.assert_array_equal(to_numpy(loss.state.keys), before)
    assert int(to_numpy(loss.state.position)) == 0
    assert np.isfinite(to_numpy(loss(K, Q)))
    assert int(to_numpy(loss.state.position)) == len(K) % 10


# On every commit each place and each of NaN, Inf and -Inf once; the other combinations in
# the slow tier.
@pytest.mark.parametrize("where,bad", slow_beyond(
    [pytest.param(where, bad, id=f"{where}-{bad}") for bad in (np.nan, np.inf, -np.inf)
     for where in ("queries_view1", "queries_view2", "keys_view1", "keys_view2")],
    {"queries_view1-nan", "queries_view2-inf", "keys_view1--inf", "keys_view2-nan"}))
def test_moco_nonfinite_inputs_give_nan(where, bad):
    q, k = Q.copy(), K.copy()
    (q if where.startswith("queries") else k)[1 if where.endswith("1") else HALF + 1, 2] = bad
    assert np.isnan(to_numpy(moco_loss(q, k)))
    assert np.isnan(to_numpy(moco_loss(q, k, QUEUE)))
    assert np.isnan(to_numpy(MoCoLoss(queue_size=0, dtype="float64")(k, q)))
    queued = MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM, dtype="float64")
    assert np.isnan(to_numpy(queued(k, q, training=False)))
    q32, k32 = q.astype(np.float32), k.astype(np.float32)
    v3 = _compiled_once("moco_v3", lambda: lambda kk, qq: MoCoLoss(queue_size=0)(kk, qq))
    assert np.isnan(to_numpy(v3(k32, q32)))

    def make_queued():
        queued = MoCoLoss(queue_size=10, seed=0, embedding_dim=DIM)
        return lambda kk, qq: queued(kk, qq, training=False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX: "a memory bank that a compiled step does not update"
        value = _compiled_once("moco_queue", make_queued)(k32, q32)
    assert np.isnan(to_numpy(value))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_moco_nonfinite_queue_gives_nan(bad):
    queue = QUEUE.copy()
    queue[4, 0] = bad
    assert np.isnan(to_numpy(moco_loss(Q, K, queue)))


def test_moco_zero_query_is_finite():
    q = Q.copy()
    q[2] = 0.0
    value, grad = value_and_grad(lambda qq: moco_loss(qq, K, QUEUE), q)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(value, ref.moco_loss(q, K, QUEUE), rtol=1e-12)
    np.testing.assert_array_equal(grad[2], 0.0)


@pytest.mark.parametrize("queue", [False, True], ids=["v3", "queue"])
def test_moco_compiled_equals_eager(queue):
    loss = MoCoLoss(queue_size=10 if queue else 0, seed=0, embedding_dim=DIM)
    q, k = Q.astype(np.float32), K.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX: the unowned queue of a compiled step
        step = value_and_grad_function(lambda kk, qq: loss(kk, qq, training=False), argnums=1,
                                       jit_compile=True)
        value, grad = to_numpy(step(k, q))
    want, want_grad = value_and_grad(lambda kk, qq: loss(kk, qq, training=False), k, q,
                                     argnums=1)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a dynamic batch size: TensorFlow graphs")
def test_moco_odd_rows_are_nan_in_a_graph_with_a_dynamic_batch():
    import tensorflow as tf

    spec = tf.TensorSpec([None, DIM], tf.float32)
    fn = tf.function(lambda k, q: MoCoLoss(queue_size=0)(k, q), input_signature=[spec, spec])
    q, k = Q.astype(np.float32), K.astype(np.float32)
    assert np.isnan(fn(k[:-1], q[:-1]).numpy())
    np.testing.assert_allclose(fn(k, q).numpy(), ref.moco_loss(Q, K), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("queue", [False, True], ids=["v3", "queue"])
def test_moco_low_precision_inputs_are_computed_in_float32(queue, dtype):
    q, k = keras.ops.cast(Q, dtype), keras.ops.cast(K, dtype)
    as_float = [to_numpy(keras.ops.cast(x, "float64")) for x in (q, k)]
    past = QUEUE if queue else None
    want = ref.moco_loss(*as_float, past)
    loss = MoCoLoss(queue_size=10 if queue else 0, seed=0, embedding_dim=DIM)
    if queue:
        loss.state.keys.assign(QUEUE.astype(np.float32))
    value = loss(k, q, training=False)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-5)
    low = moco_loss(q, k, None if past is None else keras.ops.cast(past, dtype))
    assert keras.backend.standardize_dtype(low.dtype) == dtype
    np.testing.assert_allclose(to_numpy(keras.ops.cast(low, "float64")), want, rtol=1e-2)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_moco_config_round_trips(dtype):
    for loss in (MoCoLoss(0.5, queue_size=10, embedding_dim=DIM, seed=3, reduction="sum",
                          name="mc", dtype=dtype),
                 MoCoLoss(1.0, queue_size=0, dtype=dtype),
                 MoCoLoss(queue_size=32)):
        clone = assert_config_roundtrip(loss)
        for key in ("temperature", "queue_size", "embedding_dim", "seed", "reduction", "name"):
            assert getattr(clone, key) == getattr(loss, key), key
        assert clone.dtype == loss.dtype
        assert (clone.state is None) == (loss.state is None)
        if loss.embedding_dim is not None:  # the same seeded initial queue
            np.testing.assert_array_equal(to_numpy(clone.state.keys), to_numpy(loss.state.keys))
    loss = MoCoLoss(0.5, queue_size=0, dtype="float64")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(restored, MoCoLoss) and restored.dtype == "float64"
    np.testing.assert_allclose(to_numpy(restored(K, Q)), to_numpy(loss(K, Q)), rtol=1e-12)


def test_moco_keras_round_trip(tmp_path):
    rng = np.random.default_rng(6)
    features = rng.normal(size=(8, 6)).astype(np.float32)
    keys = rng.normal(size=(8, 4)).astype(np.float32)
    assert_keras_save_load(MoCoLoss(0.5, queue_size=0), tmp_path, keys, features)


@pytest.mark.parametrize("make,match", [
    (lambda: MoCoLoss(temperature=0.0), "temperature"),
    (lambda: MoCoLoss(temperature=-0.2), "temperature"),
    (lambda: MoCoLoss(temperature=float("inf")), "temperature"),
    (lambda: moco_loss(Q, K, temperature=0.0), "temperature"),
    (lambda: MoCoLoss(queue_size=-1), "queue_size"),
    (lambda: MoCoLoss(queue_size=2.5), "queue_size"),
    (lambda: MoCoLoss(embedding_dim=0), "embedding_dim"),
    (lambda: MoCoLoss(seed=-1), "seed"),
    (lambda: MoCoLoss(queue_size=0)(K[:-1], Q[:-1]), "two views"),
    (lambda: moco_loss(Q[:-1], K[:-1]), "two views"),
    (lambda: moco_loss(Q, K[:-2]), "same shape"),
    (lambda: MoCoLoss(queue_size=0)(K[:, :-1], Q), "same shape"),
    (lambda: moco_loss(Q, K, QUEUE[0]), "queue"),
    (lambda: MoCoLoss(queue_size=0)(K, Q[0]), "y_pred"),
])
def test_moco_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("how", ["functional", "class"])
def test_moco_queue_of_another_size_is_a_value_error(how):
    with pytest.raises(ValueError, match="queue|embedding_dim"):
        if how == "functional":
            moco_loss(Q, K, QUEUE[:, :-1])
        else:
            MoCoLoss(queue_size=10, embedding_dim=DIM - 1)(K, Q)
