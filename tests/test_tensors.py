"""tfdml._tensors: the checks on class ids, embeddings and reference offsets that every
loss, miner and metric makes (``cast_labels`` itself: tests/test_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest
from backends import BACKEND, compiled, to_numpy
from keras import ops

from tfdml._tensors import (
    check_batch_sizes,
    check_embeddings,
    check_label_array,
    check_ref_offset,
    compute_dtype,
    multi_hot_ok,
    same_label_dtype,
    validate_class_ids,
)

pytestmark = pytest.mark.multibackend


@pytest.mark.parametrize("dtype,expected", [
    ("float64", "float64"), ("float32", "float32"), ("float16", "float32"),
    ("bfloat16", "float32"), ("int32", "float32"),
])
def test_compute_dtype_keeps_float64_only(dtype, expected):
    assert compute_dtype(dtype) == expected


def test_check_embeddings_wants_a_rank_2_float_tensor():
    x = check_embeddings(np.ones((3, 2), np.float32))
    assert tuple(x.shape) == (3, 2)
    with pytest.raises(ValueError, match=r"rank-2.*Received: e\.shape=\(3,\)"):
        check_embeddings(np.ones(3, np.float32), name="e")
    with pytest.raises(ValueError, match=r"floating dtype.*Received: e\.dtype=int32"):
        check_embeddings(np.ones((3, 2), np.int32), name="e")


def test_check_batch_sizes_names_both_shapes():
    labels, x = ops.zeros((4,), "int32"), ops.zeros((3, 2))
    with pytest.raises(ValueError, match=r"`y` and `x`.*y\.shape=\(4,\), x\.shape=\(3, 2\)"):
        check_batch_sizes(labels, x, "y", "x")
    check_batch_sizes(ops.zeros((3,), "int32"), x)  # the same size: no error


def test_check_label_array_refuses_strings_and_fractions():
    check_label_array([0, 1, 2])
    check_label_array(np.array([0.0, 3.0]))
    with pytest.raises(ValueError, match="`y`"):
        check_label_array(np.array(["a", "b"]))
    with pytest.raises(ValueError, match="`labels`"):
        check_label_array(np.array([0.5, 1.0]), name="labels")


@pytest.mark.parametrize("offset", [0, 2, 5])
def test_check_ref_offset_accepts_offsets_that_keep_the_anchors_inside(offset):
    assert check_ref_offset(offset, 3, 8) == offset
    assert check_ref_offset(ops.convert_to_tensor(offset), 3, 8) == offset
    assert check_ref_offset(None, 3, 8) is None


@pytest.mark.parametrize("offset", [-1, 6, 100])
def test_check_ref_offset_refuses_anchors_outside_the_reference_set(offset):
    with pytest.raises(ValueError, match=r"`ref_offset` must be in \[0, 5\].*"
                                         rf"Received: ref_offset={offset}"):
        check_ref_offset(offset, 3, 8)


@pytest.mark.parametrize("offset", [1.0, True, "1"])
def test_check_ref_offset_wants_an_int(offset):
    with pytest.raises(ValueError, match="must be an int or None"):
        check_ref_offset(offset, 3, 8)


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
