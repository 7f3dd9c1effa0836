"""false_positive_probability, FAPPYLoss and HistogramLoss against tests/references.py.

The references follow the FAPPY paper (eqs. 3-7, Algorithm 1) and Ustinova and Lempitsky's
histogram loss with explicit loops in float64. Float32 values are compared with the reference
evaluated on the same (float32-rounded) embeddings. Float32 gradients are compared with central
differences of the float64 reference at inputs whose similarities stay away from the histogram
nodes (where the estimates are differentiable).

Lemma 1 of the paper says that d P_ij / d s_ik is non-zero only for s_ik in s_ij's bin
[b_t, b_{t+1}]. For eqs. 3-7 as written this does not hold: with
P_i = h_left sum_{u>=t} h_i^u + h_right sum_{u>=t+1} h_i^u = h_left h_i^t + sum_{u>=t+1} h_i^u,
a negative in [b_t, b_{t+1}] gives d P_ij / d s_ik = h_right / (Delta |N|), a negative in the
bin below, [b_{t-1}, b_t], moves weight onto node t and gives h_left / (Delta |N|), and every
other bin gives 0. (The appendix's values -h_right for the same bin and +(h_i^t + h_j^t) for
d P_ij / d s_ij have the wrong sign and lack the 1/(Delta |N|) and 1/Delta factors: the true
derivative with respect to s_ij is -(h_i^t + h_j^t) / Delta.) The Lemma tests check that.

The tests marked ``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import BACKEND, CAN_COMPILE, gradient_check, to_numpy, value_and_grad
from harness import assert_compiled_values_equal_eager, slow_beyond
from keras import ops

from tfdml import ops as dml
from tfdml.losses import FAPPYLoss, HistogramLoss, false_positive_probability

P_TOL = 2e-6
LOSS_TOL = 2e-6
GRAD_RTOL = 2e-3
GRAD_ATOL = 1e-4
MB = pytest.mark.multibackend


def grid(firsts, seconds, multibackend=(), fast=None):
    """Every ``(first, second)`` as pytest params ``first-second``; the pairs in
    ``multibackend`` also run under JAX and PyTorch. (Eager JAX compiles every op for each new
    shape, and each scale of FAPPY has its own number of nodes: the multibackend subset keeps
    to few shapes and scales.) With ``fast``, the names of the pairs that run on every commit
    (every first and every second at least once): the others run in the slow tier."""
    params = [pytest.param(a, b, id=f"{a}-{b}", marks=[MB] if (a, b) in multibackend else [])
              for a in firsts for b in seconds]
    return params if fast is None else slow_beyond(params, fast)


def f32(x):
    """``(float32 array, the same values in float64)``."""
    x32 = np.asarray(x, dtype=np.float32)
    return x32, x32.astype(np.float64)


def unit(d, k, sign=1.0):
    e = np.zeros(d)
    e[k] = sign
    return e


def extreme_batch():
    """Exact duplicates and exact opposites, pairs near s = 1 and s = -1, singletons; B=14, D=6.

    Exact +-1 similarities use axis vectors, so float32 and float64 agree on them.
    """
    rng = np.random.default_rng(7)
    d = 6
    r = rng.normal(size=d)
    rows = [
        (10, unit(d, 0)),  # 0
        (10, unit(d, 0, -1.0)),  # 1: positive pair (0, 1) at s = -1 exactly
        (11, unit(d, 0)),  # 2: negative of 0 at s = 1 exactly
        (12, r),  # 3
        (12, r.copy()),  # 4: positive pair (3, 4), exact duplicates
        (13, -r),  # 5: negative of 3 and 4, exact opposite
        (12, r + 0.03 * rng.normal(size=d)),  # 6: positive, s near 1 with 3 and 4
        (12, -r + 0.03 * rng.normal(size=d)),  # 7: positive, s near -1 with 3 and 4
        (11, unit(d, 1)),  # 8
        (11, unit(d, 1, -1.0)),  # 9: positive pair (8, 9) at s = -1 exactly
        (14, rng.normal(size=d)),  # 10: singleton
        (15, rng.normal(size=d)),  # 11: singleton
        (10, rng.normal(size=d)),  # 12
        (13, rng.normal(size=d)),  # 13
    ]
    labels = np.array([lab for lab, _ in rows], dtype=np.int32)
    return labels, np.stack([v for _, v in rows])


BATCHES = {
    "mixed": ref.make_batch([4, 3, 2, 2, 1], 5, seed=0),  # B=12, D=5
    "wide": ref.make_batch([3, 3, 2, 1, 1, 1], 3, seed=1),  # B=11, D=3: similarities spread out
    "pairs": ref.make_batch([2, 2, 2, 2, 2, 1], 16, seed=2),  # B=11, D=16
    "extreme": extreme_batch(),
}


def check_away_from_thresholds(labels, x64, min_bin_width, margin=1e-5):
    """Algorithm 1 counts a pair at scale Delta iff 1 - s_ij >= Delta: a jump. Test data must
    not sit within rounding of it. Pairs of axis vectors are exempt: their similarity (-1, 0 or
    1) is exact in both precisions, so both sides of the comparison agree exactly."""
    sim = ref.clipped_similarities(x64)
    for i, j in ref.positive_pairs([int(v) for v in labels]):
        if np.count_nonzero(x64[i]) == 1 and np.count_nonzero(x64[j]) == 1:
            continue
        for delta in ref.fappy_scales(min_bin_width):
            assert abs(1.0 - sim[i][j] - delta) > margin, (i, j, delta)


def distance_to_nodes(x64, delta):
    """Smallest distance of an off-diagonal similarity to a node ``-1 + u * delta``."""
    sim = ref.clipped_similarities(x64)
    n = len(sim)
    closest = np.inf
    for i in range(n):
        for j in range(n):
            if i != j:
                position = (sim[i][j] + 1.0) / delta
                closest = min(closest, abs(position - round(position)) * delta)
    return closest


def smooth_batch(counts, dim, finest, margin, seed):
    """A seeded batch whose similarities all keep ``margin`` from the nodes of width ``finest``
    (the nodes of every coarser scale of Algorithm 1 are among them)."""
    for attempt in range(200):
        labels, x = ref.make_batch(counts, dim, seed=seed + 97 * attempt)
        _, x64 = f32(x)
        if distance_to_nodes(x64, finest) > margin:
            return labels, x64
    raise AssertionError("no batch away from the nodes")


def loss_value_and_grad(fn, labels, x32):
    """``fn(labels, x)`` and the gradient of its sum with respect to ``x``, as NumPy.

    Under JAX through ``jax.jit``: eager JAX compiles every op (forward and backward) for
    each new shape, several times slower than one compiled function.
    """
    y = ops.convert_to_tensor(labels)
    if BACKEND == "jax":
        import jax

        value, grad = jax.jit(jax.value_and_grad(lambda e: ops.sum(fn(y, e))))(x32)
        return to_numpy(value), to_numpy(grad)
    return value_and_grad(lambda e: fn(y, e), x32)


def tensors(labels, x):
    return ops.convert_to_tensor(labels), ops.convert_to_tensor(x)


# -- the references themselves --------------------------------------------------------------------


@pytest.mark.parametrize("delta", [2.0, 0.5, 0.1, 2.0 / 1024])
def test_node_weights_are_eq3(delta):
    n = ref.histogram_node_count(delta)
    rng = np.random.default_rng(3)
    values = [-1.0, 1.0, 0.0, -1.0 + delta, 1.0 - delta / 3] + list(rng.uniform(-1, 1, 20))
    for s in values:
        literal = [ref.triangular_weight(s, u, delta) for u in range(n)]
        sparse = ref.node_weights(s, delta)
        for u in range(n):
            assert sparse.get(u, 0.0) == pytest.approx(literal[u], abs=1e-9), (s, u)
        assert sum(literal) == pytest.approx(1.0, abs=1e-9)
        assert sum(w * ref.histogram_node(u, delta) for u, w in sparse.items()) == pytest.approx(s)
    last = ref.node_weights(1.0, delta)
    assert set(last) == {n - 2, n - 1}
    assert last[n - 1] == pytest.approx(1.0, abs=1e-9) and abs(last[n - 2]) < 1e-9


# -- false_positive_probability -------------------------------------------------------------------

HAND_X = np.array([
    [1.0, 0.0, 0.0, 0.0],  # 0, label 1
    [-0.6, 0.8, 0.0, 0.0],  # 1, label 1: s_01 = -0.6
    [1.0, 0.0, 0.0, 0.0],  # 2, label 2
    [-1.0, 0.0, 0.0, 0.0],  # 3, label 3
    [0.0, 0.0, 1.0, 0.0],  # 4, label 4
    [0.0, 0.0, 0.0, 1.0],  # 5, label 5
    [0.0, 0.0, 0.0, 1.0],  # 6, label 5: s_56 = 1 (never counted by Algorithm 1)
])
HAND_LABELS = np.array([1, 1, 2, 3, 4, 5, 5], dtype=np.int32)
# P_01 worked out by hand from eqs. 3-7 (five negatives 2..6 for both 0 and 1):
HAND_P01 = {2.0: 1.8, 1.0: 1.872, 0.5: 1.808}


@pytest.mark.parametrize("delta", sorted(HAND_P01))
def test_probability_hand_example(delta):
    x32, _ = f32(HAND_X)
    got = to_numpy(false_positive_probability(*tensors(HAND_LABELS, x32), delta))
    want = np.zeros((7, 7))
    want[0, 1] = want[1, 0] = HAND_P01[delta]
    # pair (5, 6): s = 1 (h_right = 1), all five negatives at s = 0. At Delta = 2 (nodes -1, 1)
    # each puts half its weight on node 1: P = 0.5 + 0.5; for Delta <= 1 none reaches it: P = 0.
    want[5, 6] = want[6, 5] = 1.0 if delta == 2.0 else 0.0
    np.testing.assert_allclose(ref.false_positive_probability(HAND_LABELS, HAND_X, delta), want,
                               atol=1e-12)
    np.testing.assert_allclose(got, want, atol=P_TOL)


@pytest.mark.parametrize("batch,delta", grid(
    sorted(BATCHES), [2.0, 0.5, 0.1, 0.0625, 0.01, 2.0 / 4096],
    multibackend=[("mixed", 0.1)],
    fast={"extreme-0.00048828125", "mixed-0.1", "pairs-2.0", "wide-0.5", "mixed-0.0625",
          "wide-0.01"}))
def test_probability_matches_reference(batch, delta):
    labels, x = BATCHES[batch]
    x32, x64 = f32(x)
    got = to_numpy(false_positive_probability(*tensors(labels, x32), delta))
    assert got.dtype == np.float32 and got.shape == (len(labels), len(labels))
    want = ref.false_positive_probability(labels, x64, delta)
    same = labels[:, None] == labels[None, :]
    positive = same & ~np.eye(len(labels), dtype=bool)
    assert np.all(got[~positive] == 0.0)  # diagonal, negative pairs, singletons
    assert np.count_nonzero(want[positive]) > 0
    # float32 similarities carry ~1e-7 error, and P moves by (h_i^t + h_j^t)/Delta per unit s_ij
    tol = P_TOL + 2e-8 / delta
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def test_probability_rescaling_invariant_and_float64():
    """(float64: TensorFlow only, see tests/losses/test_triplet.py.)"""
    labels, x = BATCHES["mixed"]
    p64 = to_numpy(false_positive_probability(*tensors(labels, x), 0.1))
    assert p64.dtype == np.float64
    np.testing.assert_allclose(p64, ref.false_positive_probability(labels, x, 0.1), atol=1e-10)
    scaled = false_positive_probability(*tensors(labels, 3.7 * x), 0.1)
    np.testing.assert_allclose(to_numpy(scaled), p64, atol=1e-10)


def overshooting_vector(dim=5, seed=11):
    """A float32 vector ``r`` whose float32 similarities to itself and to ``-r`` round past
    1 and -1 (as computed by tfdml.ops), so that clipping to [-1, 1] is observable."""
    rng = np.random.default_rng(seed)
    for _ in range(500):
        r = rng.normal(size=dim).astype(np.float32)
        x = dml.l2_normalize(ops.convert_to_tensor(np.stack([r, r, -r])))
        sim = to_numpy(dml.pairwise_similarity(x))
        if sim[0, 1] > 1.0 and sim[0, 2] < -1.0:
            return r
    raise AssertionError("no float32 vector overshoots")


@pytest.mark.parametrize("delta", [0.01, pytest.param(2.0 / 16384, marks=MB)])
def test_probability_clips_similarities(delta):
    r = overshooting_vector()
    rng = np.random.default_rng(12)
    labels = np.array([0, 0, 1, 2, 2, 0, 1, 3], dtype=np.int32)
    x32 = np.stack([r, r, -r, r, -r] + list(rng.normal(size=(3, 5)))).astype(np.float32)
    got = to_numpy(false_positive_probability(*tensors(labels, x32), delta))
    want = ref.false_positive_probability(labels, x32.astype(np.float64), delta)
    # without clipping, s = 1 + 1.2e-7 would move weight 1.2e-7 / Delta past the last node
    overshoot = (np.array([0, 1, 3, 4]), np.array([1, 0, 4, 3]))
    np.testing.assert_allclose(got[overshoot], want[overshoot], rtol=0, atol=2e-5)
    # Elsewhere a float32 similarity error of ~1e-7 moves ~1e-7 / Delta of a negative's
    # unit weight (8e-4 at the finest Delta; 6e-5 measured), spread over |N| negatives.
    np.testing.assert_allclose(got, want, rtol=0, atol=max(2e-5, 2e-8 / delta))
    assert want[0, 1] > 0 and want[3, 4] > 0


# -- FAPPYLoss ------------------------------------------------------------------------------------

# Algorithm 1 by hand on HAND_X: count = 2 positive pairs; (5, 6) has 1 - s = 0, never counted;
# (0, 1) has 1 - s = 1.6: counted at Delta = 1 and below.
HAND_LOSS = {2.0: 0.0, 1.0: (0.0 + 1.872 / 2) / 2, 0.5: ((0.0 + 1.872 / 2) / 2 + 1.808 / 2) / 2}


@pytest.mark.parametrize("min_bin_width", [2.0, 1.0, pytest.param(0.5, marks=MB)])
def test_loss_hand_example(min_bin_width):
    x32, _ = f32(HAND_X)
    want = HAND_LOSS[min_bin_width]
    assert ref.fappy_loss(HAND_LABELS, HAND_X, min_bin_width) == pytest.approx(want, abs=1e-12)
    got = to_numpy(FAPPYLoss(min_bin_width=min_bin_width)(*tensors(HAND_LABELS, x32)))
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=LOSS_TOL)


def test_scales_of_algorithm_1():
    assert ref.fappy_scales(2.0) == [2.0]
    assert ref.fappy_scales(0.5) == [2.0, 1.0, 0.5]
    assert ref.fappy_scales(0.01) == [2.0 / 2**k for k in range(8)]  # down to 0.015625
    assert ref.fappy_scales(1e-4) == [2.0 / 2**k for k in range(15)]  # down to 1.22e-4
    # A batch whose only positive pair is at s = -1 (counted at every scale, P = 2): the scales
    # are weighted 1/2, 1/4, ..., so L = 2 (1 - 2^-K) for K scales.
    labels = np.array([0, 0, 1, 2], dtype=np.int32)
    x = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    for min_bin_width, scales in ((2.0, 1), (0.01, 8), (0.003, 10), (1e-4, 15)):
        want = 2.0 * (1.0 - 0.5**scales)
        assert ref.fappy_loss(labels, x, min_bin_width) == pytest.approx(want)
        got = to_numpy(FAPPYLoss(min_bin_width=min_bin_width)(labels, x.astype(np.float32)))
        np.testing.assert_allclose(got, want, atol=LOSS_TOL)


@pytest.mark.parametrize("batch,min_bin_width", grid(
    sorted(BATCHES), [2.0, 0.5, 0.01, 0.003, 1e-3, 1e-4],
    multibackend=[("extreme", 0.5)],
    fast={"extreme-0.5", "extreme-0.0001", "mixed-2.0", "pairs-0.01", "wide-0.003",
          "mixed-0.001"}))
def test_loss_matches_reference(batch, min_bin_width):
    labels, x = BATCHES[batch]
    x32, x64 = f32(x)
    check_away_from_thresholds(labels, x64, min_bin_width)
    got = to_numpy(FAPPYLoss(min_bin_width=min_bin_width)(*tensors(labels, x32)))
    assert got.shape == () and got.dtype == np.float32
    want = ref.fappy_loss(labels, x64, min_bin_width)
    if min_bin_width < 2.0 or batch == "extreme":
        assert want > 0.0
    np.testing.assert_allclose(got, want, rtol=0, atol=LOSS_TOL + 1e-9 / min_bin_width)


def test_loss_float64_matches_reference():
    """(float64: TensorFlow only, see tests/losses/test_triplet.py.)"""
    labels, x = BATCHES["wide"]
    got = to_numpy(FAPPYLoss(min_bin_width=1e-3, dtype="float64")(*tensors(labels, x)))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref.fappy_loss(labels, x, 1e-3), atol=1e-10)


# 0.01 (slow tier) lies between the coarse 0.25 and the fine 1e-3, both on every commit.
@pytest.mark.parametrize("min_bin_width", slow_beyond([pytest.param(0.25, marks=MB), 0.01, 1e-3],
                                                      {"0.25", "0.001"}))
def test_loss_gradient_matches_finite_differences(min_bin_width):
    finest = ref.fappy_scales(min_bin_width)[-1]
    labels, x64 = smooth_batch([3, 3, 2, 2, 1], 4, finest, margin=2e-5, seed=10)
    x32 = x64.astype(np.float32)
    check_away_from_thresholds(labels, x64, min_bin_width)
    loss = FAPPYLoss(min_bin_width=min_bin_width)
    value, grad = loss_value_and_grad(loss, labels, x32)
    np.testing.assert_allclose(value, ref.fappy_loss(labels, x64, min_bin_width),
                               atol=LOSS_TOL)
    fd = ref.finite_difference_gradient(lambda e: ref.fappy_loss(labels, e, min_bin_width), x64)
    assert np.abs(fd).max() > 1e-2
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL * np.abs(fd).max())


@pytest.mark.multibackend
def test_loss_gradient_float64_compute_gradient(float64):
    labels, x64 = smooth_batch([3, 2, 2, 1], 5, 2.0 / 256, margin=1e-4, seed=20)
    loss = FAPPYLoss(min_bin_width=0.01, dtype="float64")
    label_t = ops.convert_to_tensor(labels)
    theoretical, numerical = gradient_check(lambda e: loss(label_t, e), x64, delta=1e-7)
    assert np.abs(numerical).max() > 1e-2
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-5,
                               atol=1e-6 * np.abs(numerical).max())


# -- HistogramLoss --------------------------------------------------------------------------------

# Three unit vectors: the positive pair (0, 1) at s = 0.6, negatives (0, 2) at 0 and (1, 2) at 0.8.
HIST_X = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 1.0, 0.0]])
HIST_LABELS = np.array([0, 0, 1], dtype=np.int32)
# By hand: bin 1: h+ = [0, .4, .6], h- = [0, .6, .4] -> .6 * .4 + .4 * 1;
# bin .5: h+ = [0, 0, 0, .8, .2], h- = [0, 0, .5, .2, .3] -> .2 * .8 + .3 * 1.
HIST_HAND = {1.0: 0.64, 0.5: 0.46}


@pytest.mark.parametrize("bin_width", sorted(HIST_HAND))
def test_histogram_hand_example(bin_width):
    x32, _ = f32(HIST_X)
    want = HIST_HAND[bin_width]
    assert ref.histogram_loss(HIST_LABELS, HIST_X, bin_width) == pytest.approx(want, abs=1e-12)
    got = to_numpy(HistogramLoss(bin_width=bin_width)(*tensors(HIST_LABELS, x32)))
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=LOSS_TOL)


def test_histogram_reversed_distributions():
    # positive pair at s = -1, negatives at s = 1 and s = -1: every negative is at least as
    # similar as the positive, L = 1; swapped classes separate perfectly, L = 0.
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    for bin_width in (1.0, 0.01):
        got = to_numpy(HistogramLoss(bin_width=bin_width)(np.array([0, 0, 1]), x))
        np.testing.assert_allclose(got, 1.0, atol=LOSS_TOL)
        got = to_numpy(HistogramLoss(bin_width=bin_width)(np.array([0, 1, 0]), x))
        np.testing.assert_allclose(got, 0.0, atol=LOSS_TOL)


@pytest.mark.parametrize("batch,bin_width", grid(
    sorted(BATCHES), [0.5, 0.25, 0.1, 0.05, 0.01], multibackend=[("mixed", 0.1)],
    fast={"mixed-0.1", "extreme-0.01", "pairs-0.5", "wide-0.25", "extreme-0.05"}))
def test_histogram_matches_reference(batch, bin_width):
    labels, x = BATCHES[batch]
    x32, x64 = f32(x)
    got = to_numpy(HistogramLoss(bin_width=bin_width)(*tensors(labels, x32)))
    assert got.shape == () and got.dtype == np.float32
    want = ref.histogram_loss(labels, x64, bin_width)
    assert want > 0.0
    np.testing.assert_allclose(got, want, rtol=0, atol=LOSS_TOL)


@pytest.mark.parametrize("bin_width", [pytest.param(0.1, marks=MB), 0.01])
def test_histogram_gradient_matches_finite_differences(bin_width):
    labels, x64 = smooth_batch([3, 3, 2, 1], 4, bin_width, margin=1e-4, seed=30)
    x32 = x64.astype(np.float32)
    value, grad = loss_value_and_grad(HistogramLoss(bin_width=bin_width), labels, x32)
    np.testing.assert_allclose(value, ref.histogram_loss(labels, x64, bin_width),
                               atol=LOSS_TOL)
    fd = ref.finite_difference_gradient(lambda e: ref.histogram_loss(labels, e, bin_width), x64)
    assert np.abs(fd).max() > 1e-2
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL * np.abs(fd).max())


@pytest.mark.multibackend
def test_histogram_gradient_float64_compute_gradient(float64):
    labels, x64 = smooth_batch([3, 2, 2, 1], 5, 0.05, margin=1e-4, seed=40)
    loss = HistogramLoss(bin_width=0.05, dtype="float64")
    label_t = ops.convert_to_tensor(labels)
    theoretical, numerical = gradient_check(lambda e: loss(label_t, e), x64, delta=1e-7)
    assert np.abs(numerical).max() > 1e-2
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-5,
                               atol=1e-6 * np.abs(numerical).max())


# -- Lemma 1: where d P_ij / d s_ik is non-zero ---------------------------------------------------

LEMMA_DELTA = 0.25  # nodes -1, -0.75, ..., 1; s_ij in [0.25, 0.5] is bin t = 5
LEMMA_T = 5
# s_ik of the negatives of i: bins 5, 5, 4, 4, 6, 7, 3, 1 (t, t, t-1, t-1, t+1, t+2, t-2, t-4)
LEMMA_NEGATIVES = [0.33, 0.47, 0.05, 0.2, 0.62, 0.8, -0.1, -0.6]


def lemma_expected(s_ik, h_left, h_right, count, delta=LEMMA_DELTA, t=LEMMA_T):
    """d P_ij / d s_ik for eqs. 3-7 (s_ik inside a bin)."""
    v = ref.similarity_bin(s_ik, delta)
    if v == t:
        return h_right / (delta * count)
    if v == t - 1:
        return h_left / (delta * count)
    return 0.0


def lemma_similarity_matrix(s_ij, seed=5):
    """Labels ``[0, 0, 1, ..., 8, 0]`` (i = 0, j = 1, eight negatives, a third positive last)
    and a symmetric similarity matrix with row 0 of the negatives given by LEMMA_NEGATIVES."""
    rng = np.random.default_rng(seed)
    n = 2 + len(LEMMA_NEGATIVES) + 1
    labels = [0, 0] + list(range(1, len(LEMMA_NEGATIVES) + 1)) + [0]
    sim = rng.uniform(-0.9, 0.9, size=(n, n))
    sim = (sim + sim.T) / 2
    np.fill_diagonal(sim, 1.0)
    sim[0, 1] = sim[1, 0] = s_ij
    for k, s in enumerate(LEMMA_NEGATIVES, start=2):
        sim[0, k] = sim[k, 0] = s
    return labels, sim


@pytest.mark.parametrize("s_ij", [0.26, 0.3, 0.375, 0.49])
def test_lemma1_reference_derivatives(s_ij):
    labels, sim = lemma_similarity_matrix(s_ij)
    count = len(LEMMA_NEGATIVES)
    h_left = (0.5 - s_ij) / LEMMA_DELTA
    h_right = 1.0 - h_left

    def p_with(row, col, value):
        s = sim.copy()
        s[row, col] = value  # row 0 holds the negatives of i; only that row is perturbed
        return ref.fappy_pair_probability(s, labels, 0, 1, LEMMA_DELTA)

    eps = 1e-7
    for k, s_ik in enumerate(LEMMA_NEGATIVES, start=2):
        derivative = (p_with(0, k, s_ik + eps) - p_with(0, k, s_ik - eps)) / (2 * eps)
        want = lemma_expected(s_ik, h_left, h_right, count)
        assert derivative == pytest.approx(want, abs=1e-6), (s_ik, derivative, want)
    # The bin just below s_ij's bin is not excluded, contrary to the statement of Lemma 1.
    below = [s for s in LEMMA_NEGATIVES if ref.similarity_bin(s, LEMMA_DELTA) == LEMMA_T - 1]
    assert below and all(lemma_expected(s, h_left, h_right, count) > 0 for s in below)
    # The third positive (last row) is no negative: P_ij does not depend on s_im.
    assert p_with(0, 10, sim[0, 10] + 0.3) == p_with(0, 10, sim[0, 10])
    # d P_ij / d s_ij = -(h_i^t + h_j^t) / Delta (both rows hold s_ij).
    s_up, s_down = sim.copy(), sim.copy()
    s_up[0, 1] = s_up[1, 0] = s_ij + eps
    s_down[0, 1] = s_down[1, 0] = s_ij - eps
    derivative = (ref.fappy_pair_probability(s_up, labels, 0, 1, LEMMA_DELTA)
                  - ref.fappy_pair_probability(s_down, labels, 0, 1, LEMMA_DELTA)) / (2 * eps)
    negatives = list(range(2, 2 + count))
    h_t = sum(ref.negative_histogram(sim[a], negatives, LEMMA_DELTA).get(LEMMA_T, 0.0)
              for a in (0, 1))
    assert h_t > 0
    assert derivative == pytest.approx(-h_t / LEMMA_DELTA, abs=1e-6)


def lemma_embeddings(s_ij, dim=12, seed=6):
    """Unit vectors: i = e0, j with s_ij, negatives with s_ik from LEMMA_NEGATIVES, a third
    positive; all other similarities random."""
    rng = np.random.default_rng(seed)

    def with_similarity_to_e0(s):
        u = rng.normal(size=dim)
        u[0] = 0.0
        u /= np.linalg.norm(u)
        return s * unit(dim, 0) + np.sqrt(1.0 - s * s) * u

    rows = [unit(dim, 0), with_similarity_to_e0(s_ij)]
    rows += [with_similarity_to_e0(s) for s in LEMMA_NEGATIVES]
    rows.append(with_similarity_to_e0(0.1))
    labels = np.array([0, 0] + list(range(1, len(LEMMA_NEGATIVES) + 1)) + [0], dtype=np.int32)
    return labels, np.stack(rows)


def orthogonal_part(v, others):
    """``v`` minus its projection on the span of ``others``."""
    q, _ = np.linalg.qr(np.stack(others, axis=1))
    return v - q @ (q.T @ v)


@pytest.mark.parametrize("s_ij", [0.26, pytest.param(0.3, marks=MB), 0.375, 0.49])
def test_lemma1_gradient(s_ij):
    labels, x64 = lemma_embeddings(s_ij)
    x32 = x64.astype(np.float32)
    _, grad = loss_value_and_grad(
        lambda y, e: false_positive_probability(y, e, LEMMA_DELTA)[0, 1], labels, x32)
    grad = grad.astype(np.float64)
    count = len(LEMMA_NEGATIVES)
    sim = ref.clipped_similarities(x32.astype(np.float64))
    h_left = (0.5 - sim[0][1]) / LEMMA_DELTA
    h_right = 1.0 - h_left
    xi, xj = x64[0], x64[1]
    got_by_bin = {}
    for k, s_ik in enumerate(LEMMA_NEGATIVES, start=2):
        # Move x_k (a unit vector) along d, orthogonal to x_k and to x_j: s_jk stays put to
        # first order and s_ik changes at rate d . x_i, so d P / d s_ik = (grad_k . d) / (d . x_i).
        d = orthogonal_part(xi, [x64[k], xj])
        derivative = grad[k] @ d / (d @ xi)
        want = lemma_expected(s_ik, h_left, h_right, count)
        np.testing.assert_allclose(derivative, want, rtol=1e-4, atol=1e-5, err_msg=str(s_ik))
        got_by_bin.setdefault(ref.similarity_bin(s_ik, LEMMA_DELTA) - LEMMA_T, []).append(
            derivative)
    assert all(g > 0.01 for g in got_by_bin[0] + got_by_bin[-1])  # same bin and bin below
    assert all(abs(g) < 1e-5 for off in (1, 2, -2, -4) for g in got_by_bin[off])
    # The third positive does not enter P_ij at all.
    np.testing.assert_array_equal(grad[10], 0.0)
    # d P / d s_ij: move x_j orthogonally to itself and to every negative.
    d = orthogonal_part(xi, [xj] + [x64[k] for k in range(2, 2 + count)])
    derivative = grad[1] @ d / (d @ xi)
    negatives = list(range(2, 2 + count))
    h_t = sum(ref.negative_histogram(sim[a], negatives, LEMMA_DELTA).get(LEMMA_T, 0.0)
              for a in (0, 1))
    assert h_t > 0
    np.testing.assert_allclose(derivative, -h_t / LEMMA_DELTA, rtol=1e-4, atol=1e-5)


# -- robustness -----------------------------------------------------------------------------------

LOSSES = {
    "fappy_0.25": lambda: FAPPYLoss(min_bin_width=0.25),
    "fappy_0.01": lambda: FAPPYLoss(min_bin_width=0.01),
    "fappy_1e-4": lambda: FAPPYLoss(min_bin_width=1e-4),
    "histogram_0.01": lambda: HistogramLoss(bin_width=0.01),
    "histogram_0.5": lambda: HistogramLoss(bin_width=0.5),
}


#: The losses whose tests also run under JAX and PyTorch (few FAPPY scales: see grid()).
MB_LOSSES = ("fappy_0.25",)


def _loss_params():
    return [pytest.param(n, marks=MB) if n in MB_LOSSES else n for n in sorted(LOSSES)]


# fappy_0.01 and histogram_0.5 (slow tier): scales between those of the other cases.
@pytest.mark.parametrize("name", slow_beyond(_loss_params(),
                                             {"fappy_0.25", "fappy_1e-4", "histogram_0.01"}))
def test_extreme_similarities_finite(name):
    labels, x = BATCHES["extreme"]
    x32, _ = f32(x)
    value, grad = loss_value_and_grad(LOSSES[name](), labels, x32)
    assert np.isfinite(value) and value > 0
    assert np.all(np.isfinite(grad))
    assert np.abs(grad).max() > 0


@pytest.mark.parametrize("delta", [2.0, 0.01, pytest.param(2.0 / 16384, marks=MB)])
def test_probability_extreme_gradient_finite(delta):
    labels, x = BATCHES["extreme"]
    x32, _ = f32(x)
    value, grad = loss_value_and_grad(
        lambda lab, e: ops.sum(false_positive_probability(lab, e, delta)), labels, x32)
    assert np.isfinite(value)
    assert np.all(np.isfinite(grad))


NO_PAIRS = {
    "no_positive": np.array([5, 1, 2, 3, 4, 0], dtype=np.int32),
    "one_class": np.array([2, 2, 2, 2, 2, 2], dtype=np.int32),
}


@pytest.mark.parametrize("case,name", grid(
    sorted(NO_PAIRS), sorted(LOSSES), multibackend=[("one_class", "fappy_0.25")],
    fast={"one_class-fappy_0.25", "one_class-fappy_0.01", "no_positive-fappy_1e-4",
          "no_positive-histogram_0.5", "one_class-histogram_0.01"}))
def test_nothing_to_learn_gives_zero(case, name):
    labels = NO_PAIRS[case]
    x = np.random.default_rng(8).normal(size=(6, 4))
    x[1] = x[0]  # an exact duplicate
    x[2] = -x[0]  # and an exact opposite
    x32, _ = f32(x)
    value, grad = loss_value_and_grad(LOSSES[name](), labels, x32)
    assert value == 0.0
    np.testing.assert_array_equal(grad, 0.0)
    p = to_numpy(false_positive_probability(*tensors(labels, x32), 0.01))
    np.testing.assert_array_equal(p, 0.0)


def test_singletons_have_no_pairs():
    labels, x = BATCHES["mixed"]
    x32, x64 = f32(x)
    p = to_numpy(false_positive_probability(*tensors(labels, x32), 0.05))
    singleton = [i for i in range(len(labels)) if np.sum(labels == labels[i]) == 1]
    assert singleton
    for i in singleton:
        assert np.all(p[i] == 0.0) and np.all(p[:, i] == 0.0)


@pytest.mark.parametrize("value", [0, 0.0, -1, 2.5])
def test_invalid_min_bin_width(value):
    with pytest.raises(ValueError, match="min_bin_width"):
        FAPPYLoss(min_bin_width=value)


@pytest.mark.parametrize("value", [0, 0.0, -0.1])
def test_invalid_bin_width(value):
    with pytest.raises(ValueError, match="bin_width"):
        HistogramLoss(bin_width=value)


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager values.

    (Not marked multibackend: tests/losses/test_loss_base.py compares jax.jit with eager JAX.)"""
    labels, x = BATCHES["mixed"]
    x32, _ = f32(x)
    assert_compiled_values_equal_eager(
        (FAPPYLoss(min_bin_width=0.25), HistogramLoss(bin_width=0.05)), labels, x32)
