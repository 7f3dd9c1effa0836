"""Cars196 reader, on tiny fake copies of the original (`cars_annos.mat`) and devkit layouts."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from scipy import io as sio

import tfdml.datasets as D

JPEG = tf.io.encode_jpeg(np.zeros((4, 7, 3), np.uint8)).numpy()
# (class, test flag) per image: classes on both sides of 98 / 99, test flags mixed.
IMAGES = [(1, 0), (1, 1), (98, 0), (99, 1), (99, 0), (196, 1)]


def _struct(fields, rows):
    arr = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        for f, v in zip(fields, row, strict=True):
            arr[0, i][f] = v
    return arr


def _names():
    names = np.empty((1, 196), dtype=object)
    names[0, :] = [f"Car model {i}" for i in range(1, 197)]
    return names


def make_original(root):
    os.makedirs(root / "car_ims")
    rows = []
    for i, (c, t) in enumerate(IMAGES, start=1):
        (root / "car_ims" / f"{i:06d}.jpg").write_bytes(JPEG)
        rows.append((f"car_ims/{i:06d}.jpg", i, 2 * i, i + 10, 2 * i + 20, c, t))
    fields = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    sio.savemat(
        root / "cars_annos.mat", {"annotations": _struct(fields, rows), "class_names": _names()}
    )
    return root


def make_devkit(root):
    for d in ("cars_train", "cars_test", "devkit"):
        os.makedirs(root / d)
    fields = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")
    parts = {0: [], 1: []}
    for i, (c, t) in enumerate(IMAGES, start=1):
        folder = "cars_test" if t else "cars_train"
        (root / folder / f"{i:05d}.jpg").write_bytes(JPEG)
        parts[t].append((i, 2 * i, i + 10, 2 * i + 20, c, f"{i:05d}.jpg"))
    sio.savemat(
        root / "devkit" / "cars_train_annos.mat", {"annotations": _struct(fields, parts[0])}
    )
    sio.savemat(root / "cars_test_annos_withlabels.mat", {"annotations": _struct(fields, parts[1])})
    sio.savemat(root / "devkit" / "cars_meta.mat", {"class_names": _names()})
    return root


@pytest.mark.parametrize("make", [make_original, make_devkit])
def test_zero_shot_split_by_class_not_test_flag(tmp_path, make):
    root = make(tmp_path)
    train = D.load("cars196", "train", data_dir=root)
    test = D.load("cars196", "test", data_dir=root)
    assert train.class_counts() == {1: 2, 98: 1}
    assert test.class_counts() == {99: 2, 196: 1}
    assert test.class_names == {99: "Car model 99", 196: "Car model 196"}
    assert all(os.path.isfile(p) for p in np.concatenate([train.paths, test.paths]))
    # (ymin, xmin, ymax, xmax) = (y1, x1, y2, x2); image i has x1=i, y1=2i, x2=i+10, y2=2i+20.
    boxes = {int(os.path.basename(p)[:-4]): b for p, b in zip(test.paths, test.bboxes, strict=True)}
    np.testing.assert_allclose(boxes[4], [8.0, 4.0, 28.0, 14.0])
    assert train.bboxes.shape == (3, 4)


def test_single_annotation_and_count_warning(tmp_path, caplog):
    os.makedirs(tmp_path / "car_ims")
    (tmp_path / "car_ims" / "000001.jpg").write_bytes(JPEG)
    fields = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    ann = _struct(fields, [("car_ims/000001.jpg", 1, 2, 3, 4, 120, 0)])
    sio.savemat(tmp_path / "cars_annos.mat", {"annotations": ann, "class_names": _names()})
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        test = D.load_cars196(tmp_path, "test")
    assert list(test.labels) == [120] and len(D.load_cars196(tmp_path, "train")) == 0
    assert "8131" in caplog.text


def test_published_class_split():
    counts = D.split_counts({c: 80 for c in range(1, 197)}, num_train_classes=98)
    assert counts["train"][0] == 98 and counts["test"][0] == 98


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cars_annos\.mat.*Stanford Cars"):
        D.load_cars196(tmp_path, "train")
    (tmp_path / "cars_annos.mat").write_bytes(b"not a mat file")
    with pytest.raises(ValueError, match=r"cars_annos\.mat"):
        D.load_cars196(tmp_path, "train")
    sio.savemat(tmp_path / "cars_annos.mat", {"annotations": _struct(("class",), [(1,)])})
    with pytest.raises(ValueError, match="relative_im_path"):
        D.load_cars196(tmp_path, "train")
    make_original(tmp_path / "ok")
    os.remove(tmp_path / "ok" / "car_ims" / "000004.jpg")
    with pytest.raises(FileNotFoundError, match="000004.jpg"):
        D.load_cars196(tmp_path / "ok", "test")
    with pytest.raises(ValueError, match="split"):
        D.load_cars196(tmp_path / "ok", "all")


def test_devkit_missing_test_labels(tmp_path):
    root = make_devkit(tmp_path)
    os.remove(root / "cars_test_annos_withlabels.mat")
    with pytest.raises(FileNotFoundError, match="cars_test_annos_withlabels.mat"):
        D.load_cars196(root, "train")
