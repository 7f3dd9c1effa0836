"""tfdml.data.numpy_augment: the transforms of tfdml.data.augment, in NumPy.

The comparisons with augment (TensorFlow's image ops) run under TensorFlow.
"""

import numpy as np
import pytest
from backends import BACKEND

import tfdml
from tfdml.data import numpy_augment

RNG = np.random.default_rng(7)
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="compares with tf.image")


@tensorflow_only
@pytest.mark.parametrize("shape,size,keep", [((37, 23, 3), 16, False), ((9, 14, 1), 20, False),
                                             ((30, 61, 3), 16, True), ((8, 8, 1), 8, False)])
def test_resize_equals_tf_image_resize(shape, size, keep):
    image = RNG.uniform(0, 255, size=shape).astype(np.float32)
    want = tfdml.data.augment.resize(image, size, keep_aspect_ratio=keep).numpy()
    got = numpy_augment.resize(image, size, keep_aspect_ratio=keep)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


@tensorflow_only
@pytest.mark.parametrize("shape", [(11, 9, 3), (5, 4, 1), (8, 3, 3)])
def test_center_crop_and_eval_transform_equal_augment(shape):
    image = RNG.integers(0, 256, size=shape).astype(np.uint8)
    np.testing.assert_array_equal(numpy_augment.center_crop(image, 6),
                                  tfdml.data.augment.center_crop(image, 6).numpy())
    for preprocess in (None, "resnet50", "resnet18", "inception_v3", "none"):
        want = tfdml.data.augment.eval_transform(6, 7, preprocess=preprocess)(image).numpy()
        got = numpy_augment.eval_transform(6, 7, preprocess=preprocess)(image)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_train_and_pad_crop_transforms_follow_their_generator():
    image = RNG.integers(0, 256, size=(20, 30, 1)).astype(np.uint8)
    for make in (lambda: numpy_augment.train_transform(12, 16, preprocess="resnet50"),
                 lambda: numpy_augment.pad_crop_transform(16, 3)):
        fn = make()
        outs = [fn(image, rng=np.random.default_rng(s)) for s in (0, 0, 1, 2, 3)]
        assert outs[0].dtype == np.float32
        np.testing.assert_array_equal(outs[0], outs[1])
        assert any(not np.array_equal(outs[0], o) for o in outs[2:])
    assert numpy_augment.train_transform(12, 16, preprocess="resnet50")(image).shape == (12, 12, 3)
    untouched = image.copy()
    numpy_augment.get_preprocess("resnet50")(image.astype(np.float32))
    np.testing.assert_array_equal(image, untouched)
    with pytest.raises(ValueError, match="crop_size"):
        numpy_augment.train_transform(20, 16)
    with pytest.raises(ValueError, match="preprocess"):
        numpy_augment.get_preprocess("resnet500")
    with pytest.raises(ValueError, match="3 channels"):
        numpy_augment.get_preprocess("resnet50")(np.zeros((4, 4, 2)))
    with pytest.raises(ValueError, match="at least 8 x 8"):
        numpy_augment.random_crop(np.zeros((4, 9, 3)), 8)
