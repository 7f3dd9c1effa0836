"""tfdml._labels: the checks and casts of class ids and multi-hot label sets, and the rule
of relevant pairs (``cast_labels`` itself: tests/test_ops.py; multi-hot labels in the metrics:
tests/test_metrics_multilabel.py)."""

from __future__ import annotations

import numpy as np
import pytest
from backends import BACKEND, compiled, to_numpy
from keras import ops

from tfdml._labels import (
    check_label_array,
    multi_hot_ok,
    relevance,
    row_relevance,
    same_label_dtype,
    validate_class_ids,
)

pytestmark = pytest.mark.multibackend


def test_check_label_array_refuses_strings_and_fractions():
    check_label_array([0, 1, 2])
    check_label_array(np.array([0.0, 3.0]))
    with pytest.raises(ValueError, match="`y`"):
        check_label_array(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="`labels`"):
        check_label_array(np.array([0.5, 1.0]), name="labels")


def test_same_label_dtype_widens_to_int64_only_when_they_differ():
    a32, b32 = ops.zeros((2,), "int32"), ops.ones((3,), "int32")
    a, b = same_label_dtype(a32, b32)
    assert a is a32 and b is b32
    if BACKEND == "jax":
        return  # int64 needs jax_enable_x64; without it both stay int32
    a, b = same_label_dtype(a32, ops.ones((3,), "int64"))
    assert ops.dtype(a) == ops.dtype(b) == "int64"


def test_validate_class_ids_raises_eagerly_and_flags_when_compiled():
    labels = ops.convert_to_tensor(np.array([0, 2, 3], np.int32))
    same, ok = validate_class_ids(labels, 4)
    assert ok is True and np.array_equal(to_numpy(same), [0, 2, 3])
    with pytest.raises(ValueError, match=r"\[0, 3\).*from 0 to 3"):
        validate_class_ids(labels, 3)
    flag = compiled(lambda y: ops.cast(validate_class_ids(y, 3)[1], "int32"))
    expected = 0 if BACKEND != "torch" else None  # PyTorch runs it eagerly: it raises
    if expected is None:
        with pytest.raises(ValueError):
            flag(labels)
    else:
        assert int(to_numpy(flag(labels))) == expected
        assert int(to_numpy(flag(ops.convert_to_tensor(np.array([0, 1], np.int32))))) == 1


def test_multi_hot_ok_flags_bad_values_and_empty_sets_when_traced():
    assert multi_hot_ok(ops.convert_to_tensor(np.array([0, 1, 2], np.int32))) is True
    good = np.array([[1, 0], [0, 1]], np.int32)
    assert multi_hot_ok(ops.convert_to_tensor(good)) is True  # eager: checked already
    if BACKEND == "torch":
        return  # no traced path under PyTorch
    flag = compiled(lambda y: ops.cast(multi_hot_ok(y), "int32"))
    assert int(to_numpy(flag(good))) == 1
    assert int(to_numpy(flag(np.array([[1, 0], [0, 0]], np.int32)))) == 0  # an empty set
    assert int(to_numpy(flag(np.array([[1, -1], [0, 1]], np.int32)))) == 0  # not 0 or 1


def test_check_label_array_lets_what_it_cannot_read_pass():
    check_label_array(None)
    check_label_array(ops.convert_to_tensor(np.array([0.5])))  # a tensor: the loss checks it
    check_label_array([[0, 1], [2]])  # ragged: Keras says what is wrong
    check_label_array(iter([0.5]))  # neither an array nor a list


def test_row_relevance_of_class_ids_and_of_label_sets():
    ids = row_relevance(np.array([1, 2]), np.array([[1, 3], [2, 2]]))
    assert ids.tolist() == [[True, False], [True, True]]
    assert row_relevance(np.array([1]), np.array([[1, 3]]), graded=True).tolist() == [[1.0, 0.0]]
    sets = np.array([[1, 1, 0]], bool)
    items = np.array([[[1, 0, 0], [0, 0, 1], [1, 1, 0]]], bool)
    assert row_relevance(sets, items).tolist() == [[True, False, True]]
    assert row_relevance(sets, items, min_jaccard=0.6).tolist() == [[False, False, True]]
    assert row_relevance(sets, items, graded=True).tolist() == [[0.5, 0.0, 1.0]]
    for labels, batch in ((np.array([1, 2]), np.array([[1, 3], [2, 2]])), (sets, items)):
        np.testing.assert_array_equal(
            row_relevance(labels, batch),
            [relevance(labels[i : i + 1], batch[i])[0] for i in range(len(labels))])
