"""Finite embeddings at the ends of the float range: exact normalization, NaN where a loss
cannot represent them.

The catalogue (each case asserts NaN or the value of a plain NumPy float64 reference):

* ``tfdml.ops.l2_normalize`` gives unit norm to every non-zero finite vector (float32 norms
  from 1e-40, subnormal, to 8e38, beyond the float32 range; float16 and bfloat16 down to
  their subnormals; float64 from 1e-310 to 2e308), zero rows stay zero with a zero
  gradient, gradients are exact (0 for rows of subnormal entries, whose exact gradient
  overflows); eagerly and compiled. With ``epsilon`` it is ``tf.math.l2_normalize``'s
  formula, which ``tfdml.layers.L2Normalization`` keeps.
* A loss that normalizes has the same value (and the gradient divided by the scale) at
  ``x``, ``1e20 * x``, ``1e-25 * x`` and ``1e-40 * x``: before, huge rows normalized to
  zeros and tiny ones were scaled by 1e6 instead of to unit norm, and every loss gave its
  all-zero value (log 2 for TripletNCA).
* A loss that does not normalize returns NaN once its distances could overflow (float32
  norms above about 9.2e18), for a whole batch or a single row, for every reduction, and
  below that either its float64 value or a non-finite one, never a finite wrong one.
* ``tfdml.search.Index`` and the metrics give the same neighbours for ``x`` and
  ``1e20 * x`` (``"cosine"``, ``"l2"``, ``"dot"``, Recall@K, MAP@R, NMI).
* A model whose weights blow up: with a loss that does not normalize,
  ``keras.callbacks.TerminateOnNaN`` stops the training; with a normalizing loss the logged
  loss is the true loss of its embeddings (the value at unit scale), not log 2.
"""

from __future__ import annotations

import math

import keras
import ml_dtypes
import numpy as np
import pytest
from backends import (
    BACKEND,
    CAN_COMPILE,
    compiled,
    to_numpy,
    traced,
    value_and_grad,
    value_and_grad_function,
)
from harness import slow_beyond
from keras import ops

import tfdml
from tfdml import losses, metrics, search
from tfdml import ops as dml
from tfdml.layers import L2Normalization

MB = pytest.mark.multibackend  # also under JAX and PyTorch (see conftest.py)

EPS = 1e-12
RNG = np.random.default_rng(0)
LABELS = np.repeat(np.arange(4), 4).astype(np.int32)
X = RNG.normal(size=(16, 8)).astype(np.float32)
F32_MAX = float(np.finfo(np.float32).max)


def _rows32():
    """float32 rows across the whole range, each with a name."""
    base = RNG.normal(size=(10, 8))
    spiky = np.ones(8)
    spiky[2] = 1e30
    rows = {
        "ordinary": base[0],
        "huge_1e20": base[1] * 1e20,
        "near_max": base[2] / np.abs(base[2]).max() * 3e38,
        "every_entry_near_max": np.full(8, 3e38),
        "one_huge_entry": spiky,
        "small_above_sqrt_eps": base[3] * 1e-5,
        "below_sqrt_eps": base[4] * 1e-8,
        "tiny_1e-30": base[5] * 1e-30,
        "subnormal_1e-40": base[6] * 1e-40,
        "one_hot": np.eye(8)[3] * 3.0,
        "zero": np.zeros(8),
    }
    return list(rows), np.stack(list(rows.values())).astype(np.float32)


NAMES, ROWS = _rows32()


F32_TINY = float(np.finfo(np.float32).tiny)


def ref_normalize(x, epsilon=None):
    """float64 ``x / |x|`` row by row (0 for a zero row), or with ``epsilon``
    ``x / sqrt(max(|x|^2, epsilon))``; the norm by ``math.hypot`` of the row over its largest
    entry (a float64 norm itself may overflow: 1e308 * sqrt(6), or underflow: 1e-310)."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        top = np.abs(row).max()
        if top == 0:
            continue
        norm_over_top = math.hypot(*(row / top))
        if epsilon is not None and top < math.sqrt(epsilon) / norm_over_top:
            out[i] = row / math.sqrt(epsilon)
        else:
            out[i] = (row / top) / norm_over_top
    return out


def ref_normalize_grad(x, w, epsilon=None, subnormal=F32_TINY):
    """d/dx of ``sum(normalize(x) * w)``: ``(w - u (u.w)) / |x|``; 0 for a zero row and a
    row whose entries are all below ``subnormal`` (its exact gradient overflows float32),
    or ``w / sqrt(epsilon)`` below that bound."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        n = math.hypot(*row)
        if epsilon is not None and n * n < epsilon:
            out[i] = w[i] / math.sqrt(epsilon)
        elif np.abs(row).max() >= subnormal:
            u = row / n
            out[i] = (w[i] - u * np.dot(u, w[i])) / n
    return out


def assert_rows_close(got, want, rtol, floor=0.0):
    """Row by row, relative to the row's largest entry (a gradient row of a 1e20 vector is
    about 1e-20); ``floor``: an absolute tolerance for entries below the normal range (the
    gradient of a row of norm 1e38 is subnormal, which a backend may flush to 0)."""
    for name, g, w in zip(NAMES if len(got) == len(NAMES) else range(len(got)), got, want,
                          strict=True):
        scale = np.abs(w).max()
        np.testing.assert_allclose(g, w, rtol=rtol, atol=max(rtol * scale, floor),
                                   err_msg=str(name))


# -- l2_normalize ----------------------------------------------------------------------------


@MB
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_l2_normalize_is_exact_for_every_finite_float32_vector(mode):
    fn = dml.l2_normalize if mode == "eager" else compiled(dml.l2_normalize)
    got = to_numpy(fn(ops.convert_to_tensor(ROWS)))
    assert got.dtype == np.float32
    # The subnormal row's entries carry 16 significant bits or fewer.
    for i, (name, want) in enumerate(zip(NAMES, ref_normalize(ROWS), strict=True)):
        assert_rows_close(got[i:i + 1], want[None], rtol=1e-4 if "subnormal" in name else 1e-6)
    unit = [i for i, n in enumerate(NAMES) if n != "zero"]
    np.testing.assert_allclose(np.linalg.norm(got[unit].astype(np.float64), axis=1), 1.0,
                               rtol=1e-6)
    np.testing.assert_array_equal(got[NAMES.index("zero")], 0.0)
    np.testing.assert_array_equal(to_numpy(fn(ops.convert_to_tensor(-0.0 * X[:2]))), 0.0)


@MB
@pytest.mark.usefixtures("float64")
def test_l2_normalize_is_exact_for_every_finite_float64_vector():
    base = RNG.normal(size=(5, 6))
    x = np.stack([base[0] * 1e300, base[1] * 1e200, base[2] * 1e-200, base[3] * 1e-300,
                  np.full(6, 1e308), base[4], base[4] * 1e-310, np.zeros(6)])
    got = to_numpy(dml.l2_normalize(ops.convert_to_tensor(x)))
    assert got.dtype == np.float64
    assert_rows_close(got[:-2], ref_normalize(x[:-2]), rtol=1e-14)
    # 1e-310 is subnormal in float64: about 36 significant bits.
    assert_rows_close(got[-2:], ref_normalize(x[-2:]), rtol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(got[:-1], axis=1), 1.0, rtol=1e-14)
    np.testing.assert_array_equal(got[-1], 0.0)


@MB
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_l2_normalize_half_precision_keeps_dtype_and_does_not_overflow(dtype):
    # 6e4^2 * 8 overflows float16; the sum runs in float32 and the result is cast back.
    # The smallest: float16 subnormals (2^-24 = 6e-8), and bfloat16 ones (2^-133 = 9e-41,
    # subnormal in float32 too).
    tiny = 2.0**-24 if dtype == "float16" else 2.0**-133
    x = np.stack([np.full(8, 6e4), np.arange(8.0) * 7e3 + 1.0, np.zeros(8),
                  np.array([3, -1, 0, 2, 0, 0, 1, -3]) * tiny])
    half = keras.ops.convert_to_tensor(x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16"
                                                else np.float16))
    assert float(to_numpy(ops.cast(half, "float32"))[-1, 0]) == 3 * tiny
    out = dml.l2_normalize(half)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    got = to_numpy(ops.cast(out, "float32"))
    np.testing.assert_allclose(got, ref_normalize(x), atol=1e-2)
    np.testing.assert_allclose(np.linalg.norm(got[[0, 1, 3]], axis=1), 1.0, atol=1e-2)


@MB
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_l2_normalize_gradient_is_finite_and_exact_everywhere(mode):
    w = RNG.normal(size=ROWS.shape).astype(np.float32)
    w_t = ops.convert_to_tensor(w)

    def fn(v):
        return ops.sum(dml.l2_normalize(v) * w_t)

    if mode == "eager":
        _, grad = value_and_grad(fn, ROWS)
    else:
        _, grad = to_numpy(value_and_grad_function(fn, jit_compile=CAN_COMPILE)(ROWS))
    assert np.all(np.isfinite(grad))
    assert_rows_close(grad, ref_normalize_grad(ROWS, w), rtol=1e-5,
                      floor=4 * float(np.finfo(np.float32).tiny))


@MB
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_l2_normalize_nan_and_inf_rows_give_nan_rows(mode):
    # Rows 3-5: a NaN among zeros or subnormal entries (compiled TensorFlow's maximum skips
    # the NaN, so the row looks like one of zeros or subnormals).
    x = np.stack([X[0], X[1], X[2], np.zeros(8), X[3] * 1e-40, X[4] * 1e-40]).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, 2] = x[4, 5] = np.nan
    x[5, 1] = -np.inf
    fn = dml.l2_normalize if mode == "eager" else compiled(dml.l2_normalize)
    got = to_numpy(fn(ops.convert_to_tensor(x)))
    assert np.all(np.isnan(got[1:]))
    np.testing.assert_allclose(got[0], ref_normalize(x[:1])[0], rtol=1e-6)


@MB
def test_l2_normalization_layer_is_l2_normalize_with_its_epsilon():
    # (The subnormal row is left out: TensorFlow and XLA read it as 0 below epsilon.)
    rows = np.delete(ROWS, NAMES.index("subnormal_1e-40"), axis=0)
    got = to_numpy(L2Normalization()(rows))
    assert_rows_close(got, ref_normalize(rows, EPS), rtol=1e-6)
    # epsilon as in tf.math.l2_normalize: norm below sqrt(epsilon) is scaled by 1/sqrt(eps).
    small = ROWS[[NAMES.index("below_sqrt_eps")]]
    loose = to_numpy(L2Normalization(epsilon=1e-30)(small))
    assert_rows_close(loose, ref_normalize(small, 1e-30), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(loose), 1.0, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(L2Normalization()(small)), small * 1e6, rtol=1e-6)
    # axis tuple: one vector per sample over two axes, 1e20 * 1e18 beyond float32 squares.
    cube = (RNG.normal(size=(2, 3, 4)) * 1e19).astype(np.float32)
    got = to_numpy(L2Normalization(axis=(1, 2))(cube))
    np.testing.assert_allclose(np.sqrt((got.astype(np.float64) ** 2).sum(axis=(1, 2))), 1.0,
                               rtol=1e-6)


# -- losses that normalize: the same value at any scale -------------------------------------------


NORMALIZING = {
    "triplet_nca": lambda: losses.TripletNCALoss(),
    "triplet_margin": lambda: losses.TripletMarginLoss(),
    "pn": lambda: losses.PNLoss(),
    "contrastive": lambda: losses.ContrastiveLoss(),
    "margin": lambda: losses.MarginLoss(miner=None),
    "multi_similarity": lambda: losses.MultiSimilarityLoss(),
    "supcon": lambda: losses.SupConLoss(),
    "ntxent": lambda: losses.NTXentLoss(),
    "circle": lambda: losses.CircleLoss(),
    "soft_nearest_neighbor": lambda: losses.SoftNearestNeighborLoss(normalize=True),
    "lifted_structure": lambda: losses.LiftedStructureLoss(),
    "loop": lambda: losses.LoOpLoss(),
}
NOT_NORMALIZING = {
    "triplet_nca": lambda: losses.TripletNCALoss(normalize=False),
    "triplet_margin": lambda: losses.TripletMarginLoss(normalize=False),
    "pn": lambda: losses.PNLoss(normalize=False),
    "contrastive": lambda: losses.ContrastiveLoss(normalize=False),
    "margin": lambda: losses.MarginLoss(normalize=False, miner=None),
    "multi_similarity": lambda: losses.MultiSimilarityLoss(normalize=False),
    "supcon": lambda: losses.SupConLoss(normalize=False),
    "ntxent": lambda: losses.NTXentLoss(normalize=False),
    "circle": lambda: losses.CircleLoss(normalize=False),
    "soft_nearest_neighbor": lambda: losses.SoftNearestNeighborLoss(),
    "lifted_structure": lambda: losses.LiftedStructureLoss(normalize=False),
    "hphn_triplet": lambda: losses.HPHNTripletLoss(normalize=False),
    "loop_segments": lambda: losses.LoOpLoss(normalize=False),
}


def _on_every_backend(names, multibackend):
    """``names`` as pytest params; those in ``multibackend`` also run under JAX and PyTorch
    (a few per test: the others are the same code path)."""
    return [pytest.param(n, marks=MB) if n in multibackend else n for n in names]


#: Losses that normalize, reduce and check their value in the shared code of
#: ``tfdml.losses.base`` as triplet_nca and contrastive do: their cases run in the slow tier.
SHARED_PATH = ("circle", "margin", "multi_similarity", "ntxent", "triplet_margin")


def _on_every_commit(params, suffix=""):
    """``params`` with the cases of :data:`SHARED_PATH` (``name + suffix``) in the slow tier."""
    slow = {name + suffix for name in SHARED_PATH}
    names = [p.values[0] if isinstance(p, type(pytest.param(None))) else p for p in params]
    return slow_beyond(params, {n for n in names if n not in slow})


def _loss_function(loss):
    """``x -> loss(LABELS, x)``, traced once under JAX (eager JAX compiles every op)."""
    fn = lambda x: loss(LABELS, x)  # noqa: E731
    return traced(fn) if BACKEND == "jax" else fn


@pytest.mark.parametrize("name", _on_every_commit(_on_every_backend(
    NORMALIZING, ("triplet_nca", "contrastive", "soft_nearest_neighbor"))))
def test_normalizing_loss_has_the_same_value_at_any_scale(name):
    fn = _loss_function(NORMALIZING[name]())
    want = float(to_numpy(fn(X)))
    assert np.isfinite(want)
    for scale in (1e20, 1e37 / np.abs(X).max(), 1e-25, 1e-40):
        # 1e-40 * X is subnormal: its entries keep 13 to 17 significant bits.
        got = float(to_numpy(fn(X * np.float32(scale))))
        np.testing.assert_allclose(got, want, rtol=1e-4 if scale > 1e-38 else 1e-3,
                                   err_msg=f"scale {scale:g}")


@MB
@pytest.mark.parametrize("name, mode", [("triplet_nca", "eager"),
                                        ("triplet_nca", "compiled"),
                                        ("soft_nearest_neighbor", "eager"),
                                        ("contrastive", "compiled")])
def test_normalizing_loss_at_huge_and_tiny_scales_and_its_gradient(name, mode):
    loss = NORMALIZING[name]()
    if mode == "eager" and BACKEND != "jax":
        def step(v):
            return value_and_grad(lambda u: loss(LABELS, u), v)
    else:  # "eager" under JAX is jitted too: eagerly it compiles every op
        compiled_step = value_and_grad_function(lambda u: loss(LABELS, u), jit_compile=True)

        def step(v):
            return to_numpy(compiled_step(v))
    want, grad_want = step(X)
    for scale in (1e20, 1e-25):  # 1e-25: below the former bound sqrt(epsilon) = 1e-6
        got, grad = step(X * np.float32(scale))
        np.testing.assert_allclose(float(got), float(want), rtol=1e-5, err_msg=str(scale))
        assert np.all(np.isfinite(grad))
        # d/dx L(s x) = L'(s x) s = L'(x): the gradient at s x is L'(x) / s.
        np.testing.assert_allclose(grad.astype(np.float64) * scale, grad_want, rtol=1e-3,
                                   atol=1e-4 * np.abs(grad_want).max(), err_msg=str(scale))
    if name == "triplet_nca":  # log 2 is its value when every embedding is zero
        assert abs(float(want) - math.log(2)) > 0.05
        np.testing.assert_allclose(float(step(0 * X)[0]), math.log(2), rtol=1e-6)


# -- losses that do not normalize: NaN once distances could overflow ------------------------------


def _one_huge_row(x, scale):
    x = x.copy()
    x[5] *= np.float32(scale)
    return x


@pytest.mark.parametrize("name", _on_every_commit(_on_every_backend(
    NOT_NORMALIZING, ("contrastive", "soft_nearest_neighbor"))))
def test_loss_without_normalization_is_nan_when_distances_overflow(name):
    fn = _loss_function(NOT_NORMALIZING[name]())
    for case, x in (("all_rows", X * np.float32(1e20)), ("one_row", _one_huge_row(X, 1e20)),
                    ("just_over", X / np.linalg.norm(X, axis=1).max() * np.float32(9.3e18))):
        value = to_numpy(fn(x))
        assert np.isnan(value), (case, value)
    per_anchor = NOT_NORMALIZING[name]()
    per_anchor.reduction = "none"
    assert np.all(np.isnan(to_numpy(per_anchor(LABELS, _one_huge_row(X, 1e20)))))


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name", _on_every_commit([
    pytest.param(name, marks=pytest.mark.xfail(
        reason="the float32 segment distances of tfdml.geometry lose accuracy for norms far "
               "from 1 (5% at 1e10), whatever the overflow", strict=False))
    if name == "loop_segments" else
    pytest.param(name, marks=MB) if name in ("contrastive", "soft_nearest_neighbor") else name
    for name in NOT_NORMALIZING]))
def test_loss_without_normalization_below_the_bound_is_right_or_not_finite(name):
    """Below the bound the float32 value is its float64 value, or Inf/NaN where the loss's own
    arithmetic overflows (exp of a huge similarity), never a finite wrong value."""
    fn = _loss_function(NOT_NORMALIZING[name]())
    for case, x in (("all_rows", X * np.float32(1e17)), ("one_row", _one_huge_row(X, 1e18))):
        got = float(to_numpy(fn(x)))
        want = float(to_numpy(fn(x.astype(np.float64))))
        if np.isfinite(got):
            np.testing.assert_allclose(got, want, rtol=1e-3, err_msg=case)


@MB
def test_loss_value_check_is_compiled_too():
    loss = NOT_NORMALIZING["contrastive"]()
    fn = compiled(lambda v: loss(LABELS, v))
    assert np.isnan(to_numpy(fn(ops.convert_to_tensor(_one_huge_row(X, 1e20)))))
    np.testing.assert_allclose(to_numpy(fn(ops.convert_to_tensor(X))),
                               to_numpy(loss(LABELS, X)), rtol=1e-6)


@MB
@pytest.mark.usefixtures("float64")
def test_float64_bound_is_that_of_float64():
    """float64 embeddings compute in float64 (the functional form returns float64 too)."""
    x = X.astype(np.float64)

    def value(v, normalize):
        out = to_numpy(losses.contrastive_loss(LABELS, v, normalize=normalize))
        assert out.dtype == np.float64
        return float(out)

    np.testing.assert_allclose(value(x * 1e100, False), value(x, False) * 1e100, rtol=1e-3)
    assert np.isnan(value(x * 1e160, False))
    np.testing.assert_allclose(value(x * 1e300, True), value(x, True), rtol=1e-12)


FUNCTIONAL = {
    "triplet_nca_loss": lambda x, n: losses.triplet_nca_loss(LABELS, x, normalize=n),
    "triplet_margin_loss": lambda x, n: losses.triplet_margin_loss(LABELS, x, normalize=n),
    "pn_loss": lambda x, n: losses.pn_loss(LABELS, x, normalize=n),
    "contrastive_loss": lambda x, n: losses.contrastive_loss(LABELS, x, normalize=n),
    "margin_loss": lambda x, n: losses.margin_loss(LABELS, x, normalize=n, miner=None),
    "multi_similarity_loss": lambda x, n: losses.multi_similarity_loss(LABELS, x, normalize=n),
    "supcon_loss": lambda x, n: losses.supcon_loss(LABELS, x, normalize=n),
    "ntxent_loss": lambda x, n: losses.ntxent_loss(LABELS, x, normalize=n),
    "circle_loss": lambda x, n: losses.circle_loss(LABELS, x, normalize=n),
    "soft_nearest_neighbor_loss": lambda x, n: losses.soft_nearest_neighbor_loss(
        LABELS, x, normalize=n),
    "lifted_structure_loss": lambda x, n: losses.lifted_structure_loss(LABELS, x, normalize=n),
    "hphn_triplet_loss": lambda x, n: losses.hphn_triplet_loss(LABELS, x, normalize=n),
    "loop_loss": lambda x, n: losses.loop_loss(LABELS, x, normalize=n),
    "multiple_negatives_ranking_loss": lambda x, n: losses.multiple_negatives_ranking_loss(
        x, x[::-1], normalize=n),
    "with_reference_set": lambda x, n: losses.triplet_margin_loss(
        LABELS[:8], x[:8], normalize=n, ref_embeddings=x, ref_labels=LABELS, ref_offset=0),
}


@pytest.mark.parametrize("name", _on_every_commit(_on_every_backend(
    FUNCTIONAL, ("contrastive_loss", "multiple_negatives_ranking_loss")), "_loss"))
def test_functional_losses(name):
    fn = FUNCTIONAL[name]
    assert np.isnan(to_numpy(fn(_one_huge_row(X, 1e20), False)))
    want = to_numpy(fn(X, True))
    np.testing.assert_allclose(to_numpy(fn(X * np.float32(1e20), True)), want, rtol=1e-4)


# -- search and metrics -----------------------------------------------------------------------------


def _clusters(n=30, dim=8, seed=1):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n // 6), 6)
    x = rng.normal(size=(n // 6, dim))[labels] + 0.3 * rng.normal(size=(n, dim))
    return x.astype(np.float32), labels


def _brute_force(queries, gallery, metric, k):
    """float64 NumPy neighbours (ties cannot occur in random data) and their scores."""
    q, g = queries.astype(np.float64), gallery.astype(np.float64)
    if metric == "cosine":
        q, g = ref_normalize(q), ref_normalize(g)
    if metric == "l2":
        scores = np.sqrt(((q[:, None, :] - g[None, :, :]) ** 2).sum(-1))
        order = np.argsort(scores, axis=1, kind="stable")
    else:
        scores = q @ g.T
        order = np.argsort(-scores, axis=1, kind="stable")
    order = order[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def _backends():
    """The Keras search on every backend; faiss (NumPy in, NumPy out) under TensorFlow."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return [pytest.param("keras", marks=MB)]
    return [pytest.param("keras", marks=MB), "faiss"]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("metric", ["cosine", "l2", "dot"])
@pytest.mark.parametrize("case", ["ordinary", "all_1e20", "all_1e36", "one_huge_row"])
def test_index_gives_exact_neighbours_for_huge_rows(case, metric, backend):
    gallery, _ = _clusters()
    queries = gallery[::3] + np.float32(0.05)
    if case == "all_1e20":
        gallery, queries = gallery * np.float32(1e20), queries * np.float32(1e20)
    elif case == "all_1e36":
        gallery, queries = gallery * np.float32(1e36), queries * np.float32(1e36)
    elif case == "one_huge_row":
        gallery = _one_huge_row(gallery, 1e25)
        queries = np.concatenate([queries, gallery[5:6] * np.float32(1.01)])
    index = search.Index(metric, backend=backend, chunk_size=4, gallery_chunk_size=16)
    index.add(gallery)
    if metric == "cosine":  # stored unit rows, not zeros
        np.testing.assert_allclose(index.embeddings, ref_normalize(gallery), rtol=1e-6,
                                   atol=1e-7)
    scores, indices = index.search(queries, k=4)
    want_scores, want_indices = _brute_force(queries, gallery, metric, 4)
    np.testing.assert_array_equal(indices, want_indices)
    with np.errstate(over="ignore"):
        want32 = want_scores.astype(np.float32)  # Inf beyond the float32 range
    finite = np.isfinite(want32)
    np.testing.assert_array_equal(np.isfinite(scores), finite)
    # "l2": |q|^2 + |g|^2 - 2 q.g loses digits for a near neighbour (at any scale).
    np.testing.assert_allclose(scores[finite], want32[finite],
                               rtol=1e-3 if metric == "l2" else 1e-5,
                               atol=1e-5 if metric == "cosine" else 0.0)


@MB
def test_score_scale_is_one_unless_scores_could_overflow():
    assert search.score_scale(1e3, 512, "l2") == 1.0
    assert search.score_scale(1e30, 512, "cosine") == 1.0
    for max_abs, dim in ((1e20, 8), (3e38, 8), (1e18, 4096), (1.0, 10**40)):
        s = search.score_scale(max_abs, dim, "l2")
        assert s < 1.0 and math.frexp(s)[0] == 0.5  # a power of two
        assert np.isfinite(np.float32(4.0 * dim * (max_abs * s) ** 2))
        assert 4.0 * dim * (max_abs * s * 2) ** 2 > F32_MAX / 4  # no smaller than needed


@MB
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_retrieval_metrics_are_the_same_for_x_and_huge_x(metric):
    x, labels = _clusters(seed=2)
    x = x + np.float32(0.5) * np.random.default_rng(3).normal(size=x.shape).astype(np.float32)
    want = metrics.recall_at_k(x, labels, (1, 2, 4), metric=metric)
    want_map = metrics.map_at_r(x, labels, metric=metric)
    q, g = x[:10], x[10:]
    want_gallery = metrics.recall_at_k(q, labels[:10], (1, 2), gallery_embeddings=g,
                                       gallery_labels=labels[10:], metric=metric)
    for scale in (1e20, 1e36):
        s = np.float32(scale)
        assert metrics.recall_at_k(x * s, labels, (1, 2, 4), metric=metric) == want
        assert metrics.map_at_r(x * s, labels, metric=metric) == pytest.approx(want_map)
        assert metrics.recall_at_k(q * s, labels[:10], (1, 2), gallery_embeddings=g * s,
                                   gallery_labels=labels[10:], metric=metric) == want_gallery
    # one diverged sample among ordinary ones: it changes nothing for the others' ranks
    # beyond being far away, in the float64 brute force too.
    one = _one_huge_row(x, 1e25)
    _, order = _brute_force(one, one, metric, len(x))
    hits = [labels[[j for j in row if j != i][0]] == labels[i] for i, row in enumerate(order)]
    assert metrics.recall_at_k(one, labels, (1,), metric=metric)[1] == pytest.approx(
        np.mean(hits))


@MB
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_clustering_metrics_are_the_same_for_x_and_huge_x(metric):
    x, labels = _clusters(seed=4)
    want = metrics.nmi(x, labels, metric=metric)
    for scale in (1e20, 1e37):
        assert metrics.nmi(x * np.float32(scale), labels, metric=metric) == pytest.approx(want)


# -- a model whose weights blow up ----------------------------------------------------------------


# XLA where eager steps are slow (JAX); a TensorFlow graph builds faster than its XLA program.
FIT_XLA = BACKEND == "jax"


def _tiny_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8)])


def _batch():
    rng = np.random.default_rng(5)
    return rng.normal(size=(32, 6)).astype(np.float32), np.repeat(np.arange(4), 8)


@pytest.mark.parametrize("name", _on_every_commit(_on_every_backend(
    ["contrastive", "soft_nearest_neighbor", "triplet_margin"], ("soft_nearest_neighbor",))))
def test_diverged_training_stops_with_nan_loss(name):
    """SGD at learning rate 1e30: after one step the embeddings are about 1e29..1e31, finite,
    but their squared distances are not; the loss is NaN and TerminateOnNaN stops."""
    inputs, labels = _batch()
    model = _tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(1e30), loss=NOT_NORMALIZING[name](),
                  jit_compile=FIT_XLA)
    history = model.fit(inputs, labels, batch_size=32, epochs=6, shuffle=False, verbose=0,
                        callbacks=[keras.callbacks.TerminateOnNaN()])
    logged = history.history["loss"]
    assert np.isfinite(logged[0]) and np.isnan(logged[-1]) and len(logged) < 6, logged


@MB
# Keras' symbolic build of evaluate (PyTorch) calls the loss on a batch of one class.
@pytest.mark.filterwarnings("ignore:Loss 'triplet_nca_loss'. no anchor:UserWarning")
def test_diverged_model_with_a_normalizing_loss_logs_its_true_loss():
    """Huge but finite weights (the embeddings about 1e20): a normalizing loss is the loss of
    the directions, the same as at unit scale, not its all-zero value log 2."""
    inputs, labels = _batch()
    model = _tiny_model()
    model.compile(loss=losses.TripletNCALoss(), jit_compile=FIT_XLA)
    want = model.evaluate(inputs, labels, batch_size=32, verbose=0)
    kernel, bias = model.get_weights()
    model.set_weights([kernel * np.float32(1e20), bias * np.float32(1e20)])
    assert np.abs(model.predict(inputs, verbose=0)).max() > 1e19
    got = model.evaluate(inputs, labels, batch_size=32, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert abs(got - math.log(2.0)) > 1e-2
    # A learning rate of 1e30 blows the weights up the same way after one step: the logged
    # loss is then that of the (unit-scale) embeddings, never log 2.
    model = _tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(1e30), loss=losses.TripletNCALoss(),
                  jit_compile=FIT_XLA)
    logged = model.fit(inputs, labels, batch_size=32, epochs=3, shuffle=False, verbose=0,
                       callbacks=[keras.callbacks.TerminateOnNaN()]).history["loss"]
    embeddings = model.predict(inputs, verbose=0)
    assert np.abs(embeddings).max() > 1e25
    unit = ref_normalize(embeddings).astype(np.float32)
    assert np.all(np.isfinite(logged)) and len(logged) == 3
    np.testing.assert_allclose(logged[-1], to_numpy(losses.TripletNCALoss()(labels, unit)),
                               rtol=1e-4)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tfdml.compat.tfa needs TensorFlow")
@pytest.mark.parametrize("name", ["semihard_l2", "semihard_squared", "hard_l2", "hard_soft",
                                  "lifted", "angular"])
def test_tfa_losses(name):
    tfa = tfdml.compat.tfa
    fn = {
        "semihard_l2": lambda x: tfa.losses.triplet_semihard_loss(LABELS, x),
        "semihard_squared": lambda x: tfa.losses.triplet_semihard_loss(
            LABELS, x, distance_metric="squared-L2"),
        "hard_l2": lambda x: tfa.losses.triplet_hard_loss(LABELS, x),
        "hard_soft": lambda x: tfa.losses.triplet_hard_loss(LABELS, x, soft=True),
        "lifted": lambda x: tfa.losses.lifted_struct_loss(LABELS, x),
        "angular": lambda x: tfa.losses.triplet_semihard_loss(LABELS, x,
                                                              distance_metric="angular"),
    }[name]
    huge = _one_huge_row(X, 1e20)
    if name == "angular":  # normalizes: the value of the directions
        np.testing.assert_allclose(to_numpy(fn(X * np.float32(1e20))), to_numpy(fn(X)),
                                   rtol=1e-5)
    else:
        assert np.isnan(to_numpy(fn(huge)))
