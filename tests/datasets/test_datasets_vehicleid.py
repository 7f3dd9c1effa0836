"""VehicleID reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml.datasets as D

JPEG = tf.io.encode_jpeg(np.zeros((4, 4, 3), np.uint8)).numpy()
LISTS = {
    "train_list.txt": [("0001083", 1), ("0001084", 1), ("0000001", 2)],
    "test_list_800.txt": [("0000010", 5), ("0000011", 5), ("0000012", 5), ("0000013", 9)],
    "test_list_1600.txt": [("0000010", 5), ("0000013", 9), ("0000014", 11)],
    "test_list_2400.txt": [("0000010", 5), ("0000015", 12)],
}


def make_vehicleid(root):
    base = root / "VehicleID_V1.0"
    os.makedirs(base / "image")
    os.makedirs(base / "train_test_split")
    for fname, rows in LISTS.items():
        for img, _ in rows:
            (base / "image" / f"{img}.jpg").write_bytes(JPEG)
        text = "\n".join(f"{img} {vid}" for img, vid in rows) + "\n"
        (base / "train_test_split" / fname).write_text(text)
    return base


def test_splits(tmp_path, caplog):
    make_vehicleid(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        out = {
            s: D.load("vehicleid", s, data_dir=tmp_path)
            for s in ("train", "test_small", "test_medium", "test_large")
        }
    assert out["train"].class_counts() == {1: 2, 2: 1}
    assert out["test_small"].class_counts() == {5: 3, 9: 1}
    assert out["test_medium"].class_counts() == {5: 1, 9: 1, 11: 1}
    assert out["test_large"].class_counts() == {5: 1, 12: 1}
    assert out["train"].paths[0].endswith(os.path.join("image", "0001083.jpg"))
    assert all(os.path.isfile(p) for p in out["test_small"].paths)
    assert "7332" in caplog.text and "20038" in caplog.text


def test_query_gallery_protocol(tmp_path):
    ds = D.load_vehicleid(make_vehicleid(tmp_path), "test_small")
    query, gallery = D.vehicleid_query_gallery(ds, seed=3)
    assert gallery.class_counts() == {5: 1, 9: 1}  # one image per vehicle
    assert query.class_counts() == {5: 2}  # vehicle 9 has one image: no query
    assert set(query.paths) | set(gallery.paths) == set(ds.paths)
    assert not set(query.paths) & set(gallery.paths)
    again, _ = D.vehicleid_query_gallery(ds, seed=3)
    np.testing.assert_array_equal(again.paths, query.paths)
    with pytest.raises(ValueError, match="`ds`"):
        D.vehicleid_query_gallery([1, 2], seed=0)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"test_list_1600\.txt.*pku-vehicleid"):
        D.load_vehicleid(tmp_path, "test_medium")
    base = make_vehicleid(tmp_path)
    (base / "train_test_split" / "train_list.txt").write_text("0001083\n")
    with pytest.raises(ValueError, match="malformed line 1"):
        D.load_vehicleid(base, "train")
    os.remove(base / "image" / "0000015.jpg")
    with pytest.raises(FileNotFoundError, match="0000015.jpg"):
        D.load_vehicleid(base, "test_large")
    with pytest.raises(ValueError, match="split.*'small'"):
        D.load_vehicleid(base, "small")
