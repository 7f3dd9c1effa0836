"""Losses in row blocks (``block_size``): the dense loss's values and gradients, in less memory.

Every loss of the ``MetricLoss`` family that builds a ``[B, B]`` matrix takes
``block_size``; with it the loss runs over blocks of anchors, each against the whole batch,
and recomputes each block in the backward pass (``tfdml.losses.row_blocks``). Here: values and
gradients equal the dense loss (which the per-loss tests check against NumPy references)
with a ragged last block, eagerly and compiled, in float32 and float64, for every
reduction and with sample weights; wrapped in ``CrossBatchMemory`` and ``TrimmedLoss``;
random miners draw from the dense loss's distribution, once per step, and the backward
pass replays the forward pass's draws; bad ``block_size`` values and losses that cannot run
in blocks raise a ValueError. Peak memory is measured by ``benchmarks/large_batch.py``.
"""

from __future__ import annotations

import functools
import math
import warnings

import keras
import numpy as np
import pytest
from backends import (
    BACKEND,
    CAN_COMPILE,
    enable_float64,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import assert_config_roundtrip, pk_arrays, slow_beyond, small_embedding_model

import tfdml
from tfdml import losses, miners
from tfdml.losses import (
    CircleLoss,
    ContrastiveLoss,
    CrossBatchMemory,
    FAPPYLoss,
    HistogramLoss,
    HPHNTripletLoss,
    LiftedStructureLoss,
    LoOpLoss,
    MarginLoss,
    MultiSimilarityLoss,
    NTXentLoss,
    PNLoss,
    SoftNearestNeighborLoss,
    SupConLoss,
    TrimmedLoss,
    TripletMarginLoss,
    TripletNCALoss,
)
from tfdml.miners import AllPairsMiner, MultiSimilarityMiner, TripletMiner

pytestmark = pytest.mark.multibackend

BLOCKABLE = {
    "ephn_order2": lambda **kw: TripletNCALoss(order=2, **kw),
    "nca_hard_semihard": lambda **kw: TripletNCALoss(
        miner=TripletMiner("hard", "semihard"), **kw),
    "semihard_margin": lambda **kw: TripletMarginLoss(**kw),
    "margin_all_triplets": lambda **kw: TripletMarginLoss(miner=None, distance="l2", **kw),
    "pn": lambda **kw: PNLoss(**kw),
    "pn_hinge_easy_all": lambda **kw: PNLoss(margin=0.3, miner=TripletMiner("easy", "all"),
                                             **kw),
    "pn_all_pairs": lambda **kw: PNLoss(miner=None, **kw),
    "multi_similarity": lambda **kw: MultiSimilarityLoss(**kw),
    "eps_multi_similarity": lambda **kw: MultiSimilarityLoss(
        miner=MultiSimilarityMiner(positive="easy"), **kw),
    "contrastive": lambda **kw: ContrastiveLoss(**kw),
    "margin_learned_beta": lambda **kw: MarginLoss(miner=TripletMiner("easy", "hard"),
                                                   num_classes=7, **kw),
    "supcon": lambda **kw: SupConLoss(**kw),
    "ntxent": lambda **kw: NTXentLoss(**kw),
    "circle": lambda **kw: CircleLoss(**kw),
    "soft_nearest_neighbor": lambda **kw: SoftNearestNeighborLoss(**kw),
    "fappy": lambda **kw: FAPPYLoss(min_bin_width=0.05, **kw),
    "histogram": lambda **kw: HistogramLoss(bin_width=0.1, **kw),
    "loop_triplet": lambda **kw: LoOpLoss(**kw),
    "loop_hphn": lambda **kw: LoOpLoss("hphn_triplet", **kw),
    "loop_lifted_segments": lambda **kw: LoOpLoss("lifted_structure", normalize=False, **kw),
    "loop_multi_similarity": lambda **kw: LoOpLoss("multi_similarity", epsilon=0.3, **kw),
    "hphn": lambda **kw: HPHNTripletLoss(**kw),
    "lifted_structure": lambda **kw: LiftedStructureLoss(**kw),
    "angular": lambda **kw: losses.AngularLoss(**kw),
    "tuplet_margin": lambda **kw: losses.TupletMarginLoss(**kw),
    "generalized_lifted": lambda **kw: losses.GeneralizedLiftedStructureLoss(**kw),
    "snr_contrastive": lambda **kw: losses.SNRContrastiveLoss(**kw),
    "fast_ap": lambda **kw: losses.FastAPLoss(**kw),
    "pnp": lambda **kw: losses.PNPLoss(**kw),
    "smooth_ap": lambda **kw: losses.SmoothAPLoss(temperature=0.1, **kw),
    "instance": lambda **kw: losses.InstanceLoss(gamma=8, **kw),
    "threshold_consistent": lambda **kw: losses.ThresholdConsistentMarginLoss(**kw),
    "ranked_list": lambda **kw: losses.RankedListLoss(margin=0.4, tn=1.0, **kw),
    "dynamic_soft_margin": lambda **kw: losses.DynamicSoftMarginLoss(**kw),
}


def test_every_loss_that_takes_block_size_is_in_the_catalogue():
    """Listed from the code: each loss class whose constructor takes `block_size` is here
    (and so is checked against its dense form below), or refuses it with a ValueError."""
    import inspect

    from tfdml.losses.base import MetricLoss

    takes = set()
    for name in losses.__all__:
        cls = getattr(losses, name)
        if (inspect.isclass(cls) and issubclass(cls, MetricLoss)
                and "block_size" in inspect.signature(cls.__init__).parameters
                and name != "MetricLoss"):
            takes.add(cls)
    listed = {type(make()) for make in BLOCKABLE.values()}
    refused = takes - listed
    assert listed <= takes
    for cls in refused:
        with pytest.raises(ValueError, match="block_size"):
            cls(block_size=4)
    assert {cls.__name__ for cls in refused} == {"IntraPairVarianceLoss"}

def _batch(batch=23, dim=7, num_classes=7, seed=0, dtype="float32", duplicate=True):
    """Asymmetric (B != D), shuffled, with a singleton class and an exact duplicate."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes - 1, size=batch)
    labels[3] = num_classes - 1  # alone in its class
    x = rng.normal(size=(batch, dim))
    if duplicate:
        x[5] = x[9]
        labels[5] = labels[9]
    return labels.astype("int64"), x.astype(dtype)


def _value_and_grad(loss, labels, x, jit_compile=False, sample_weight=None):
    """The loss and its gradient as NumPy; under JAX always ``jax.jit`` (as JAX users run it,
    and eager JAX differentiates op by op, many times slower)."""
    def fn(e):
        return loss(labels, e, sample_weight=sample_weight)

    if not jit_compile and BACKEND != "jax":
        return value_and_grad(fn, x)
    return to_numpy(value_and_grad_function(fn, jit_compile=True)(x))


def _assert_close(got, want, rtol):
    value, grad = got
    np.testing.assert_allclose(value, want[0], rtol=rtol, atol=rtol)
    scale = max(float(np.abs(want[1]).max()), 1e-30)
    np.testing.assert_allclose(grad, want[1], rtol=rtol, atol=rtol * scale)


@functools.cache
def _dense(name, rows=23, duplicate=True):
    """The dense loss's value and gradient on the first ``rows`` rows of :func:`_batch`
    (computed once per module: the losses of ``BLOCKABLE`` are deterministic)."""
    labels, x = _batch(duplicate=duplicate)
    return _value_and_grad(BLOCKABLE[name](), labels[:rows], x[:rows])


# Ragged last blocks: 23 = 2 x 10 + 3 (the last block shifted back by 7 rows) and
# 23 = 2 x 8 + 7 (by 1 row), three blocks each (an eager block costs its ops again: three
# are a first, a middle and a ragged last one). The block machinery is the same for every
# loss, so the losses take the two block sizes in turn.
BLOCK_SIZES = {name: (10, 8)[i % 2] for i, name in enumerate(sorted(BLOCKABLE))}


# Under JAX and PyTorch, one loss per path through the blocks: the generic blocks with a
# triplet miner, with a pair miner, with all pairs, with a learned variable and with a
# batch-level reference (SupCon), the batch-pairs losses' (FAPPY), LoOp's (pairs and the MS
# form's samples) and the pair baselines'. What the others add, their terms for a block of
# anchors against the batch, is keras.ops code checked here under TensorFlow and, dense,
# under every backend in their own tests.
BLOCK_PATHS = frozenset({"semihard_margin", "multi_similarity", "pn_all_pairs",
                         "margin_learned_beta", "supcon", "fappy", "loop_triplet",
                         "loop_multi_similarity", "hphn"})


@pytest.mark.parametrize("name", sorted(BLOCKABLE))
def test_blocks_give_the_dense_values_and_gradients(name):
    if BACKEND != "tensorflow" and name not in BLOCK_PATHS:
        pytest.skip("the same path through the blocks as a loss of BLOCK_PATHS")
    # With every pair, PN's min(d(a, n), d(p, n)) is a tie for duplicates a = p, and a tie's
    # gradient goes to either side depending on the last bit of two matrix products. So is
    # LoOp's closest point of a zero-length arc (a duplicate pair) where the CPU's matrix
    # products round a block of rows and the whole batch differently (PyTorch; TensorFlow
    # on some processors).
    ties = name == "pn_all_pairs" or name.startswith("loop_")
    labels, x = _batch(duplicate=not ties)
    dense = _dense(name, duplicate=not ties)
    assert np.isfinite(dense[0]) and dense[0] != 0
    _assert_close(_value_and_grad(BLOCKABLE[name](block_size=BLOCK_SIZES[name]), labels, x),
                  dense, 1e-5)


# XLA compiles each (seconds). tests/losses/test_recorded_losses.py compiles on every commit
# the generic blocks with a triplet miner (nca_blocks) and with the multi-similarity miner
# (ms_blocks), FAPPY's (fappy_blocks) and LoOp's multi-similarity form (loop_ms_blocks), each
# with a ragged last block, against the record: here on every commit the paths it does not
# compile (PN's, a batch-level reference, a learned variable, LoOp's pairs, the histogram
# loss's), the others in the slow tier.
@pytest.mark.skipif(BACKEND != "tensorflow", reason="JAX runs jitted throughout; torch eager")
@pytest.mark.parametrize("name", slow_beyond(
    ["ephn_order2", "semihard_margin", "pn", "multi_similarity", "supcon", "margin_learned_beta",
     "fappy", "histogram", "loop_triplet", "loop_multi_similarity"],
    {"pn", "supcon", "margin_learned_beta", "histogram", "loop_triplet"}))
def test_blocks_compiled_equal_the_dense_loss(name):
    labels, x = _batch()
    blocked = _value_and_grad(BLOCKABLE[name](block_size=6), labels, x, jit_compile=True)
    dense = _dense(name)
    if name.startswith("loop_"):  # a duplicate pair's gradient split: see the float64 test
        blocked, dense = _merge_duplicate_rows(blocked), _merge_duplicate_rows(dense)
    _assert_close(blocked, dense, 1e-5)


@pytest.mark.parametrize("name", ["ephn_order2", "pn", "multi_similarity", "ntxent",
                                  "soft_nearest_neighbor", "fappy", "histogram", "loop_triplet",
                                  "loop_multi_similarity"])
def test_blocks_in_float64_equal_up_to_summation_order(name):
    with enable_float64():
        labels, x = _batch(dtype="float64")
        dense = _value_and_grad(BLOCKABLE[name](), labels, x)
        blocked = _value_and_grad(BLOCKABLE[name](block_size=8), labels, x)  # 2 x 8 + 7
        assert blocked[1].dtype == np.float64
        if name.startswith("loop_"):
            # Rows 5 and 9 are one embedding: their pair is a zero-length arc, whose closest
            # point to another arc is any point of it. The CPU's matrix products may round a
            # block of rows and the whole batch differently (PyTorch; TensorFlow on some
            # processors), so the gradient is split between the two rows differently; their
            # sum, and every other row, agree.
            dense, blocked = (_merge_duplicate_rows(g) for g in (dense, blocked))
        _assert_close(blocked, dense, 1e-12)


def _merge_duplicate_rows(value_and_grad, rows=(5, 9)):
    value, grad = value_and_grad
    grad = grad.copy()
    grad[rows[0]] = grad[list(rows)].sum(axis=0)
    grad[rows[1]] = 0.0
    return value, grad


@pytest.mark.parametrize("reduction", ["none", "sum", "mean_with_sample_weight"])
def test_blocks_every_reduction_with_sample_weights(reduction):
    labels, x = _batch()
    weights = np.random.default_rng(3).uniform(0.2, 2.0, size=len(labels)).astype("float32")
    dense = _value_and_grad(TripletNCALoss(order=2, reduction=reduction), labels, x,
                            sample_weight=weights)
    blocked = _value_and_grad(TripletNCALoss(order=2, reduction=reduction, block_size=7),
                              labels, x, sample_weight=weights)
    _assert_close(blocked, dense, 1e-5)


def test_one_block_when_the_batch_fits_and_nan_gives_nan():
    labels, x = _batch()
    dense = _value_and_grad(SupConLoss(), labels, x)
    _assert_close(_value_and_grad(SupConLoss(block_size=1000), labels, x), dense, 1e-6)
    x[11, 2] = np.nan
    value = to_numpy(SupConLoss(block_size=5)(labels, x))
    assert np.isnan(value)
    value = to_numpy(TripletNCALoss(block_size=5)(labels, np.where(np.isnan(x), np.inf, x)))
    assert np.isnan(value)


def test_wrapped_losses_use_the_blocks_of_the_loss_they_wrap():
    labels, x = _batch(batch=12)
    dense = _value_and_grad(TrimmedLoss(MultiSimilarityLoss(), trim=0.25), labels, x)
    blocked = _value_and_grad(TrimmedLoss(MultiSimilarityLoss(block_size=5), trim=0.25),
                              labels, x)
    _assert_close(blocked, dense, 1e-5)

    rng = np.random.default_rng(4)
    memories = [CrossBatchMemory(TripletNCALoss(order=2), memory_size=24),
                CrossBatchMemory(TripletNCALoss(order=2, block_size=5), memory_size=24)]
    for memory in memories:
        memory.build_state(7)
    for _ in range(3):  # steps 2 and 3 mine against the full bank
        features = rng.normal(size=(12, 7)).astype("float32")
        dense, blocked = (  # under JAX jitted, the bank read as it is at this step
            _value_and_grad(lambda y, e, sample_weight=None, m=m: m(y, e, training=False),
                            labels, features)
            for m in memories)
        _assert_close(blocked, dense, 1e-5)
        for memory in memories:
            memory(labels, features)  # eagerly: the bank takes the batch
    np.testing.assert_array_equal(to_numpy(memories[0].bank.labels),
                                  to_numpy(memories[1].bank.labels))


def _seed_state(loss):
    return np.array(to_numpy(loss.miner.seed_generator.state))


def test_random_miners_draw_once_per_step_and_replay_their_draws_backwards():
    labels, x = _batch(batch=14, dim=5)
    loss = TripletNCALoss(miner=TripletMiner("easy", "random", seed=3), block_size=4)
    loss.build_state()
    before = _seed_state(loss)
    value, grad = value_and_grad(lambda e: loss(labels, e), x)  # eager: the seed moves
    after = _seed_state(loss)
    np.testing.assert_array_equal(after - before, [0, 1])  # one draw of the step's seed
    assert np.isfinite(value) and np.all(np.isfinite(grad))

    # The random negatives do not depend on the embeddings, so with the seed state reset
    # before each evaluation the loss is a smooth function whose gradient the backward
    # pass gives only if it recomputes each block with the forward pass's draws.
    def at(e):
        loss.miner.seed_generator.state.assign(before)
        return float(to_numpy(loss(labels, e.astype("float32"))))

    direction = np.random.default_rng(5).normal(size=x.shape)
    step = 1e-2
    numeric = (at(x + step * direction) - at(x - step * direction)) / (2 * step)
    loss.miner.seed_generator.state.assign(before)
    _, grad = value_and_grad(lambda e: loss(labels, e), x)
    np.testing.assert_allclose(np.sum(grad * direction), numeric, rtol=2e-3, atol=1e-5)


def test_random_negatives_in_blocks_follow_the_dense_distribution():
    # Per anchor, the expected loss under a uniformly random negative is the mean of the
    # anchor's term over its negatives; the blocked draws average to it. The batch is 120
    # copies of one 10-sample batch, each copy with its own class ids, so that each
    # anchor of the small batch gets 120 independent draws per call (600 in 5 calls).
    labels, x = _batch(batch=10, dim=4, num_classes=4, seed=2)
    copies = 120
    tiled_labels = np.concatenate([labels + 10 * c for c in range(copies)])
    tiled_x = np.tile(x, (copies, 1))
    loss = TripletNCALoss(miner=TripletMiner("easy", "random", seed=11), block_size=64,
                          reduction="none")
    loss.build_state()
    exact = TripletNCALoss(miner=TripletMiner("easy", "all"), reduction="none")
    want = to_numpy(exact(tiled_labels, tiled_x))[:10]  # the mean over the negatives
    draws = np.concatenate([to_numpy(loss(tiled_labels, tiled_x)).reshape(copies, 10)
                            for _ in range(5)])
    active = want > 0
    assert active.sum() >= 8
    np.testing.assert_allclose(draws.mean(axis=0)[active], want[active], rtol=0.08)
    assert draws.std(axis=0)[active].min() > 0  # the draws do change


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_block_size_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="block_size"):
        TripletNCALoss(block_size=bad)


def test_miners_that_cannot_run_in_blocks_are_rejected_at_construction():
    with pytest.raises(ValueError, match="TripletNCALoss cannot run in blocks with TripletMiner"):
        TripletNCALoss(miner=TripletMiner("easy", "hard", disjoint=True), block_size=8)
    with pytest.raises(ValueError, match="PNLoss cannot run in blocks"):
        PNLoss(miner=TripletMiner("all", "semihard"), block_size=8)
    PNLoss(miner=TripletMiner("all", "semihard"))  # dense is fine


# Every miner of tfdml.miners, in the configurations that select differently: a loss with
# `block_size` selects exactly the dense pairs with it, or refuses it at construction.
MINERS = {
    "AllPairsMiner": [lambda: miners.AllPairsMiner()],
    "AngularMiner": [lambda: miners.AngularMiner(math.radians(35))],
    "BatchEasyHardMiner": [lambda: miners.BatchEasyHardMiner(),
                           lambda: miners.BatchEasyHardMiner("semihard", "hard")],
    "EmbeddingsAlreadyPackagedAsTriplets": [lambda: miners.EmbeddingsAlreadyPackagedAsTriplets()],
    "HDCMiner": [lambda: miners.HDCMiner(0.3)],
    "MultiSimilarityMiner": [lambda: miners.MultiSimilarityMiner(),
                             lambda: miners.MultiSimilarityMiner(positive="easy")],
    "PairMarginMiner": [lambda: miners.PairMarginMiner(0.3, 0.9)],
    "TripletMarginMiner": [lambda: miners.TripletMarginMiner(0.3, type_of_triplets="semihard")],
    "TripletMiner": [lambda: TripletMiner("easy", "hard"), lambda: TripletMiner("all", "semihard"),
                     lambda: TripletMiner("hard", "easy", disjoint=True)],
    "UniformHistogramMiner": [lambda: miners.UniformHistogramMiner(1, 1, 1, seed=0)],
}


def test_every_miner_is_in_the_block_catalogue():
    found = {name for name in dir(miners) if isinstance(getattr(miners, name), type)
             and issubclass(getattr(miners, name), miners.Miner) and name != "Miner"}
    assert found == set(MINERS)


@pytest.mark.parametrize("make", [m for makers in MINERS.values() for m in makers],
                         ids=[f"{name}{i}" for name, makers in MINERS.items()
                              for i in range(len(makers))])
def test_every_miner_in_blocks_selects_the_dense_pairs_or_is_refused(make):
    """B = 11 in blocks of 4 (a ragged last block): the same values and gradients as without
    blocks (which the miners' own tests check against pytorch-metric-learning), or a
    ValueError at construction naming `block_size`."""
    labels, x = _batch(batch=11, num_classes=4)
    if not make().blockwise:
        with pytest.raises(ValueError, match="block_size"):
            ContrastiveLoss(miner=make(), block_size=4)
        with pytest.raises(ValueError, match="block_size"):
            TripletMarginLoss(miner=make(), block_size=4)
        return
    if BACKEND != "tensorflow":
        pytest.skip("the selections are keras.ops code, compared under TensorFlow")
    for loss in (ContrastiveLoss, TripletMarginLoss):
        dense = _value_and_grad(loss(miner=make()), labels, x)
        _assert_close(_value_and_grad(loss(miner=make(), block_size=4), labels, x), dense,
                      rtol=2e-5)


def test_block_size_round_trips_through_the_config():
    loss = MultiSimilarityLoss(block_size=256)
    assert loss.get_config()["block_size"] == 256
    assert_config_roundtrip(loss)
    assert "block_size" not in MultiSimilarityLoss().get_config()


def test_fit_with_a_blocked_loss_trains_as_the_dense_one():
    data = pk_arrays(num_classes=4, per_class=3, num_batches=2)
    weights = []
    for block_size in (None, 5):
        model = small_embedding_model(seed=0)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=TripletNCALoss(order=2, block_size=block_size),
                      jit_compile=CAN_COMPILE)
        model.fit(data.x, data.y, batch_size=data.batch_size, epochs=1, shuffle=False,
                  verbose=0)
        weights.append([np.array(to_numpy(w)) for w in model.weights])
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# Under XLA (slow tier): test_blocks_compiled_equal_the_dense_loss and the recorded blocked
# losses (tests/losses/test_recorded_losses.py) compile every blocked path with a known batch
# size on every commit.
XLA_SLOW = [False, pytest.param(True, marks=pytest.mark.slow)]


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a batch size unknown when traced: TF")
@pytest.mark.parametrize("jit_compile", XLA_SLOW)
# One loss per blocked path: the generic one (PN), the batch-pairs losses' (FAPPY; the
# histogram loss shares it), LoOp's and the pair baselines'.
@pytest.mark.parametrize("name", ["pn", "fappy", "loop_multi_similarity", "lifted_structure"])
def test_unknown_batch_size_in_a_tf_graph(name, jit_compile):
    import tensorflow as tf

    labels, x = _batch()
    loss = BLOCKABLE[name](block_size=6)

    # Without AutoGraph, as tests/support/backends.py traces: the losses are keras.ops code,
    # with nothing to convert, and the conversion is most of the tracing time.
    @tf.function(jit_compile=jit_compile, autograph=False, input_signature=[
        tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 7], tf.float32)])
    def step(y, e):
        with tf.GradientTape() as tape:
            tape.watch(e)
            value = loss(y, e)
        return value, tape.gradient(value, e)

    for size in (23, 4):  # ragged blocks, and a batch smaller than one block
        _assert_close(to_numpy(step(labels[:size], x[:size])), _dense(name, size), 1e-5)
    # An empty batch: a loop over no blocks, whose outputs' block size is unknown (it used
    # to fail to stack them), under XLA too: the dense loss's 0, nothing to learn.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no anchor of this batch ..."
        value, grad = to_numpy(step(labels[:0], x[:0]))
    assert float(value) == 0.0 and grad.shape == (0, 7)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a tf.function capturing the labels")
@pytest.mark.parametrize("jit_compile", XLA_SLOW)
@pytest.mark.parametrize("name", sorted(BLOCK_PATHS | {"histogram", "fast_ap"}))
def test_labels_captured_by_a_tf_function(name, jit_compile):
    """Labels closed over by the function (not an argument) used to fail the blocked
    histogram losses' gradient ("in list of internal_captures but not in
    internal_capture_to_output"): one loss per path through the blocks."""
    import tensorflow as tf

    labels, x = _batch()
    captured = tf.constant(labels)
    loss = BLOCKABLE[name](block_size=6)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step(e):
        with tf.GradientTape() as tape:
            tape.watch(e)
            value = loss(captured, e)
        return value, tape.gradient(value, e)

    got, want = to_numpy(step(tf.constant(x))), _dense(name)
    if name.startswith("loop_"):  # a duplicate pair's gradient split: see the float64 test
        got, want = _merge_duplicate_rows(got), _merge_duplicate_rows(want)
    _assert_close(got, want, 1e-5)


@pytest.mark.parametrize("name", sorted(BLOCKABLE))
def test_an_empty_batch_gives_what_the_dense_loss_gives(name):
    """B = 0 in row blocks, eagerly: the dense loss's value, 0, nothing to learn. (In a
    TensorFlow graph whose batch size is known at run time only, see
    ``test_unknown_batch_size_in_a_tf_graph``.)"""
    if BACKEND != "tensorflow" and name not in BLOCK_PATHS:
        pytest.skip("the same path through the blocks as a loss of BLOCK_PATHS")
    labels, x = np.zeros((0,), "int64"), np.zeros((0, 7), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no anchor of this batch ..."
        dense = float(to_numpy(BLOCKABLE[name]()(labels, x)))
        blocked = float(to_numpy(BLOCKABLE[name](block_size=5)(labels, x)))
    assert blocked == dense == 0.0


def test_functional_losses_unaffected():
    labels, x = _batch()
    value = to_numpy(tfdml.losses.triplet_nca_loss(labels, x, order=2))
    np.testing.assert_allclose(value, to_numpy(TripletNCALoss(order=2)(labels, x)), rtol=1e-6)


def test_multi_similarity_miner_and_all_pairs_miner_in_blocks():
    labels, x = _batch()
    for miner in (AllPairsMiner(), MultiSimilarityMiner(epsilon=0.05, positive="all")):
        dense = _value_and_grad(ContrastiveLoss(miner=miner), labels, x)
        blocked = _value_and_grad(ContrastiveLoss(miner=miner, block_size=4), labels, x)
        _assert_close(blocked, dense, 1e-5)
