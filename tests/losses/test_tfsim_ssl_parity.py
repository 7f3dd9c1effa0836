"""tfdml's self-supervised losses against values recorded from TensorFlow Similarity 0.17.1.

``tests/fixtures/tfsim_ssl_0.17.npz`` is recorded by
``tests/fixtures/make_tfsim_ssl_fixtures.py`` (TensorFlow 2.15.1, float32): two unnormalized
views ``za``, ``zb`` per batch (``small`` [8, 6], ``wide`` [12, 16], ``degenerate`` [8, 6]
with constant columns, two equal rows and a pair ``zb[0] == za[0]``), each TensorFlow
Similarity loss called as ``loss(za, zb)``: its per-example values, their mean and the
gradients of the mean; and ``ContrastiveModel``'s loss with identity backbone and projector.
tfdml runs in float64 here. What TensorFlow Similarity computes (``n(x) = x / ||x||``,
``cos_i = n(p_i) . n(z_i)``, ``N`` rows, ``D`` columns):

* ``SimSiamLoss(projection_type, margin=0.001)``, ``call(projector z, predictor p)``:
  per example ``0.5 * proj(cos_i) + margin`` with ``proj`` ``-cos``, ``1 - cos`` or
  ``arccos(cos) / pi`` (not clipped: NaN gradient at ``cos = 1``, NaN value above); mean over
  the batch; no stop-gradient in the loss (``ContrastiveModel`` stops ``z``:
  ``loss(sg(z1), p2) + loss(sg(z2), p1)``). tfdml's ``simsiam_loss(p, z)`` is the mean of
  ``proj(cos_i)`` with ``z`` stopped: TensorFlow Similarity's is ``tfdml / 2 + margin``, and
  its model's sum of the two directions is the paper's symmetric loss plus ``2 * margin``.
* ``SimCLRLoss(temperature=0.05)`` (on ``n(za)``, ``n(zb)``): per example
  ``l_a(i) + l_b(i)`` with ``l_a(i) = -log softmax([za_i . zb_j / T]_j ++
  [za_i . za_j / T - 1e9 [j == i]]_j)[i]`` (``l_b`` with the views swapped): NT-Xent over
  the ``2N`` rows, the two views of a sample summed; the mean over ``N`` is twice tfdml's
  ``SelfSupervisedLoss(NTXentLoss(T))`` (the mean over the ``2N`` rows).
* ``Barlow(lambda_=5e-3, margin=1e-12)``: columns standardized with the population std
  (``divide_no_nan``: a constant column is 0), ``c = za_n^T zb_n / N``, one value
  ``sum_i (1 - c_ii)^2 + lambda sum_{i != j} c_ij^2 + margin``; the margin does not show in
  float32. tfdml divides by ``sqrt(Var + eps)``, ``eps = 1e-5`` (the authors' BatchNorm):
  with ``eps = 1e-12`` it is TensorFlow Similarity's, but for the gradient w.r.t. a
  constant column (0 in TensorFlow Similarity, ``(g - mean g) / sqrt(eps)`` in tfdml).
* ``VicReg(std_const=1e-4, lambda_=25, mu=25, nu=1)``, reduction NONE by default: per
  example ``lambda mean_d (za_id - zb_id)^2 + mu [v(za) + v(zb)] / 2 + nu [c(za) + c(zb)]``,
  ``v(z) = mean_d relu(1 - sqrt(Var_d + 1e-4))`` with the *biased* variance (``N``),
  ``c(z) = sum_{d != e} Cov_de^2 / D`` with the unbiased covariance (``N - 1``). Its mean is
  the authors' loss but for the variance, which the authors (and tfdml) take unbiased.
  ``ContrastiveModel`` differentiates the ``[N]`` vector, i.e. its sum: ``N`` times the
  gradient of the mean.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from backends import to_numpy, value_and_grad

import tfdml.losses as L

FIXTURES = np.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "fixtures", "tfsim_ssl_0.17.npz"))
BATCHES = ("small", "wide", "degenerate")
SIMSIAM_MARGIN = 0.001  # TensorFlow Similarity's SimSiamLoss default


def _views(batch):
    return (FIXTURES[f"batch/{batch}/za"].astype(np.float64),
            FIXTURES[f"batch/{batch}/zb"].astype(np.float64))


def _case(batch, loss):
    return {key: FIXTURES[f"case/{batch}/{loss}/{key}"]
            for key in ("values", "default", "mean", "grad_za", "grad_zb")}


def _model(batch, algorithm):
    prefix = f"model/{batch}/{algorithm}/"
    return {key[len(prefix):]: FIXTURES[key] for key in FIXTURES.files if key.startswith(prefix)}


def _close_grad(got, want, rtol=2e-6):
    """Entrywise ``rtol`` with an absolute floor of ``rtol`` times the largest entry (float32
    gradients recorded, float64 computed)."""
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def _stacked(fn):
    """``fn(None, [za; zb])`` as a function of the two views (tfdml's two-view losses take
    the views stacked along the batch axis)."""
    return lambda a, b: fn(None, tf.concat([a, b], axis=0))


# -- SimSiam ------------------------------------------------------------------------------------

PROJECTIONS = ("negative_cosine_sim", "cosine_distance", "angular_distance")


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_simsiam_is_twice_tfsims_without_margin(batch, projection):
    """TensorFlow Similarity: ``0.5 * proj(cos) + 0.001`` per example, no stop-gradient.
    tfdml: ``proj(cos)``, targets stopped. So tfdml's value is ``2 (tfsim - 0.001)``, its
    gradient w.r.t. the predictions twice TensorFlow Similarity's, and w.r.t. the targets 0
    (TensorFlow Similarity's is not: ``ContrastiveModel`` stops it outside the loss)."""
    za, zb = _views(batch)  # TFSim's loss(za, zb): za the targets z, zb the predictions p
    want = _case(batch, f"simsiam_{projection}")
    value, (grad_p, grad_z) = value_and_grad(
        lambda p, z: L.simsiam_loss(p, z, projection_type=projection), zb, za, argnums=(0, 1))
    np.testing.assert_array_equal(grad_z, 0.0)
    assert np.abs(want["grad_za"][1:]).max() > 1e-3
    rows = np.s_[:]
    if batch == "degenerate" and projection == "angular_distance":
        # Row 0 has p == z: TFSim's arccos of the unclipped cosine has an infinite
        # derivative there (NaN gradient); tfdml's value of the row is 0 and its gradient
        # finite. Compare the other rows' gradients.
        assert want["values"][0] == np.float32(SIMSIAM_MARGIN)
        assert np.isnan(want["grad_zb"][0]).all() and np.isfinite(want["grad_zb"][1:]).all()
        assert np.isfinite(grad_p).all()
        rows = np.s_[1:]
    np.testing.assert_allclose(value, 2.0 * (want["mean"].astype(np.float64) - SIMSIAM_MARGIN),
                               rtol=1e-6)
    _close_grad(grad_p[rows], 2.0 * want["grad_zb"][rows])
    per_example = to_numpy(L.SimSiamLoss(projection_type=projection, reduction="none",
                                         dtype="float64")(za, zb))
    np.testing.assert_allclose(per_example,
                               2.0 * (want["values"].astype(np.float64) - SIMSIAM_MARGIN),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        to_numpy(L.SimSiamLoss(projection_type=projection, dtype="float64")(za, zb)), value,
        rtol=1e-12)
    if projection == "cosine_distance":  # BYOL (no TFSim counterpart): 2 - 2 cos, twice this
        np.testing.assert_allclose(to_numpy(L.byol_loss(zb, za)), 2.0 * value, rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_simsiam_contrastive_model_is_the_symmetric_loss_plus_two_margins(batch):
    """``ContrastiveModel``: ``loss(sg(z1), p2) + loss(sg(z2), p1)`` with ``p = z @ kernel``;
    the paper's ``D(p1, z2) / 2 + D(p2, z1) / 2`` is that minus ``2 * 0.001``, and has the
    same gradients w.r.t. the views (through the predictor only)."""
    za, zb = _views(batch)
    want = _model(batch, "simsiam")
    kernel = tf.constant(want["kernel"].astype(np.float64))

    def symmetric(z1, z2):
        p1, p2 = tf.matmul(z1, kernel), tf.matmul(z2, kernel)
        return L.simsiam_loss(p1, z2) / 2.0 + L.simsiam_loss(p2, z1) / 2.0

    def stacked(z1, z2):  # tfdml's one call on stacked rows: loss([z2; z1], [p1; p2])
        p = tf.matmul(tf.concat([z1, z2], axis=0), kernel)
        return L.SimSiamLoss(dtype="float64")(tf.concat([z2, z1], axis=0), p)

    value, (grad_a, grad_b) = value_and_grad(symmetric, za, zb, argnums=(0, 1))
    np.testing.assert_allclose(value, want["value"] - 2.0 * SIMSIAM_MARGIN, rtol=1e-6)
    _close_grad(grad_a, want["grad_za"])
    _close_grad(grad_b, want["grad_zb"])
    one_call, (grad_a1, grad_b1) = value_and_grad(stacked, za, zb, argnums=(0, 1))
    np.testing.assert_allclose(one_call, value, rtol=1e-12)
    _close_grad(grad_a1, grad_a, 1e-12)
    _close_grad(grad_b1, grad_b, 1e-12)


def test_simsiam_model_loss_is_the_two_recorded_directions():
    """The recorded model value is the sum of the two loss-level directions (TFSim's
    ``SimSiamLoss`` with its margin), as ``ContrastiveModel._forward_pass`` writes it."""
    za, zb = _views("small")
    want = _model("small", "simsiam")
    kernel = want["kernel"].astype(np.float64)

    def tfsim(z, p):  # TFSim's default projection, per example, then the mean
        cos = np.sum(z * p, 1) / np.linalg.norm(z, axis=1) / np.linalg.norm(p, axis=1)
        return np.mean(0.5 * -cos + SIMSIAM_MARGIN)

    np.testing.assert_allclose(tfsim(za, zb), _case("small", "simsiam_negative_cosine_sim")["mean"],
                               rtol=1e-6)
    np.testing.assert_allclose(tfsim(za, zb @ kernel) + tfsim(zb, za @ kernel), want["value"],
                               rtol=1e-6)


# -- SimCLR -------------------------------------------------------------------------------------

SIMCLR = {"simclr_default": 0.05, "simclr_t0.5": 0.5}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", sorted(SIMCLR))
def test_simclr_is_twice_ntxent_on_the_two_views(batch, case):
    """TensorFlow Similarity's per-example value sums the NT-Xent terms of the two views of
    the sample and its mean is over ``N``: twice tfdml's mean over the ``2N`` rows; the
    per-row terms agree."""
    za, zb = _views(batch)
    n = len(za)
    want = _case(batch, case)
    loss = L.SelfSupervisedLoss(L.NTXentLoss(temperature=SIMCLR[case]), dtype="float64")
    value, (grad_a, grad_b) = value_and_grad(_stacked(loss), za, zb, argnums=(0, 1))
    np.testing.assert_allclose(2.0 * value, want["mean"], rtol=1e-6)
    _close_grad(2.0 * grad_a, want["grad_za"])
    _close_grad(2.0 * grad_b, want["grad_zb"])
    rows = to_numpy(L.SelfSupervisedLoss(L.NTXentLoss(temperature=SIMCLR[case]),
                                         reduction="none", dtype="float64")(
        None, np.concatenate([za, zb])))
    # TFSim's float32 logits reach 1 / T = 20 (spacing 2e-6): its small per-example values
    # (1e-3 and less) carry absolute rounding errors up to 3e-7.
    np.testing.assert_allclose(rows[:n] + rows[n:], want["values"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", BATCHES)
def test_simclr_contrastive_model_is_the_loss(batch):
    """``ContrastiveModel`` calls ``loss(z1, z2)`` once: its value and gradients are the
    loss's (so twice tfdml's)."""
    want, case = _model(batch, "simclr"), _case(batch, "simclr_default")
    np.testing.assert_allclose(want["value"], case["mean"], rtol=1e-6)
    _close_grad(want["grad_za"], case["grad_za"], 1e-5)
    _close_grad(want["grad_zb"], case["grad_zb"], 1e-5)


# -- Barlow Twins -------------------------------------------------------------------------------

BARLOW = {"barlow_default": 5e-3, "barlow_lambda0.05": 0.05}


CONSTANT_COLUMNS = {"za": 2, "zb": 4}  # of the degenerate batch


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", sorted(BARLOW))
def test_barlow_twins_without_eps_is_tfsims(batch, case):
    """TensorFlow Similarity divides the centred columns by the population std with no
    ``eps`` (``divide_no_nan``); tfdml by ``sqrt(Var + eps)``, ``eps = 1e-5`` by default
    (the authors' ``BatchNorm1d``). With ``eps = 1e-12`` the values and gradients are
    TensorFlow Similarity's to float32 precision (its ``margin=1e-12`` does not show in
    float32), but for the gradient w.r.t. a constant column (the degenerate batch's), which
    TensorFlow Similarity's ``divide_no_nan`` makes 0 and tfdml's ``eps`` ``(g - mean g) /
    sqrt(eps)`` (test below)."""
    za, zb = _views(batch)
    want = _case(batch, case)
    lambda_ = BARLOW[case]
    np.testing.assert_allclose(want["default"], want["mean"], rtol=0)  # one value per batch
    value, (grad_a, grad_b) = value_and_grad(
        lambda a, b: L.barlow_twins_loss(a, b, lambda_=lambda_, eps=1e-12), za, zb,
        argnums=(0, 1))
    np.testing.assert_allclose(value, want["mean"], rtol=1e-6)
    columns = {"za": np.s_[:], "zb": np.s_[:]}
    if batch == "degenerate":
        columns = {key: np.arange(za.shape[1]) != column
                   for key, column in CONSTANT_COLUMNS.items()}
    _close_grad(grad_a[:, columns["za"]], want["grad_za"][:, columns["za"]], 1e-6)
    _close_grad(grad_b[:, columns["zb"]], want["grad_zb"][:, columns["zb"]], 1e-6)
    stacked = value_and_grad(_stacked(L.BarlowTwinsLoss(lambda_=lambda_, eps=1e-12,
                                                        dtype="float64")), za, zb,
                             argnums=(0, 1))
    np.testing.assert_allclose(stacked[0], value, rtol=1e-12)
    _close_grad(stacked[1][0], grad_a, 1e-12)
    _close_grad(stacked[1][1], grad_b, 1e-12)
    # tfdml's default eps = 1e-5: a difference of order eps / (2 Var) in every column.
    default = to_numpy(L.barlow_twins_loss(za, zb, lambda_=lambda_))
    assert 1e-6 < abs(default / want["mean"] - 1) < 1e-3


def test_barlow_twins_constant_columns():
    """A constant column standardizes to 0 in both libraries (same value); TensorFlow
    Similarity's gradient w.r.t. it is 0 (``divide_no_nan``), tfdml's is BatchNorm's: the
    centred gradient of the standardized column divided by ``sqrt(eps)``."""
    za, zb = _views("degenerate")
    want = _case("degenerate", "barlow_default")
    grads = {}
    for eps in (1e-5, 1e-7):
        value, grads[eps] = value_and_grad(
            lambda a, b, eps=eps: L.barlow_twins_loss(a, b, eps=eps), za, zb, argnums=(0, 1))
        np.testing.assert_allclose(value, want["mean"], rtol=1e-4)
    for view, (key, column) in enumerate(CONSTANT_COLUMNS.items()):
        assert np.all(want[f"grad_{key}"][:, column] == 0.0)
        got = {eps: grads[eps][view][:, column] for eps in grads}
        assert np.abs(got[1e-5]).max() > 1.0
        np.testing.assert_allclose(np.sum(got[1e-5]), 0.0, atol=1e-9)
        np.testing.assert_allclose(got[1e-5] * np.sqrt(1e-5), got[1e-7] * np.sqrt(1e-7),
                                   rtol=1e-4)


@pytest.mark.parametrize("batch", BATCHES)
def test_barlow_contrastive_model_is_the_loss(batch):
    want, case = _model(batch, "barlow"), _case(batch, "barlow_default")
    np.testing.assert_allclose(want["value"], case["mean"], rtol=1e-6)
    _close_grad(want["grad_za"], case["grad_za"], 1e-5)
    _close_grad(want["grad_zb"], case["grad_zb"], 1e-5)


# -- VICReg -------------------------------------------------------------------------------------


def _vicreg(za, zb, ddof, per_example=False):
    """VICReg (defaults 25, 25, 1, eps 1e-4) in TensorFlow, with the variance of the
    standard-deviation hinge over ``N - ddof``: ``ddof=0`` is TensorFlow Similarity's,
    ``ddof=1`` the authors' (and tfdml's). The covariance is over ``N - 1`` in both."""
    n, d = za.shape

    def spread(z):
        centered = z - tf.reduce_mean(z, axis=0)
        var = tf.reduce_sum(centered ** 2, axis=0) / (n - ddof)
        hinge = tf.reduce_mean(tf.nn.relu(1.0 - tf.sqrt(var + 1e-4)))
        cov = tf.matmul(centered, centered, transpose_a=True) / (n - 1)
        off = cov - tf.linalg.diag(tf.linalg.diag_part(cov))
        return hinge, tf.reduce_sum(off ** 2) / d

    (va, ca), (vb, cb) = spread(za), spread(zb)
    invariance = tf.reduce_mean((za - zb) ** 2, axis=1)
    values = 25.0 * invariance + 25.0 * (va + vb) / 2.0 + (ca + cb)
    return values if per_example else tf.reduce_mean(values)


@pytest.mark.parametrize("batch", BATCHES)
def test_vicreg_differs_by_the_biased_variance_only(batch):
    """TensorFlow Similarity's variance hinge uses the biased variance (``N``), tfdml's the
    unbiased one (``N - 1``, as the authors' code): the reference with ``ddof=0`` gives
    TensorFlow Similarity's per-example values, mean and gradients; with ``ddof=1`` tfdml's
    value and gradients; and the two differ."""
    za, zb = _views(batch)
    want = _case(batch, "vicreg_default")
    np.testing.assert_allclose(want["default"], want["values"], rtol=0)  # reduction NONE
    biased = value_and_grad(lambda a, b: _vicreg(a, b, 0), za, zb, argnums=(0, 1))
    np.testing.assert_allclose(biased[0], want["mean"], rtol=1e-6)
    _close_grad(biased[1][0], want["grad_za"])
    _close_grad(biased[1][1], want["grad_zb"])
    np.testing.assert_allclose(to_numpy(_vicreg(tf.constant(za), tf.constant(zb), 0, True)),
                               want["values"], rtol=1e-6)

    unbiased = value_and_grad(lambda a, b: _vicreg(a, b, 1), za, zb, argnums=(0, 1))
    value, (grad_a, grad_b) = value_and_grad(L.vicreg_loss, za, zb, argnums=(0, 1))
    np.testing.assert_allclose(value, unbiased[0], rtol=1e-12)
    _close_grad(grad_a, unbiased[1][0], 1e-10)
    _close_grad(grad_b, unbiased[1][1], 1e-10)
    stacked = to_numpy(L.VICRegLoss(dtype="float64")(None, np.concatenate([za, zb])))
    np.testing.assert_allclose(stacked, value, rtol=1e-12)
    assert abs(value - want["mean"]) > 1e-3 * abs(want["mean"])
    assert np.abs(grad_a - want["grad_za"]).max() > 1e-3 * np.abs(want["grad_za"]).max()


@pytest.mark.parametrize("batch", BATCHES)
def test_vicreg_contrastive_model_differentiates_the_sum(batch):
    """``VicReg``'s reduction is NONE: ``ContrastiveModel``'s loss is the ``[N]`` vector and
    its tape differentiates the sum, ``N`` times the gradient of the mean."""
    want, case = _model(batch, "vicreg"), _case(batch, "vicreg_default")
    n = len(case["values"])
    np.testing.assert_allclose(want["value"], case["values"], rtol=1e-6)
    _close_grad(want["grad_za"], n * case["grad_za"], 1e-5)
    _close_grad(want["grad_zb"], n * case["grad_zb"], 1e-5)
