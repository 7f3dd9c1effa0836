"""Tests for tfdml.data.DatasetSplit and pk_batches over each kind of DatasetSplit."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tfdml.data import DatasetSplit, augment, pk_batches


def _encoded(labels, size=20):
    out = []
    for i, label in enumerate(labels):
        image = np.zeros((size + i % 2, size, 3), np.uint8)
        image[..., 1] = 30 * label + 5
        out.append(tf.io.encode_png(image).numpy())
    return out


def test_dataset_split_contract():
    split = DatasetSplit("toy", "train", labels=[3, 3, 5], paths=np.array(["a", "b", "c"]))
    assert len(split) == 3 and split.num_classes == 2
    assert split.labels.dtype == np.int64
    assert split.class_counts() == {3: 2, 5: 1}
    assert "toy" in repr(split) and "source=paths" in repr(split)
    with pytest.raises(ValueError, match="exactly one"):
        DatasetSplit("toy", "train", labels=[1], paths=np.array(["a"]), images=np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="labels.shape"):
        DatasetSplit("toy", "train", labels=[1, 2], paths=np.array(["a"]))
    with pytest.raises(ValueError, match="bboxes"):
        DatasetSplit("toy", "train", labels=[1], paths=np.array(["a"]), bboxes=np.zeros((1, 3)))


def test_pk_batches_from_paths_split(tmp_path):
    labels = np.repeat(np.arange(4), 3)
    paths = []
    for i, data in enumerate(_encoded(labels)):
        path = os.path.join(str(tmp_path), f"{i}.png")
        tf.io.write_file(path, data)
        paths.append(path)
    split = DatasetSplit("toy", "train", labels=labels, paths=np.array(paths))
    ds = pk_batches(split, 2, 3, seed=0, map_fn=augment.eval_transform(16, 16))
    for images, y in ds.take(3):
        assert images.shape == (6, 16, 16, 3)
        np.testing.assert_allclose(images.numpy()[:, 5, 5, 1], 30 * y.numpy() + 5, atol=1)


def test_pk_batches_from_encoded_split_and_corrupt_bytes(caplog):
    labels = np.repeat(np.arange(3), 2)
    encoded = _encoded(labels)
    encoded[1] = b"broken"
    split = DatasetSplit("toy", "test", labels=labels, encoded=np.array(encoded, dtype=object))
    fn = augment.eval_transform(16, 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="toy/test: encoded image 1"):
        next(iter(pk_batches(split, 3, 2, seed=0, map_fn=fn)))
    ds = pk_batches(split, 3, 2, seed=0, map_fn=fn, on_error="skip", prefetch=None)
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        images, y = next(iter(ds))
    assert images.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(images.numpy()[:, 5, 5, 1], 30 * y.numpy() + 5, atol=1)
    assert "toy/test: encoded image 1" in caplog.text


def test_pk_batches_from_images_split_with_bbox_crop():
    labels = np.repeat(np.arange(3), 2)
    images = np.zeros((6, 30, 40, 1), np.float32)
    bboxes = np.zeros((6, 4), np.float32)
    for i, label in enumerate(labels):  # a box of value label + 1 on a zero background
        y0, x0 = i, 2 * i
        images[i, y0:y0 + 10, x0:x0 + 12] = label + 1
        bboxes[i] = (y0, x0, y0 + 10, x0 + 12)
    split = DatasetSplit("toy", "train", labels=labels, images=images, bboxes=bboxes)
    ds = pk_batches(split, 3, 2, seed=0, crop_to_bbox=True)
    out, y = next(iter(ds))
    assert out.shape == (6, 10, 12, 1)
    np.testing.assert_array_equal(out.numpy().reshape(6, -1), (y.numpy() + 1)[:, None] * np.ones(120))
    plain, _ = next(iter(pk_batches(split, 3, 2, seed=0)))
    assert plain.shape == (6, 30, 40, 1)
