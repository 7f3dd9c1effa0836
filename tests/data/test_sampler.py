"""Tests for tfdml.data.pk_batches and eval_batches (PKSampler alone: test_pk.py)."""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from harness import slow_beyond
from test_pk import _labels  # noqa: E402  (the sampler's test labels)

import tfdml
from tfdml.data import PKSampler, augment, pk_batches


def test_one_sample_per_class_is_rejected():
    # With K = 1 no anchor of a batch has a positive: every tfdml loss would be zero.
    labels = _labels()
    x = np.zeros((len(labels), 4, 4, 1), "float32")
    for make in (lambda k: PKSampler(labels, 4, k), lambda k: pk_batches((x, labels), 4, k),
                 lambda k: pk_batches((x, labels), classes_per_batch=4, samples_per_class=k)):
        for k in (1, 0, True):
            with pytest.raises(ValueError, match=rf"`samples_per_class`.*at least 2.*no "
                                                 rf"anchor has a positive.*samples_per_class={k}\b"):
                make(k)


def _gray_and_rgb(labels, dtype="uint8"):
    """[N, 4, 4, 1] images whose value is the label, and their RGB version."""
    gray = np.broadcast_to(labels[:, None, None, None], (len(labels), 4, 4, 1)).astype(dtype)
    return gray, np.repeat(gray, 3, axis=-1)


@pytest.mark.parametrize("per_image", [False, True])
def test_pk_batches_channels_apply_to_in_memory_images(per_image):
    labels = _labels(num_classes=6, per_class=4)
    gray, rgb = _gray_and_rgb(labels)
    map_fn = (lambda image: image) if per_image else None  # per image, or per batch
    images, y = next(iter(pk_batches((gray, labels), 3, 2, seed=0, channels=3, map_fn=map_fn)))
    assert images.shape == (6, 4, 4, 3) and images.dtype == tf.uint8
    np.testing.assert_array_equal(images.numpy(), np.broadcast_to(
        y.numpy()[:, None, None, None], (6, 4, 4, 3)))
    images, y = next(iter(pk_batches((rgb, labels), 3, 2, seed=0, channels=1, map_fn=map_fn)))
    assert images.shape == (6, 4, 4, 1)
    np.testing.assert_array_equal(images.numpy()[:, 0, 0, 0], y.numpy())  # gray of gray
    # channels=None (the default) and the images' own channel count leave them as they are.
    for source, c in ((gray, None), (gray, 1), (rgb, None), (rgb, 3)):
        images, _ = next(iter(pk_batches((source, labels), 3, 2, seed=0, channels=c,
                                         map_fn=map_fn)))
        assert images.shape == (6, 4, 4, source.shape[-1])


def test_in_memory_channels_validation():
    labels = _labels(num_classes=6, per_class=4)
    rgba = np.zeros((len(labels), 4, 4, 4), "uint8")
    for fn in (lambda **kw: pk_batches((rgba, labels), 3, 2, **kw),
               lambda **kw: tfdml.data.eval_batches((rgba, labels), 8, **kw)):
        with pytest.raises(ValueError, match=r"`channels`.*channels=3 for images with 4"):
            fn(channels=3)
    features = np.zeros((len(labels), 5), "float32")
    with pytest.raises(ValueError, match=r"`channels`.*channels=1 with features of shape"):
        pk_batches((features, labels), 3, 2, channels=1)
    with pytest.raises(ValueError, match="channels=0"):
        tfdml.data.eval_batches((features, labels), 8, channels=0)
    assert next(iter(pk_batches((features, labels), 3, 2)))[0].shape == (6, 5)


def test_eval_batches_channels_apply_to_in_memory_images():
    labels = _labels(num_classes=6, per_class=4)
    gray, rgb = _gray_and_rgb(labels, "float32")
    images, y = next(iter(tfdml.data.eval_batches((gray, labels), 8, channels=3)))
    assert images.shape == (8, 4, 4, 3)
    np.testing.assert_array_equal(images.numpy(), rgb[:8])
    np.testing.assert_array_equal(y, labels[:8])
    images, _ = next(iter(tfdml.data.eval_batches((rgb, labels), 8, channels=1)))
    np.testing.assert_allclose(images.numpy(), gray[:8], rtol=1e-3)  # weights sum to ~1
    assert next(iter(tfdml.data.eval_batches((gray, labels), 8)))[0].shape == (8, 4, 4, 1)


def test_pk_batches_seeded_and_repeat_false_gives_fresh_epochs():
    labels = _labels(num_classes=8, per_class=4)
    x = np.arange(len(labels), dtype="float32")[:, None]
    first = [y.numpy() for _, y in pk_batches((x, labels), 4, 2, seed=3).take(6)]
    again = [y.numpy() for _, y in pk_batches((x, labels), 4, 2, seed=3).take(6)]
    other = [y.numpy() for _, y in pk_batches((x, labels), 4, 2, seed=4).take(6)]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert pk_batches((x, labels), 4, 2).cardinality() == tf.data.INFINITE_CARDINALITY
    finite = pk_batches((x, labels), 4, 2, seed=3, repeat=False)
    assert finite.cardinality() == 2
    epoch0 = [xb.numpy() for xb, _ in finite]
    epoch1 = [xb.numpy() for xb, _ in finite]
    assert len(epoch0) == len(epoch1) == 2  # ceil(8 / 4)
    assert not np.array_equal(epoch0, epoch1)
    for epoch in (epoch0, epoch1):  # every class once per epoch
        seen = labels[np.concatenate(epoch).astype(int).ravel()]
        np.testing.assert_array_equal(np.unique(seen), np.unique(labels))


@pytest.mark.parametrize("repeat", [False, True])
def test_pk_batches_initial_epoch_continues_an_interrupted_run(repeat):
    labels = _labels(num_classes=8, per_class=4)
    x = np.arange(len(labels), dtype="float32")[:, None]
    sampler = tfdml.data.PKSampler(labels, 4, 2, seed=3)
    resumed = pk_batches((x, labels), 4, 2, seed=3, repeat=repeat, initial_epoch=2)
    if repeat:  # one endless stream that starts with epoch 2's batches
        got = [xb.numpy().ravel() for xb, _ in resumed.take(2)]
        want = sampler.epoch_batches(2)
    else:  # each iteration (Keras epoch) draws the next epoch: 2, then 3
        got = [xb.numpy().ravel() for _ in range(2) for xb, _ in resumed]
        want = np.concatenate([sampler.epoch_batches(e) for e in (2, 3)])  # [4, P*K]
    np.testing.assert_array_equal(np.array(got), x[want][..., 0])
    # A fresh pipeline started at 0 draws other batches.
    fresh = [xb.numpy().ravel() for xb, _ in pk_batches((x, labels), 4, 2, seed=3).take(2)]
    assert not np.array_equal(fresh, got[:2])


def test_pk_batches_map_fn_gets_per_element_seeds():
    labels = np.repeat(np.arange(4), 3)
    x = np.zeros((12, 2), "float32")
    seeded = pk_batches((x, labels), 2, 2, seed=0,
                        map_fn=lambda image, seed: image + tf.cast(seed[1] % 1000, tf.float32))
    images, _ = next(iter(seeded))
    assert len(np.unique(images.numpy()[:, 0])) == 4  # one seed per element
    images2, _ = next(iter(pk_batches((x, labels), 2, 2, seed=0, map_fn=lambda image, seed:
                                      image + tf.cast(seed[1] % 1000, tf.float32))))
    np.testing.assert_array_equal(images, images2)
    plain = pk_batches((x, labels), 2, 2, seed=0, map_fn=lambda image: image + 1.0)
    np.testing.assert_array_equal(next(iter(plain))[0], np.ones((4, 2)))


def _write_jpegs(directory, labels, size=24):
    """Solid-colour JPEGs: the red channel encodes the class, so decoding can be checked."""
    paths = []
    for i, label in enumerate(labels):
        image = np.zeros((size, size + i % 3, 3), np.uint8)
        image[..., 0] = 20 * label + 10
        path = os.path.join(directory, f"img_{i}.jpg")
        tf.io.write_file(path, tf.io.encode_jpeg(image, quality=100))
        paths.append(path)
    return paths


def test_pk_batches_decodes_jpeg_files(tmp_path):
    labels = np.repeat(np.arange(6), 3)
    paths = _write_jpegs(str(tmp_path), labels)
    fn = augment.eval_transform(16, 20)
    ds = pk_batches((paths, labels), 3, 3, seed=0, map_fn=fn)
    for images, y in ds.take(4):
        assert images.shape == (9, 16, 16, 3)
        red = images.numpy()[:, 8, 8, 0]
        np.testing.assert_allclose(red, 20 * y.numpy() + 10, atol=3)
    # Random augmentation is reproducible under the pipeline seed, and varies with it.
    train = augment.train_transform(12, 20)
    a = [x.numpy() for x, _ in pk_batches((paths, labels), 3, 3, seed=5, map_fn=train).take(3)]
    b = [x.numpy() for x, _ in pk_batches((paths, labels), 3, 3, seed=5, map_fn=train).take(3)]
    c = [x.numpy() for x, _ in pk_batches((paths, labels), 3, 3, seed=6, map_fn=train).take(3)]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_corrupt_file_raise_names_path(tmp_path):
    labels = np.repeat(np.arange(3), 2)
    paths = _write_jpegs(str(tmp_path), labels)
    with open(paths[2], "wb") as f:
        f.write(b"not a jpeg")
    ds = pk_batches((paths, labels), 3, 2, seed=0, map_fn=augment.eval_transform(16, 16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="img_2.jpg"):
        next(iter(ds))


#: File ``bad`` broken, drawn with ``seed=bad``: seeds 1, 0 and 2 put it first, inside and
#: last in the first batch. On every commit those three in an endless stream, and the last
#: with ``repeat=False`` (the end of the stream: its only batch); the others in the slow tier.
@pytest.mark.parametrize("repeat,bad", slow_beyond(
    [pytest.param(repeat, bad, id=f"{repeat}-{bad}") for bad in range(6)
     for repeat in (True, False)],
    {"True-0", "True-1", "True-2", "False-2"}))
def test_corrupt_file_at_any_position_is_named(tmp_path, repeat, bad):
    labels = np.repeat(np.arange(3), 2)
    paths = _write_jpegs(str(tmp_path), labels)
    with open(paths[0], "rb") as f:
        good = f.read()
    for i, path in enumerate(paths):
        with open(path, "wb") as f:
            f.write(b"broken" if i == bad else good)
    ds = pk_batches((paths, labels), 3, 2, seed=bad, repeat=repeat,
                    steps_per_epoch=1 if not repeat else None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"img_{bad}.jpg"):
        list(ds.take(2))


def test_corrupt_file_skip_warns_and_keeps_batch_size(tmp_path, caplog):
    labels = np.repeat(np.arange(3), 2)
    paths = _write_jpegs(str(tmp_path), labels)
    with open(paths[2], "wb") as f:
        f.write(b"not a jpeg")
    os.remove(paths[5])  # a missing file is skipped too
    ds = pk_batches((paths, labels), 3, 2, seed=0, on_error="skip", prefetch=None,
                    map_fn=augment.eval_transform(16, 16))
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        images, y = next(iter(ds))
    assert images.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(images.numpy()[:, 8, 8, 0], 20 * y.numpy() + 10, atol=3)
    assert "img_2.jpg" in caplog.text and "img_5.jpg" in caplog.text


def test_class_whose_images_all_fail_raises_even_with_skip(tmp_path):
    labels = np.repeat(np.arange(2), 2)
    paths = _write_jpegs(str(tmp_path), labels)
    for p in paths[:2]:
        with open(p, "wb") as f:
            f.write(b"")
    ds = pk_batches((paths, labels), 2, 2, seed=0, on_error="skip",
                    map_fn=augment.eval_transform(16, 16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="img_0.jpg"):
        next(iter(ds))


def test_batch_whose_images_all_fail_raises_not_hangs(tmp_path):
    labels = np.repeat(np.arange(2), 2)
    paths = _write_jpegs(str(tmp_path), labels)
    os.remove(paths[0])
    for p in paths[1:]:
        with open(p, "wb") as f:
            f.write(b"x")
    for on_error in ("raise", "skip"):
        ds = pk_batches((paths, labels), 2, 2, seed=0, on_error=on_error,
                        map_fn=augment.eval_transform(16, 16))
        with pytest.raises(tf.errors.InvalidArgumentError, match="img_3.jpg"):
            next(iter(ds))


@pytest.mark.parametrize("kwargs,match", [
    ({"on_error": "ignore"}, "on_error='ignore'"),
    ({"map_fn": 3}, "map_fn=3"),
    ({"crop_to_bbox": True}, "crop_to_bbox"),
    ({"channels": 0}, "channels=0"),
    ({"initial_epoch": -1}, "initial_epoch=-1"),
    ({"initial_epoch": 1.5}, "initial_epoch=1.5"),
])
def test_pk_batches_validation(kwargs, match):
    x, y = np.zeros((8, 2), "float32"), np.repeat(np.arange(4), 2)
    with pytest.raises(ValueError, match=match):
        pk_batches((x, y), 2, 2, **kwargs)
    with pytest.raises(ValueError, match="source"):
        pk_batches(x, 2, 2)


@pytest.mark.slow  # a Keras Applications backbone trained
def test_model_fit_with_keras_applications_backbone():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(8), 4)
    x = rng.integers(0, 256, (32, 40, 40, 3)).astype("uint8")
    fn = augment.train_transform(32, 36, preprocess="mobilenet_v3_small")
    ds = pk_batches((x, labels), 4, 2, seed=0, map_fn=fn)
    backbone = keras.applications.MobileNetV3Small(
        input_shape=(32, 32, 3), include_top=False, weights=None, pooling="avg",
        include_preprocessing=False, minimalistic=True)
    model = keras.Sequential([backbone, keras.layers.Dense(16)])
    model.compile(optimizer="adam", loss=tfdml.losses.TripletNCALoss(order=2), jit_compile=False)
    history = model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)
    assert np.all(np.isfinite(history.history["loss"]))
    # One sampler epoch per Keras epoch, no steps_per_epoch needed: ceil(8 / 4) = 2 steps.
    finite = pk_batches((x, labels), 4, 2, seed=0, map_fn=fn, repeat=False)
    history = model.fit(finite, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))
