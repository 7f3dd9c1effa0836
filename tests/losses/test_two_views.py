"""VICRegLoss and SelfSupervisedLoss: two views stacked as ``y_pred = [view1; view2]``.

Against NumPy references and pytorch-metric-learning 2.9 (tests/fixtures/pml_2.9.npz, the
``two_views`` batch), and the contract tests that the cases of tests/loss_cases.py skip for
them (no labels, an even number of rows): .keras round trips, non-finite and degenerate
batches, mixed precision, bad arguments.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    compiled,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import (
    assert_config_roundtrip,
    assert_keras_save_load,
    slow_beyond,
    small_embedding_model,
)
from pml_data import DATA

import tfdml
from tfdml.losses import (
    ContrastiveLoss,
    MarginLoss,
    NTXentLoss,
    SelfSupervisedLoss,
    TripletMarginLoss,
    VICRegLoss,
    vicreg_loss,
)
from tfdml.miners import TripletMiner

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

X1, X2 = DATA["two_views/embeddings"], DATA["two_views/ref_embeddings"]
STACKED = np.concatenate([X1, X2])
N = len(X1)
VICREG_ARGS = {"vicreg": (), "vicreg_args": (5.0, 10.0, 2.0, 1e-3)}


def _views(seed, n=7, dim=5):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, dim)) * np.linspace(0.2, 1.6, dim)
    return a, a + 0.5 * rng.normal(size=(n, dim))


def _check_recorded(case, value, grad):
    np.testing.assert_allclose(value, DATA[f"{case}/two_views/value"], rtol=1e-9)
    for got, key in ((grad[:N], "grad"), (grad[N:], "ref_grad")):
        want = DATA[f"{case}/two_views/{key}"]
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7 * np.abs(want).max())


# -- VICReg -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), (5.0, 10.0, 2.0, 1e-3), (0.0, 1.0, 0.0, 0.5)])
def test_vicreg_values_and_gradients_match_the_reference(args):
    a, b = _views(0)
    y = np.concatenate([a, b])
    loss = VICRegLoss(*args, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), y)

    def want(e):
        return ref.vicreg_loss(e[:7], e[7:], *args)

    np.testing.assert_allclose(value, want(y), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, y), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("case", sorted(VICREG_ARGS))
def test_vicreg_equals_pytorch_metric_learning(case):
    loss = VICRegLoss(*VICREG_ARGS[case], dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), STACKED)
    _check_recorded(case, value, grad)
    value, grads = value_and_grad(lambda a, b: vicreg_loss(a, b, *VICREG_ARGS[case]), X1, X2,
                                  argnums=(0, 1))
    _check_recorded(case, value, np.concatenate(grads))


def test_vicreg_ignores_labels():
    want = to_numpy(VICRegLoss(dtype="float64")(None, STACKED))
    for labels in (np.zeros(2 * N, np.int64), np.arange(N), np.ones((2 * N, 1), np.float32)):
        assert to_numpy(VICRegLoss(dtype="float64")(labels, STACKED)) == want


def test_vicreg_batch_of_one_pair_is_finite():
    """N = 1: variance 0 (not 0/0), covariance 0; only the invariance term has a gradient."""
    y = np.array([[0.3, -1.0, 2.0], [0.5, -0.5, 1.0]])
    value, grad = value_and_grad(lambda e: VICRegLoss(dtype="float64")(None, e), y)
    spread = 25.0 * (1.0 - np.sqrt(1e-4))  # two views, each halved
    np.testing.assert_allclose(value, 25.0 * np.mean((y[0] - y[1]) ** 2) + spread, rtol=1e-12)
    np.testing.assert_allclose(value, ref.vicreg_loss(y[:1], y[1:]), rtol=1e-12)
    np.testing.assert_allclose(grad, 25.0 * 2.0 / 3.0 * np.array([y[0] - y[1], y[1] - y[0]]),
                               rtol=1e-12)


def test_vicreg_degenerate_batches_are_finite():
    for y in (np.zeros((6, 4)), np.repeat(STACKED[:1], 6, axis=0), STACKED[:, :1]):
        value, grad = value_and_grad(lambda e: VICRegLoss(dtype="float64")(None, e), y)
        assert np.isfinite(value) and np.all(np.isfinite(grad))
        np.testing.assert_allclose(value, ref.vicreg_loss(y[:len(y) // 2], y[len(y) // 2:]),
                                   rtol=1e-12)


# -Inf (slow tier) takes the path of Inf.
@pytest.mark.parametrize("bad", slow_beyond([np.nan, np.inf, -np.inf, 1e200],
                                            {"nan", "inf", "1e+200"}))
def test_vicreg_nonfinite_embeddings_give_nan(bad):
    y = STACKED.copy()
    y[3, 2] = bad
    assert np.isnan(to_numpy(VICRegLoss(dtype="float64")(None, y)))
    assert np.isnan(to_numpy(vicreg_loss(y[:N], y[N:])))
    if BACKEND != "torch":
        with np.errstate(over="ignore"):
            f32 = y.astype(np.float32)
        assert np.isnan(to_numpy(compiled(lambda e: VICRegLoss()(None, e))(f32)))


def test_vicreg_compiled_equals_eager():
    y = STACKED.astype(np.float32)
    step = value_and_grad_function(lambda e: VICRegLoss()(None, e), jit_compile=True)
    value, grad = to_numpy(step(y))
    want, want_grad = value_and_grad(lambda e: VICRegLoss()(None, e), y)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_vicreg_low_precision_inputs_are_computed_in_float32(dtype):
    y = keras.ops.cast(STACKED, dtype)
    as_float = to_numpy(keras.ops.cast(y, "float64"))
    value = VICRegLoss()(None, y)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(value), ref.vicreg_loss(as_float[:N], as_float[N:]),
                               rtol=1e-5)
    # The functional form returns the dtype of its input, computed in float32.
    low = to_numpy(keras.ops.cast(vicreg_loss(y[:N], y[N:]), "float64"))
    np.testing.assert_allclose(low, ref.vicreg_loss(as_float[:N], as_float[N:]), rtol=1e-2)


def test_vicreg_odd_rows_are_a_value_error_eagerly():
    with pytest.raises(ValueError, match="two views"):
        VICRegLoss()(None, STACKED[:-1])
    with pytest.raises(ValueError, match="same shape"):
        vicreg_loss(X1, X2[:-1])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a dynamic batch size: TensorFlow graphs")
def test_vicreg_odd_rows_are_nan_in_a_graph_with_a_dynamic_batch():
    import tensorflow as tf

    fn = tf.function(lambda e: VICRegLoss()(None, e),
                     input_signature=[tf.TensorSpec([None, X1.shape[1]], tf.float32)])
    assert np.isnan(fn(STACKED[:-1].astype(np.float32)).numpy())
    np.testing.assert_allclose(fn(STACKED.astype(np.float32)).numpy(),
                               ref.vicreg_loss(X1, X2), rtol=1e-5)


def test_vicreg_config_and_keras_round_trips(tmp_path):
    loss = VICRegLoss(5.0, 10.0, 2.0, 1e-3, name="vic")
    clone = assert_config_roundtrip(loss)
    assert clone.arguments == loss.arguments and clone.name == "vic"
    features = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    assert_keras_save_load(loss, tmp_path, np.zeros(8, np.int64), features)


def test_vicreg_trains_a_two_view_model():
    first, second = keras.Input((6,)), keras.Input((6,))
    dense = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(seed=0))
    views = keras.layers.Concatenate(axis=0)([dense(first), dense(second)])
    model = keras.Model([first, second], views)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=VICRegLoss())
    rng = np.random.default_rng(1)
    a = rng.normal(size=(32, 6)).astype(np.float32)
    b = (a + 0.1 * rng.normal(size=(32, 6))).astype(np.float32)
    before = to_numpy(VICRegLoss()(None, model([a, b])))
    model.fit([a, b], np.zeros(32), batch_size=32, epochs=5, verbose=0)
    assert to_numpy(VICRegLoss()(None, model([a, b]))) < before


@pytest.mark.parametrize("make,match", [
    (lambda: VICRegLoss(invariance_lambda=-1.0), "invariance_lambda"),
    (lambda: VICRegLoss(variance_mu=float("nan")), "variance_mu"),
    (lambda: VICRegLoss(covariance_v="1"), "covariance_v"),
    (lambda: VICRegLoss(eps=0.0), "eps"),
    (lambda: vicreg_loss(X1, X2, eps=-1e-4), "eps"),
    (lambda: VICRegLoss()(None, STACKED, sample_weight=np.ones(2 * N)), "sample_weight"),
    (lambda: VICRegLoss()(None, STACKED[0]), "y_pred"),
])
def test_vicreg_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- SelfSupervisedLoss -------------------------------------------------------------------------

# pml's losses as the migration table maps them (docs/losses.md).
WRAPPED = {
    "ss_triplet": lambda: TripletMarginLoss(margin=0.2, distance="l2", miner=None,
                                           average="nonzero", dtype="float64"),
    "ss_ntxent": lambda: NTXentLoss(temperature=0.07, dtype="float64"),
}


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("case", sorted(WRAPPED))
def test_self_supervised_equals_pytorch_metric_learning(case, symmetric):
    loss = SelfSupervisedLoss(WRAPPED[case](), symmetric=symmetric, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), STACKED)
    _check_recorded(case + ("" if symmetric else "_asym"), value, grad)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_self_supervised_contrastive_differs_as_contrastive_does(symmetric):
    """pml's ContrastiveLoss averages the positive and the negative pairs separately (over
    their non-zero terms) and adds the means; tfdml averages all pairs (docs/losses.md)."""
    case = "ss_contrastive" + ("" if symmetric else "_asym")
    ids = np.arange(N)
    if symmetric:
        pos, neg = ref.label_masks(np.concatenate([ids, ids]))
    else:
        pos, neg = ids[:, None] == ids[None, :], ids[:, None] != ids[None, :]
    zeros = np.zeros_like(pos)

    def split(e):
        return (e, None) if symmetric else (e[:N], e[N:])

    def pml_reading(e):
        return sum(ref.contrastive_loss(split(e)[0], p, n, 0.0, 1.0, ref_embeddings=split(e)[1],
                                        average="nonzero")[0]
                   for p, n in ((pos, zeros), (zeros, neg)))

    def tfdml_reading(e):
        return ref.contrastive_loss(split(e)[0], pos, neg, 0.0, 1.0,
                                    ref_embeddings=split(e)[1])[0]

    want = DATA[f"{case}/two_views/value"]
    np.testing.assert_allclose(pml_reading(STACKED), want, rtol=1e-9)
    pml_grad = np.concatenate([DATA[f"{case}/two_views/grad"], DATA[f"{case}/two_views/ref_grad"]])
    np.testing.assert_allclose(reference_gradient(pml_reading, STACKED), pml_grad, rtol=1e-7,
                               atol=1e-9)
    loss = SelfSupervisedLoss(ContrastiveLoss(0.0, 1.0, dtype="float64"), symmetric,
                              dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), STACKED)
    np.testing.assert_allclose(value, tfdml_reading(STACKED), rtol=1e-9)
    np.testing.assert_allclose(grad, reference_gradient(tfdml_reading, STACKED), rtol=1e-7,
                               atol=1e-9)
    assert abs(float(value) - float(want)) > 0.1


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_self_supervised_contrastive_with_halves_equals_pytorch_metric_learning(symmetric):
    loss = SelfSupervisedLoss(ContrastiveLoss(0.0, 1.0, average="halves", dtype="float64"),
                              symmetric, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(None, e), STACKED)
    _check_recorded("ss_contrastive" + ("" if symmetric else "_asym"), value, grad)


def test_self_supervised_is_the_wrapped_loss_on_view_labels():
    inner = TripletMarginLoss(dtype="float64")
    labels = np.concatenate([np.arange(N), np.arange(N)])
    np.testing.assert_allclose(to_numpy(SelfSupervisedLoss(inner, dtype="float64")(None, STACKED)),
                               to_numpy(inner(labels, STACKED)), rtol=1e-12)
    asym = SelfSupervisedLoss(NTXentLoss(dtype="float64"), symmetric=False, dtype="float64")
    want = tfdml.losses.ntxent_loss(np.arange(N), X1, ref_embeddings=X2,
                                    ref_labels=np.arange(N))
    np.testing.assert_allclose(to_numpy(asym(np.zeros(2 * N), STACKED)), to_numpy(want),
                               rtol=1e-12)
    per_row = to_numpy(SelfSupervisedLoss(NTXentLoss(), symmetric=False,
                                          reduction="none")(None, STACKED.astype(np.float32)))
    assert per_row.shape == (2 * N,) and np.all(per_row[N:] == 0) and np.all(per_row[:N] > 0)


def test_self_supervised_config_and_keras_round_trips(tmp_path):
    loss = SelfSupervisedLoss(NTXentLoss(0.2, miner=TripletMiner("easy", "hard")),
                              symmetric=False)
    clone = assert_config_roundtrip(loss)
    assert clone.symmetric is False and isinstance(clone.loss, NTXentLoss)
    assert clone.loss.temperature == 0.2 and clone.loss.miner.negative == "hard"
    assert clone.cross_replica is False
    features = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    assert_keras_save_load(loss, tmp_path, np.zeros(8, np.int64), features)


def test_self_supervised_odd_rows_and_bad_arguments():
    with pytest.raises(ValueError, match="two views"):
        SelfSupervisedLoss(NTXentLoss())(None, STACKED[:-1])
    with pytest.raises(ValueError, match="loss"):
        SelfSupervisedLoss(keras.losses.MeanSquaredError())
    with pytest.raises(ValueError, match="symmetric"):
        SelfSupervisedLoss(NTXentLoss(), symmetric="no")
    with pytest.raises(ValueError, match="ref_embeddings"):
        SelfSupervisedLoss(NTXentLoss()).compute_terms(None, STACKED, X1, np.arange(N))


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_self_supervised_nonfinite_and_low_precision_views(symmetric):
    loss = SelfSupervisedLoss(NTXentLoss(), symmetric)
    for row in (2, N + 2):  # either view
        y = STACKED.astype(np.float32)
        y[row, 1] = np.nan
        assert np.isnan(to_numpy(loss(None, y)))
    want = to_numpy(loss(None, to_numpy(keras.ops.cast(keras.ops.cast(STACKED, "float16"),
                                                       "float32"))))
    value = loss(None, keras.ops.cast(STACKED, "float16"))
    np.testing.assert_allclose(to_numpy(value), want, rtol=1e-5)
    if symmetric:  # every replica's views are gathered (tests/test_distribute.py)
        loss.cross_replica = True
        assert loss.cross_replica is None
    else:  # the reference set is each replica's own second view
        with pytest.raises(ValueError, match="cross_replica"):
            loss.cross_replica = True


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a dynamic batch size: TensorFlow graphs")
def test_self_supervised_odd_rows_are_nan_in_a_graph_with_a_dynamic_batch():
    import tensorflow as tf

    loss = SelfSupervisedLoss(NTXentLoss())
    fn = tf.function(lambda e: loss(None, e),
                     input_signature=[tf.TensorSpec([None, X1.shape[1]], tf.float32)])
    assert np.isnan(fn(STACKED[:-1].astype(np.float32)).numpy())
    np.testing.assert_allclose(fn(STACKED.astype(np.float32)).numpy(),
                               to_numpy(loss(None, STACKED.astype(np.float32))), rtol=1e-5)


def test_self_supervised_compiled_equals_eager():
    loss = SelfSupervisedLoss(TripletMarginLoss(), symmetric=False)
    y = STACKED.astype(np.float32)
    value, grad = to_numpy(value_and_grad_function(lambda e: loss(None, e),
                                                   jit_compile=True)(y))
    want, want_grad = value_and_grad(lambda e: loss(None, e), y)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(BACKEND == "jax", reason="one fit per backend is enough; slow under JAX")
def test_metric_model_trains_the_wrapped_loss_state():
    """The wrapped loss's learned beta is the wrapper's state, which MetricModel owns."""
    inner = MarginLoss(miner=TripletMiner("easy", "hard"))
    loss = SelfSupervisedLoss(inner)
    assert loss.state is inner.state
    model = tfdml.models.MetricModel(small_embedding_model(), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    rng = np.random.default_rng(2)
    a = rng.normal(size=(8, 6)).astype(np.float32)
    x = np.concatenate([a, a + 0.1 * rng.normal(size=(8, 6)).astype(np.float32)])
    model.fit(x, np.zeros(16), batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert any(v is inner.trainable_variables[0] for v in model.trainable_variables)
    assert abs(float(to_numpy(inner.beta)) - 1.2) > 1e-3
