"""ManifoldLoss against a NumPy reference and pytorch-metric-learning 2.9.

The contract tests of the class-vector losses (tests/losses/test_class_vectors.py build each
loss as ``cls(num_classes=C)``; ManifoldLoss takes ``(l, k)``) are written out here: values
and gradients in float64 and float32, the gradient against central differences, the class
form against the functional form, degenerate batches, NaN and Inf, meta classes outside
``[0, k)`` (eagerly a ValueError, compiled a NaN), bad arguments, the config, the .keras
file with MetricModel (which owns and trains the proxies), compiled against eager; and where the
proxies start: away from the data, a plateau with a zero gradient; at the class means, training.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    CAN_COMPILE,
    assert_close_grad,
    compiled,
    gradient_check,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
    value_and_grad_tensors,
)
from harness import assert_config_roundtrip, pk_arrays, small_embedding_model
from keras import ops
from pml_data import BATCHES, DATA

from tfdml.losses import ManifoldLoss, manifold_loss
from tfdml.losses.manifold import random_walk_similarities
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

PML_K = 10  # the recorded cases: K = 10 proxies, meta classes = labels % 10

# -- a small batch: B = 9, D = 5, k = 4 (meta class 3 absent) --------------------------------------

B, D, K = 9, 5, 4
META = np.array([0, 2, 2, 1, 0, 2, 1, 0, 2], np.int32)


def _float32_exact(a):
    return np.asarray(a, np.float32).astype(np.float64)


_RNG = np.random.default_rng(41)
X = _float32_exact(_RNG.normal(size=(B, D)))
P = _float32_exact(_RNG.normal(size=(K, D)))


def _step(fn, argnums=(1, 2)):
    """``value_and_grad`` of ``fn``, under ``jax.jit`` under JAX (eager JAX is slow)."""
    if BACKEND == "jax":
        compiled_fn = value_and_grad_function(fn, argnums=argnums, jit_compile=True)
        return lambda *args: to_numpy(compiled_fn(*args))
    return lambda *args: value_and_grad(fn, *args, argnums=argnums)


def _functional(**kwargs):
    return lambda y, e, w: manifold_loss(y, e, w, D, K, **kwargs)


def _loss(**kwargs):
    loss = ManifoldLoss(D, K, **kwargs)
    loss.build_state(D)
    return loss


# -- pytorch-metric-learning -----------------------------------------------------------------------


def _pml_case(case, batch):
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    meta = DATA[f"manifold/{batch}/meta"]
    np.testing.assert_array_equal(meta, labels % PML_K)
    return meta, x, DATA[f"manifold/{batch}/proxies"], tuple(
        DATA[f"{case}/{batch}/{part}"] for part in ("value", "grad", "proxies_grad"))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case,kwargs", [
    ("manifold_f64", {}), ("manifold_int_f64", dict(lambda_c=0.0)),
    ("manifold_a05_f64", dict(alpha=0.5, margin=0.01))], ids=["default", "intrinsic", "a05"])
def test_equals_pytorch_metric_learning_in_float64(case, kwargs, batch, float64):
    """pml computed in float64 throughout (the recording lifts its float32 cast before the
    inverse): values to 1e-9, gradients w.r.t. the embeddings and the proxies to 1e-7."""
    meta, x, proxies, (want, want_x, want_p) = _pml_case(case, batch)
    dim = x.shape[1]
    value, (grad_x, grad_p) = value_and_grad(
        lambda e, w: manifold_loss(meta, e, w, dim, PML_K, **kwargs), x, proxies, argnums=(0, 1))
    assert value.dtype == grad_x.dtype == grad_p.dtype == np.float64
    np.testing.assert_allclose(value, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad_x, want_x, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(grad_p, want_p, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ref.manifold_loss(meta, x, proxies, **kwargs)[0], want,
                               rtol=1e-12)
    # The class form, with the recorded proxies as its variable.
    loss = ManifoldLoss(dim, PML_K, **kwargs, dtype="float64")
    loss.build_state(dim)
    loss.class_vectors.assign(proxies.astype(np.float32))
    got = to_numpy(loss(meta, x))
    np.testing.assert_allclose(got, ref.manifold_loss(
        meta, x, proxies.astype(np.float32).astype(np.float64), **kwargs)[0], rtol=1e-9)


@pytest.mark.parametrize("batch", BATCHES)
def test_pytorch_metric_learning_as_shipped_inverts_in_float32(batch, float64):
    """pml 2.9 casts ``I - alpha S_bar`` to float32 before ``torch.inverse``: its float64
    values are off by about 1e-9 relative, its gradients by about 1e-7."""
    meta, x, proxies, (want, want_x, want_p) = _pml_case("manifold", batch)
    exact = DATA[f"manifold_f64/{batch}/value"]
    value, (grad_x, grad_p) = value_and_grad(
        lambda e, w: manifold_loss(meta, e, w, x.shape[1], PML_K), x, proxies, argnums=(0, 1))
    np.testing.assert_allclose(value, exact, rtol=1e-12)
    assert 1e-12 < abs(want / exact - 1) < 1e-8
    np.testing.assert_allclose(grad_x, want_x, rtol=2e-6, atol=1e-8)
    np.testing.assert_allclose(grad_p, want_p, rtol=2e-6, atol=1e-8)


@pytest.mark.parametrize("batch", BATCHES)
def test_lambda_c_inf_is_the_context_loss_alone(batch, float64):
    """pml 2.9 computes ``0 + inf * loss_ctx``: inf. tfdml gives the context loss alone, as
    pml's docstring says (lambda_C = inf: only the context loss)."""
    meta = DATA[f"manifold/{batch}/meta"]
    x, proxies = DATA[f"{batch}/embeddings"], DATA[f"manifold/{batch}/proxies"]
    assert np.isinf(DATA[f"manifold_ctx_only/{batch}/value"])
    value = to_numpy(manifold_loss(meta, x, proxies, x.shape[1], PML_K, lambda_c=math.inf))
    np.testing.assert_allclose(value, ref.manifold_loss(meta, x, proxies, lambda_c=np.inf)[0],
                               rtol=1e-12)
    # loss(1) = intrinsic + context; loss(0) = intrinsic.
    both = ref.manifold_loss(meta, x, proxies, lambda_c=1.0)[0]
    intrinsic = DATA[f"manifold_int_f64/{batch}/value"]
    np.testing.assert_allclose(value, both - intrinsic, rtol=1e-9)


# -- the reference ---------------------------------------------------------------------------------


def test_random_walk_is_the_reference_and_solves_its_equation(float64):
    u = ref.l2_normalize(X)
    p = ref.l2_normalize(P)
    f = to_numpy(random_walk_similarities(u, p, 0.8))
    np.testing.assert_allclose(f, ref.manifold_random_walk(X, P, 0.8), rtol=1e-12)
    np.testing.assert_allclose(f, f.T, atol=1e-14)  # symmetric, as S_bar is


@pytest.mark.parametrize("kwargs", [{}, dict(lambda_c=0.0), dict(lambda_c=math.inf),
                                    dict(lambda_c=2.5, alpha=0.3, margin=0.02)],
                         ids=["default", "intrinsic", "context", "other"])
def test_float64_matches_the_reference(kwargs, float64):
    value, (grad_x, grad_p) = _step(_functional(**kwargs))(META, X, P)
    want = ref.manifold_loss(META, X, P, **kwargs)[0]
    np.testing.assert_allclose(value, want, rtol=1e-9)
    assert_close_grad(grad_x, reference_gradient(
        lambda e: ref.manifold_loss(META, e, P, **kwargs)[0], X), 1e-7)
    assert_close_grad(grad_p, reference_gradient(
        lambda w: ref.manifold_loss(META, X, w, **kwargs)[0], P), 1e-7)
    assert np.abs(grad_x).max() > 1e-4 and np.abs(grad_p).max() > 1e-4


def test_float32_matches_the_reference():
    value, (grad_x, grad_p) = _step(_functional())(META, X.astype(np.float32),
                                                   P.astype(np.float32))
    assert value.dtype == np.float32
    np.testing.assert_allclose(value, ref.manifold_loss(META, X, P)[0], rtol=1e-5)
    assert_close_grad(grad_x, reference_gradient(lambda e: ref.manifold_loss(META, e, P)[0], X),
                      1e-3)


def test_float64_gradient_check(float64):
    """The gradient w.r.t. the embeddings and the proxies against central differences of
    tfdml itself."""
    meta, x, p = META[:5], X[:5, :3], P[:, :3]

    def fn(packed):
        return manifold_loss(meta, ops.reshape(packed[:x.size], x.shape),
                             ops.reshape(packed[x.size:], p.shape), 3, K)

    theoretical, numerical = gradient_check(fn, np.concatenate([x.ravel(), p.ravel()]),
                                            delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    assert_close_grad(theoretical, numerical, 1e-6)


# -- the class -------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_class_form_equals_functional_form_and_reduces_per_sample():
    x32, p32 = X.astype(np.float32), P.astype(np.float32)
    loss = _loss(lambda_c=0.5)
    assert tuple(loss.class_vectors.shape) == (K, D) and len(loss.trainable_variables) == 1
    assert (loss.l, loss.k) == (D, K)
    loss.class_vectors.assign(p32)
    got_value, got_grad = value_and_grad(lambda y, e: loss(y, e), META, x32, argnums=1)
    want_value, want_grad = value_and_grad(_functional(lambda_c=0.5), META, x32, p32, argnums=1)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    assert_close_grad(got_grad, want_grad, 1e-5)
    per_sample = ref.manifold_loss(META, X, P, lambda_c=0.5)[1]
    none = _loss(lambda_c=0.5, reduction="none")
    none.class_vectors.assign(p32)
    np.testing.assert_allclose(to_numpy(none(META, x32)), per_sample, rtol=1e-5)
    weights = np.linspace(0.0, 2.0, B).astype(np.float32)
    np.testing.assert_allclose(to_numpy(loss(META, x32, sample_weight=weights)),
                               np.sum(weights * per_sample) / B, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(loss(META[:, None], x32)), want_value, rtol=1e-6)


def test_degenerate_batches_are_finite(float64):
    """One meta class, every meta class once, one sample, duplicate rows and rows equal to a
    proxy, zero rows: finite values and gradients, the reference's values."""
    dup = np.stack([X[0], X[0], X[0], P[1], -P[2], P[1]])
    zeros = X[:6].copy()
    zeros[[1, 4]] = 0.0
    batches = {
        "one_meta_class": (np.full(6, 2, np.int32), X[:6]),
        "each_once": (np.array([3, 0, 2, 1, 1, 0], np.int32), X[:6]),
        "duplicates": (np.array([0, 0, 1, 1, 2, 1], np.int32), dup),
        "zero_rows": (np.array([0, 2, 2, 1, 0, 1], np.int32), zeros),
    }
    step = _step(_functional())
    for kind, (meta, x) in batches.items():
        value, (grad_x, grad_p) = step(meta, x, P)
        assert np.isfinite(value) and np.all(np.isfinite(grad_x)), kind
        assert np.all(np.isfinite(grad_p)), kind
        np.testing.assert_allclose(value, ref.manifold_loss(meta, x, P)[0], rtol=1e-9,
                                   err_msg=kind)
    value, (grad_x, grad_p) = value_and_grad(_functional(), META[:1], X[:1], P, argnums=(1, 2))
    np.testing.assert_allclose(value, ref.manifold_loss(META[:1], X[:1], P)[0], rtol=1e-9)
    assert np.all(np.isfinite(grad_x)) and np.all(np.isfinite(grad_p))


def test_an_empty_batch_and_one_proxy_give_zero():
    """No sample: 0. One proxy: no other proxy to beat, 0 for every sample."""
    x32 = X.astype(np.float32)
    one = np.ones((1, D), np.float32)
    assert float(to_numpy(manifold_loss(META[:0], x32[:0], P.astype(np.float32), D, K))) == 0.0
    assert float(to_numpy(manifold_loss(np.zeros(B, np.int32), x32, one, D, 1))) == 0.0
    assert float(to_numpy(manifold_loss(META[:0], x32[:0], one, D, 1))) == 0.0


@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_nan_or_inf_gives_nan():
    fn = compiled(_functional()) if BACKEND == "jax" else _functional()
    x32, p32 = X.astype(np.float32), P.astype(np.float32)
    assert np.isfinite(to_numpy(fn(META, x32, p32)))
    for bad in (np.nan, np.inf, -np.inf):
        x_bad = x32.copy()
        x_bad[3, 1] = bad
        assert np.isnan(to_numpy(fn(META, x_bad, p32))), f"{bad} in y_pred"
        p_bad = p32.copy()
        p_bad[3, 2] = bad  # the proxy of an absent meta class
        assert np.isnan(to_numpy(fn(META, x32, p_bad))), f"{bad} in the proxies"
    loss = _loss()
    loss.class_vectors.assign(p_bad)
    assert np.isnan(to_numpy(loss(META, x32)))


def test_meta_classes_outside_the_proxies():
    """Eagerly a ValueError; compiled (nothing can raise) a NaN loss."""
    x32, p32 = X.astype(np.float32), P.astype(np.float32)
    for bad_id in (K, -1):
        meta = META.copy()
        meta[2] = bad_id
        with pytest.raises(ValueError, match=r"Class ids.*`proxies`: \[0, 4\)"):
            manifold_loss(meta, x32, p32, D, K)
        with pytest.raises(ValueError, match="Class ids"):
            _loss()(meta, x32)
        if CAN_COMPILE and BACKEND != "tensorflow":
            assert np.isnan(to_numpy(compiled(_functional())(meta, x32, p32)))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        meta = META.copy()
        meta[2] = K
        # Without AutoGraph: converting the loss's code (no control flow on tensors to
        # convert) takes seconds.
        step = tf.function(lambda y, e, w: manifold_loss(y, e, w, D, K), jit_compile=True,
                           autograph=False)
        assert np.isnan(to_numpy(step(meta, x32, p32)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(lambda_c=-1.0), "lambda_c"), (dict(lambda_c=float("nan")), "lambda_c"),
    (dict(alpha=0.0), "alpha"), (dict(alpha=1.0), "alpha"), (dict(alpha=-0.5), "alpha"),
    (dict(margin=math.inf), "margin"), (dict(margin="0.1"), "margin"),
    (dict(k=0), "`k`"), (dict(k=2.0), "`k`"), (dict(l=0), "`l`"), (dict(l=None), "`l`")])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    args = {"l": D, "k": K, **kwargs}
    with pytest.raises(ValueError, match=match):
        ManifoldLoss(**args)
    with pytest.raises(ValueError, match=match):
        manifold_loss(META, X, P, **args)


def test_shapes_must_fit():
    with pytest.raises(ValueError, match=r"`proxies` must have shape \[k, l\] = \[5, 5\]"):
        manifold_loss(META, X, P, D, 5)
    with pytest.raises(ValueError, match="`proxies` must have shape"):
        manifold_loss(META, X, P[:, :3], D, K)
    with pytest.raises(ValueError, match="`y_pred` must have l = 6"):
        manifold_loss(META, X, np.zeros((K, 6)), 6, K)
    with pytest.raises(ValueError, match="size 5"):
        ManifoldLoss(5, K).build_state(6)


def test_config_round_trip():
    loss = ManifoldLoss(D, K, lambda_c=math.inf, alpha=0.6, margin=0.01,
                        initializer=keras.initializers.RandomNormal(stddev=0.5))
    config = loss.get_config()
    assert config["l"] == D and config["k"] == K and config["lambda_c"] == math.inf
    assert "num_classes" not in config and "embedding_dim" not in config
    clone = assert_config_roundtrip(loss)
    assert (clone.l, clone.k, clone.lambda_c, clone.alpha, clone.margin) == (
        D, K, math.inf, 0.6, 0.01)


def test_metric_model_trains_the_proxies_and_the_keras_file_keeps_them(tmp_path):
    data = pk_arrays(num_classes=4, per_class=3, num_batches=2, seed=0)
    loss = ManifoldLoss(4, k=8, initializer=keras.initializers.RandomNormal(0.0, 0.5, seed=3))
    model = MetricModel(small_embedding_model(), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.05), jit_compile=CAN_COMPILE)
    assert any(v is loss.class_vectors for v in model.trainable_variables)
    before = np.array(to_numpy(loss.class_vectors))
    model.fit(data.x, data.y, batch_size=data.batch_size, epochs=1, shuffle=False, verbose=0)
    after = np.array(to_numpy(loss.class_vectors))
    assert np.abs(after - before).max() > 1e-3 and np.all(np.isfinite(after))
    path = tmp_path / "manifold.keras"
    model.save(path)
    again = keras.models.load_model(path)
    assert isinstance(again.metric_loss, ManifoldLoss) and again.metric_loss.k == 8
    np.testing.assert_array_equal(to_numpy(again.metric_loss.class_vectors), after)


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_compiled_equals_eager():
    x32, p32 = X.astype(np.float32), P.astype(np.float32)
    loss = _loss()
    loss.class_vectors.assign(p32)

    def everything(meta, x, p):
        return value_and_grad_tensors(_functional(), meta, x, p, argnums=(1, 2)), loss(meta, x)

    eager = to_numpy(everything(*(ops.convert_to_tensor(a) for a in (META, x32, p32))))
    got = to_numpy(compiled(everything)(META, x32, p32))
    (value, (grad_x, grad_p)), class_value = got
    (want, (want_x, want_p)), want_class = eager
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(class_value, want_class, rtol=1e-5)
    assert_close_grad(grad_x, want_x, 1e-5)
    assert_close_grad(grad_p, want_p, 1e-5)


# -- where the proxies start (the class docstring's "Start the proxies in the data") ---------------


def _unit(a):
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _cone(rng, num_classes=3, per_class=4, input_dim=6):
    """Inputs that share a large first coordinate (their embeddings fill a narrow cone), one
    more coordinate per class, and a little noise."""
    labels = np.repeat(np.arange(num_classes), per_class).astype(np.int32)
    eye = np.eye(input_dim)
    inputs = 4.0 * eye[0] + eye[1 + labels] + 0.1 * rng.normal(size=(len(labels), input_dim))
    return labels, inputs


def _away_from(embeddings, k, rng):
    """``k`` proxies at negative cosines with every embedding and with one another: each is
    ``-u / 2`` (``u`` the embeddings' mean direction) plus a unit vertex of a regular simplex
    orthogonal to ``u`` (pairwise cosines ``-1 / (k - 1)``)."""
    u = _unit(_unit(embeddings).mean(axis=0))
    basis = np.linalg.qr(np.stack([u, *rng.normal(size=(k, len(u)))]).T)[0].T[1:]
    vertices = _unit(basis - basis.mean(axis=0))
    return -0.5 * u + vertices


def _plateau(k, lambda_c, margin=5e-4):
    """Each term when every other proxy scores as the own one: ``log(1 + (k-1) e^margin)``."""
    term = math.log(1.0 + (k - 1) * math.exp(margin))
    return term if math.isinf(lambda_c) else (1.0 + lambda_c) * term


@pytest.mark.parametrize("lambda_c", [1.0, 0.0, math.inf])
def test_proxies_with_no_positive_cosine_are_a_flat_plateau(lambda_c, float64):
    """No sample or proxy at a positive cosine with a proxy: every edge to a proxy weighs
    ``exp(0) = 1``, the walk cannot tell the proxies apart, and the loss is
    ``(1 + lambda_c) log(1 + (k-1) e^margin)`` with a zero gradient (the relu passes none)."""
    rng = np.random.default_rng(5)
    labels, inputs = _cone(rng, num_classes=K, per_class=3, input_dim=D)
    x = inputs @ rng.normal(size=(D, D))
    proxies = _away_from(x, K, rng)
    unit_x, unit_p = _unit(x), _unit(proxies)
    assert (unit_x @ unit_p.T).max() < -0.05
    assert (unit_p @ unit_p.T)[~np.eye(K, dtype=bool)].max() < -0.05
    value, (grad_x, grad_p) = _step(_functional(lambda_c=lambda_c))(labels, x, proxies)
    np.testing.assert_allclose(value, _plateau(K, lambda_c), rtol=1e-12)
    np.testing.assert_allclose(value, ref.manifold_loss(labels, x, proxies, lambda_c=lambda_c)[0],
                               rtol=1e-12)
    assert np.abs(grad_x).max() < 1e-12 and np.abs(grad_p).max() < 1e-12


def test_proxies_started_at_the_class_means_train_and_proxies_away_from_the_data_do_not():
    """A linear embedding of inputs in a narrow cone, 15 Adam steps on the embedding and the
    proxies: from the class means of the first embeddings the loss falls to a fraction of its
    start; from proxies at negative cosines with all of them it stays on the plateau."""
    rng = np.random.default_rng(0)
    labels, inputs = _cone(rng)
    num_classes, input_dim, dim = 3, inputs.shape[1], 4
    inputs = inputs.astype(np.float32)
    kernel = (rng.normal(size=(input_dim, dim)) / np.sqrt(input_dim)).astype(np.float32)
    first = _unit((inputs @ kernel).astype(np.float64))
    means = np.stack([first[labels == c].mean(axis=0) for c in range(num_classes)])
    step = value_and_grad_function(
        lambda w, p: manifold_loss(labels, ops.matmul(inputs, w), p, dim, num_classes),
        argnums=(0, 1), jit_compile=BACKEND == "jax")

    def train(proxies, steps=15, rate=0.05):
        params = [kernel.copy(), proxies.astype(np.float32)]
        moments = [[np.zeros_like(a), np.zeros_like(a)] for a in params]
        values = []
        for t in range(1, steps + 1):
            value, grads = to_numpy(step(*params))
            values.append(float(value))
            for a, g, m in zip(params, grads, moments, strict=True):
                m[0] = 0.9 * m[0] + 0.1 * g
                m[1] = 0.999 * m[1] + 0.001 * g * g
                a -= rate * (m[0] / (1 - 0.9 ** t)) / (np.sqrt(m[1] / (1 - 0.999 ** t)) + 1e-7)
        return np.array(values)

    trained = train(means)
    assert trained[0] > 0.5 and trained[-5:].mean() < 0.5 * trained[0], trained
    away = _away_from(first, num_classes, rng)
    assert (first @ _unit(away).T).max() < -0.05
    stuck = train(away)
    np.testing.assert_allclose(stuck, _plateau(num_classes, 1.0), rtol=1e-5)
