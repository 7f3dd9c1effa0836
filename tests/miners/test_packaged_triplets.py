"""EmbeddingsAlreadyPackagedAsTriplets: the triplets pytorch-metric-learning 2.9 takes from
the same batches (tests/fixtures/pml_2.9.npz), a loss with it equal to pml's, the incomplete
last group, a reference set, compiled = eager and every loss taking it."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, compiled, enable_float64, to_numpy, value_and_grad
from pml_data import DATA

import tfdml
from tfdml.miners import EmbeddingsAlreadyPackagedAsTriplets, Triplets, as_pairs

pytestmark = pytest.mark.multibackend

PML_BATCHES = [pytest.param(b, marks=pytest.mark.skipif(
    BACKEND == "jax" and b != "uneven", reason="JAX: one batch (each shape compiles every op)"))
    for b in ("uneven", "pk")]


def _mine(labels, x, ref=None, ref_labels=None, ref_offset=0):
    scores = tfdml.ops.pairwise_similarity(x, ref)
    return EmbeddingsAlreadyPackagedAsTriplets().mine(scores, labels, ref_labels, ref_offset,
                                                      x, ref)


def _triplets(mined):
    assert isinstance(mined, Triplets)
    mask = to_numpy(mined.mask)
    assert mask.shape[1:] == (1, 1)
    kept = np.flatnonzero(mask[:, 0, 0])
    p, n = (to_numpy(t)[:, 0] for t in (mined.positive, mined.negative))
    return {(a, p[a], n[a]) for a in kept}


@pytest.mark.parametrize("batch", PML_BATCHES)
def test_selects_what_pytorch_metric_learning_selects(batch):
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    with enable_float64():
        got = _triplets(_mine(labels, x))
    a, p, n = (DATA[f"miner/already_packaged/{batch}/{k}"] for k in ("a", "p", "n"))
    want = set(zip(a.tolist(), p.tolist(), n.tolist(), strict=True))
    assert got == want and len(want) == len(labels) // 3


@pytest.mark.parametrize("batch", PML_BATCHES)
def test_triplet_margin_loss_with_it_equals_pytorch_metric_learning(batch):
    """pml's TripletMarginLoss(margin=0.2) with the miner: tfdml's with pml's distance and
    average (docs/losses.md, the migration table)."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    loss = tfdml.losses.TripletMarginLoss(margin=0.2, distance="l2", average="nonzero",
                                          miner=EmbeddingsAlreadyPackagedAsTriplets(),
                                          dtype="float64")
    with enable_float64():
        value, grad = value_and_grad(lambda e: loss(labels, e), x)
    np.testing.assert_allclose(value, DATA[f"packaged_triplet/{batch}/value"], rtol=1e-9)
    np.testing.assert_allclose(grad, DATA[f"packaged_triplet/{batch}/grad"], rtol=1e-7,
                               atol=1e-10)
    assert float(value) > 0


def test_labels_are_not_read():
    x = np.random.default_rng(0).normal(size=(9, 4)).astype("float32")
    want = {(0, 1, 2), (3, 4, 5), (6, 7, 8)}
    for labels in (np.zeros(9, np.int64), np.arange(9), np.array([0, 1, 0] * 3)):
        assert _triplets(_mine(labels, x)) == want


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8])
def test_the_incomplete_last_group_is_left_out(size):
    x = np.random.default_rng(size).normal(size=(size, 3)).astype("float32")
    got = _triplets(_mine(np.zeros(size, np.int64), x))
    assert got == {(a, a + 1, a + 2) for a in range(0, size - 2, 3)}


def test_a_reference_set_is_indexed_from_the_offset():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3)).astype("float32")
    memory = rng.normal(size=(4, 3)).astype("float32")
    labels, ref_labels = np.zeros(6, np.int64), np.zeros(10, np.int64)
    # The batch first in the reference set (as CrossBatchMemory puts it): its own groups.
    ref = np.concatenate([x, memory])
    assert _triplets(_mine(labels, x, ref, ref_labels, 0)) == {(0, 1, 2), (3, 4, 5)}
    # The groups are counted in reference rows: anchor i is reference row i + ref_offset.
    ref = np.concatenate([memory, x])
    assert _triplets(_mine(labels, x, ref, ref_labels, 4)) == {(2, 7, 8)}
    # No offset (the anchors are not in the reference set): rows 3i + 1 and 3i + 2 of it, as
    # pytorch-metric-learning indexes the reference set; beyond it, no triplet.
    assert _triplets(_mine(labels, x, ref, ref_labels, None)) == {(0, 1, 2), (3, 4, 5)}
    assert _triplets(_mine(labels, x, ref[:5], ref_labels[:5], None)) == {(0, 1, 2)}


@pytest.mark.parametrize("size", [12, 11])
def test_a_loss_in_blocks_keeps_the_batch_groups(size):
    x = np.random.default_rng(size).normal(size=(size, 4)).astype("float32")
    labels = np.zeros(size, np.int64)
    miner = EmbeddingsAlreadyPackagedAsTriplets()
    whole = tfdml.losses.TripletMarginLoss(margin=5.0, miner=miner)  # every triplet > 0
    blocks = tfdml.losses.TripletMarginLoss(margin=5.0, miner=miner, block_size=4)
    value = to_numpy(whole(labels, x))
    assert value > 0
    np.testing.assert_allclose(to_numpy(blocks(labels, x)), value, rtol=1e-6)
    per_anchor = to_numpy(tfdml.losses.TripletMarginLoss(margin=5.0, miner=miner,
                                                         reduction="none")(labels, x))
    assert np.all((per_anchor != 0) == ((np.arange(size) % 3 == 0)
                                        & (np.arange(size) + 2 < size)))


def test_as_pairs_gives_the_anchor_positive_and_negative():
    x = np.random.default_rng(2).normal(size=(7, 3)).astype("float32")
    pairs = to_numpy(as_pairs(_mine(np.arange(7), x), num_ref=7))
    assert {tuple(ij) for ij in np.argwhere(pairs.positive)} == {(0, 1), (3, 4)}
    assert {tuple(ij) for ij in np.argwhere(pairs.negative)} == {(0, 2), (3, 5)}


@pytest.mark.skipif(BACKEND == "torch", reason="no XLA compilation under PyTorch")
def test_compiled_equals_eager():
    x = np.random.default_rng(3).normal(size=(11, 4)).astype("float32")
    labels = np.zeros(11, np.int64)
    eager = _triplets(_mine(labels, x))
    positive, negative, mask = compiled(lambda y, e: tuple(_mine(y, e)))(labels, x)
    assert _triplets(Triplets(positive, negative, mask)) == eager


@pytest.mark.parametrize("make_loss", [
    lambda m: tfdml.losses.TripletMarginLoss(miner=m),
    lambda m: tfdml.losses.ContrastiveLoss(miner=m),
    lambda m: tfdml.losses.MultiSimilarityLoss(miner=m),
    lambda m: tfdml.losses.TripletNCALoss(miner=m),
    lambda m: tfdml.losses.MarginLoss(learn_beta=False, miner=m),
    lambda m: tfdml.losses.AngularLoss(miner=m),
], ids=["triplet_margin", "contrastive", "multi_similarity", "nca", "margin", "angular"])
def test_every_loss_takes_it_and_round_trips(make_loss):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(12, 5)).astype("float32")
    labels = np.zeros(12, np.int64)  # not read: the packaging decides
    loss = make_loss(EmbeddingsAlreadyPackagedAsTriplets())
    value = to_numpy(loss(labels, x))
    assert np.isfinite(value) and value != 0
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(clone.miner) is EmbeddingsAlreadyPackagedAsTriplets
    np.testing.assert_allclose(to_numpy(clone(labels, x)), value, rtol=1e-6)
