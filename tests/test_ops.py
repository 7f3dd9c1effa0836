"""tfdml.ops against naive loops of tests/support/references/.

The tests marked ``multibackend`` also run under JAX and PyTorch; those comparing
float64 values (or holding int64 ids beyond int32) enable float64 under JAX for the
test (the ``float64`` fixture). Graph-mode checks (dynamic shapes, runtime
assertions) stay TensorFlow-only.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, CAN_COMPILE, compiled, enable_float64, to_numpy, value_and_grad
from keras import ops

import tfdml
from tfdml import ops as dml

MB = pytest.mark.multibackend

RNG = np.random.default_rng(0)
X = RNG.normal(size=(5, 3))  # B=5, D=3
Y = RNG.normal(size=(8, 3))  # R=8


@pytest.fixture
def float64():
    """float64 (and int64) tensors exist during the test (JAX: jax_enable_x64)."""
    with enable_float64():
        yield


def tensor(x, dtype=None):
    return ops.convert_to_tensor(x, dtype=dtype)


def dtype_of(x):
    return keras.backend.standardize_dtype(x.dtype)


# -- similarities and distances ------------------------------------------------------------------


@MB
@pytest.mark.usefixtures("float64")
def test_pairwise_similarity():
    got = dml.pairwise_similarity(tensor(X), tensor(Y))
    assert tuple(got.shape) == (5, 8) and dtype_of(got) == "float64"
    np.testing.assert_allclose(to_numpy(got), ref.pairwise_similarity(X, Y), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(dml.pairwise_similarity(tensor(X))),
                               ref.pairwise_similarity(X), rtol=1e-12)


@MB
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("squared", [False, True])
def test_pairwise_distance(squared):
    got = dml.pairwise_distance(tensor(X, "float32"), tensor(Y, "float32"), squared=squared)
    assert tuple(got.shape) == (5, 8) and dtype_of(got) == "float32"
    np.testing.assert_allclose(to_numpy(got), ref.pairwise_distance(X, Y, squared=squared),
                               rtol=1e-5, atol=1e-5)
    got_self = to_numpy(dml.pairwise_distance(tensor(X), squared=squared))
    assert got_self.dtype == np.float64
    np.testing.assert_allclose(got_self, ref.pairwise_distance(X, squared=squared), atol=1e-7)
    assert np.all(got_self >= 0)


@MB
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("squared", [False, True])
def test_pairwise_distance_gradient_matches_finite_differences(squared):
    y = tensor(Y)
    weights = RNG.normal(size=(5, 8))

    w = tensor(weights)
    _, grad = value_and_grad(
        lambda x: ops.sum(dml.pairwise_distance(x, y, squared=squared) * w), X
    )

    def f(e):
        return float(np.sum(ref.pairwise_distance(e, Y, squared=squared) * weights))

    np.testing.assert_allclose(grad, ref.finite_difference_gradient(f, X), atol=1e-7)


@MB
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("squared", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pairwise_distance_gradient_at_duplicates(squared, dtype):
    # Rows 0 and 2 are duplicates; the diagonal is zero distance too.
    x_np = np.array([[0.3, -1.2, 2.0], [1.0, 0.5, -0.7], [0.3, -1.2, 2.0]])
    x = tensor(x_np, dtype)
    duplicate_pair, g_pair = value_and_grad(
        lambda e: dml.pairwise_distance(e, squared=squared)[0, 2], x)
    dist, g_total = value_and_grad(lambda e: dml.pairwise_distance(e, squared=squared), x)
    assert dist.dtype == np.dtype(dtype)
    tol = 1e-3 if dtype == "float32" else 1e-7
    assert abs(float(duplicate_pair)) <= tol
    np.testing.assert_allclose(np.diag(dist), 0.0, atol=tol)
    assert np.all(np.isfinite(g_pair)) and np.all(np.isfinite(g_total))
    # The distance between duplicates is flat (squared) or has its (sub)gradient 0.
    np.testing.assert_allclose(g_pair, 0.0, atol=1e-4)
    # Only the non-duplicate pairs contribute to the gradient of the sum.
    def f(e):
        d = ref.pairwise_distance(e, squared=squared)
        d[0, 2] = d[2, 0] = 0.0
        np.fill_diagonal(d, 0.0)
        return float(np.sum(d))

    np.testing.assert_allclose(g_total, ref.finite_difference_gradient(f, x_np), atol=1e-3)


@MB
@pytest.mark.usefixtures("float64")
def test_safe_sqrt():
    x = tensor([0.0, 1e-14, 4.0, 2.25], "float64")
    y, grad = value_and_grad(dml.safe_sqrt, x)
    np.testing.assert_allclose(y, [0.0, 0.0, 2.0, 1.5])
    np.testing.assert_allclose(grad, [0.0, 0.0, 0.25, 1.0 / 3.0])


# -- normalization -------------------------------------------------------------------------------


@MB
@pytest.mark.usefixtures("float64")
def test_l2_normalize_values_and_zero_rows():
    x = np.concatenate([X, np.zeros((1, 3))], axis=0)
    got = to_numpy(dml.l2_normalize(tensor(x)))
    np.testing.assert_allclose(got, ref.l2_normalize(x), atol=1e-12)
    np.testing.assert_array_equal(got[-1], 0.0)
    np.testing.assert_allclose(np.linalg.norm(got[:-1], axis=1), 1.0)


@MB
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_l2_normalize_gradient(dtype):
    x_np = np.concatenate([X, np.zeros((1, 3))], axis=0)
    weights = tensor(RNG.normal(size=x_np.shape), dtype)
    _, grad = value_and_grad(lambda x: ops.sum(dml.l2_normalize(x) * weights),
                             tensor(x_np, dtype))
    assert grad.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(grad[-1], 0.0)  # 0 at the zero row, not NaN

    def f(e):
        return float(np.sum(ref.l2_normalize(e) * to_numpy(weights)[:-1]))

    fd = ref.finite_difference_gradient(f, x_np[:-1])
    atol = 1e-5 if dtype == "float32" else 1e-8
    np.testing.assert_allclose(grad[:-1], fd, atol=atol)
    # A tiny vector has the same direction, and the gradient divided by its scale.
    scale = 1e-25 if dtype == "float32" else 1e-300
    tiny = tensor(x_np[:-1] * scale, dtype)
    _, tiny_grad = value_and_grad(lambda x: ops.sum(dml.l2_normalize(x) * weights[:-1]), tiny)
    np.testing.assert_allclose(to_numpy(dml.l2_normalize(tiny)), ref.l2_normalize(x_np[:-1]),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tiny_grad * scale, fd, atol=atol)


# -- labels --------------------------------------------------------------------------------------


@MB
@pytest.mark.usefixtures("float64")
def test_cast_labels_shapes_and_dtypes():
    for labels in ([3, 1, 4], [[3], [1], [4]], np.array([[3], [1], [4]], np.int16),
                   np.array([3, 1, 4], np.uint8)):
        got = dml.cast_labels(labels)
        assert dtype_of(got) == "int32" and tuple(got.shape) == (3,)
        np.testing.assert_array_equal(to_numpy(got), [3, 1, 4])
    # Floats holding whole numbers become int64 (ids beyond 2**31 keep their value).
    for labels in (np.array([3.0, 1.0, 4.0], np.float32), np.array([[3.0], [1.0], [4.0]])):
        got = dml.cast_labels(labels)
        assert dtype_of(got) == "int64" and tuple(got.shape) == (3,)
        np.testing.assert_array_equal(to_numpy(got), [3, 1, 4])
    # int64 ids stay int64: an int32 cast would wrap ids beyond 2**31 onto others.
    got = dml.cast_labels(np.array([[3], [1], [4]], np.int64))
    assert dtype_of(got) == "int64" and tuple(got.shape) == (3,)
    np.testing.assert_array_equal(to_numpy(got), [3, 1, 4])


@MB
def test_cast_labels_keeps_large_float_ids_distinct():
    got = dml.cast_labels(np.array([256.0, 257.0, 16777215.0], np.float32))
    np.testing.assert_array_equal(to_numpy(got), [256, 257, 16777215])


@MB
@pytest.mark.parametrize("shape", [(2, 3, 1), (4, 2), ()])
def test_cast_labels_rejects_bad_rank(shape):
    with pytest.raises(ValueError, match="my_labels"):
        dml.cast_labels(np.zeros(shape, np.int32), name="my_labels")


@MB
@pytest.mark.parametrize("ref_offset", [0, 3, None])
def test_label_masks_with_reference_set(ref_offset):
    ref_labels = np.array([1, 4, 4, 7, 1, 1, 4, 9, 4, 7])
    if ref_offset is None:
        labels = np.array([4, 1, 4, 7, 1])  # anchors not in the reference set
    else:
        labels = ref_labels[ref_offset:ref_offset + 5]  # anchor i is row i + ref_offset
    pos, neg = dml.label_masks(tensor(labels), tensor(ref_labels), ref_offset)
    want_pos, want_neg = ref.label_masks(labels, ref_labels, ref_offset)
    assert dtype_of(pos) == "bool" and tuple(pos.shape) == (5, 10)
    pos, neg = to_numpy(pos), to_numpy(neg)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(neg, want_neg)
    same = labels[:, None] == ref_labels[None, :]
    np.testing.assert_array_equal(neg, ~same)
    if ref_offset is None:
        np.testing.assert_array_equal(pos, same)
    else:
        # Exactly the self pairs are removed from the same-label pairs.
        for i in range(5):
            assert same[i, i + ref_offset] and not pos[i, i + ref_offset]
        assert pos.sum() == same.sum() - 5


@MB
def test_label_masks_batch_default():
    labels = np.array([[2], [0], [2], [2], [5]])
    pos, neg = to_numpy(dml.label_masks(labels))
    want_pos, want_neg = ref.label_masks(labels)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(neg, want_neg)
    assert not np.any(np.diag(pos))
    assert pos[0, 2] and pos[3, 0] and not pos[4].any()


# -- masked reductions ---------------------------------------------------------------------------


def _masked_reference(x, mask, axis, kind):
    """Loop over the reduced axis; (0, False) where the mask is empty."""
    x = np.moveaxis(np.asarray(x), axis, -1)
    mask = np.moveaxis(np.asarray(mask), axis, -1)
    values = np.zeros(x.shape[:-1])
    indices = np.zeros(x.shape[:-1], np.int64)
    found = np.zeros(x.shape[:-1], bool)
    for idx in np.ndindex(x.shape[:-1]):
        best = None
        for k in range(x.shape[-1]):
            if not mask[idx + (k,)]:
                continue
            better = best is None or (
                x[idx + (k,)] > x[idx + (best,)] if kind == "max" else
                x[idx + (k,)] < x[idx + (best,)])
            if better:
                best = k
        if best is not None:
            values[idx], indices[idx], found[idx] = x[idx + (best,)], best, True
    return values, indices, found


@MB
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_masked_reductions(kind, axis):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 7)).astype(np.float32)
    mask = rng.random(size=(6, 7)) < 0.4
    mask[2, :] = False  # an empty row
    mask[:, 4] = False  # an empty column
    mask[0, :] = False
    mask[0, 5] = True  # a single entry
    want_values, want_idx, want_found = _masked_reference(x, mask, axis, kind)
    assert not want_found.all() and want_found.any()
    reduce_fn = dml.masked_max if kind == "max" else dml.masked_min
    arg_fn = dml.masked_argmax if kind == "max" else dml.masked_argmin
    values, found = reduce_fn(tensor(x), tensor(mask), axis=axis)
    idx, idx_found = arg_fn(tensor(x), tensor(mask), axis=axis)
    assert dtype_of(idx) == "int32"
    np.testing.assert_array_equal(to_numpy(found), want_found)
    np.testing.assert_array_equal(to_numpy(idx_found), want_found)
    np.testing.assert_array_equal(to_numpy(values), want_values.astype(np.float32))
    np.testing.assert_array_equal(to_numpy(idx), want_idx)


@MB
def test_masked_argmax_ties_go_to_lowest_index():
    x = tensor([[1.0, 3.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0]], "float32")
    mask = tensor([[True, False, True, True], [False, True, True, True]])
    idx, found = to_numpy(dml.masked_argmax(x, mask))
    np.testing.assert_array_equal(idx, [2, 1])
    assert found.all()
    idx, _ = to_numpy(dml.masked_argmin(x, mask))
    np.testing.assert_array_equal(idx, [0, 1])


@MB
def test_masked_argmax_never_returns_an_index_outside_the_mask():
    # The only candidate (index 2) has score -inf.
    x = tensor([[0.0, 5.0, -np.inf]], "float32")
    mask = tensor([[False, False, True]])
    idx, found = to_numpy(dml.masked_argmax(x, mask))
    values, _ = to_numpy(dml.masked_max(x, mask))
    assert bool(found[0])
    assert int(idx[0]) == 2  # returns 0 on CPU: a masked-out index
    assert values[0] == -np.inf  # returns float32.min
    # A NaN among the candidates (nothing equals the row's NaN maximum): an index in the
    # mask all the same, in eager and compiled code.
    x = tensor([[0.0, np.nan, 1.0, 7.0], [np.nan, 2.0, np.nan, 3.0]], "float32")
    mask = tensor([[False, True, True, False], [True, False, True, False]])
    for fn in (dml.masked_argmax, compiled(lambda x, m: dml.masked_argmax(x, m))):
        idx, found = to_numpy(fn(x, mask))
        assert found.all() and to_numpy(mask)[[0, 1], idx].all(), idx


@MB
def test_cast_labels_does_not_merge_large_int64_ids():
    """(JAX without jax_enable_x64 refuses them.)"""
    labels = np.array([2**32 + 5, 5], np.int64)
    try:
        got = to_numpy(dml.cast_labels(labels))
    except ValueError:
        return  # refusing the ids is acceptable
    assert got[0] != got[1]


def _row_stats(x, mask):
    """A row-wise function with a sort inside: the rank of each entry among the masked ones."""
    order = dml.stable_argsort(ops.where(mask, x, ops.full_like(x, np.inf)), axis=1)
    rank = dml.stable_argsort(order, axis=1)
    return ops.where(mask, rank, -1), ops.logical_and(mask, x > 0)


def _row_stats_reference(x, mask):
    rank = np.full(x.shape, -1, np.int32)
    for i in range(x.shape[0]):
        masked = np.where(mask[i], x[i], np.inf)
        order = np.argsort(masked, kind="stable")
        r = np.empty_like(order)
        r[order] = np.arange(len(order))
        rank[i] = np.where(mask[i], r, -1)
    return rank, mask & (x > 0)


@pytest.mark.parametrize("rows,width,max_elements", [
    (13, 7, 20),   # 2 rows per block, the last block half empty
    (13, 7, 5),    # fewer elements than a row: one row per block
    (6, 9, 54),    # exactly one block
    (6, 9, 1000),  # no loop
    (1, 4, 2),
])
@pytest.mark.parametrize("mode", [
    pytest.param("eager", marks=MB),
    "graph_dynamic",  # TensorFlow only: unknown static shapes
    pytest.param("xla", marks=MB),  # tf.function(jit_compile=True) / jax.jit
])
def test_map_row_blocks_matches_the_whole(rows, width, max_elements, mode):
    if mode == "xla" and not CAN_COMPILE:
        pytest.skip(f"nothing is compiled under the {BACKEND} backend (the eager case runs)")
    rng = np.random.default_rng(rows * 100 + width)
    x = rng.normal(size=(rows, width)).astype(np.float32)
    mask = rng.random((rows, width)) < 0.6
    want = _row_stats_reference(x, mask)

    def run(x, mask):
        return dml.map_row_blocks(_row_stats, (x, mask), ("int32", "bool"),
                                  max_elements=max_elements)

    if mode == "eager":
        got = run(tensor(x), tensor(mask))
    elif mode == "graph_dynamic":
        import tensorflow as tf

        fn = tf.function(run, input_signature=[tf.TensorSpec([None, None], tf.float32),
                                               tf.TensorSpec([None, None], tf.bool)])
        got = fn(x, mask)
    else:
        got = compiled(run)(tensor(x), tensor(mask))
    assert tuple(got[0].shape) == (rows, width) and tuple(got[1].shape) == (rows, width)
    assert dtype_of(got[0]) == "int32" and dtype_of(got[1]) == "bool"
    np.testing.assert_array_equal(to_numpy(got[0]), want[0])
    np.testing.assert_array_equal(to_numpy(got[1]), want[1])


@MB
def test_map_row_blocks_loops_only_when_the_input_is_large():
    calls = []

    def fn(x):
        calls.append(tuple(x.shape))
        return (x * 2,)

    x = ops.ones([8, 4])
    dml.map_row_blocks(fn, (x,), ("float32",), max_elements=32)
    assert calls == [(8, 4)]
    calls.clear()
    (out,) = dml.map_row_blocks(fn, (x,), ("float32",), max_elements=12)
    if BACKEND == "jax":
        assert calls == [(3, 4)]  # jax.lax.map traces the block function once
    else:
        assert calls == [(3, 4)] * 3  # eager: one call per 3-row block
    np.testing.assert_array_equal(to_numpy(out), np.full([8, 4], 2.0))


def test_map_row_blocks_on_an_empty_batch():
    import tensorflow as tf

    fn = tf.function(lambda x: dml.map_row_blocks(lambda t: (t + 1,), (x,), ("float32",),
                                                  max_elements=4),
                     input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    (out,) = fn(tf.zeros([0, 3]))
    assert out.shape == (0, 3)


@MB
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("labels", [
    np.array([2**32 + 1, 1], np.uint64),
    np.array([2**63 + 1, 1], np.uint64),
    np.array([2**32 + 1, 1], np.uint32 if False else np.int64),
    np.array([2.0**32 + 1, 1.0], np.float64),
    np.array([2.0**31, 0.0], np.float32),
    np.array([2**31 + 7, 7], np.uint32),
])
def test_cast_labels_keeps_large_ids_distinct(labels):
    got = to_numpy(dml.cast_labels(labels))
    assert got[0] != got[1]
    assert len(np.unique(got)) == len(np.unique(labels))


@MB
@pytest.mark.usefixtures("float64")
def test_cast_labels_large_ids_distinct_in_a_loss():
    # [2**32 + 1, 1] used to become [1, 1]: one class, so no negative and a loss of 0.
    x = np.random.RandomState(0).normal(size=(4, 3)).astype("float32")
    merged = tfdml.losses.TripletNCALoss()(np.array([1, 1, 1, 1], np.int64), x)
    for dtype in (np.uint64, np.float64):
        labels = np.array([2**32 + 1, 2**32 + 1, 1, 1], dtype)
        value = tfdml.losses.TripletNCALoss()(labels, x)
        assert float(merged) == 0.0 and float(value) > 0.0


@MB
@pytest.mark.parametrize("labels", [np.array([0.5, 1.0]), np.array([2.9999, 1.0]),
                                    np.array([np.nan, 1.0]), np.array([np.inf, 1.0])])
def test_cast_labels_rejects_fractional_floats(labels):
    with pytest.raises(ValueError, match="y_true.*whole numbers"):
        dml.cast_labels(labels, "y_true")
    with pytest.raises(ValueError, match="y_true"):
        tfdml.losses.TripletNCALoss()(labels, np.ones((2, 3), np.float32))


def test_cast_labels_fractional_floats_fail_in_graph():
    import tensorflow as tf

    fn = tf.function(lambda y: dml.cast_labels(y, "y_true"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="whole numbers"):
        fn(tf.constant([0.5, 1.0]))
    np.testing.assert_array_equal(fn(tf.constant([2.0, 1.0])).numpy(), [2, 1])


def _check_rejects_strings(labels):
    with pytest.raises(ValueError, match="y_true"):
        dml.cast_labels(labels, "y_true")
    with pytest.raises(ValueError, match="y_true"):
        tfdml.losses.MultiSimilarityLoss()(labels, np.ones((2, 3), np.float32))


@MB
@pytest.mark.parametrize("labels", [np.array(["a", "b"]), ["cat", "dog"],
                                    np.array([b"a", b"b"])])
def test_cast_labels_rejects_strings(labels):
    _check_rejects_strings(labels)


def test_cast_labels_rejects_string_tensors():
    import tensorflow as tf

    _check_rejects_strings(tf.constant(["a", "b"]))


@MB
@pytest.mark.parametrize("offset", [-1, 5, 100])
def test_ref_offset_outside_reference_set_rejected(offset):
    x = np.random.RandomState(0).normal(size=(4, 3)).astype("float32")
    ref = np.random.RandomState(1).normal(size=(8, 3)).astype("float32")
    labels, ref_labels = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1, 0, 1, 0, 1])
    with pytest.raises(ValueError, match="ref_offset"):
        tfdml.losses.triplet_nca_loss(labels, x, ref_embeddings=ref, ref_labels=ref_labels,
                                      ref_offset=offset)
    with pytest.raises(ValueError, match="ref_offset"):  # a tensor offset, eagerly
        tfdml.losses.triplet_nca_loss(labels, x, ref_embeddings=ref, ref_labels=ref_labels,
                                      ref_offset=ops.convert_to_tensor(offset))


def test_ref_offset_checked_in_graph_with_dynamic_shapes():
    import tensorflow as tf

    spec = tf.TensorSpec([None, 3], tf.float32)

    @tf.function(input_signature=[spec, spec, tf.TensorSpec([], tf.int32)])
    def fn(x, ref, offset):
        n, r = tf.shape(x)[0], tf.shape(ref)[0]
        return tfdml.losses.triplet_nca_loss(tf.range(n) % 2, x, ref_embeddings=ref,
                                             ref_labels=tf.range(r) % 2, ref_offset=offset)

    x = tf.random.normal([4, 3], seed=1)
    ref = tf.random.normal([8, 3], seed=2)
    for offset in (0, 4):
        assert np.isfinite(float(fn(x, ref, offset)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="ref_offset"):
        fn(x, ref, 5)


@MB
def test_ref_offset_valid_range_accepted():
    x = np.random.RandomState(0).normal(size=(4, 3)).astype("float32")
    ref = np.concatenate([np.random.RandomState(1).normal(size=(4, 3)), x]).astype("float32")
    labels, ref_labels = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1, 0, 0, 1, 1])
    for offset in (0, 2, 4, None):
        value = tfdml.losses.triplet_nca_loss(labels, x, ref_embeddings=ref,
                                              ref_labels=ref_labels, ref_offset=offset)
        assert np.isfinite(float(value))
