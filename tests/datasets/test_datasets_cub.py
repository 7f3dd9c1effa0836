"""CUB-200-2011 reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml.datasets as D
from tfdml.data.source import DatasetSplit

# class id -> number of images; ids on both sides of the 100/101 boundary.
CLASSES = {1: 2, 2: 1, 100: 2, 101: 1, 150: 2, 200: 1}
JPEG = tf.io.encode_jpeg(np.full((6, 5, 3), 128, np.uint8)).numpy()


def make_cub(root, classes=CLASSES, boxes=True):
    base = root / "CUB_200_2011"
    images, labels, bbox, names = [], [], [], []
    img_id = 0
    for c, n in classes.items():
        folder = f"{c:03d}.Bird_{c}"
        names.append(f"{c} {folder}")
        os.makedirs(base / "images" / folder, exist_ok=True)
        for k in range(n):
            img_id += 1
            rel = f"{folder}/Bird_{c}_{k}.jpg"
            (base / "images" / rel).write_bytes(JPEG)
            images.append(f"{img_id} {rel}")
            labels.append(f"{img_id} {c}")
            bbox.append(f"{img_id} {img_id}.0 {2 * img_id}.0 10.0 20.0")
    (base / "images.txt").write_text("\n".join(images) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (base / "classes.txt").write_text("\n".join(names) + "\n")
    if boxes:
        (base / "bounding_boxes.txt").write_text("\n".join(bbox) + "\n")
    return base


def test_zero_shot_split_ids_boxes(tmp_path):
    base = make_cub(tmp_path)
    train = D.load("cub200", "train", data_dir=base)
    test = D.load("cub200", "test", data_dir=tmp_path)  # the parent folder works too
    assert isinstance(train, DatasetSplit) and train.paths is not None
    assert train.class_counts() == {1: 2, 2: 1, 100: 2}
    assert test.class_counts() == {101: 1, 150: 2, 200: 1}
    assert train.class_names[100] == "100.Bird_100"
    assert all(os.path.isfile(p) for p in np.concatenate([train.paths, test.paths]))
    assert tf.io.decode_jpeg(tf.io.read_file(test.paths[0])).shape == (6, 5, 3)
    # image 6 (the first test image): x=6, y=12, w=10, h=20 -> (ymin, xmin, ymax, xmax)
    np.testing.assert_allclose(test.bboxes[0], [12.0, 6.0, 32.0, 16.0])
    assert train.bboxes.shape == (5, 4) and train.bboxes.dtype == np.float32


def test_without_bounding_boxes_file(tmp_path):
    base = make_cub(tmp_path, boxes=False)
    assert D.load_cub200(base, "train").bboxes is None


def test_warns_when_counts_differ_from_published(tmp_path, caplog):
    base = make_cub(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        D.load_cub200(base, "test")
    assert "5924" in caplog.text and "cub200/test" in caplog.text


def test_published_class_split():
    # Applied to 200 classes, the split gives the papers' 100 / 100 classes.
    counts = D.split_counts({c: 59 for c in range(1, 201)}, num_train_classes=100)
    assert counts["train"][0] == 100 and counts["test"][0] == 100
    assert D.PUBLISHED_COUNTS[("cub200", "train")][:2] == (100, 5864)
    assert D.PUBLISHED_COUNTS[("cub200", "test")][:2] == (100, 5924)


def test_missing_list_file_names_it_and_the_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"images\.txt.*caltech"):
        D.load("cub200", "train", data_dir=tmp_path)
    base = make_cub(tmp_path)
    os.remove(base / "classes.txt")
    with pytest.raises(FileNotFoundError, match=r"classes\.txt"):
        D.load_cub200(base, "train")


def test_missing_image(tmp_path):
    base = make_cub(tmp_path)
    os.remove(base / "images" / "150.Bird_150" / "Bird_150_1.jpg")
    D.load_cub200(base, "train")
    with pytest.raises(FileNotFoundError, match="Bird_150_1.jpg"):
        D.load_cub200(base, "test")


def test_malformed_files(tmp_path):
    base = make_cub(tmp_path)
    (base / "bounding_boxes.txt").write_text("1 a b c d\n")
    with pytest.raises(ValueError, match="bounding_boxes.txt"):
        D.load_cub200(base, "train")
    make_cub(tmp_path)
    (base / "image_class_labels.txt").write_text("1 one\n")
    with pytest.raises(ValueError, match="image_class_labels.txt.*'one'"):
        D.load_cub200(base, "train")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split.*'val'"):
        D.load("cub200", "val", data_dir=tmp_path)
    with pytest.raises(ValueError, match="data_dir=None"):
        D.load_cub200(None, "train")
    with pytest.raises(ValueError, match="label"):
        D.load("cub200", "train", data_dir=tmp_path, label="alphabet")
