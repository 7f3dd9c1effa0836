"""Stanford Online Products reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml
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


def make_sop(root, train=TRAIN, test=TEST):
    base = root / "Stanford_Online_Products"
    for fname, rows in (("Ebay_train.txt", train), ("Ebay_test.txt", test)):
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


def test_super_classes_are_the_categories(tmp_path):
    make_sop(tmp_path)
    train = D.load_sop(tmp_path, "train")
    test = D.load_sop(tmp_path, "test")
    assert train.categories == {1: 1, 11318: 12}
    assert test.categories == {11319: 3, 22634: 12}
    assert test.category_names == dict(enumerate(D.sop.SUPER_CLASSES, start=1))
    assert test.category_names[3] == "chair" and test.category_names[12] == "toaster"


def test_categories_feed_the_sampler(tmp_path):
    # 5 products (2 images each) in 3 super-classes
    rows = [(c, s, f"{name}_final/{c}_{i}.JPG") for c, s, name in
            ((1, 1, "bicycle"), (2, 1, "bicycle"), (3, 3, "chair"), (4, 3, "chair"),
             (5, 12, "toaster")) for i in range(2)]
    make_sop(tmp_path, train=rows)
    train = D.load_sop(tmp_path, "train")
    assert train.categories == {1: 1, 2: 1, 3: 3, 4: 3, 5: 12}
    sampler = tfdml.data.PKSampler(train.labels, 2, 2, seed=0, categories=train.categories,
                                   categories_per_batch=2)
    for idx in np.concatenate([sampler.epoch_batches(e) for e in range(5)]):
        classes = train.labels[idx][::2]
        assert len({train.categories[int(c)] for c in classes}) == 2
    data = tfdml.data.PKDataset(train, 2, 2, seed=0, categories_per_batch=2, repeat=False)
    np.testing.assert_array_equal(data.sampler.epoch_batches(0), sampler.epoch_batches(0))
