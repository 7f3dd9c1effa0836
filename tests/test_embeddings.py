"""tfdml._embeddings: the checks on embeddings, batch sizes and reference offsets that every
loss, miner and metric makes, and the dtype they compute in."""

from __future__ import annotations

import numpy as np
import pytest
from keras import ops

from tfdml._embeddings import check_batch_sizes, check_embeddings, check_ref_offset, compute_dtype

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
