"""The exported SavedModel: raw uint8 in, the Keras model's L2-normalized embeddings out."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml.search
from tfdml import models
from tfdml.export import export_embedding_model

SMALL = (32, 32, 3)


def _images(n, height=32, width=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, height, width, 3)).astype(np.uint8)


@pytest.fixture(scope="module")
def resnet18_model():
    keras.utils.set_random_seed(1)
    return models.build_embedding_model("resnet18", embedding_dim=8, input_shape=SMALL,
                                        weights=None, pooling="gem")


@pytest.fixture(scope="module")
def exported(resnet18_model, tmp_path_factory):
    """The ResNet18 embedding model exported once with "auto" (its own torch) preprocessing."""
    path = tmp_path_factory.mktemp("export") / "embedder"
    export_embedding_model(resnet18_model, path)
    return path


def _tiny_model(input_shape=(12, 10, 3), embedding_dim=5, normalize=True):
    """A small conv net standing in for a backbone (no preprocessing of its own)."""
    layers = [
        keras.Input(input_shape),
        keras.layers.Conv2D(4, 3, activation="relu",
                            kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(
            embedding_dim, kernel_initializer=keras.initializers.GlorotUniform(seed=3)
        ),
    ]
    if normalize:
        from tfdml.layers import L2Normalization

        layers.append(L2Normalization())
    return keras.Sequential(layers)


def test_saved_model_matches_keras_model_at_two_batch_sizes(resnet18_model, exported):
    loaded = tf.saved_model.load(str(exported))
    serve = loaded.signatures["serving_default"]
    spec = serve.structured_input_signature[1]["images"]
    assert spec.dtype == tf.uint8 and spec.shape.as_list() == [None, 32, 32, 3]

    preprocess = models.get_preprocess("resnet18")
    for batch in (1, 5):
        images = _images(batch, seed=batch)
        got = serve(images=tf.constant(images))["embeddings"].numpy()
        expected = resnet18_model.predict(preprocess(images), verbose=0)
        assert got.shape == (batch, 8) and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    # The preprocessing really is inside: feeding unpreprocessed pixels to Keras differs.
    images = _images(2, seed=9)
    raw = resnet18_model.predict(images.astype(np.float32), verbose=0)
    assert not np.allclose(serve(images=tf.constant(images))["embeddings"].numpy(), raw, atol=1e-3)


def test_caffe_preprocessing_and_resize_inside_the_saved_model(tmp_path):
    model = _tiny_model(input_shape=(12, 10, 3))
    path = tmp_path / "resized"
    export_embedding_model(model, path, preprocess="resnet50", image_size=(20, 16))
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    preprocess = models.get_preprocess("resnet50")
    for batch in (2, 7):
        images = _images(batch, 20, 16, seed=batch)
        resized = tf.image.resize(tf.cast(images, tf.float32), (12, 10), method="bilinear")
        expected = model.predict(preprocess(resized), verbose=0)
        got = serve(images=tf.constant(images))["embeddings"].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_any_image_size_and_normalization_of_an_unnormalized_model(tmp_path):
    model = _tiny_model(input_shape=(12, 10, 3), normalize=False)
    path = tmp_path / "any"

    def halve(x):
        return x / 2.0

    export_embedding_model(model, path, preprocess=halve, image_size=(None, None))
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    for height, width in ((12, 10), (30, 17)):
        images = _images(3, height, width, seed=height)
        x = tf.image.resize(tf.cast(images, tf.float32), (12, 10))
        expected = model.predict(halve(x), verbose=0)
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
        got = serve(images=tf.constant(images))["embeddings"].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize(("image_size", "accepted"), [(None, (12, 10)), ((20, 16), (20, 16))])
def test_images_of_another_size_are_refused_when_served(tmp_path, image_size, accepted):
    # image_size=None promises the model's input size only. The signature declares it, but a
    # call does not enforce it: a global-pooling model used to embed 40 x 40 images as they
    # came. Now the served function refuses them, naming the size it takes.
    model = _tiny_model(input_shape=(12, 10, 3))
    path = tmp_path / "fixed"
    export_embedding_model(model, path, preprocess=None, image_size=image_size)
    loaded = tf.saved_model.load(str(path))
    serve = loaded.signatures["serving_default"]
    assert serve.structured_input_signature[1]["images"].shape.as_list() == [None, *accepted, 3]
    got = serve(images=tf.constant(_images(2, *accepted)))["embeddings"]
    assert got.shape == (2, 5)
    for height, width in ((40, 40), (accepted[0], accepted[1] + 1)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"images must be {accepted[0]} x {accepted[1]} pixels.*"
                                 r"image_size=\(None, None\)"):
            serve(images=tf.constant(_images(2, height, width)))


def test_a_model_of_unknown_input_size_serves_any_size_unresized(tmp_path):
    model = _tiny_model(input_shape=(None, None, 3))
    export_embedding_model(model, tmp_path / "free", preprocess=None)
    serve = tf.saved_model.load(str(tmp_path / "free")).signatures["serving_default"]
    for height, width in ((12, 10), (30, 17)):
        images = _images(2, height, width, seed=height)
        expected = model.predict(images.astype(np.float32), verbose=0)
        got = serve(images=tf.constant(images))["embeddings"].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_model_loaded_from_keras_file_needs_preprocess_named(resnet18_model, tmp_path):
    model_path = tmp_path / "m.keras"
    resnet18_model.save(model_path)
    loaded = keras.models.load_model(model_path)
    with pytest.raises(ValueError, match=r"`preprocess`.*Received: preprocess='auto'"):
        export_embedding_model(loaded, tmp_path / "x")


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"preprocess": "alexnet"}, "preprocess"),
        ({"image_size": (32,)}, "image_size"),
        ({"image_size": (0, 32)}, "image_size"),
        ({"normalize": "yes"}, "normalize"),
        ({"resize_method": "cubic"}, "resize_method"),
    ],
)
def test_export_rejects_bad_arguments(kwargs, arg, tmp_path):
    with pytest.raises(ValueError, match=rf"`{arg}`.*Received: {arg}="):
        export_embedding_model(_tiny_model(), tmp_path / "bad", **{"preprocess": None, **kwargs})


def test_export_rejects_a_model_that_is_not_an_image_model(tmp_path):
    flat = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"`model`.*Received: model.input_shape="):
        export_embedding_model(flat, tmp_path / "flat", preprocess=None)
    with pytest.raises(ValueError, match=r"`model`.*Received: model="):
        export_embedding_model("model.keras", tmp_path / "str", preprocess=None)


@pytest.mark.slow  # runs an example script
def test_export_and_query_example_runs_offline(tmp_path, capsys):
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "examples" / "export_and_query.py"
    spec = importlib.util.spec_from_file_location("export_and_query", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    found, calibrated, precision = example.main(
        ["--steps", "0", "--gallery", "40", "--queries", "3", "--k", "4", "--calibration", "30",
         "--out", str(tmp_path)]
    )
    assert found.indices.shape == found.scores.shape == found.labels.shape == (3, 4)
    assert np.all(np.diff(found.scores, axis=1) <= 1e-7) and np.all(found.scores <= 1 + 1e-5)
    assert 0.0 <= precision <= 1.0 and 0.0 <= calibrated.precision <= 1.0
    assert (tmp_path / "embedder" / "saved_model.pb").exists()
    loaded = tfdml.search.Index.load(tmp_path / "gallery_index.npz")
    assert len(loaded) == 40 and loaded.ids is not None
    out = capsys.readouterr().out
    assert out.count("-> top-4 digits (cosine)") == 3 and "precision@4" in out
    assert "(raw pixels " in out and "untrained network " in out
    assert "match threshold" in out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gallery", "1500", "--calibration", "500"], "--calibration 500"),  # 1797 digits
        (["--k", "0"], "--k"),
        (["--k", "50", "--gallery", "40"], "--gallery 40"),
        (["--steps", "-1"], "--steps"),
    ],
)
def test_export_and_query_example_refuses_sizes_it_cannot_give(argv, named, capsys):
    import importlib.util
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "examples" / "export_and_query.py"
    spec = importlib.util.spec_from_file_location("export_and_query", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with pytest.raises(SystemExit) as info:
        example.main(argv)
    assert info.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.slow  # a fresh Python process importing TensorFlow: ~10 s
def test_saved_model_is_served_without_tfdml(resnet18_model, exported, tmp_path):
    import os
    import subprocess
    import sys

    path = exported
    images = _images(3, seed=11)
    np.save(tmp_path / "images.npy", images)
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        f"serve = tf.saved_model.load({str(path)!r}).signatures['serving_default']\n"
        f"x = np.load({str(tmp_path / 'images.npy')!r})\n"
        "out = serve(images=tf.constant(x))['embeddings'].numpy()\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, out)\n"
        "assert 'tfdml' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    expected = resnet18_model.predict(models.get_preprocess("resnet18")(images), verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5)


def test_metric_model_exports_its_embedding_model(tmp_path):
    import tfdml

    embedder = _tiny_model()
    model = tfdml.models.MetricModel(embedder, tfdml.losses.ArcFaceLoss(3))
    path = tmp_path / "wrapped"
    export_embedding_model(model, path, preprocess=None)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    images = _images(2, 12, 10)
    got = serve(images=tf.constant(images))["embeddings"].numpy()
    expected = embedder.predict(images.astype(np.float32), verbose=0)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # The loss's class weights ([3, 5]) are not in the SavedModel; the embedder's are.
    shapes = [shape for _, shape in tf.train.list_variables(str(path / "variables" / "variables"))]
    assert [3, 3, 3, 4] in shapes and [3, 5] not in shapes, shapes


def test_huge_embeddings_are_normalized_exactly_when_served(tmp_path):
    # A model whose embeddings overflow float32 when squared: the served vectors are still
    # the unit vectors, not zeros (tfdml.ops.l2_normalize scales before squaring).
    model = _tiny_model(normalize=False)
    huge = keras.Sequential([model, keras.layers.Rescaling(1e30)])
    export_embedding_model(huge, tmp_path / "huge", preprocess=None)
    serve = tf.saved_model.load(str(tmp_path / "huge")).signatures["serving_default"]
    images = _images(3, 12, 10)
    got = serve(images=tf.constant(images))["embeddings"].numpy()
    want = model.predict(images.astype(np.float32), verbose=0).astype(np.float64)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
