"""CrossBatchMemory (Wang et al. 2020): the bank, and the loss against it.

The loss against the bank equals the wrapped loss computed by hand on the batch with the
past batches appended as its reference set (values and gradients); the bank is a FIFO
that wraps around, is used once full and after the warm-up, is left alone by
``evaluate``, trains under a compiled ``fit`` and survives save/load.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, compiled, to_numpy, value_and_grad
from harness import assert_config_roundtrip, small_embedding_model

from tfdml.losses import (
    ContrastiveLoss,
    CrossBatchMemory,
    MultiSimilarityLoss,
    ProxyAnchorLoss,
    SupConLoss,
    TripletMarginLoss,
    contrastive_loss,
    supcon_loss,
)
from tfdml.miners import TripletMiner
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

B, D = 6, 5


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        labels = rng.integers(0, 4, B).astype(np.int32)
        labels[:2] = [i % 4, i % 4]  # at least one positive pair
        out.append((labels, rng.normal(size=(B, D)).astype(np.float32)))
    return out


def _bank(loss):
    bank = loss.bank
    return (np.array(to_numpy(bank.embeddings)), np.array(to_numpy(bank.labels)),
            int(to_numpy(bank.position)), int(to_numpy(bank.filled)),
            int(to_numpy(bank.steps)))


@pytest.mark.parametrize("inner,functional", [
    (lambda: SupConLoss(), lambda y, x, **kw: supcon_loss(y, x, **kw)),
    (lambda: ContrastiveLoss(), lambda y, x, **kw: contrastive_loss(y, x, **kw)),
], ids=["supcon", "contrastive"])
def test_loss_against_the_bank_equals_the_concatenated_batches(inner, functional):
    loss = CrossBatchMemory(inner(), memory_size=2 * B)
    (y1, x1), (y2, x2), (y3, x3) = _batches(3)
    # While the bank fills, the loss is the wrapped loss on the batch alone.
    for y, x in ((y1, x1), (y2, x2)):
        np.testing.assert_allclose(to_numpy(loss(y, x)), to_numpy(functional(y, x)), rtol=1e-6)
    embeddings, labels, position, filled, steps = _bank(loss)
    np.testing.assert_array_equal(labels, np.concatenate([y1, y2]))
    np.testing.assert_allclose(embeddings, np.concatenate([x1, x2]), rtol=0)
    assert (position, filled, steps) == (0, 2 * B, 2)

    # Full: the batch is scored against [batch; bank]; the bank is a constant.
    ref_x, ref_y = np.concatenate([x3, x1, x2]), np.concatenate([y3, y1, y2])
    past = keras.ops.convert_to_tensor(ref_x[B:])

    def by_hand(x):
        reference = keras.ops.concatenate([x, past], axis=0)
        return functional(y3, x, ref_embeddings=reference, ref_labels=ref_y, ref_offset=0)

    expected, expected_grad = value_and_grad(by_hand, x3)
    value, grad = value_and_grad(lambda x: loss(y3, x, training=False), x3)
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    # Differs from the batch alone, so the comparison can fail.
    assert abs(float(value) - float(to_numpy(functional(y3, x3)))) > 1e-3


def test_fifo_wraps_around_and_warmup_delays_the_memory():
    loss = CrossBatchMemory(TripletMarginLoss(miner=TripletMiner("all", "all")),
                            memory_size=B + B // 2, warmup_steps=3)
    batches = _batches(4, seed=1)
    values = [float(to_numpy(loss(y, x))) for y, x in batches]
    embeddings, labels, position, filled, steps = _bank(loss)
    # 4 x 6 rows written into 9 (0-based batches): batch 1 wrapped around to rows 0-2,
    # batch 2 took rows 3-8, batch 3 rows 0-5; the next write starts at row 6.
    assert (position, filled, steps) == (6, 9, 4)
    (y2, x2), (y3, x3) = batches[2:]
    np.testing.assert_allclose(embeddings[:6], x3, rtol=0)
    np.testing.assert_allclose(embeddings[6:], x2[3:], rtol=0)
    np.testing.assert_array_equal(labels, np.concatenate([y3, y2[3:]]))
    # Batch 3 (steps == 3 >= warmup, bank full) used the memory; batch 2 (full after
    # batch 1, but steps == 2 < warmup) did not.
    alone = [float(to_numpy(loss.loss(y, x))) for y, x in batches]
    np.testing.assert_allclose(values[:3], alone[:3], rtol=1e-6)
    assert abs(values[3] - alone[3]) > 1e-4


def test_evaluation_leaves_the_bank_alone():
    loss = CrossBatchMemory(SupConLoss(), memory_size=B)
    (y, x), = _batches(1)
    loss(y, x, training=False)
    assert _bank(loss)[2:] == (0, 0, 0)
    loss(y, x)
    assert _bank(loss)[2:] == (0, B, 1)


def test_compiled_equals_eager():
    if not CAN_COMPILE:
        pytest.skip("PyTorch runs eagerly")
    batches = _batches(3, seed=2)
    eager = CrossBatchMemory(MultiSimilarityLoss(), memory_size=2 * B)
    jitted = CrossBatchMemory(MultiSimilarityLoss(), memory_size=2 * B)
    jitted.build_state(D)
    # A tf.function reads the bank's variables when it runs: one compiled function for every
    # batch (as in fit).
    once = compiled(lambda y, x: jitted(y, x, training=False)) if BACKEND == "tensorflow" else None
    for y, x in batches:
        # Traced anew each time under JAX: jax.jit reads variables as constants of the trace.
        step = once or compiled(lambda y, x: jitted(y, x, training=False))
        # The compiled function only reads the bank (jax.jit cannot assign variables
        # outside the stateless scope of fit); the batch is written eagerly after it.
        np.testing.assert_allclose(to_numpy(step(y, x)), to_numpy(eager(y, x)), rtol=1e-5)
        jitted.bank.enqueue(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y))


def test_fit_fills_the_bank_and_save_load_keeps_it(tmp_path):
    loss = CrossBatchMemory(ContrastiveLoss(), memory_size=4 * B)
    model = MetricModel(small_embedding_model(input_dim=7, embed_dim=D), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.01), jit_compile=CAN_COMPILE)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5 * B, 7)).astype(np.float32)
    y = np.tile(np.repeat(np.arange(3), 2), 5).astype(np.int32)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    embeddings, labels, position, filled, steps = _bank(loss)
    assert (position, filled, steps) == (B, 4 * B, 5)
    # Rows hold the embeddings of the last four batches as computed during fit (weights
    # changed between batches): the last batch's rows match the model before its update
    # only approximately, but the labels are exact.
    np.testing.assert_array_equal(labels, np.concatenate([y[4 * B:], y[B:4 * B]]))
    assert np.abs(embeddings).max() > 0
    model.evaluate(x, y, batch_size=B, verbose=0)
    assert _bank(loss)[4] == 5  # evaluate does not write
    path = tmp_path / "xbm.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for a, b in zip(_bank(loaded.metric_loss), _bank(loss), strict=True):
        np.testing.assert_array_equal(a, b)


def test_arguments_and_config():
    with pytest.raises(ValueError, match="memory_size"):
        CrossBatchMemory(SupConLoss(), memory_size=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        CrossBatchMemory(SupConLoss(), warmup_steps=-1)
    with pytest.raises(ValueError, match="reference set"):
        CrossBatchMemory(ProxyAnchorLoss(3))
    loss = CrossBatchMemory(SupConLoss(), memory_size=B - 1)
    (y, x), = _batches(1)
    with pytest.raises(ValueError, match="at least the batch size"):
        loss(y, x)
    assert_config_roundtrip(CrossBatchMemory(SupConLoss(temperature=0.2), memory_size=64,
                                             warmup_steps=10))
