"""scikit-learn digits as a zero-shot DatasetSplit."""

import numpy as np
import pytest

import tfdml.datasets as D


def test_splits_and_dtypes():
    train = D.load("digits", "train")
    test = D.load("digits", "test", dtype="float32")
    full = D.load_digits("all")
    assert train.images.shape[1:] == (8, 8, 1) and train.images.dtype == np.uint8
    assert sorted(train.class_counts()) == [0, 1, 2, 3, 4, 5]
    assert sorted(test.class_counts()) == [6, 7, 8, 9]
    assert (len(train), len(test), len(full)) == (1083, 714, 1797)
    assert test.images.dtype == np.float32 and 0.0 <= test.images.min() < test.images.max() <= 1.0
    assert train.images.max() == 255 and train.class_names[3] == "3"
    # uint8 is the float version scaled to 0-255.
    as_float = D.load_digits("train", dtype="float32").images
    np.testing.assert_array_equal(np.round(as_float * 255).astype(np.uint8), train.images)


def test_errors():
    with pytest.raises(ValueError, match="dtype.*'float16'"):
        D.load("digits", "train", dtype="float16")
    with pytest.raises(ValueError, match="split.*'query'"):
        D.load_digits("query")
    with pytest.raises(ValueError, match="label"):
        D.load("digits", "train", label="alphabet")
