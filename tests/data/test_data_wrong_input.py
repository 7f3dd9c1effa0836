"""Wrong or unusual input to tfdml.data gives the right values or a ValueError naming the
argument, on both paths (PKDataset / EvalDataset in NumPy, pk_batches / eval_batches in
tf.data): 16-bit images, inverted boxes, a `map_fn` that returns None. Endless datasets in
`fit` and Keras' shuffle warning: tests/test_endless.py.

The PyDataset tests run under every backend; the tf.data ones under TensorFlow.
"""


import numpy as np
import pytest
from backends import BACKEND

import tfdml
from tfdml.data import numpy_augment

tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data path")

# 16-bit values and their high bytes (what tf.io.decode_image and libpng keep)
VALUES_16 = np.array([[0, 255, 256, 40000], [32896, 33000, 65280, 65535]], np.uint16)
HIGH_BYTE = np.array([[0, 0, 1, 156], [128, 128, 255, 255]], np.uint8)
LABELS = np.array([0, 0, 1, 1])


def _write_16bit_pngs(folder):
    from PIL import Image

    paths = []
    for i in range(len(LABELS)):
        path = folder / f"{i}.png"
        Image.fromarray(VALUES_16).save(path)  # Pillow mode "I;16"
        paths.append(str(path))
    with Image.open(paths[0]) as image:
        assert image.mode == "I;16"
    return paths


# -- 1. 16-bit images: the high byte, on both paths ------------------------------------------


@pytest.mark.multibackend
@pytest.mark.parametrize("channels", [None, 1])
def test_16bit_png_decodes_to_its_high_byte(tmp_path, channels):
    paths = _write_16bit_pngs(tmp_path)
    want = np.repeat(HIGH_BYTE[..., None], 1 if channels == 1 else 3, axis=-1)
    assert (VALUES_16 >> 8 == HIGH_BYTE).all()
    for data in (tfdml.data.EvalDataset((paths, LABELS), 4, channels=channels),
                 tfdml.data.PKDataset((paths, LABELS), 2, 2, seed=0, channels=channels)):
        images = data[0][0]
        assert images.dtype == np.uint8
        for image in images:  # 40000 -> 156, was clipped to 255
            np.testing.assert_array_equal(image, want)


@tensorflow_only
@pytest.mark.parametrize("channels", [None, 1])
def test_16bit_png_same_on_the_tf_data_path(tmp_path, channels):
    import tensorflow as tf

    paths = _write_16bit_pngs(tmp_path)
    got = next(iter(tfdml.data.eval_batches((paths, LABELS), 4, channels=channels)))[0]
    np.testing.assert_array_equal(got.numpy(), tfdml.data.EvalDataset(
        (paths, LABELS), 4, channels=channels)[0][0])
    batch = next(iter(tfdml.data.pk_batches((paths, LABELS), 2, 2, seed=0, channels=channels)))
    np.testing.assert_array_equal(batch[0].numpy(), tfdml.data.PKDataset(
        (paths, LABELS), 2, 2, seed=0, channels=channels)[0][0])
    # 16-bit RGB (Pillow keeps the high byte itself) agrees as well
    rgb = np.stack([VALUES_16, VALUES_16[::-1], VALUES_16[:, ::-1]], axis=-1)
    encoded = [tf.io.encode_png(rgb).numpy()] * 4
    np.testing.assert_array_equal(
        tfdml.data.EvalDataset((encoded, LABELS), 4)[0][0],
        next(iter(tfdml.data.eval_batches((encoded, LABELS), 4)))[0].numpy())
    np.testing.assert_array_equal(tfdml.data.EvalDataset((encoded, LABELS), 4)[0][0][0],
                                  rgb >> 8)


@pytest.mark.multibackend
def test_32bit_and_float_files_raise_naming_the_file(tmp_path):
    from PIL import Image

    paths = []
    for i in range(4):
        path = tmp_path / f"{i}.tif"
        Image.fromarray(np.full((4, 4), 0.5, np.float32)).save(path)  # Pillow mode "F"
        paths.append(str(path))
    with pytest.raises(ValueError, match=r"0\.tif.*'F'"):
        tfdml.data.EvalDataset((paths, LABELS), 4)[0]


# -- 3. uint16 images into a normalization: scaled by 255 / 65535 ---------------------------


def _resnet50_reference(values):
    """Keras' resnet50 preprocess_input of the 8-bit scale of uint16 `values`, in NumPy."""
    pixels = values.astype(np.float64) * 255.0 / 65535.0
    return pixels[..., ::-1] - np.array([103.939, 116.779, 123.68])


@pytest.mark.multibackend
def test_uint16_images_are_scaled_before_the_normalization():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 65536, (6, 6, 3)).astype(np.uint16)
    want = _resnet50_reference(image)
    got = numpy_augment.get_preprocess("resnet50")(image)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    # A transform whose resize keeps the size: its output is the normalized image
    got = numpy_augment.eval_transform(6, 6, preprocess="resnet50")(image)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(numpy_augment.get_preprocess(None)(image),
                               image * (255.0 / 65535.0), rtol=1e-6)
    np.testing.assert_allclose(numpy_augment.to_pixels(np.array([40000], np.uint16)),
                               [40000 * 255 / 65535], rtol=1e-6)
    assert numpy_augment.to_pixels(np.array([200], np.uint8))[0] == 200.0
    # In a PKDataset: in-memory uint16 images through map_fn
    images = np.repeat(image[None], 4, axis=0)
    batch = tfdml.data.PKDataset((images, LABELS), 2, 2, seed=0, map_fn=numpy_augment
                                 .eval_transform(6, 6, preprocess="resnet50"))[0][0]
    assert np.abs(batch).max() < 256
    np.testing.assert_allclose(batch[0], want, rtol=1e-5, atol=1e-3)


@tensorflow_only
def test_uint16_images_are_scaled_on_the_tf_path():
    import tensorflow as tf

    from tfdml.data import augment

    rng = np.random.default_rng(1)
    image = rng.integers(0, 65536, (6, 6, 3)).astype(np.uint16)
    want = _resnet50_reference(image)
    for fn in (augment.get_preprocess("resnet50"),
               augment.eval_transform(6, 6, preprocess="resnet50"),
               augment.get_preprocess(tfdml.models.get_preprocess("resnet50"))):
        np.testing.assert_allclose(fn(tf.constant(image)).numpy(), want, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(augment.get_preprocess("none")(image).numpy(),
                               image * (255.0 / 65535.0), rtol=1e-6)
    images = np.repeat(image[None], 4, axis=0)
    batch = next(iter(tfdml.data.pk_batches(
        (images, LABELS), 2, 2, seed=0, map_fn=augment.eval_transform(6, 6, preprocess="resnet50"))))
    np.testing.assert_allclose(batch[0][0].numpy(), want, rtol=1e-5, atol=1e-3)


# -- 2. inverted bounding boxes -----------------------------------------------------------------


def _split_with_boxes(boxes, paths=None):
    images = np.zeros((4, 8, 8, 3), np.uint8)
    kwargs = {"paths": np.array(paths)} if paths is not None else {"images": images}
    return tfdml.data.DatasetSplit("toy", "train", LABELS, bboxes=np.array(boxes, np.float32),
                                   **kwargs)


GOOD_BOXES = [[0, 0, 4, 4], [1, 1, 5, 6], [2, 2, 2, 2], [0, 0, 8, 8]]  # row 2: 1 pixel


@pytest.mark.multibackend
@pytest.mark.parametrize("row,box", [(2, [5, 1, 2, 6]), (1, [1, 6, 5, 2])])
def test_inverted_box_raises_naming_bboxes_the_row_and_file(row, box):
    boxes = [list(b) for b in GOOD_BOXES]
    boxes[row] = box
    paths = [f"img{i}.jpg" for i in range(4)]
    with pytest.raises(ValueError, match=rf"`bboxes`.*bboxes\[{row}\]=.*img{row}\.jpg"):
        _split_with_boxes(boxes, paths)
    # A split whose boxes were replaced after it was built: refused when a dataset is made
    split = _split_with_boxes(GOOD_BOXES)
    split.bboxes = np.array(boxes, np.float32)
    for make in (lambda: tfdml.data.PKDataset(split, 2, 2, crop_to_bbox=True),
                 lambda: tfdml.data.EvalDataset(split, 2, crop_to_bbox=True)):
        with pytest.raises(ValueError, match=rf"`bboxes`.*bboxes\[{row}\]"):
            make()
    with pytest.raises(ValueError, match=r"`bbox`.*Received: bbox="):
        numpy_augment.crop_to_bbox(np.zeros((8, 8, 3)), box)
    with pytest.raises(ValueError, match="`bbox`"):
        numpy_augment.crop_to_bbox(np.zeros((8, 8, 3)), [0, 0, np.nan, 4])
    crop = numpy_augment.crop_to_bbox(np.zeros((8, 8, 3)), GOOD_BOXES[1])
    assert crop.shape == (4, 5, 3)


@tensorflow_only
def test_inverted_box_on_the_tf_data_path():
    import tensorflow as tf

    from tfdml.data import augment

    split = _split_with_boxes(GOOD_BOXES)
    split.bboxes = np.array([[0, 0, 4, 4], [1, 1, 5, 6], [5, 1, 2, 6], [0, 0, 8, 8]], np.float32)
    for make in (lambda: tfdml.data.pk_batches(split, 2, 2, crop_to_bbox=True),
                 lambda: tfdml.data.eval_batches(split, 2, crop_to_bbox=True)):
        with pytest.raises(ValueError, match=r"`bboxes`.*bboxes\[2\]"):
            make()
    image = tf.zeros([8, 8, 3])
    with pytest.raises(ValueError, match=r"`bbox`.*Received: bbox="):
        augment.crop_to_bbox(image, [5.0, 1.0, 2.0, 6.0])
    crop = tf.function(augment.crop_to_bbox)
    assert crop(image, tf.constant([1.0, 1.0, 5.0, 6.0])).shape == (4, 5, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`bbox`"):
        crop(image, tf.constant([5.0, 1.0, 2.0, 6.0]))


# -- 4. a map_fn that returns None ----------------------------------------------------------------


@pytest.mark.multibackend
def test_map_fn_returning_none_raises_naming_map_fn(tmp_path):
    x = np.zeros((4, 3, 3, 3), np.uint8)

    def forgot_return(image, rng=None):
        image.astype(np.float32)

    for make in (lambda fn: tfdml.data.PKDataset((x, LABELS), 2, 2, seed=0, map_fn=fn),
                 lambda fn: tfdml.data.EvalDataset((x, LABELS), 2, map_fn=fn)):
        with pytest.raises(ValueError, match=r"`map_fn`.*forgot_return.*returned None"):
            make(forgot_return)[0]
        with pytest.raises(ValueError, match=r"`map_fn`.*returned a dict"):
            make(lambda image: {"image": image})[0]


@tensorflow_only
def test_map_fn_returning_none_raises_when_the_tf_pipeline_is_built():
    x = np.zeros((4, 3, 3, 3), np.uint8)

    def forgot_return(image):
        image + 1

    for make in (lambda: tfdml.data.pk_batches((x, LABELS), 2, 2, seed=0, map_fn=forgot_return),
                 lambda: tfdml.data.eval_batches((x, LABELS), 2, map_fn=forgot_return)):
        with pytest.raises(ValueError, match=r"`map_fn`.*forgot_return.*returned None"):
            make()
