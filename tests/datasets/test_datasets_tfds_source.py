"""source="tfds": the same splits and ids as the file readers, on `tfds.testing.mock_data`
(no download, no network)."""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfdml.datasets as D

JPEG = tf.io.encode_jpeg(np.zeros((10, 20, 3), np.uint8)).numpy()  # height 10, width 20
PNG = tf.io.encode_png(np.zeros((6, 4, 3), np.uint8)).numpy()  # height 6, width 4


def mock_examples(per_split):
    """`as_dataset_fn` for `mock_data` yielding the given examples of each TFDS split
    (`"train+test"` concatenates), images already encoded (the reader skips decoding)."""

    def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False, **kw):
        rows = [ex for part in str(split).split("+") for ex in per_split[part]]
        keys = list(rows[0])
        return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in keys})

    return tfds.testing.mock_data(as_dataset_fn=as_dataset, policy=tfds.testing.MockPolicy.USE_CODE)


def _bird(label, image=JPEG):
    return {
        "image": image,
        "label": label,
        "label_name": f"bird_{label}",
        "bbox": np.array([0.1, 0.25, 0.5, 1.0], np.float32),
    }


def test_cub_merges_tfds_splits_and_splits_by_class(tmp_path, caplog):
    # TFDS labels are 0-based: 0 -> CUB class 1, 99 -> 100, 100 -> 101.
    data = {
        "train": [_bird(0), _bird(99), _bird(100)],
        "test": [_bird(0), _bird(199, PNG), _bird(100)],
    }
    with mock_examples(data), caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        train = D.load("cub200", "train", data_dir=tmp_path, source="tfds")
        test = D.load("cub200", "test", source="tfds")
    assert train.class_counts() == {1: 2, 100: 1}
    assert test.class_counts() == {101: 2, 200: 1}
    assert train.encoded is not None and train.encoded[0] == JPEG
    assert test.class_names[200] == "bird_199"
    # Normalized (0.1, 0.25, 0.5, 1.0) -> pixels of a 10 x 20 JPEG and a 6 x 4 PNG.
    np.testing.assert_allclose(train.bboxes[0], [1.0, 5.0, 5.0, 20.0], rtol=1e-6)
    png_row = list(test.labels).index(200)
    np.testing.assert_allclose(test.bboxes[png_row], [0.6, 1.0, 3.0, 4.0], rtol=1e-6)
    assert "5864" in caplog.text


def test_cars_split_and_names():
    car = lambda c: {"image": JPEG, "label": c, "bbox": np.zeros(4, np.float32)}  # noqa: E731
    data = {"train": [car(0), car(97), car(98)], "test": [car(195), car(97)]}
    with mock_examples(data):
        train = D.load_tfds("cars196", "train")
        test = D.load_tfds("cars196", "test")
    assert train.class_counts() == {1: 1, 98: 2}
    assert test.class_counts() == {99: 1, 196: 1}
    assert train.class_names[1] == "AM General Hummer SUV 2000"  # TFDS's ClassLabel names


def test_sop_ids_match_ebay_lists():
    prod = lambda c, s: {"image": JPEG, "class_id": c, "super_class_id": s}  # noqa: E731
    data = {"train": [prod(0, 0), prod(11317, 11)], "test": [prod(11318, 2), prod(22633, 11)]}
    with mock_examples(data):
        train = D.load("sop", "train", source="tfds")
        test = D.load("sop", "test", source="tfds")
    assert train.class_names == {1: "bicycle", 11318: "toaster"}
    assert test.class_counts() == {11319: 1, 22634: 1}


def test_omniglot_labels_match_file_reader():
    # TFDS label = file-name character number - 1; alphabet = index among the 50 sorted names.
    glyph = lambda lab, a: {"image": PNG, "label": lab, "alphabet": a}  # noqa: E731
    data = {
        "train": [glyph(708, 0), glyph(682, 27), glyph(682, 27)],
        "test": [glyph(964, 1), glyph(1597, 49)],
    }
    with mock_examples(data):
        chars = D.load("omniglot", "train", source="tfds")
        alpha = D.load("omniglot", "test", source="tfds", label="alphabet")
    assert chars.class_counts() == {683: 2, 709: 1}
    assert alpha.class_counts() == {30: 1, 31: 1}


@pytest.mark.parametrize("name", ["sop", "omniglot"])
def test_default_random_mock(name):
    # TFDS's own random mock data (its random boxes are invalid, so not CUB / Cars196).
    with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = D.load(name, "test", source="tfds")
    assert len(ds) == 5 and isinstance(ds.encoded[0], bytes)
    assert ds.labels.min() >= 1


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="source.*'tfds'"):
        D.load("inshop", "train", source="tfds")
    with pytest.raises(ValueError, match="source.*'web'"):
        D.load("sop", "train", source="web")
    with pytest.raises(ValueError, match="split.*'query'"):
        D.load_tfds("sop", "query")
    with pytest.raises(ValueError, match="label.*'alphabet'"):
        D.load_tfds("cub200", "train", label="alphabet")
    with pytest.raises(FileNotFoundError, match="caltech_birds2011.*tfds build"):
        D.load("cub200", "train", data_dir=str(tmp_path), source="tfds")
