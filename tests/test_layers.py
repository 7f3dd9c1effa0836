"""GeM pooling and L2 normalization against NumPy references; config and .keras round trips.

Everything but the tf.data check runs under every Keras backend (``multibackend``).
"""

import keras
import numpy as np
import pytest
from backends import central_differences, compiled, enable_float64, to_numpy, value_and_grad
from harness import assert_config_roundtrip
from keras import ops

from tfdml.layers import GeneralizedMeanPooling2D, L2Normalization

MB = pytest.mark.multibackend

# -- NumPy references (float64, plain formulas) ---------------------------------------------


def gem_reference(x, p, eps=1e-6):
    """(mean over H, W of max(x, eps)^p)^(1/p), channels last, one loop per (sample, channel)."""
    x = np.asarray(x, np.float64)
    out = np.zeros((x.shape[0], x.shape[3]))
    for b in range(x.shape[0]):
        for c in range(x.shape[3]):
            values = np.maximum(x[b, :, :, c], eps).ravel()
            out[b, c] = np.mean(values**p) ** (1.0 / p)
    return out


def _features(shape=(2, 3, 4, 5), seed=0):
    # Positive, as after a ReLU backbone, with a margin above epsilon; B, H, W, C all differ.
    return np.random.default_rng(seed).uniform(0.1, 3.0, size=shape)


# -- GeM ------------------------------------------------------------------------------------


@MB
@pytest.mark.parametrize("p", [1.0, 2.5, 3.0, 7.0])
def test_gem_matches_reference(p):
    x = _features()
    layer = GeneralizedMeanPooling2D(p=p)
    out = to_numpy(layer(x.astype(np.float32)))
    assert out.shape == (2, 5)
    np.testing.assert_allclose(out, gem_reference(x, p), rtol=1e-5)


@MB
def test_gem_gradients_match_reference_in_float64():
    x = _features(seed=1)
    w = np.random.default_rng(2).normal(size=(2, 5))  # a weighted sum: non-uniform upstream grads
    p = 2.7
    with enable_float64():
        layer = GeneralizedMeanPooling2D(p=p, dtype="float64")
        layer.build(x.shape)

        def value(v, p_value):  # p as an argument: the layer called with p_value as its weight
            out, _ = layer.stateless_call([p_value], [], v)
            return ops.sum(ops.multiply(out, w))

        _, (gx, gp) = value_and_grad(value, x, np.array(p), argnums=(0, 1))
    ref_gx = central_differences(lambda v: np.sum(gem_reference(v, p) * w), x)
    up, down = gem_reference(x, p + 1e-6), gem_reference(x, p - 1e-6)
    ref_gp = np.sum((up - down) * w) / 2e-6
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gp, ref_gp, rtol=1e-6)


@MB
def test_gem_p1_is_average_pooling():
    x = _features(seed=3).astype(np.float32)
    out = to_numpy(GeneralizedMeanPooling2D(p=1.0)(x))
    np.testing.assert_allclose(out, to_numpy(keras.layers.GlobalAveragePooling2D()(x)),
                               rtol=1e-6)


@MB
def test_gem_large_p_approaches_max_pooling_without_overflow():
    x = _features(seed=4).astype(np.float32) * 50.0  # 150**500 would overflow a naive power
    max_pool = to_numpy(keras.layers.GlobalMaxPooling2D()(x))
    errors = []
    for p in (10.0, 50.0, 500.0):
        out = to_numpy(GeneralizedMeanPooling2D(p=p)(x))
        assert np.all(np.isfinite(out))
        assert np.all(out <= max_pool * (1 + 1e-6))
        errors.append(np.max((max_pool - out) / max_pool))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.01  # (1/N)^(1/p) with N = 12 spatial positions: 0.5 %


@MB
def test_gem_epsilon_clamps_negative_and_zero_inputs_with_finite_gradient():
    x = np.zeros((1, 2, 2, 3), np.float32)
    x[0, 0, 0] = [-1.0, 0.0, 2.0]
    layer = GeneralizedMeanPooling2D(p=3.0, epsilon=1e-6)
    out, grad = value_and_grad(layer, x)
    np.testing.assert_allclose(out[0, :2], [1e-6, 1e-6], rtol=1e-4)
    np.testing.assert_allclose(out[0, 2], (8.0 / 4) ** (1 / 3), rtol=1e-6)
    assert np.all(np.isfinite(grad))


@MB
def test_gem_learnable_and_fixed_p():
    learnable = GeneralizedMeanPooling2D(p=3.0)
    learnable.build((None, 4, 4, 2))
    assert [w.name for w in learnable.trainable_weights] == ["p"]
    fixed = GeneralizedMeanPooling2D(p=3.0, learnable=False)
    fixed.build((None, 4, 4, 2))
    assert fixed.trainable_weights == [] and len(fixed.non_trainable_weights) == 1


@MB
def test_gem_p_is_trained_by_fit():
    model = keras.Sequential([keras.Input((3, 3, 2)), GeneralizedMeanPooling2D(p=3.0, name="gem")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x = _features((8, 3, 3, 2), seed=5).astype(np.float32)
    target = to_numpy(keras.layers.GlobalMaxPooling2D()(x))  # max pooling: p should grow
    model.fit(x, target, epochs=3, verbose=0)
    assert float(model.get_layer("gem").p.numpy()) > 3.0


@MB
def test_gem_channels_first_and_keepdims():
    x = _features(seed=6).astype(np.float32)
    last = to_numpy(GeneralizedMeanPooling2D(p=2.0)(x))
    first = to_numpy(GeneralizedMeanPooling2D(p=2.0, data_format="channels_first")(
        np.transpose(x, (0, 3, 1, 2))
    ))
    np.testing.assert_allclose(first, last, rtol=1e-6)
    kept = GeneralizedMeanPooling2D(p=2.0, keepdims=True)(x)
    assert kept.shape == (2, 1, 1, 5)


@MB
@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"p": 0.5}, "p"),
        ({"p": "3"}, "p"),
        ({"p": True}, "p"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"learnable": "yes"}, "learnable"),
        ({"data_format": "NHWC"}, "data_format"),
    ],
)
def test_gem_rejects_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=rf"`{arg}`.*Received: {arg}="):
        GeneralizedMeanPooling2D(**kwargs)


@MB
def test_gem_config_and_keras_round_trip(tmp_path):
    layer = GeneralizedMeanPooling2D(p=4.0, learnable=False, epsilon=1e-5, keepdims=True)
    clone = assert_config_roundtrip(layer)
    assert clone.initial_p == 4.0 and clone.learnable is False and clone.keepdims is True

    model = keras.Sequential([keras.Input((3, 4, 5)), GeneralizedMeanPooling2D(p=2.0, name="gem")])
    model.get_layer("gem").p.assign(5.5)  # a "trained" p must come back, not the initial one
    path = tmp_path / "gem.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert float(loaded.get_layer("gem").p.numpy()) == 5.5
    x = _features().astype(np.float32)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(loaded(x)), gem_reference(x, 5.5), rtol=1e-5)


# -- L2Normalization ------------------------------------------------------------------------


@MB
def test_l2_normalization_unit_norm_and_matches_reference():
    x = np.random.default_rng(7).normal(size=(6, 5)).astype(np.float32) * 30.0
    out = to_numpy(L2Normalization()(x))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out, x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)


@MB
def test_l2_normalization_zero_vector_stays_zero_with_finite_gradient():
    x = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]], np.float32)
    w = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], np.float32)
    layer = L2Normalization()
    _, grad = value_and_grad(lambda v: ops.sum(ops.multiply(layer(v), w)), x)
    out = to_numpy(layer(x))
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_allclose(out[1], [1 / 3, 2 / 3, 2 / 3], rtol=1e-6)
    assert np.all(np.isfinite(grad))


@MB
def test_l2_normalization_gradient_matches_reference():
    x = np.random.default_rng(8).normal(size=(3, 4))
    w = np.random.default_rng(9).normal(size=(3, 4))
    with enable_float64():
        layer = L2Normalization(dtype="float64")
        _, grad = value_and_grad(lambda v: ops.sum(ops.multiply(layer(v), w)), x)
    ref = central_differences(lambda v: np.sum(v / np.linalg.norm(v, axis=1, keepdims=True) * w), x)
    np.testing.assert_allclose(grad, ref, rtol=1e-6, atol=1e-9)


@MB
def test_l2_normalization_axis_and_float16_no_overflow():
    x = np.random.default_rng(10).normal(size=(2, 3, 4)).astype(np.float32)
    out = to_numpy(L2Normalization(axis=1)(x))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    big = np.full((2, 8), 300.0, np.float16)  # 300^2 * 8 overflows float16
    out16 = L2Normalization(dtype="mixed_float16")(big)
    assert keras.backend.standardize_dtype(out16.dtype) == "float16"
    np.testing.assert_allclose(to_numpy(out16).astype(np.float32), 8**-0.5, rtol=1e-3)


@MB
@pytest.mark.parametrize(
    "kwargs, arg",
    [({"axis": 1.5}, "axis"), ({"axis": ()}, "axis"), ({"epsilon": -1.0}, "epsilon")],
)
def test_l2_normalization_rejects_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=rf"`{arg}`.*Received: {arg}="):
        L2Normalization(**kwargs)


@MB
def test_l2_normalization_config_and_keras_round_trip(tmp_path):
    clone = assert_config_roundtrip(L2Normalization(axis=(1, 2), epsilon=1e-8))
    assert clone.axis == (1, 2) and clone.epsilon == 1e-8
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), L2Normalization()])
    path = tmp_path / "l2.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[-1], L2Normalization)
    x = np.random.default_rng(11).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), rtol=1e-6)


@MB
def test_layers_compile_with_xla_and_match_eager():
    x = _features(seed=12).astype(np.float32)
    gem, norm = GeneralizedMeanPooling2D(p=2.5), L2Normalization()
    eager = to_numpy(norm(gem(x)))
    xla = compiled(lambda v: norm(gem(v)))
    np.testing.assert_allclose(to_numpy(xla(ops.convert_to_tensor(x))), eager, rtol=1e-5,
                               atol=1e-6)


def test_layers_in_a_tf_data_map():
    import tensorflow as tf

    x = _features(seed=12).astype(np.float32)
    gem, norm = GeneralizedMeanPooling2D(p=2.5), L2Normalization()
    eager = to_numpy(norm(gem(x)))
    data = tf.data.Dataset.from_tensor_slices(x).batch(2).map(lambda v: norm(gem(v)))
    np.testing.assert_allclose(np.concatenate(list(data.as_numpy_iterator())), eager, rtol=1e-6)
