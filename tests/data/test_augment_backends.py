"""The NumPy path (numpy_augment, numpy_views) and the tf.data path (augment, views) are one set
of steps on two backends: where no random draw decides, or where the draws cannot change the
result, they give the same images, to float32 rounding (the resize, the colour conversions
and Keras' normalization are each backend's own float32 ops).

Every public function of the four modules is compared: the deterministic ones as they are, the
random ones with settings under which every draw gives the same image (a crop as large as the
image, no flip, probabilities 0 or 1, a colour jitter of strength 0).
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdml.data import augment, numpy_augment, numpy_views, views

RNG = np.random.default_rng(3)
PREPROCESS = [None, "none", "resnet50", "resnet18", "inception_v3", "caffe", "torch", "tf",
              "densenet121", "efficientnet_b0", lambda image: image * 2]


def _images():
    for shape in ((20, 30, 3), (33, 17, 1), (16, 16, 3), (24, 24, 1)):
        pixels = RNG.integers(0, 256, shape)
        yield f"uint8{list(shape)}", pixels.astype(np.uint8)
        yield f"uint16{list(shape)}", (pixels * 257 + RNG.integers(0, 257, shape)).astype(np.uint16)
        yield f"float32{list(shape)}", RNG.uniform(0, 255, shape).astype(np.float32)
        yield f"float64{list(shape)}", RNG.uniform(0, 255, shape)


IMAGES = dict(_images())
SQUARE = {name: image for name, image in IMAGES.items() if image.shape[0] == image.shape[1]}
UNIT = {name: (image / 255).astype(np.float32) for name, image in IMAGES.items()
        if name.startswith("float32")}


def _same(numpy_out, tf_out, atol=1e-3, exact=False):
    tf_out = np.asarray(tf_out)
    assert isinstance(numpy_out, np.ndarray) and numpy_out.shape == tf_out.shape
    assert numpy_out.dtype == tf_out.dtype
    if exact:
        np.testing.assert_array_equal(numpy_out, tf_out)
    else:
        np.testing.assert_allclose(numpy_out, tf_out, rtol=1e-5, atol=atol)


def _preprocess_ids(preprocess):
    return "callable" if callable(preprocess) else repr(preprocess)


@pytest.mark.parametrize("name", IMAGES)
def test_geometry_agrees(name):
    image = IMAGES[name]
    _same(numpy_augment.to_pixels(image), augment.to_pixels(image), exact=True)
    for size in (8, 16, 37):
        for keep in (False, True):
            _same(numpy_augment.resize(image, size, keep), augment.resize(image, size, keep))
        _same(numpy_augment.center_crop(image, size), augment.center_crop(image, size),
              exact=True)
    for box in ((2.0, 3.0, 12.5, 15.2), (-5.0, 2.0, 200.0, 8.0), (4.0, 4.0, 4.0, 4.0)):
        _same(numpy_augment.crop_to_bbox(image, box), augment.crop_to_bbox(image, box),
              exact=True)
    for size in (4, 16):  # a crop as large as the image: no draw decides
        whole = numpy_augment.center_crop(image, size)
        _same(numpy_augment.random_crop(whole, size), augment.random_crop(whole, size), exact=True)


@pytest.mark.parametrize("preprocess", PREPROCESS, ids=_preprocess_ids)
def test_normalization_and_transforms_agree(preprocess):
    for image in IMAGES.values():
        if image.shape[-1] == 1 and preprocess == "efficientnet_b0":
            # The one difference the paths keep: tf.data converts grayscale to RGB for every
            # Keras Applications backbone, NumPy for the RGB modes only.
            assert numpy_augment.get_preprocess(preprocess)(image).shape[-1] == 1
            assert augment.get_preprocess(preprocess)(image).shape[-1] == 3
            continue
        _same(numpy_augment.get_preprocess(preprocess)(image),
              augment.get_preprocess(preprocess)(image))
        for keep in (False, True):
            args = (12, 16, preprocess, keep)
            _same(numpy_augment.eval_transform(*args)(image),
                  augment.eval_transform(*args)(image))
        train = (16, 16, False, preprocess)  # a square resize cropped whole, no flip
        _same(numpy_augment.train_transform(*train)(image, rng=np.random.default_rng(0)),
              augment.train_transform(*train)(image, seed=(0, 1)))
        _same(numpy_augment.pad_crop_transform(16, 0, False, preprocess)(image),
              augment.pad_crop_transform(16, 0, False, preprocess)(image, seed=(2, 3)))


@pytest.mark.parametrize("name", UNIT)
def test_colour_ops_agree(name):
    image = UNIT[name]
    for module_op in ("to_grayscale", "solarize"):
        _same(getattr(numpy_views, module_op)(image), getattr(views, module_op)(image),
              atol=1e-5)
    for sigma, kernel_size in ((1.3, 5), (0.6, 3), (2.0, None), (1.5, 100)):
        _same(numpy_views.gaussian_blur(image, sigma, kernel_size),
              views.gaussian_blur(image, sigma, kernel_size), atol=1e-5)
    for op, factor in (("adjust_brightness", 1.3), ("adjust_contrast", 0.6),
                       ("adjust_saturation", 1.7), ("adjust_hue", -0.2), ("adjust_hue", 0.5)):
        _same(getattr(numpy_views, op)(image, factor), getattr(views, op)(image, factor),
              atol=1e-5)
    _same(numpy_views.color_jitter(image, 0, 0, 0, 0, rng=np.random.default_rng(0)),
          views.color_jitter(image, 0, 0, 0, 0, seed=(0, 0)), atol=1e-5)


def test_crop_boxes_agree_where_no_box_fits():
    for height, width in ((10, 100), (100, 10), (9, 9)):
        box = numpy_views.random_crop_box(height, width, (0.9, 1.0), (1.5, 2))
        assert box == tuple(views.random_crop_box(height, width, (0.9, 1.0), (1.5, 2)).numpy())
    for image in SQUARE.values():  # the whole image: a crop of area share 1
        _same(numpy_views.random_resized_crop(image, 8, scale=(1.0, 1.0)),
              views.random_resized_crop(image, 8, scale=(1.0, 1.0)))


@pytest.mark.parametrize("preprocess", PREPROCESS[:7], ids=_preprocess_ids)
def test_augmenters_and_views_agree_when_no_draw_decides(preprocess):
    settings = {"scale": (1.0, 1.0), "flip": False, "jitter_strength": 0.0,
                "jitter_probability": 1.0, "grayscale_probability": 1.0,
                "blur_probability": 0.0, "solarize_probability": 1.0, "preprocess": preprocess}
    fn_numpy, fn_tf = numpy_views.simclr_augmenter(12, **settings), views.simclr_augmenter(
        12, **settings)
    pair_numpy, pair_tf = numpy_views.simclr_views(12, **settings), views.simclr_views(
        12, **settings)
    for image in SQUARE.values():
        _same(fn_numpy(image, rng=np.random.default_rng(1)), fn_tf(image, seed=(1, 2)))
        for a, b in zip(pair_numpy(image, np.random.default_rng(4)), pair_tf(image, (4, 5)),
                        strict=True):
            _same(a, b)
    assert fn_numpy.settings == fn_tf.settings


def test_views_agree_in_tf_data():
    settings = {"scale": (1.0, 1.0), "flip": False, "jitter_probability": 0.0,
                "grayscale_probability": 0.0, "blur_probability": 0.0}
    images = np.stack([IMAGES["uint8[16, 16, 3]"]] * 4)
    (v1, v2), = next(iter(views.two_view_batches(images, views.simclr_views(8, **settings), 4,
                                                 seed=0)))
    want = numpy_views.simclr_views(8, **settings)(images[0], np.random.default_rng(0))
    for got in (v1, v2):
        for row in np.asarray(got):
            _same(want[0], row)


def test_the_modules_have_the_same_functions_and_arguments():
    import inspect

    for numpy_module, tf_module in ((numpy_augment, augment), (numpy_views, views)):
        shared = set(numpy_module.__all__) & set(tf_module.__all__)
        assert shared >= set(tf_module.__all__) - {"two_view_batches"}
        for name in sorted(shared):
            numpy_args = str(inspect.signature(getattr(numpy_module, name)))
            tf_args = str(inspect.signature(getattr(tf_module, name)))
            assert numpy_args.replace("rng=None", "seed=None") == tf_args, name
    assert tf.is_tensor(views.simclr_views(8)(IMAGES["uint8[16, 16, 3]"], seed=(0, 0))[0])
