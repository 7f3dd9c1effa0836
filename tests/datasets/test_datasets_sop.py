"""Stanford Online Products reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml.datasets as D

JPEG = tf.io.encode_jpeg(np.zeros((3, 3, 3), np.uint8)).numpy()
HEADER = "image_id class_id super_class_id path"
TRAIN = [
    (1, 1, "bicycle_final/111_0.JPG"),
    (1, 1, "bicycle_final/111_1.JPG"),
    (11318, 12, "toaster_final/222_0.JPG"),
]
TEST = [
    (11319, 3, "chair_final/333_0.JPG"),
    (22634, 12, "toaster_final/444_0.JPG"),
    (22634, 12, "toaster_final/444_1.JPG"),
]


def make_sop(root):
    base = root / "Stanford_Online_Products"
    for fname, rows in (("Ebay_train.txt", TRAIN), ("Ebay_test.txt", TEST)):
        lines = [HEADER]
        for i, (c, s, p) in enumerate(rows, start=1):
            os.makedirs(base / os.path.dirname(p), exist_ok=True)
            (base / p).write_bytes(JPEG)
            lines.append(f"{i} {c} {s} {p}")
        (base / fname).write_text("\n".join(lines) + "\n")
    return base


def test_splits_ids_and_names(tmp_path, caplog):
    make_sop(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        train = D.load("sop", "train", data_dir=tmp_path)
    test = D.load_sop(tmp_path / "Stanford_Online_Products", "test")
    assert train.class_counts() == {1: 2, 11318: 1}
    assert test.class_counts() == {11319: 1, 22634: 2}
    assert test.class_names == {11319: "chair", 22634: "toaster"}
    assert all(os.path.isfile(p) for p in test.paths)
    assert "59551" in caplog.text


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Ebay_test\.txt.*lifted_struct"):
        D.load_sop(tmp_path, "test")
    base = make_sop(tmp_path)
    (base / "Ebay_train.txt").write_text("1 1 1 bicycle_final/111_0.JPG\n")
    with pytest.raises(ValueError, match="first line"):
        D.load_sop(base, "train")
    (base / "Ebay_train.txt").write_text(HEADER + "\n1 1 13 bicycle_final/111_0.JPG\n")
    with pytest.raises(ValueError, match="super_class_id.*13"):
        D.load_sop(base, "train")
    (base / "Ebay_train.txt").write_text(HEADER + "\n1 1 1\n")
    with pytest.raises(ValueError, match="malformed line 2"):
        D.load_sop(base, "train")
    os.remove(base / "chair_final" / "333_0.JPG")
    with pytest.raises(FileNotFoundError, match="333_0.JPG"):
        D.load_sop(base, "test")
