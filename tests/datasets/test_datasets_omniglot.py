"""Omniglot reader, on a tiny fake copy of the published layout."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfdml.datasets as D

PNG = tf.io.encode_png(np.full((5, 5, 1), 255, np.uint8)).numpy()
FILES = {
    "images_background": [
        "Latin/character01/0683_01.png",
        "Latin/character01/0683_02.png",
        "Alphabet_of_the_Magi/character01/0709_01.png",
        "Alphabet_of_the_Magi/character02/0710_01.png",
        "Alphabet_of_the_Magi/character02/0710_02.png",
    ],
    "images_evaluation": ["ULOG/character01/1598_01.png", "Angelic/character03/0967_05.png"],
}


def make_omniglot(root, files=FILES):
    for folder, names in files.items():
        for name in names:
            path = root / folder / name
            os.makedirs(path.parent, exist_ok=True)
            path.write_bytes(PNG)
    return root


def test_character_labels(tmp_path, caplog):
    make_omniglot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        train = D.load("omniglot", "train", data_dir=tmp_path)
    test = D.load("omniglot", "evaluation", data_dir=tmp_path)
    assert train.split == "train" and test.split == "test"
    assert train.class_counts() == {683: 2, 709: 1, 710: 2}
    assert test.class_counts() == {967: 1, 1598: 1}
    assert train.class_names[710] == "Alphabet_of_the_Magi/character02"
    assert all(os.path.isfile(p) for p in train.paths)
    assert "19280" in caplog.text


def test_alphabet_labels(tmp_path):
    make_omniglot(tmp_path)
    train = D.load("omniglot", "train", data_dir=tmp_path, label="alphabet")
    test = D.load_omniglot(tmp_path, "test", label="alphabet")
    # Sorted folder names; background ids from 0, evaluation ids from 30.
    assert train.class_names == {0: "Alphabet_of_the_Magi", 1: "Latin"}
    assert train.class_counts() == {0: 3, 1: 2}
    assert test.class_names == {30: "Angelic", 31: "ULOG"}
    assert test.class_counts() == {30: 1, 31: 1}


def test_extra_folder_level(tmp_path):
    # Some copies extract to images_background/images_background/<alphabet>/...
    make_omniglot(tmp_path / "images_background", {"images_background": FILES["images_background"]})
    assert len(D.load_omniglot(tmp_path, "train")) == 5


def test_published_counts_from_character_numbers():
    # 20 drawers per character; characters 1-964 are the background set, 965-1623 evaluation.
    counts = D.split_counts({c: 20 for c in range(1, 1624)}, num_train_classes=964)
    assert counts["train"] == D.PUBLISHED_COUNTS[("omniglot", "train")][:2] == (964, 19280)
    assert counts["test"] == D.PUBLISHED_COUNTS[("omniglot", "test")][:2] == (659, 13180)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="images_evaluation.*brendenlake"):
        D.load_omniglot(tmp_path, "test")
    make_omniglot(tmp_path, {"images_background": ["Latin/character01/x_01.png"]})
    with pytest.raises(ValueError, match="'x_01.png'"):
        D.load_omniglot(tmp_path, "train")
    os.makedirs(tmp_path / "images_evaluation")
    with pytest.raises(FileNotFoundError, match="alphabet"):
        D.load_omniglot(tmp_path, "test")
    with pytest.raises(ValueError, match="label.*'letter'"):
        D.load_omniglot(tmp_path, "train", label="letter")
    with pytest.raises(ValueError, match="split.*'val'"):
        D.load_omniglot(tmp_path, "val")
