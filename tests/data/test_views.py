"""tfdml.data.numpy_views and tfdml.data.views: two augmented views per image (SimCLR,
Barlow Twins), in NumPy (every backend) and as tf.data map functions.

The NumPy tests are marked ``multibackend``; the tf.data ones import TensorFlow when they
run (under TensorFlow only).
"""

import colorsys

import numpy as np
import pytest

import tfdml
from tfdml.data import numpy_views as nv

RNG = np.random.default_rng(11)
IMAGES = RNG.integers(0, 256, size=(12, 16, 16, 3)).astype(np.uint8)
UNIT = RNG.uniform(0, 1, size=(16, 16, 3)).astype(np.float32)


def _augmenters(size=12):
    return {"simclr": nv.simclr_augmenter(size),
            "simclr_solarized": nv.simclr_augmenter(size, solarize_probability=0.5,
                                                    blur_probability=1.0),
            "barlow1": nv.barlow_augmenter(size, view=1),
            "barlow2": nv.barlow_augmenter(size, view=2)}


def _blur_reference(image, sigma, radius):
    """A direct 2-D convolution with the outer product of the 1-D Gaussian, reflected edges."""
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-x * x / (2 * sigma * sigma))
    kernel = np.outer(g, g) / g.sum() ** 2
    padded = np.pad(image.astype(np.float64), [(radius, radius), (radius, radius), (0, 0)],
                    mode="reflect")
    out = np.zeros(image.shape, np.float64)
    for dy in range(2 * radius + 1):
        for dx in range(2 * radius + 1):
            out += kernel[dy, dx] * padded[dy:dy + image.shape[0], dx:dx + image.shape[1]]
    return out


# -- NumPy: the ops ----------------------------------------------------------------------------


@pytest.mark.multibackend
def test_deterministic_ops_equal_plain_numpy_references():
    gray = nv.to_grayscale(UNIT)
    luma = UNIT @ np.array([0.2989, 0.5870, 0.1140])
    assert gray.shape == UNIT.shape and gray.dtype == np.float32
    for c in range(3):
        np.testing.assert_allclose(gray[..., c], luma, atol=1e-6)
    np.testing.assert_array_equal(nv.to_grayscale(UNIT[..., :1]), UNIT[..., :1])
    np.testing.assert_allclose(nv.solarize(UNIT, 0.3), np.where(UNIT >= 0.3, 1 - UNIT, UNIT))
    for sigma, kernel_size, radius in ((1.3, None, 0), (0.7, 5, 2), (2.0, 9, 4)):
        got = nv.gaussian_blur(UNIT, sigma, kernel_size)
        want = UNIT if radius == 0 else _blur_reference(UNIT, sigma, radius)
        np.testing.assert_allclose(got, want, atol=1e-5)
    image = RNG.uniform(0, 1, size=(40, 40, 3)).astype(np.float32)  # default: 10% of 40 -> 5 taps
    np.testing.assert_allclose(nv.gaussian_blur(image, 1.0), _blur_reference(image, 1.0, 2),
                               atol=1e-5)
    for op in (nv.adjust_brightness, nv.adjust_contrast, nv.adjust_saturation):
        np.testing.assert_allclose(op(UNIT, 1.0), UNIT, atol=1e-6)
    np.testing.assert_allclose(nv.adjust_hue(UNIT, 0.0), UNIT, atol=1e-5)
    np.testing.assert_allclose(nv.adjust_hue(nv.adjust_hue(UNIT, 0.3), -0.3), UNIT, atol=1e-5)
    np.testing.assert_allclose(nv.adjust_brightness(UNIT, 2.0), np.clip(2 * UNIT, 0, 1))
    np.testing.assert_allclose(nv.adjust_saturation(UNIT, 0.0), gray, atol=1e-6)
    np.testing.assert_allclose(nv.adjust_contrast(UNIT, 0.0), np.full_like(UNIT, luma.mean()),
                               atol=1e-6)


@pytest.mark.multibackend
def test_adjust_hue_equals_colorsys():
    image = UNIT[:6, :6]
    got = nv.adjust_hue(image, 0.25)
    for y, x in np.ndindex(6, 6):
        h, s, v = colorsys.rgb_to_hsv(*image[y, x].astype(float))
        np.testing.assert_allclose(got[y, x], colorsys.hsv_to_rgb((h + 0.25) % 1, s, v),
                                   atol=1e-5)


@pytest.mark.multibackend
def test_color_jitter_ranges_channels_and_no_op():
    one = UNIT[..., :1]
    for image in (UNIT, one):
        out = nv.color_jitter(image, 0.8, 0.8, 0.8, 0.2, rng=np.random.default_rng(0))
        assert out.shape == image.shape and out.dtype == np.float32
        assert out.min() >= 0 and out.max() <= 1 and not np.allclose(out, image)
        same = nv.color_jitter(image, 0, 0, 0, 0, rng=np.random.default_rng(0))
        np.testing.assert_allclose(same, image, atol=1e-5)
    np.testing.assert_array_equal(nv.adjust_hue(one, 0.3), one)
    np.testing.assert_array_equal(nv.adjust_saturation(one, 0.3), one)


def _inside_and_scaled(box, height, width, scale, ratio):
    top, left, h, w = box
    assert 0 <= top and 0 <= left and 1 <= h and 1 <= w
    assert top + h <= height and left + w <= width
    # w and h are rounded from a real box whose area share is in `scale`, ratio in `ratio`
    area = height * width
    return ((w - 0.5) * (h - 0.5) <= scale[1] * area and (w + 0.5) * (h + 0.5) >= scale[0] * area
            and (w - 0.5) / (h + 0.5) <= ratio[1] and (w + 0.5) / (h - 0.5) >= ratio[0])


@pytest.mark.multibackend
def test_random_crop_box_stays_inside_and_respects_scale():
    scale, ratio = (0.2, 0.5), (3 / 4, 4 / 3)
    for seed in range(200):
        box = nv.random_crop_box(32, 24, scale, ratio, rng=np.random.default_rng(seed))
        central = box == (4, 0, 24, 24)  # the fallback: the central crop of ratio <= 4/3
        assert _inside_and_scaled(box, 32, 24, scale, ratio) or central, box
    # a box that cannot fit: the central crop with the aspect ratio clamped to `ratio`
    assert nv.random_crop_box(10, 100, (0.9, 1.0), (1, 2), np.random.default_rng(0)) == (
        0, 40, 10, 20)
    assert nv.random_crop_box(100, 10, (0.9, 1.0), (1, 2), np.random.default_rng(0)) == (
        45, 0, 10, 10)
    out = nv.random_resized_crop(IMAGES[0], 8, rng=np.random.default_rng(0))
    assert out.shape == (8, 8, 3) and out.dtype == np.float32


# -- NumPy: the augmenters and TwoViews -----------------------------------------------------


@pytest.mark.multibackend
def test_augmenters_give_float32_views_in_range_that_follow_their_generator():
    for name, fn in _augmenters().items():
        outs = [fn(IMAGES[0], rng=np.random.default_rng(s)) for s in (0, 0, 1, 2)]
        assert outs[0].shape == (12, 12, 3) and outs[0].dtype == np.float32, name
        assert all(o.min() >= 0 and o.max() <= 255 for o in outs), name
        np.testing.assert_array_equal(outs[0], outs[1])
        assert not np.array_equal(outs[0], outs[2]) and not np.array_equal(outs[0], outs[3])
    sixteen = nv.simclr_augmenter(8)(IMAGES[0].astype(np.uint16) * 257, np.random.default_rng(0))
    np.testing.assert_allclose(sixteen, nv.simclr_augmenter(8)(IMAGES[0], np.random.default_rng(0)),
                               atol=1e-3)
    # A 1-channel view for ResNet-50: the same random view in [0, 255], made RGB, then
    # Keras' "caffe" normalization (BGR order, ImageNet means subtracted).
    gray = nv.simclr_augmenter(8, preprocess="resnet50")(IMAGES[0, ..., :1],
                                                         np.random.default_rng(0))
    plain = nv.simclr_augmenter(8)(IMAGES[0, ..., :1], np.random.default_rng(0))
    assert gray.shape == (8, 8, 3) and plain.shape == (8, 8, 1)
    np.testing.assert_allclose(gray, plain - np.float32([103.939, 116.779, 123.68]),
                               atol=1e-4)
    assert nv.barlow_augmenter(8)(IMAGES[0, ..., :1], np.random.default_rng(0)).shape == (8, 8, 1)


@pytest.mark.multibackend
def test_two_views_differ_and_repeat_for_a_seed():
    for views in (nv.simclr_views(12), nv.barlow_views(12),
                  nv.TwoViews(nv.simclr_augmenter(12), nv.barlow_augmenter(12))):
        v1, v2 = views(IMAGES[1], np.random.default_rng(3))
        w1, w2 = views(IMAGES[1], np.random.default_rng(3))
        assert v1.shape == v2.shape == (12, 12, 3)
        assert not np.array_equal(v1, v2)
        np.testing.assert_array_equal(v1, w1)
        np.testing.assert_array_equal(v2, w2)
    barlow = nv.barlow_views(12)
    assert barlow.first.settings["blur_probability"] == 1.0
    assert barlow.second.settings["solarize_probability"] == 0.2


# -- NumPy: TwoViewDataset --------------------------------------------------------------------


@pytest.mark.multibackend
def test_two_view_dataset_structure_and_reproducibility():
    data = tfdml.data.TwoViewDataset(IMAGES, nv.simclr_views(8), 5, seed=4)
    again = tfdml.data.TwoViewDataset(IMAGES, nv.simclr_views(8), 5, seed=4)
    assert len(data) == 2
    batch = data[1]
    assert len(batch) == 1 and len(batch[0]) == 2
    v1, v2 = batch[0]
    assert v1.shape == v2.shape == (5, 8, 8, 3) and v1.dtype == np.float32
    assert not np.array_equal(v1, v2)
    for i in range(2):
        for k in (0, 1):
            np.testing.assert_array_equal(data[i][0][k], again[i][0][k])
    seen = np.concatenate([data.batch_indices(i) for i in range(2)])
    assert len(set(seen.tolist())) == 10  # one pass: no image twice
    first = data[0][0][0]
    data.on_epoch_end()
    assert data.epoch == 1 and not np.array_equal(data[0][0][0], first)
    other = tfdml.data.TwoViewDataset(IMAGES, nv.simclr_views(8), 5, seed=5)
    assert not np.array_equal(other[0][0][0], first)


@pytest.mark.multibackend
def test_two_view_dataset_labels_grayscale_order_and_steps():
    labels = np.arange(12) * 10
    data = tfdml.data.TwoViewDataset(IMAGES[..., 0], nv.barlow_views(8), 4, seed=0,
                                     labels=labels, shuffle=False, steps_per_epoch=7)
    assert len(data) == 7
    (v1, v2), y = data[4]
    assert v1.shape == v2.shape == (4, 8, 8, 1)
    np.testing.assert_array_equal(y, [40, 50, 60, 70])  # the second pass, in order
    np.testing.assert_array_equal(data[0][1], [0, 10, 20, 30])
    with pytest.raises(IndexError, match="index"):
        data[7]


@pytest.mark.multibackend
def test_bad_arguments_raise_value_errors_naming_them():
    views = nv.simclr_views(8)
    cases = [
        (lambda: tfdml.data.TwoViewDataset(IMAGES, views, 13), "batch_size"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, views, 0), "batch_size"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES[0, 0], views, 2), "images"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES[:0], views, 1), "images"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, views, 2, labels=np.arange(11)), "labels"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, "simclr", 2), "views"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, views, 2, seed=-1), "seed"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, views, 2, steps_per_epoch=0),
         "steps_per_epoch"),
        (lambda: tfdml.data.TwoViewDataset(IMAGES, nv.simclr_augmenter(8), 2)[0], "views"),
        (lambda: nv.simclr_augmenter(0), "size"),
        (lambda: nv.simclr_augmenter(8, scale=(0.5, 0.2)), "scale"),
        (lambda: nv.simclr_augmenter(8, scale=(0.0, 1.0)), "scale"),
        (lambda: nv.simclr_augmenter(8, jitter_strength=3.0), "jitter_strength"),
        (lambda: nv.simclr_augmenter(8, blur_probability=1.5), "blur_probability"),
        (lambda: nv.barlow_augmenter(8, view=3), "view"),
        (lambda: nv.barlow_views(8, view=1), "view"),
        (lambda: nv.TwoViews(None), "first"),
        (lambda: nv.TwoViews(views, second=3), "second"),
        (lambda: nv.color_jitter(UNIT, hue=0.7), "hue"),
        (lambda: nv.color_jitter(UNIT, brightness=-1), "brightness"),
        (lambda: nv.color_jitter(np.zeros((4, 4, 2))), "color_jitter"),
        (lambda: nv.gaussian_blur(UNIT, 0.0), "sigma"),
        (lambda: nv.gaussian_blur(UNIT, 1.0, kernel_size=0), "kernel_size"),
        (lambda: nv.random_resized_crop(UNIT[0], 8), "image"),
        (lambda: nv.random_crop_box(8, 8, ratio=(2, 1)), "ratio"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()


# -- tf.data ---------------------------------------------------------------------------------


def test_tf_ops_agree_with_numpy():
    from tfdml.data import views

    for image in (UNIT, UNIT[..., :1]):
        np.testing.assert_allclose(views.to_grayscale(image), nv.to_grayscale(image), atol=1e-5)
        np.testing.assert_allclose(views.solarize(image, 0.4), nv.solarize(image, 0.4),
                                   atol=1e-5)
        for sigma, kernel_size in ((1.3, 5), (0.6, 3), (2.0, None)):
            np.testing.assert_allclose(views.gaussian_blur(image, sigma, kernel_size),
                                       nv.gaussian_blur(image, sigma, kernel_size), atol=1e-5)
        for name, factor in (("adjust_brightness", 1.3), ("adjust_contrast", 0.6),
                             ("adjust_saturation", 1.7), ("adjust_hue", -0.2)):
            np.testing.assert_allclose(getattr(views, name)(image, factor),
                                       getattr(nv, name)(image, factor), atol=1e-5)
    big = RNG.uniform(0, 1, size=(40, 30, 3)).astype(np.float32)
    np.testing.assert_allclose(views.gaussian_blur(big, 1.1), nv.gaussian_blur(big, 1.1),
                               atol=1e-5)


def test_tf_crop_box_and_augmenters():
    import tensorflow as tf

    from tfdml.data import views

    scale, ratio = (0.2, 0.5), (3 / 4, 4 / 3)
    boxes = tf.stack([views.random_crop_box(32, 24, scale, ratio, seed=(s, 1)) for s in range(50)])
    for box in boxes.numpy().tolist():
        assert _inside_and_scaled(box, 32, 24, scale, ratio) or box == [4, 0, 24, 24], box
    assert views.random_crop_box(10, 100, (0.9, 1.0), (1, 2), seed=(0, 0)).numpy().tolist() == [
        0, 40, 10, 20]
    for fn in (views.simclr_views(12, solarize_probability=0.5), views.barlow_views(12)):
        v1, v2 = fn(IMAGES[0], seed=(1, 2))
        w1, w2 = fn(IMAGES[0], seed=(1, 2))
        assert v1.shape == (12, 12, 3) and v1.dtype == tf.float32
        for v in (v1, v2):
            assert 0 <= float(tf.reduce_min(v)) and float(tf.reduce_max(v)) <= 255
        np.testing.assert_array_equal(v1, w1)
        np.testing.assert_array_equal(v2, w2)
        assert not np.array_equal(v1, v2)
        assert not np.array_equal(v1, fn(IMAGES[0], seed=(1, 3))[0])
    gray = views.simclr_augmenter(8, preprocess="resnet50")(IMAGES[0, ..., :1], seed=(0, 0))
    assert gray.shape == (8, 8, 3)


def test_two_view_batches_structure_and_reproducibility():
    from tfdml.data import views

    data = views.two_view_batches(IMAGES, views.simclr_views(8), 4, seed=2)
    epochs = [list(data), list(data)]  # two iterations: two epochs
    assert len(epochs[0]) == 3
    batch = epochs[0][0]
    assert len(batch) == 1 and len(batch[0]) == 2 and batch[0][0].shape == (4, 8, 8, 3)
    assert batch[0][0].dtype == "float32"
    assert not np.array_equal(batch[0][0], batch[0][1])  # the two views
    assert not np.array_equal(batch[0][0], epochs[1][0][0][0])  # the next epoch

    def crops(image, seed):  # cheaper to trace than SimCLR's views
        return (views.random_resized_crop(image, 8, seed=seed),
                views.random_resized_crop(image, 8, seed=seed + 1))

    def batches(**kwargs):
        data = views.two_view_batches(IMAGES, crops, 4, seed=2, **kwargs)
        return [list(data), list(data)]

    first, again = batches(), batches()
    for epoch in range(2):
        for b, c in zip(first[epoch], again[epoch], strict=True):
            np.testing.assert_array_equal(b[0][0], c[0][0])
            np.testing.assert_array_equal(b[0][1], c[0][1])
    assert not np.array_equal(first[0][0][0][0], first[1][0][0][0])
    labeled = views.two_view_batches(IMAGES[..., 0], crops, 4, seed=1, labels=np.arange(12),
                                     shuffle=False)
    (v1, v2), y = next(iter(labeled))
    assert v1.shape == v2.shape == (4, 8, 8, 1)
    np.testing.assert_array_equal(y, [0, 1, 2, 3])


def test_tf_bad_arguments_raise_value_errors_naming_them():
    from tfdml.data import views

    cases = [
        (lambda: views.two_view_batches(IMAGES, views.simclr_views(8), 13), "batch_size"),
        (lambda: views.two_view_batches(IMAGES, None, 2), "views"),
        (lambda: views.two_view_batches(IMAGES, views.simclr_augmenter(8), 2), "views"),
        (lambda: views.two_view_batches(IMAGES, views.simclr_views(8), 2, labels=[1]),
         "labels"),
        (lambda: views.two_view_batches(IMAGES[0, 0], views.simclr_views(8), 2), "images"),
        (lambda: views.simclr_augmenter(8, grayscale_probability=-0.1),
         "grayscale_probability"),
        (lambda: views.barlow_augmenter(8, view=0), "view"),
        (lambda: views.color_jitter(np.zeros((4, 4, 2)), seed=(0, 0)), "color_jitter"),
        (lambda: views.gaussian_blur(UNIT, -1.0), "sigma"),
        (lambda: views.random_resized_crop(UNIT, 8, scale=(0.5, 2.0)), "scale"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()
    assert tfdml.data.views is views
