"""Embedding model builder, ResNet18, preprocessing, frozen BatchNorm, offline weights.

Backbones are built at 32x32 (ResNet18 mostly: ~0.6 s to build); every Keras backbone is
built once in the slow test. Nothing here downloads: the one ImageNet test runs in a child
process with an empty Keras cache and every download refused.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from harness import pk_labels, run_under_policy

import tfdml
from tfdml import models
from tfdml.layers import GeneralizedMeanPooling2D, L2Normalization

SMALL = (32, 32, 3)


def _images(n, size=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3)).astype(np.uint8)


def _bn_layers(model):
    return [
        layer
        for layer in models.all_layers(model)[1:]
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


# -- preprocessing --------------------------------------------------------------------------


def test_every_backbone_uses_its_keras_modules_preprocess_input():
    x = np.random.default_rng(1).uniform(0, 255, size=(2, 5, 4, 3)).astype(np.float32)
    for name in models.BACKBONES:
        spec = models.backbones._BACKBONES[name]
        if spec.module is None:
            continue
        assert hasattr(keras.applications, spec.constructor), name
        keras_fn = getattr(keras.applications, spec.module).preprocess_input
        expected = np.asarray(keras_fn(tf.constant(x)))
        got = models.get_preprocess(name)(x).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5, err_msg=name)


def test_preprocess_modes_match_numpy_formulas_and_leave_input_alone():
    x = np.random.default_rng(2).uniform(0, 255, size=(3, 4, 5, 3)).astype(np.float32)
    original = x.copy()
    mean = np.array([0.485, 0.456, 0.406])
    std = np.array([0.229, 0.224, 0.225])
    caffe = x[..., ::-1] - np.array([103.939, 116.779, 123.68])
    torch_mode = (x / 255.0 - mean) / std
    np.testing.assert_allclose(models.get_preprocess("resnet50")(x), caffe, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(models.get_preprocess("resnet18")(x), torch_mode, atol=1e-5)
    np.testing.assert_allclose(models.get_preprocess("inception_v3")(x), x / 127.5 - 1, atol=1e-6)
    np.testing.assert_array_equal(models.get_preprocess("efficientnet_b0")(x), x)
    np.testing.assert_array_equal(x, original)
    uint8 = models.get_preprocess("caffe")(_images(2, size=4))
    assert uint8.dtype == tf.float32
    assert models.get_preprocess("densenet121").mode == "torch"
    assert models.preprocess_mode("resnet101") == "caffe"
    with pytest.raises(ValueError, match=r"`backbone`.*Received: backbone='alexnet'"):
        models.get_preprocess("alexnet")


# -- ResNet18 -------------------------------------------------------------------------------


def _resnet18_param_count():
    """Trainable parameters of torchvision's ResNet18 without fc, from its architecture."""

    def conv(k, c_in, c_out):
        return k * k * c_in * c_out  # no bias

    def bn(c):
        return 2 * c  # gamma, beta

    total = conv(7, 3, 64) + bn(64)
    c_in = 64
    for c_out in (64, 128, 256, 512):
        for block in range(2):
            first_in = c_in if block == 0 else c_out
            total += conv(3, first_in, c_out) + bn(c_out) + conv(3, c_out, c_out) + bn(c_out)
            if block == 0 and c_in != c_out:
                total += conv(1, c_in, c_out) + bn(c_out)
        c_in = c_out
    return total


def test_resnet18_structure_and_parameter_count():
    model = models.resnet18(input_shape=SMALL)
    expected = _resnet18_param_count()
    assert expected == 11_176_512  # torchvision: 11,689,512 - fc (512 * 1000 + 1000)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == expected
    assert model.count_params() == expected + 2 * 4800  # + moving mean/variance of 4800 channels

    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(convs) == 20 and len(_bn_layers(model)) == 20
    kernels = sorted({c.kernel_size for c in convs})
    assert kernels == [(1, 1), (3, 3), (7, 7)]
    assert [c.name for c in convs if c.kernel_size == (1, 1)] == [
        "layer2_0_downsample_0", "layer3_0_downsample_0", "layer4_0_downsample_0"
    ]
    assert model.get_layer("bn1").epsilon == 1e-5
    assert models.resnet18(input_shape=(224, 224, 3)).output_shape == (None, 7, 7, 512)

    out = model(models.get_preprocess("resnet18")(_images(2)))
    assert out.shape == (2, 1, 1, 512)
    assert np.all(np.isfinite(out.numpy()))


def test_resnet18_top_and_pooling():
    top = models.resnet18(include_top=True, input_shape=SMALL, classes=7)
    assert top.output_shape == (None, 7)
    np.testing.assert_allclose(top(np.zeros((1, *SMALL), np.float32)).numpy().sum(), 1.0, rtol=1e-5)
    assert models.resnet18(pooling="max").output_shape == (None, 512)


def test_resnet18_has_no_imagenet_weights():
    match = r"`weights`.*no ImageNet weights.*Received: weights='imagenet'"
    with pytest.raises(ValueError, match=match):
        models.resnet18(weights="imagenet")
    with pytest.raises(ValueError, match=r"`weights`.*Received: weights='imagenet'"):
        models.build_embedding_model("resnet18", input_shape=SMALL, weights="imagenet")


# -- build_embedding_model ------------------------------------------------------------------


def test_build_embedding_model_resnet18_structure_and_output():
    model = models.build_embedding_model(
        "resnet18", embedding_dim=8, input_shape=SMALL, weights=None, pooling="gem"
    )
    assert model.name == "resnet18_embedding"
    assert model.preprocess == "torch" and model.backbone_name == "resnet18"
    assert [layer.name for layer in model.layers] == [
        "images", "resnet18", "gem_pool", "embedding", "l2_normalization"
    ]
    assert isinstance(model.get_layer("gem_pool"), GeneralizedMeanPooling2D)
    assert isinstance(model.get_layer("l2_normalization"), L2Normalization)
    out = model(models.get_preprocess("resnet18")(_images(3))).numpy()
    assert out.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


@pytest.mark.slow  # training under each backend
@pytest.mark.multibackend
def test_build_embedding_model_trains_with_a_tfdml_loss_under_every_backend():
    """The model and its layers (GeM, L2Normalization) in a compiled fit step with a loss."""
    model = models.build_embedding_model(
        "resnet18", embedding_dim=8, input_shape=SMALL, weights=None, pooling="gem"
    )
    images = (_images(8) / 255.0).astype("float32")
    labels = np.repeat(np.arange(4), 2).astype("int32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=tfdml.losses.TripletNCALoss(),
                  jit_compile=keras.backend.backend() != "torch")
    before = [np.array(w) for w in model.get_weights()]
    loss = model.train_on_batch(images, labels)
    assert np.isfinite(loss) and loss > 0
    assert any(not np.array_equal(b, a) for b, a in zip(before, model.get_weights(),
                                                        strict=True))
    out = keras.ops.convert_to_numpy(model(images))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_build_embedding_model_pooling_and_head_options():
    base = dict(backbone="resnet18", input_shape=SMALL, weights=None)
    plain = models.build_embedding_model(**base, embedding_dim=None, pooling="max", normalize=False)
    assert isinstance(plain.layers[-1], keras.layers.GlobalMaxPooling2D)
    assert plain.output_shape == (None, 512)
    fixed = GeneralizedMeanPooling2D(p=4.0, learnable=False, name="my_gem")
    model = models.build_embedding_model(**base, embedding_dim=6, pooling=fixed)
    assert model.get_layer("my_gem") is fixed and model.output_shape == (None, 6)
    avg = models.build_embedding_model(**base, embedding_dim=6, name="custom")
    assert avg.name == "custom"
    assert isinstance(avg.get_layer("avg_pool"), keras.layers.GlobalAveragePooling2D)


def test_embeddings_are_float32_under_mixed_precision():
    with run_under_policy("mixed_float16"):
        model = models.build_embedding_model("resnet18", 8, SMALL, weights=None)
        out = model(np.zeros((2, *SMALL), np.float32) + 0.5)
    assert out.dtype == "float32"
    np.testing.assert_allclose(np.linalg.norm(out.numpy(), axis=1), 1.0, rtol=1e-3)


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"backbone": "resnet9"}, "backbone"),
        ({"backbone": 50}, "backbone"),
        ({"embedding_dim": 0}, "embedding_dim"),
        ({"embedding_dim": 8.0}, "embedding_dim"),
        ({"input_shape": (32, 32)}, "input_shape"),
        ({"input_shape": (32, 32, 1)}, "input_shape"),
        ({"input_shape": (0, 32, 3)}, "input_shape"),
        ({"pooling": "median"}, "pooling"),
        ({"weights": "/no/such/file.weights.h5"}, "weights"),
        ({"weights": "imagenet21k"}, "weights"),
        ({"normalize": "yes"}, "normalize"),
        ({"freeze_batchnorm": 1}, "freeze_batchnorm"),
    ],
)
def test_build_embedding_model_rejects_bad_arguments(kwargs, arg):
    args = {"backbone": "resnet50", "input_shape": SMALL, "weights": None, **kwargs}
    with pytest.raises(ValueError, match=rf"`{arg}`.*Received: {arg}="):
        models.build_embedding_model(**args)


# -- frozen BatchNorm -----------------------------------------------------------------------


def test_freeze_batchnorm_freezes_exactly_the_batchnorm_layers():
    frozen = models.build_embedding_model("resnet18", 8, SMALL, weights=None, freeze_batchnorm=True)
    free = models.build_embedding_model("resnet18", 8, SMALL, weights=None)
    bns = _bn_layers(frozen)
    assert len(bns) == 20
    assert all(not layer.trainable for layer in bns)
    others = [
        layer
        for layer in models.all_layers(frozen)[1:]
        if layer.weights and not isinstance(layer, keras.layers.BatchNormalization)
    ]
    assert others and all(layer.trainable for layer in others)
    assert all(layer.trainable for layer in _bn_layers(free))
    bn_gamma_beta = sum(2 * layer.gamma.shape[0] for layer in bns)
    assert frozen.count_params() == free.count_params()
    n_frozen = sum(int(np.prod(w.shape)) for w in frozen.trainable_weights)
    n_free = sum(int(np.prod(w.shape)) for w in free.trainable_weights)
    assert n_free - n_frozen == bn_gamma_beta == 9600

    # Frozen BN runs in inference mode even when the model is called with training=True.
    x = models.get_preprocess("resnet18")(_images(4, seed=3))
    stats = [np.array(layer.moving_mean) for layer in bns]
    np.testing.assert_allclose(frozen(x, training=True), frozen(x, training=False), atol=1e-6)
    for before, layer in zip(stats, bns, strict=True):
        np.testing.assert_array_equal(before, np.array(layer.moving_mean))
    assert not np.allclose(free(x, training=True), free(x, training=False), atol=1e-3)


def test_freeze_batchnorm_layers_helper_on_a_keras_backbone():
    backbone = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=SMALL)
    frozen = models.freeze_batchnorm_layers(backbone)
    assert frozen
    assert {id(layer) for layer in frozen} == {id(layer) for layer in _bn_layers(backbone)}
    assert all(
        layer.trainable
        for layer in backbone.layers
        if layer.weights and not isinstance(layer, keras.layers.BatchNormalization)
    )


# -- weights ---------------------------------------------------------------------------------


def test_weights_from_a_local_file_are_loaded(tmp_path):
    source = models.resnet18(input_shape=SMALL)
    # Make the weights distinguishable from any fresh initialization.
    for w in source.weights:
        w.assign(np.random.default_rng(len(w.path)).normal(size=w.shape).astype("float32") * 0.01)
    path = tmp_path / "resnet18_backbone.weights.h5"
    source.save_weights(path)

    model = models.build_embedding_model("resnet18", 8, SMALL, weights=str(path))
    loaded = model.get_layer("resnet18")
    for expected, got in zip(source.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(np.array(got), np.array(expected))
    direct = models.resnet18(input_shape=SMALL, weights=path)  # a PathLike works too
    np.testing.assert_array_equal(np.array(direct.weights[0]), np.array(source.weights[0]))


def test_weights_from_a_local_file_for_a_keras_application_backbone(tmp_path):
    source = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=SMALL)
    kernel = source.get_layer("Conv1").kernel
    kernel.assign(np.full(kernel.shape, 0.125, "float32"))
    path = tmp_path / "mobilenet_v2_notop.weights.h5"
    source.save_weights(path)
    model = models.build_embedding_model("mobilenet_v2", 8, SMALL, weights=path)
    assert model.preprocess == "tf"
    got = model.get_layer(source.name).get_layer("Conv1").kernel
    np.testing.assert_array_equal(np.array(got), 0.125)


def test_imagenet_weights_without_cache_give_a_clear_error(tmp_path):
    # A child process with an empty Keras cache ($KERAS_HOME) and no network (a proxy on a
    # closed port refuses every download at once). VGG16: Keras builds the backbone before
    # it fetches the weights, and VGG16 is the quickest to build.
    code = textwrap.dedent("""
        import tfdml
        try:
            tfdml.models.build_embedding_model("vgg16", 8, (32, 32, 3), weights="imagenet")
        except tfdml.models.WeightsUnavailableError as err:
            assert isinstance(err, FileNotFoundError)
            print(err)
    """)
    env = dict(os.environ, KERAS_HOME=str(tmp_path), HTTP_PROXY="http://127.0.0.1:9",
               HTTPS_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9",
               https_proxy="http://127.0.0.1:9", KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    message = result.stdout
    assert "'vgg16_weights_tf_dim_ordering_tf_kernels_notop.h5'" in message, message
    assert repr(str(tmp_path / "models")) in message
    assert "KERAS_HOME" in message and "~/.keras" in message
    # the address to fetch it from
    assert "https://storage.googleapis.com/" in message and "_notop.h5 and copy" in message


def test_all_layers_walks_models_and_layers_held_in_attributes():
    class Holder(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.norm = keras.layers.BatchNormalization()
            self.pair = [keras.layers.Dense(2), keras.layers.Dense(3)]

        def call(self, x):
            return self.pair[1](self.pair[0](self.norm(x)))

    inner = keras.Sequential([keras.Input((4,)), Holder()])
    outer = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1)])
    found = models.all_layers(outer)
    names = [type(layer).__name__ for layer in found]
    assert found[0] is outer and len({id(x) for x in found}) == len(found)
    assert names.count("BatchNormalization") == 1 and names.count("Dense") == 3
    assert names.count("Holder") == 1 and names.count("Sequential") == 2


# -- training and saving ----------------------------------------------------------------------


@pytest.mark.slow  # training, then a .keras file
def test_trained_embedding_model_round_trips_through_keras_file(tmp_path):
    keras.utils.set_random_seed(0)
    model = models.build_embedding_model(
        "resnet18", embedding_dim=8, input_shape=SMALL, pooling="gem", weights=None,
        freeze_batchnorm=True,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=tfdml.losses.TripletNCALoss(order=2),
        jit_compile=False,
    )
    labels = pk_labels(4, 2)
    preprocess = models.get_preprocess("resnet18")
    x = preprocess(_images(len(labels), seed=4)).numpy()
    before = np.array(model.get_layer("embedding").kernel)
    history = model.fit(x, labels, batch_size=len(labels), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert not np.array_equal(before, np.array(model.get_layer("embedding").kernel))

    path = tmp_path / "embedder.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    x_new = preprocess(_images(5, seed=5)).numpy()
    np.testing.assert_allclose(loaded.predict(x_new, verbose=0), model.predict(x_new, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert isinstance(loaded.loss, tfdml.losses.TripletNCALoss) and loaded.loss.order == 2
    assert all(not layer.trainable for layer in _bn_layers(loaded))
    np.testing.assert_allclose(
        float(loaded.get_layer("gem_pool").p.numpy()), float(model.get_layer("gem_pool").p.numpy())
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", [b for b in models.BACKBONES if b != "resnet18"])
def test_every_keras_backbone_builds_and_embeds(name):
    size = {"inception_v3": 75, "inception_resnet_v2": 75, "xception": 71}.get(name, 32)
    if name == "nasnet_large":
        size = 64
    model = models.build_embedding_model(name, 4, (size, size, 3), weights=None)
    x = models.get_preprocess(name)(_images(2, size=size))
    out = model(x).numpy()
    assert out.shape == (2, 4) and np.all(np.isfinite(out))
    # Randomly initialized MobileNets give embeddings of norm < 1e-6 (the normalization's
    # floor), so compare with the formula rather than with norm 1.
    raw = keras.Model(model.input, model.get_layer("embedding").output)(x).numpy()
    norm = np.maximum(np.linalg.norm(raw, axis=1, keepdims=True), 1e-6)
    np.testing.assert_allclose(out, raw / norm, rtol=1e-4, atol=1e-6)
