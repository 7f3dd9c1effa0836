"""`tfdml.datasets.load` / `available` and the shared helpers of `tfdml.datasets.common`."""

import logging

import numpy as np
import pytest

import tfdml.datasets as D
from tfdml.data.source import DatasetSplit
from tfdml.datasets import common


def test_available_lists_names_splits_sources():
    av = D.available()
    assert sorted(av) == ["cars196", "cub200", "digits", "glyphs", "inshop", "omniglot", "sop",
                          "vehicleid"]
    assert av["inshop"]["splits"] == ("train", "query", "gallery")
    assert av["inshop"]["sources"] == ("files",)
    assert av["cub200"]["sources"] == ("files", "tfds")
    assert av["omniglot"]["options"] == {"label": ("character", "alphabet")}
    # Every published count belongs to a listed split.
    for name, split in D.PUBLISHED_COUNTS:
        assert split in av[name.replace("_alphabet", "")]["splits"]


def test_load_validates_arguments():
    with pytest.raises(ValueError, match="name.*'mnist'"):
        D.load("mnist", "train")
    with pytest.raises(ValueError, match="data_dir=None"):
        D.load("sop", "train")
    with pytest.raises(ValueError, match="options.*'color'"):
        D.load("sop", "train", data_dir="x", color=True)


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDML_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "vehicleid")):
        D.load("vehicleid", "train")


def test_class_range_masks_and_counts():
    labels = np.array([1, 100, 101, 200, 3])
    train, test = D.class_range_masks(labels, 100, first_id=1)
    np.testing.assert_array_equal(train, [True, True, False, False, True])
    np.testing.assert_array_equal(test, ~train)
    # 0-based ids: the first 2 classes are 0 and 1.
    counts = D.split_counts({0: 3, 1: 4, 2: 5}, num_train_classes=2, first_id=0)
    assert counts == {"train": (2, 7), "test": (1, 5)}


def test_published_count_check(caplog):
    labels = np.repeat(np.arange(1, 101), 1)
    labels = np.concatenate([labels, np.full(5864 - 100, 1)])
    ok = DatasetSplit("cub200", "train", labels=labels, paths=np.array(["x"] * 5864))
    with caplog.at_level(logging.WARNING, logger="tfdml.datasets"):
        assert common.check_published_counts(ok)
        assert caplog.text == ""
        short = DatasetSplit("cub200", "train", labels=labels[:-1], paths=np.array(["x"] * 5863))
        assert not common.check_published_counts(short)
    assert "5863 images" in caplog.text and "5864" in caplog.text
    other = DatasetSplit("digits", "train", labels=[1], images=np.zeros((1, 8, 8, 1)))
    assert common.check_published_counts(other)  # nothing published: no warning


def test_published_numbers_in_papers():
    # The counts the papers in shared/papers state (FAPPY sec. 4.1, LoOp sec. 4).
    assert D.PUBLISHED_COUNTS[("sop", "train")][:2] == (11318, 59551)
    assert D.PUBLISHED_COUNTS[("sop", "test")][:2] == (11316, 60502)
    assert D.PUBLISHED_COUNTS[("cars196", "train")][:2] == (98, 8054)
    assert D.PUBLISHED_COUNTS[("cars196", "test")][:2] == (98, 8131)
    cub = D.PUBLISHED_COUNTS[("cub200", "train")][1] + D.PUBLISHED_COUNTS[("cub200", "test")][1]
    cars = D.PUBLISHED_COUNTS[("cars196", "train")][1] + D.PUBLISHED_COUNTS[("cars196", "test")][1]
    assert (cub, cars) == (11788, 16185)
    small, medium, large = (
        D.PUBLISHED_COUNTS[("vehicleid", s)][:2]
        for s in ("test_small", "test_medium", "test_large")
    )
    assert (small, medium, large) == ((800, 7332), (1600, 12995), (2400, 20038))


def test_error_helpers():
    err = common.missing_file_error("/d/x.txt", "sop")
    assert isinstance(err, FileNotFoundError)
    assert "/d/x.txt" in str(err) and "cvgl.stanford.edu" in str(err)
