"""tfdml._shims: the backend-specific pieces of the core, whose semantic ones tfdml.ops
re-exports.

``scatter_rows``, ``top_k``, the float64 ops and the other shims are checked against
references in tests/test_ops.py; the replica functions under a real MirroredStrategy in
tests/test_distribute.py (a child process with several CPU devices). Here: the loop shim,
the replica functions without a strategy, and that ``tfdml.ops`` exports the
shims users call and not the plumbing.
"""

from __future__ import annotations

import numpy as np
import pytest
from backends import BACKEND, compiled, to_numpy
from keras import ops

from tfdml import _shims
from tfdml import ops as dml
from tfdml._shims import dtype_name, map_indices, num_replicas, replica_context

pytestmark = pytest.mark.multibackend


#: The shims that are plumbing for tfdml's own code (tracing, replicas, dtypes, bits):
#: imported from tfdml._shims, not exported by tfdml.ops.
PLUMBING = {"backend_name", "bitcast_to_int64", "dtype_name", "float_bits", "gather_replicas",
            "graph_assert", "is_tensor", "is_traced", "map_indices", "num_replicas",
            "replica_context", "replica_rows"}


def test_ops_exports_every_shim_but_the_plumbing():
    assert PLUMBING <= set(_shims.__all__)
    for name in _shims.__all__:
        if name in PLUMBING:
            assert name not in dml.__all__, name
        else:
            assert getattr(dml, name) is getattr(_shims, name), name
            assert name in dml.__all__, name


def _squares_and_rows(count):
    table = ops.convert_to_tensor(np.arange(12, dtype="float32").reshape(4, 3))

    def one(i):
        return ops.cast(i * i, "float32")[None], ops.take(table, i, axis=0)

    return map_indices(one, count, [((1,), "float32"), ((3,), "float32")])


def test_map_indices_stacks_each_output_in_order():
    squares, rows = (to_numpy(t) for t in _squares_and_rows(4))
    np.testing.assert_array_equal(squares, [[0.0], [1.0], [4.0], [9.0]])
    np.testing.assert_array_equal(rows, np.arange(12).reshape(4, 3))


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch's loop is a Python loop (eager)")
def test_map_indices_compiles_and_agrees_with_eager():
    got = compiled(lambda: _squares_and_rows(3))()
    want = _squares_and_rows(3)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_no_replicas_without_a_strategy():
    assert num_replicas() == 1
    assert replica_context() is None


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("axis,keepdims", [(None, False), (None, True), (0, True), (1, False)])
def test_mean_keeps_float64(axis, keepdims):
    x = np.random.default_rng(0).normal(size=(5, 3))
    got = dml.mean(ops.convert_to_tensor(x), axis=axis, keepdims=keepdims)
    assert dtype_name(got) == "float64"
    want = np.mean(x, axis=axis, keepdims=keepdims)
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-15, atol=0)
