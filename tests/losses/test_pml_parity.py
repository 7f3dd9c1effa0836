"""tfdml against values recorded from pytorch-metric-learning 2.9.

``tests/fixtures/pml_2.9.npz`` comes from ``tests/fixtures/make_pml_fixtures.py`` (run in
a separate environment with PyTorch; see its docstring). Values and gradients are compared
in float64. Where tfdml's default differs from pytorch-metric-learning's, the test names
the tfdml settings that reproduce it, and docs/losses.md says why the default differs.

Every test runs under each Keras backend (under JAX with ``jax_enable_x64`` for the
test, so that float64 exists). Under JAX only on the ``uneven`` batch: eager JAX
compiles every op once per new batch shape, seconds per loss and batch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import references as ref
from backends import BACKEND, enable_float64, to_numpy, value_and_grad

import tfdml.losses as L
from tfdml.losses import ContrastiveLoss, MarginLoss, MultiSimilarityLoss, TripletMarginLoss
from tfdml.miners import AllPairsMiner, MultiSimilarityMiner, TripletMiner

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "pml_2.9.npz")
DATA = np.load(FIXTURE)
BATCHES = [
    pytest.param(batch, marks=pytest.mark.skipif(
        BACKEND == "jax" and batch != "uneven",
        reason="JAX: one batch (each new shape compiles every op)"))
    for batch in ("uneven", "pk", "pairs")
]

pytestmark = pytest.mark.multibackend


@pytest.fixture(autouse=True)
def _float64():
    """float64 tensors exist during each test (JAX: jax_enable_x64)."""
    with enable_float64():
        yield


def _value_and_grad(loss, batch):
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    assert x.dtype == np.float64
    return value_and_grad(lambda y, e: loss(y, e), labels, x, argnums=1)


def _check(case, batch, loss, rtol=1e-9):
    value, grad = _value_and_grad(loss, batch)
    assert value.dtype == grad.dtype == np.float64
    np.testing.assert_allclose(value, DATA[f"{case}/{batch}/value"], rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(grad, DATA[f"{case}/{batch}/grad"], rtol=max(rtol, 1e-7),
                               atol=1e-10)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("make", [
    lambda: MultiSimilarityLoss(miner=None, dtype="float64"),
    lambda: MultiSimilarityLoss(miner=AllPairsMiner(), dtype="float64"),
], ids=["none", "all_pairs"])
def test_multi_similarity_without_mining(make, batch):
    _check("ms", batch, make())


@pytest.mark.parametrize("batch", BATCHES)
def test_multi_similarity_with_its_miner_is_the_default(batch):
    _check("ms_mined", batch, MultiSimilarityLoss(dtype="float64"))


@pytest.mark.parametrize("batch", BATCHES)
def test_margin_loss_all_triplets(batch):
    loss = MarginLoss(learn_beta=False, miner=TripletMiner("all", "all"), dtype="float64")
    assert loss.average == "nonzero"
    # pytorch-metric-learning holds a fixed beta as a float32 tensor: 1.2 + 4.8e-8.
    _check("margin_all", batch, loss, rtol=2e-7)


@pytest.mark.parametrize("batch", BATCHES)
def test_triplet_margin_loss_all_triplets_over_nonzero(batch):
    loss = TripletMarginLoss(margin=0.2, distance="l2", miner=None, average="nonzero",
                             dtype="float64")
    _check("triplet_all", batch, loss)


@pytest.mark.parametrize("batch", BATCHES)
def test_contrastive_loss_sums_separately_averaged_halves(batch):
    """pytorch-metric-learning averages the positive and the negative pairs separately
    (each over its non-zero terms) and adds the means; tfdml averages over all pairs at
    once. Its value is the sum of tfdml's nonzero-averaged losses on each kind alone."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    pos, neg = ref.label_masks(labels)
    zeros = np.zeros_like(pos)
    halves = [ref.contrastive_loss(x, p, n, 0.0, 1.0, average="nonzero")[0]
              for p, n in ((pos, zeros), (zeros, neg))]
    np.testing.assert_allclose(sum(halves), DATA[f"contrastive/{batch}/value"], rtol=1e-9)
    # tfdml's own value on the same pairs, averaged over the non-zero ones, differs.
    mixed = ContrastiveLoss(0.0, 1.0, average="nonzero", dtype="float64")(labels, x)
    assert abs(float(mixed) - sum(halves)) > 1e-3
    np.testing.assert_allclose(
        float(mixed), ref.contrastive_loss(x, pos, neg, 0.0, 1.0, average="nonzero")[0],
        rtol=1e-9)


@pytest.mark.parametrize("batch", BATCHES)
def test_contrastive_loss_halves_is_pml(batch):
    """``average="halves"``: pml's value and gradient, as the class and the functional form."""
    _check("contrastive", batch, ContrastiveLoss(0.0, 1.0, average="halves", dtype="float64"))
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    value = to_numpy(L.contrastive_loss(labels, x, 0.0, 1.0, average="halves"))
    np.testing.assert_allclose(value, DATA[f"contrastive/{batch}/value"], rtol=1e-9)


def test_recorded_miner_matches_tfdml_miner_pairs():
    """The mined case differs from the unmined one only where Wang et al.'s mining drops
    pairs: check both are recorded and differ on the uneven batch."""
    assert not np.isclose(DATA["ms/uneven/value"], DATA["ms_mined/uneven/value"])
    assert isinstance(MultiSimilarityLoss().miner, MultiSimilarityMiner)


# -- SupCon, NT-Xent, circle: every pair ------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case,make", [
    ("supcon", lambda: L.SupConLoss(temperature=0.1, dtype="float64")),
    ("ntxent", lambda: L.NTXentLoss(temperature=0.07, dtype="float64")),
    ("circle", lambda: L.CircleLoss(margin=0.4, gamma=80.0, dtype="float64")),
], ids=["supcon", "ntxent", "circle"])
def test_pair_softmax_losses_equal_pml_defaults(case, make, batch):
    _check(case, batch, make())


# -- losses with class vectors: values and both gradients -------------------------------------

# The functional forms, with pytorch-metric-learning's settings of the recorded cases.
# ArcFace's margin is in degrees there (28.6) and in radians here.
_ARC = float(np.radians(28.6))
WEIGHTED = {
    "proxy_anchor": lambda y, x, w: L.proxy_anchor_loss(y, x, w, margin=0.1, alpha=32.0),
    "proxy_nca": lambda y, x, w: L.proxy_nca_loss(y, x, w, scale=4.0),
    "normalized_softmax": lambda y, x, w: L.normalized_softmax_loss(y, x, w, temperature=0.05),
    "cosface": lambda y, x, w: L.cosface_loss(y, x, w, margin=0.35, scale=64.0),
    "arcface": lambda y, x, w: L.arcface_loss(y, x, w, margin=_ARC, scale=64.0),
    "subcenter_arcface": lambda y, x, w: L.subcenter_arcface_loss(y, x, w, margin=_ARC,
                                                                  scale=64.0),
    "soft_triple": lambda y, x, w: L.soft_triple_loss(y, x, w, la=20.0, gamma=0.1,
                                                      margin=0.01),
    "large_margin_softmax": lambda y, x, w: L.large_margin_softmax_loss(y, x, w, margin=4,
                                                                        scale=1.0),
    "sphereface": lambda y, x, w: L.sphereface_loss(y, x, w, margin=4, scale=1.0),
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", sorted(WEIGHTED))
def test_class_vector_losses_equal_pml_values_and_gradients(case, batch):
    """Embedding and weight gradients to 1e-9 in float64 (the issue asks for 1e-5)."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    weights = DATA[f"{case}/{batch}/weights"]
    value, (grad, weights_grad) = value_and_grad(WEIGHTED[case], labels, x, weights,
                                                 argnums=(1, 2))
    assert value.dtype == grad.dtype == weights_grad.dtype == np.float64
    np.testing.assert_allclose(value, DATA[f"{case}/{batch}/value"], rtol=1e-9)
    np.testing.assert_allclose(grad, DATA[f"{case}/{batch}/grad"], rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(weights_grad, DATA[f"{case}/{batch}/weights_grad"], rtol=1e-7,
                               atol=1e-10)


_CLASSES = {
    "proxy_anchor": lambda c: L.ProxyAnchorLoss(c, margin=0.1, alpha=32.0, dtype="float64"),
    "arcface": lambda c: L.ArcFaceLoss(c, margin=_ARC, dtype="float64"),
    "soft_triple": lambda c: L.SoftTripleLoss(c, centers_per_class=3, dtype="float64"),
}


@pytest.mark.parametrize("case", sorted(_CLASSES))
def test_loss_classes_with_the_recorded_weights_equal_pml(case):
    """The classes hold the vectors in float32: 1e-6 relative."""
    labels, x = DATA["uneven/labels"], DATA["uneven/embeddings"]
    weights = DATA[f"{case}/uneven/weights"]
    loss = _CLASSES[case](weights.shape[0])
    loss.build_state(x.shape[1])
    loss.class_vectors.assign(weights.astype(np.float32))
    # The functional form on the same float32-rounded weights, and pml's recorded value
    # on the float64 ones (rounding the weights moves the value by about 1e-7).
    value = float(to_numpy(loss(labels, x)))
    rounded = weights.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(value, float(to_numpy(WEIGHTED[case](labels, x, rounded))),
                               rtol=1e-9)
    np.testing.assert_allclose(value, DATA[f"{case}/uneven/value"], rtol=1e-5)


@pytest.mark.parametrize("batch", BATCHES)
def test_p2s_grad_is_pml_mean_squared_error_times_half_the_classes(batch):
    """pml takes the mean squared error over the batch and the C classes; tfdml's loss is
    ``1/2 sum_c``, whose gradient is the paper's update: C/2 times pml's value and
    embedding gradient. pml renormalizes its weights in place with ``torch.renorm``, which
    divides by the norm plus 1e-7 (columns of norm ``|w| / (|w| + 1e-7)``, checked exactly
    below), so the two agree to about 1e-7 relative, not 1e-9. Its weight gradient is taken
    at those weights as constants; tfdml differentiates through the normalization: pml's
    gradient, times C/2, projected off each weight's direction and divided by its norm."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    weights = DATA[f"p2s_grad/{batch}/weights"]
    norms = np.linalg.norm(weights, axis=1, keepdims=True)
    pml_cosines = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (weights / (norms + 1e-7)).T
    one_hot = np.eye(weights.shape[0])[labels]
    np.testing.assert_allclose(np.mean((pml_cosines - one_hot) ** 2),
                               DATA[f"p2s_grad/{batch}/value"], rtol=1e-12)
    half_classes = weights.shape[0] / 2.0
    value, (grad, weights_grad) = value_and_grad(L.p2s_grad_loss, labels, x, weights,
                                                 argnums=(1, 2))
    np.testing.assert_allclose(value, half_classes * DATA[f"p2s_grad/{batch}/value"],
                               rtol=1e-6)
    np.testing.assert_allclose(grad, half_classes * DATA[f"p2s_grad/{batch}/grad"], rtol=1e-6,
                               atol=1e-8)
    unit = weights / norms
    g = half_classes * DATA[f"p2s_grad/{batch}/weights_grad"]
    projected = (g - np.sum(g * unit, axis=1, keepdims=True) * unit) / norms
    np.testing.assert_allclose(weights_grad, projected, rtol=1e-6, atol=1e-8)
