"""Tests for tfdml.data.augment: shapes, ranges, determinism, variation, bbox, preprocess."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.data import augment


def _image(h=50, w=60, seed=0):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _ramp(h=40, w=40):
    """An image whose pixel values encode their column, so crops and flips are visible."""
    col = np.tile(np.arange(w, dtype=np.float32)[None, :, None], (h, 1, 3))
    return tf.constant(col * 255.0 / (w - 1))


@pytest.mark.parametrize("name,module", [
    ("resnet50", keras.applications.resnet50),
    ("inception_v3", keras.applications.inception_v3),
    ("efficientnet_b0", keras.applications.efficientnet),
    ("mobilenet_v2", keras.applications.mobilenet_v2),
    ("densenet121", keras.applications.densenet),
])
def test_get_preprocess_matches_keras_applications(name, module):
    x = tf.random.stateless_uniform([2, 8, 8, 3], (1, 2), maxval=255.0)
    np.testing.assert_allclose(augment.get_preprocess(name)(tf.identity(x)),
                               module.preprocess_input(tf.identity(x)), rtol=1e-6, atol=1e-5)


def test_get_preprocess_torch_none_and_callable():
    x = tf.fill([2, 2, 3], 255.0)
    out = augment.get_preprocess("torch")(x).numpy()
    std = np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(out[0, 0], (1.0 - np.array([0.485, 0.456, 0.406])) / std, rtol=1e-5)
    assert augment.get_preprocess(None)(x) is x
    fn = lambda image: image * 2  # noqa: E731
    assert augment.get_preprocess(fn) is fn
    with pytest.raises(ValueError, match="preprocess='resnet51'"):
        augment.get_preprocess("resnet51")


@pytest.mark.parametrize("preprocess", ["resnet50", "resnet18", "inception_v3",
                                        "efficientnet_b0", "caffe", "torch", "tf"])
def test_rgb_preprocess_converts_grayscale_to_rgb(preprocess):
    gray = tf.constant(np.random.default_rng(0).integers(0, 256, (8, 8, 1)), tf.float32)
    rgb = tf.image.grayscale_to_rgb(gray)
    fn = augment.get_preprocess(preprocess)
    np.testing.assert_allclose(fn(gray), fn(rgb), rtol=1e-6)
    for make in (lambda p: augment.train_transform(8, 10, preprocess=p),
                 lambda p: augment.pad_crop_transform(8, 2, preprocess=p)):
        out = make(preprocess)(gray, seed=(1, 2))
        assert out.shape == (8, 8, 3)
        np.testing.assert_allclose(out, make(preprocess)(rgb, seed=(1, 2)), rtol=1e-5, atol=1e-4)
    out = augment.eval_transform(6, 8, preprocess=preprocess)(gray)
    np.testing.assert_allclose(out, augment.eval_transform(6, 8, preprocess=preprocess)(rgb),
                               rtol=1e-5, atol=1e-4)


def test_grayscale_in_tf_data_and_with_unknown_channels():
    # The reported case: 8 x 8 x 1 digits, a ResNet50 transform, in a tf.data map.
    fn = augment.train_transform(32, 36, preprocess="resnet50")
    digits = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1)).astype("uint8")
    ds = tf.data.Dataset.from_tensor_slices(digits).map(lambda x: fn(x, seed=(0, 1)))
    assert all(x.shape == (32, 32, 3) for x in ds)
    # Channels known only when run: converted when there is one.
    pre = augment.get_preprocess("resnet50")
    traced = tf.function(pre, input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    assert traced(tf.zeros([2, 2, 1])).shape == (2, 2, 3)
    np.testing.assert_allclose(traced(tf.fill([2, 2, 3], 9.0)), pre(tf.fill([2, 2, 3], 9.0)))
    # Batches too.
    assert pre(tf.zeros([5, 2, 2, 1])).shape == (5, 2, 2, 3)


def test_grayscale_kept_without_rgb_preprocess_and_bad_channels_rejected():
    import tfdml

    gray = tf.fill([8, 8, 1], 100.0)
    for preprocess in (None, "none", lambda image: image / 255.0):
        assert augment.train_transform(8, 8, preprocess=preprocess)(gray).shape == (8, 8, 1)
    # The functions of tfdml.models.get_preprocess carry their mode: converted as well.
    keras_fn = tfdml.models.get_preprocess("resnet50")
    assert augment.eval_transform(8, 8, preprocess=keras_fn)(gray).shape == (8, 8, 3)
    with pytest.raises(ValueError, match=r"preprocess='resnet50'.*3 channels.*\[8, 8, 4\]"):
        augment.eval_transform(8, 8, preprocess="resnet50")(tf.zeros([8, 8, 4]))
    with pytest.raises(ValueError, match=r"preprocess='caffe'.*\[8, 8, 2\]"):
        augment.get_preprocess("caffe")(tf.zeros([8, 8, 2]))


def test_train_transform_shapes_range_determinism_and_variation():
    fn = augment.train_transform(32, 40)
    image = _image()
    out = fn(image, seed=(1, 2))
    assert out.shape == (32, 32, 3) and out.dtype == tf.float32
    assert float(tf.reduce_min(out)) >= 0.0 and float(tf.reduce_max(out)) <= 255.0
    np.testing.assert_array_equal(out, fn(image, seed=(1, 2)))
    outs = {fn(image, seed=(1, s)).numpy().tobytes() for s in range(10)}
    assert len(outs) >= 5  # crops (and flips) vary with the seed


def test_train_transform_flip_and_crop_both_vary():
    ramp = _ramp()
    flip_only = augment.train_transform(40, 40)  # crop == resize: only flips can change it
    firsts = [float(flip_only(ramp, seed=(0, s))[0, 0, 0]) for s in range(16)]
    assert min(firsts) == 0.0 and max(firsts) == 255.0
    crop_only = augment.train_transform(20, 40, flip=False)
    lefts = {round(float(crop_only(ramp, seed=(0, s))[0, 0, 0])) for s in range(16)}
    assert len(lefts) >= 4
    flipped = [crop_only(ramp, seed=(0, s)) for s in range(4)]
    for img in flipped:  # never flipped: values grow to the right
        assert float(img[0, -1, 0]) > float(img[0, 0, 0])


def test_train_transform_in_tf_data_with_preprocess():
    fn = augment.train_transform(24, 32, preprocess="resnet50")
    ds = tf.data.Dataset.from_tensors(_image()).repeat(4).enumerate()
    ds = ds.map(lambda i, x: fn(x, seed=tf.stack([tf.constant(0, tf.int64), i])))
    outs = [x.numpy() for x in ds]
    assert all(o.shape == (24, 24, 3) for o in outs)
    assert min(o.min() for o in outs) < 0  # ImageNet means were subtracted
    with pytest.raises(ValueError, match="crop_size=50"):
        augment.train_transform(50, 40)
    with pytest.raises(ValueError, match="resize_size=0"):
        augment.train_transform(10, 0)


def test_eval_transform_is_center_crop_and_deterministic():
    fn = augment.eval_transform(20, 40)
    ramp = _ramp()
    out = fn(ramp).numpy()
    assert out.shape == (20, 20, 3)
    np.testing.assert_allclose(out, ramp.numpy()[10:30, 10:30], atol=1e-4)
    np.testing.assert_array_equal(fn(ramp, seed=(1, 1)), fn(ramp, seed=(2, 2)))
    with pytest.raises(ValueError, match="crop_size=41"):
        augment.eval_transform(41, 40)


def test_pad_crop_transform_shifts_within_padding():
    fn = augment.pad_crop_transform(40, 4, flip=False)
    ramp = _ramp() + 1.0  # no zero pixels inside the image
    outs = [fn(ramp, seed=(5, s)).numpy() for s in range(20)]
    assert all(o.shape == (40, 40, 3) for o in outs)
    zero_cols = [int(np.sum(np.all(o == 0, axis=(0, 2)))) for o in outs]
    zero_rows = [int(np.sum(np.all(o == 0, axis=(1, 2)))) for o in outs]
    assert max(zero_cols) > 0 and max(zero_cols) <= 4 and max(zero_rows) <= 4
    assert len({o.tobytes() for o in outs}) > 5
    np.testing.assert_array_equal(fn(ramp, seed=(5, 0)), outs[0])
    with pytest.raises(ValueError, match="padding=-1"):
        augment.pad_crop_transform(40, -1)


def test_crop_to_bbox_exact_and_clipped():
    image = tf.reshape(tf.range(100 * 80 * 3), [100, 80, 3])
    out = augment.crop_to_bbox(image, [10.0, 20.0, 60.0, 50.0])
    np.testing.assert_array_equal(out, image.numpy()[10:60, 20:50])
    clipped = augment.crop_to_bbox(image, [-5.0, 70.0, 200.0, 90.0])
    assert clipped.shape == (100, 10, 3)
    degenerate = augment.crop_to_bbox(image, [30.0, 30.0, 30.0, 30.0])
    assert degenerate.shape == (1, 1, 3)


def test_small_helpers():
    assert augment.resize(tf.zeros([30, 60, 3]), 16).shape == (16, 16, 3)
    assert augment.resize(tf.zeros([30, 60, 3]), 16, keep_aspect_ratio=True).shape == (16, 32, 3)
    assert augment.center_crop(tf.zeros([10, 12, 3]), 8).shape == (8, 8, 3)
    ramp = _ramp()
    crops = {augment.random_crop(ramp, 8, seed=(0, s)).numpy().tobytes() for s in range(8)}
    assert len(crops) > 1
    np.testing.assert_array_equal(augment.random_crop(ramp, 8, seed=(0, 3)),
                                  augment.random_crop(ramp, 8, seed=(0, 3)))
    flips = {float(augment.random_flip(ramp, seed=(0, s))[0, 0, 0]) for s in range(16)}
    assert flips == {0.0, 255.0}
    with pytest.raises(ValueError, match="size=0"):
        augment.center_crop(ramp, 0)
