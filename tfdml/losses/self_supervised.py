"""Self-supervised losses without negatives: VICReg, Barlow Twins, SimSiam and BYOL.

**Calling conventions.**

* :class:`VICRegLoss` and :class:`BarlowTwinsLoss` take the two views stacked along the
  batch axis, ``y_pred = [Z; Z']`` of ``[2N, D]`` (:mod:`tfdml.losses.two_views`), and
  ignore ``y_true``: one number for the batch.
* :class:`SimSiamLoss` and :class:`BYOLLoss` compare predictions with targets row by row:
  ``loss(y_true=targets, y_pred=predictions)``, both ``[M, D]``. The targets are constants
  in the gradient (the stop-gradient of both papers). The symmetric loss of two views is
  one call on stacked rows: ``loss([z2; z1], [p1; p2])``, the mean over the ``2N`` rows
  (what :class:`tfdml.models.ContrastiveModel` does).

The functional forms take the two arrays apart: ``vicreg_loss(embeddings,
ref_embeddings)``, ``barlow_twins_loss(za, zb)``, ``simsiam_loss(p, z)``, ``byol_loss(p, z)``.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_positive
from tfdml._docs import fill_doc
from tfdml._embeddings import check_embeddings, compute_dtype
from tfdml._shims import dtype_name
from tfdml.losses.base import dtype_config
from tfdml.losses.two_views import WholeBatchViewsLoss

__all__ = ["BYOLLoss", "BarlowTwinsLoss", "SimSiamLoss", "VICRegLoss", "barlow_twins_loss",
           "byol_loss", "simsiam_loss", "vicreg_loss"]


def _same_shape(a, b, names):
    if any(s is not None and t is not None and s != t
           for s, t in zip(a.shape, b.shape, strict=True)):
        raise ValueError(f"`{names[0]}` and `{names[1]}` must have the same shape [N, D]. "
                         f"Received: {tuple(a.shape)} and {tuple(b.shape)}")


# -- VICReg -------------------------------------------------------------------------------------


def _check_vicreg(invariance_lambda, variance_mu, covariance_v, eps):
    return {"invariance_lambda": check_positive("invariance_lambda", invariance_lambda, True),
            "variance_mu": check_positive("variance_mu", variance_mu, True),
            "covariance_v": check_positive("covariance_v", covariance_v, True),
            "eps": check_positive("eps", eps)}


def _spread_terms(z, eps):
    """``(variance, covariance)`` regularizers of one view ``[N, D]``: the hinge on its
    standard deviations (halved, as the authors' code) and its squared off-diagonal
    covariances over ``D``. A batch of one has variance and covariance 0."""
    rows = z.shape[0] if z.shape[0] is not None else ops.shape(z)[0]
    dtype = dtype_name(z)
    denominator = ops.cast(ops.maximum(rows - 1, 1), dtype)
    centered = z - dml.mean(z, axis=0, keepdims=True)
    cov = dml.matmul(ops.transpose(centered), centered) / denominator
    var = ops.sum(ops.square(centered), axis=0) / denominator
    std = ops.sqrt(var + ops.convert_to_tensor(eps, dtype))
    variance = dml.mean(ops.relu(1.0 - std)) / 2.0
    dim = ops.shape(cov)[0]
    diagonal = ops.equal(ops.arange(dim)[:, None], ops.arange(dim)[None, :])
    off = ops.where(diagonal, ops.zeros((), dtype), cov)
    covariance = ops.sum(ops.square(off)) / ops.cast(dim, dtype)
    return variance, covariance


def _vicreg_value(z1, z2, invariance_lambda, variance_mu, covariance_v, eps):
    """The VICReg loss of two ``[N, D]`` views in their compute dtype, NaN for non-finite
    (or overflowing) inputs."""
    dtype = compute_dtype(z1.dtype)
    a, b = ops.cast(z1, dtype), ops.cast(z2, dtype)
    invariance = dml.mean(ops.square(a - b))
    variance_a, covariance_a = _spread_terms(a, eps)
    variance_b, covariance_b = _spread_terms(b, eps)
    value = (invariance_lambda * invariance + variance_mu * (variance_a + variance_b)
             + covariance_v * (covariance_a + covariance_b))
    return dml.nan_unless_finite(value, a, b, distances=True)


def vicreg_loss(embeddings, ref_embeddings, invariance_lambda=25, variance_mu=25,
                covariance_v=1, eps=1e-4):
    """Functional form of :class:`VICRegLoss` on two views given apart.

    Args:
        embeddings: ``[N, D]``, the first view of each sample.
        ref_embeddings: ``[N, D]``, the second view (row ``i`` of each: sample ``i``).
        invariance_lambda, variance_mu, covariance_v, eps: as in :class:`VICRegLoss`.

    Returns:
        A scalar of the dtype of ``embeddings``; NaN when an embedding is NaN or Inf.

    Raises:
        ValueError: for bad arguments, or views that are not ``[N, D]`` floats of the same
            shape.
    """
    arguments = _check_vicreg(invariance_lambda, variance_mu, covariance_v, eps)
    z1 = check_embeddings(embeddings, "embeddings")
    z2 = check_embeddings(ref_embeddings, "ref_embeddings")
    _same_shape(z1, z2, ("embeddings", "ref_embeddings"))
    value = _vicreg_value(z1, z2, **arguments)
    return ops.cast(value, dtype_name(z1))


@keras.saving.register_keras_serializable(package="tfdml")
class VICRegLoss(WholeBatchViewsLoss):
    """VICReg: invariance between the two views, variance and decorrelation within each.

    With ``Z``, ``Z'`` the ``[N, D]`` views (``y_pred`` = ``[Z; Z']``, the calling convention
    of :mod:`tfdml.losses.two_views`), as the authors' code computes it::

        L = lambda mean_{i,d} (z_id - z'_id)^2
          + mu [v(Z) + v(Z')] / 2 + nu [c(Z) + c(Z')]
        v(Z) = mean_d max(0, 1 - sqrt(Var(z_.d) + eps))
        c(Z) = (1 / D) sum_{d != e} Cov(Z)_de^2

    with the unbiased variance and covariance over the batch (``N - 1``). The embeddings
    are used as given (the paper applies the loss to the expander's output, not
    normalized); no labels. The paper's equations (5) and (6) write the invariance as the
    mean over samples of ``||z_i - z'_i||^2`` (``D`` times the code's) and the variance
    term without the halving: its coefficients (25, 25, 1) are the code's, as here and in
    pytorch-metric-learning (docs/losses.md).

    The value is one number for the batch: there is no per-sample loss, so no
    ``reduction`` and no ``sample_weight``. It is computed in float32 for float16 and
    bfloat16 embeddings (float64 for float64). A batch of one pair (``N = 1``) has no
    spread: its variance is taken as 0 (so ``v = max(0, 1 - sqrt(eps))``, constant) and its
    covariance 0, and only the invariance term trains. A NaN or Inf embedding gives NaN.

    Args:
        invariance_lambda: ``lambda >= 0``. Defaults to `25`.
        variance_mu: ``mu >= 0``. Defaults to `25`.
        covariance_v: ``nu >= 0``. Defaults to `1`.
        eps: ``> 0``, added to the variance under the square root. Defaults to `1e-4`.
        name: name of the loss. Defaults to `"vicreg_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> views = keras.ops.concatenate([f(a), f(b)], axis=0)  # [2N, D]
    >>> model = keras.Model([a, b], views)
    >>> model.compile(optimizer="adam", loss=tfdml.losses.VICRegLoss())
    >>> model.fit([first_views, second_views], None)  # no labels

    Reference:
        Bardes, Ponce, LeCun, "VICReg: variance-invariance-covariance regularization for
        self-supervised learning", ICLR 2022.
    """

    def __init__(self, invariance_lambda=25, variance_mu=25, covariance_v=1, eps=1e-4, *,
                 name="vicreg_loss", dtype=None):
        super().__init__(name=name, dtype=dtype, **_check_vicreg(
            invariance_lambda, variance_mu, covariance_v, eps))

    def value(self, z1, z2):
        return _vicreg_value(z1, z2, **self.arguments)


# -- Barlow Twins -------------------------------------------------------------------------------


def _check_barlow(lambda_, eps):
    return {"lambda_": check_positive("lambda_", lambda_, True), "eps": check_positive("eps", eps)}


def _standardize(z, eps):
    """Each column of ``[N, D]`` centred and divided by ``sqrt(Var + eps)``, the population
    variance (a ``BatchNormalization`` without scale and offset, in training mode)."""
    centered = z - dml.mean(z, axis=0, keepdims=True)
    variance = dml.mean(ops.square(centered), axis=0, keepdims=True)
    return centered / ops.sqrt(variance + ops.convert_to_tensor(eps, dtype_name(z)))


def _barlow_value(za, zb, lambda_, eps):
    """The Barlow Twins loss of two ``[N, D]`` views in their compute dtype, NaN for
    non-finite (or overflowing) inputs."""
    dtype = compute_dtype(za.dtype)
    a, b = ops.cast(za, dtype), ops.cast(zb, dtype)
    rows = a.shape[0] if a.shape[0] is not None else ops.shape(a)[0]
    c = dml.matmul(ops.transpose(_standardize(a, eps)), _standardize(b, eps))
    c = c / ops.cast(rows, dtype)
    dim = ops.shape(c)[0]
    diagonal = ops.equal(ops.arange(dim)[:, None], ops.arange(dim)[None, :])
    on = ops.sum(ops.square(ops.where(diagonal, c - 1.0, ops.zeros((), dtype))))
    off = ops.sum(ops.square(ops.where(diagonal, ops.zeros((), dtype), c)))
    return dml.nan_unless_finite(on + lambda_ * off, a, b, distances=True)


def barlow_twins_loss(za, zb, lambda_=5e-3, eps=1e-5):
    """Functional form of :class:`BarlowTwinsLoss` on two views given apart.

    Args:
        za: ``[N, D]``, the first view of each sample.
        zb: ``[N, D]``, the second view (row ``i`` of each: sample ``i``).
        lambda_, eps: as in :class:`BarlowTwinsLoss`.

    Returns:
        A scalar of the dtype of ``za``; NaN when an embedding is NaN or Inf.

    Raises:
        ValueError: for bad arguments, or views that are not ``[N, D]`` floats of the same
            shape.
    """
    arguments = _check_barlow(lambda_, eps)
    a = check_embeddings(za, "za")
    b = check_embeddings(zb, "zb")
    _same_shape(a, b, ("za", "zb"))
    return ops.cast(_barlow_value(a, b, **arguments), dtype_name(a))


@keras.saving.register_keras_serializable(package="tfdml")
class BarlowTwinsLoss(WholeBatchViewsLoss):
    """Barlow Twins: the cross-correlation of the two views driven to the identity.

    With ``Z``, ``Z'`` the ``[N, D]`` views (``y_pred = [Z; Z']``, ``y_true`` ignored), each
    column standardized over the batch with its population variance (the authors' code
    applies a ``BatchNorm1d(affine=False)`` in training mode, ``eps = 1e-5``)::

        C = std(Z)^T std(Z') / N                       (D x D)
        L = sum_i (1 - C_ii)^2 + lambda sum_{i != j} C_ij^2

    The value is one number for the batch (no ``reduction``, no ``sample_weight``),
    computed in float32 for float16 and bfloat16 embeddings. A batch of one pair has no
    spread: its columns standardize to 0, ``C = 0`` and ``L = D`` with a zero gradient.
    A NaN or Inf embedding gives NaN. Each replica of a ``tf.distribute`` strategy
    computes ``C`` over its own rows (the authors' code sums ``C`` over the GPUs after a
    synchronized batch norm).

    **Against TensorFlow Similarity's** ``Barlow``: the same formula with the population
    standard deviation, but no ``eps``: its columns are divided by the standard deviation
    itself (``divide_no_nan``, so a constant column is 0 with a zero gradient), and it
    adds ``1e-12``. With ``eps=1e-12`` the values and gradients equal its recorded ones
    (``tests/losses/test_tfsim_ssl_parity.py``); the default ``eps = 1e-5`` is the
    authors' batch norm, and changes values by about ``1e-4`` relative.

    Args:
        lambda_: ``lambda >= 0``, the weight of the off-diagonal terms. Defaults to
            `5e-3` (the paper's; the authors' code uses 0.0051).
        eps: ``> 0``, added to the variance of each column. Defaults to `1e-5`.
        name: name of the loss. Defaults to `"barlow_twins_loss"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Examples:

    >>> loss = tfdml.losses.BarlowTwinsLoss()
    >>> loss(None, keras.ops.concatenate([z1, z2], axis=0))  # two [N, D] views
    >>> model = tfdml.models.ContrastiveModel(backbone, projector, algorithm="barlow")

    Reference:
        Zbontar, Jing, Misra, LeCun, Deny, "Barlow Twins: self-supervised learning via
        redundancy reduction", ICML 2021.
    """

    def __init__(self, lambda_=5e-3, eps=1e-5, *, name="barlow_twins_loss", dtype=None):
        super().__init__(name=name, dtype=dtype, **_check_barlow(lambda_, eps))

    def value(self, z1, z2):
        return _barlow_value(z1, z2, **self.arguments)


# -- SimSiam and BYOL ---------------------------------------------------------------------------

#: SimSiam's comparisons of a prediction with its target (TensorFlow Similarity's names).
PROJECTION_TYPES = ("negative_cosine_sim", "cosine_distance", "angular_distance")


def _check_projection_type(projection_type):
    if projection_type not in PROJECTION_TYPES:
        raise ValueError(f"`projection_type` must be one of {PROJECTION_TYPES}. "
                         f"Received: projection_type={projection_type!r}")
    return projection_type


def _target_cosines(targets, predictions, names=("y_true", "y_pred")):
    """``cos(p_i, stop_gradient(z_i))`` per row, in the compute dtype; NaN everywhere when
    an input is not finite (``names``: the arguments' names, for the messages)."""
    p = check_embeddings(predictions, names[1])
    z = check_embeddings(targets, names[0])
    _same_shape(p, z, names[::-1])
    dtype = compute_dtype(p.dtype)
    p, z = ops.cast(p, dtype), ops.stop_gradient(ops.cast(z, dtype))
    cosines = ops.sum(dml.l2_normalize(p) * dml.l2_normalize(z), axis=-1)
    return dml.nan_unless_finite(cosines, p, z)


def _projection(cosines, projection_type):
    """SimSiam's per-row values from the cosines."""
    if projection_type == "negative_cosine_sim":
        return -cosines
    if projection_type == "cosine_distance":
        return 1.0 - cosines
    # arccos has an infinite slope at +-1: the cosines are kept inside, by bounds of their
    # own dtype (PyTorch would round Python floats to float32, i.e. to +-1).
    dtype = dtype_name(cosines)
    tiny = float(keras.config.epsilon()) if dtype != "float64" else 1e-15
    bound = ops.convert_to_tensor(1.0 - tiny, dtype)
    return dml.arccos(dml.clip(cosines, -bound, bound)) / math.pi


def simsiam_loss(p, z, projection_type="negative_cosine_sim"):
    """Functional form of :class:`SimSiamLoss`: the mean over rows.

    Args:
        p: ``[N, D]`` predictions.
        z: ``[N, D]`` targets (constants in the gradient).
        projection_type: as in :class:`SimSiamLoss`.

    Returns:
        A scalar of the dtype of ``p``; NaN when an embedding is NaN or Inf.

    Raises:
        ValueError: for an unknown ``projection_type``, or arrays that are not ``[N, D]``
            floats of the same shape.
    """
    values = _projection(_target_cosines(z, p, ("z", "p")),
                         _check_projection_type(projection_type))
    return ops.cast(dml.mean(values), dtype_name(check_embeddings(p, "p")))


def byol_loss(p, z):
    """Functional form of :class:`BYOLLoss`: the mean over rows of ``2 - 2 cos(p, sg(z))``.

    Args:
        p: ``[N, D]`` predictions of the online network.
        z: ``[N, D]`` projections of the target network (constants in the gradient).

    Returns:
        A scalar of the dtype of ``p``; NaN when an embedding is NaN or Inf.

    Raises:
        ValueError: for arrays that are not ``[N, D]`` floats of the same shape.
    """
    values = 2.0 - 2.0 * _target_cosines(z, p, ("z", "p"))
    return ops.cast(dml.mean(values), dtype_name(check_embeddings(p, "p")))


def _target_loss_args(name):
    """The ``Args`` lines of a target loss's Keras arguments, with its default ``name``."""
    return "\n".join([
        "reduction: Keras' reduction of the per-row values. Defaults to",
        '    `"sum_over_batch_size"`.',
        f'name: name of the loss. Defaults to `"{name}"`.',
        "dtype: dtype of the returned value. Defaults to `None` (floatx).",
    ])


class _TargetLoss(keras.losses.Loss):
    """A loss of predictions against targets row by row (``y_true`` the targets), reduced
    by Keras (``reduction``, ``sample_weight`` per row)."""

    def __init__(self, *, reduction="sum_over_batch_size", name=None, dtype=None, **arguments):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._config_dtype = dtype
        self._argument_names = tuple(arguments)
        for key, value in arguments.items():
            setattr(self, key, value)

    def get_config(self):
        config = {"name": self.name, "reduction": self.reduction,
                  **{key: getattr(self, key) for key in self._argument_names}}
        config.update(dtype_config(self._config_dtype))
        return config


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(TARGET_LOSS_ARGS=_target_loss_args("simsiam_loss"))
class SimSiamLoss(_TargetLoss):
    """SimSiam: each prediction drawn towards the stop-gradient of its target.

    With ``p_i`` a prediction (``y_pred``) and ``z_i`` its target (``y_true``, a
    constant in the gradient)::

        D(p_i, z_i) = -cos(p_i, stop_gradient(z_i))        ("negative_cosine_sim")
                    = 1 - cos(p_i, stop_gradient(z_i))      ("cosine_distance")
                    = arccos(cos(p_i, stop_gradient(z_i))) / pi   ("angular_distance")

    per row, reduced as ``reduction`` says (the mean by default). SimSiam's symmetric
    loss ``D(p1, z2) / 2 + D(p2, z1) / 2`` is the mean over stacked rows:
    ``loss([z2; z1], [p1; p2])``. The paper and its code use the negative cosine; the
    other two are TensorFlow Similarity's options (the cosine distance is the negative
    cosine plus 1: the same gradients). The angular distance keeps the cosines inside
    ``(-1, 1)`` by one ``keras.config.epsilon()`` (``1e-15`` in float64), where
    ``arccos`` has a finite slope.

    **Against TensorFlow Similarity's** ``SimSiamLoss``: it computes ``0.5 D + 0.001`` per
    row (half of this loss, plus a margin), and has no stop-gradient of its own (its
    ``ContrastiveModel`` stops the gradient of the targets); its angular distance is not
    clipped, so its gradient is NaN where ``p`` and ``z`` are parallel. Values and
    gradients are checked against its recorded ones
    (``tests/losses/test_tfsim_ssl_parity.py``).

    A zero row has cosine 0. NaN or Inf in either array gives NaN; computed in float32
    for float16 and bfloat16 inputs.

    Args:
        projection_type: one of ``"negative_cosine_sim"``, ``"cosine_distance"``,
            ``"angular_distance"``. Defaults to `"negative_cosine_sim"`.
        {TARGET_LOSS_ARGS}

    Examples:

    >>> loss = tfdml.losses.SimSiamLoss()
    >>> loss(keras.ops.concatenate([z2, z1], 0), keras.ops.concatenate([p1, p2], 0))
    >>> model = tfdml.models.ContrastiveModel(backbone, projector, predictor,
    ...                                       algorithm="simsiam")

    Reference:
        Chen, He, "Exploring simple Siamese representation learning", CVPR 2021.
    """

    def __init__(self, projection_type="negative_cosine_sim", *,
                 reduction="sum_over_batch_size", name="simsiam_loss", dtype=None):
        super().__init__(projection_type=_check_projection_type(projection_type),
                         reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        return _projection(_target_cosines(y_true, y_pred), self.projection_type)


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(TARGET_LOSS_ARGS=_target_loss_args("byol_loss"))
class BYOLLoss(_TargetLoss):
    """BYOL: the normalized prediction regressed on the target network's projection.

    With ``p_i`` the online network's prediction (``y_pred``) and ``z_i`` the target
    network's projection of the other view (``y_true``, a constant in the gradient)::

        L_i = || p_i / |p_i| - z_i / |z_i| ||^2 = 2 - 2 cos(p_i, stop_gradient(z_i))

    per row, reduced as ``reduction`` says (the mean by default). The paper's symmetric
    loss sums the two directions, ``mean(L(p1, z2)) + mean(L(p2, z1))``: twice the mean
    over stacked rows, as :class:`tfdml.models.ContrastiveModel` computes it. A zero row
    has cosine 0. NaN or Inf gives NaN; computed in float32 for float16 and bfloat16.

    Args:
        {TARGET_LOSS_ARGS}

    Examples:

    >>> loss = tfdml.losses.BYOLLoss()
    >>> loss(target_projections, online_predictions)
    >>> model = tfdml.models.ContrastiveModel(backbone, projector, predictor,
    ...                                       algorithm="byol", momentum=0.996)

    Reference:
        Grill et al., "Bootstrap your own latent: a new approach to self-supervised
        learning", NeurIPS 2020 (eq. 2).
    """

    def __init__(self, *, reduction="sum_over_batch_size", name="byol_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        return 2.0 - 2.0 * _target_cosines(y_true, y_pred)
