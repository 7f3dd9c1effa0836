"""The manifold loss (Aziere & Todorovic, CVPR 2019): a random walk over the batch and proxies.

The ``N`` embeddings and ``K`` learned proxies are the nodes of a graph whose edge weights
are ``S_ij = exp(relu(cos_ij) / 0.5)`` (no self-loops), normalized symmetrically
(``S_bar = D^-1/2 S D^-1/2``). The random walk's similarities are the closed form of its
diffusion, ``F = (1 - alpha) (I - alpha S_bar)^-1``: one ``(N + K) x (N + K)`` matrix inverse
per batch. Each sample belongs to a *meta class*, the index of its proxy (``y_true``).
"""

from __future__ import annotations

import math

import keras
from keras import ops

from tfdml import ops as dml
from tfdml._argument_checks import check_int, check_number
from tfdml._docs import fill_doc
from tfdml._shims import dtype_name
from tfdml.losses._docstrings import CLASS_LOSS_ARGS
from tfdml.losses.class_vectors import (
    ClassVectorLoss,
    class_mask,
    functional_class_loss,
    sample_terms,
)

__all__ = ["ManifoldLoss", "manifold_loss"]


def random_walk_similarities(x, proxies, alpha):
    """``F = (1 - alpha) (I - alpha S_bar)^-1`` over the nodes ``[x; proxies]``.

    Args:
        x: ``[N, D]`` unit embeddings.
        proxies: ``[K, D]`` unit proxies.
        alpha: in ``(0, 1)``.

    Returns:
        ``[N + K, N + K]`` in the dtype of ``x``.
    """
    nodes = ops.concatenate([x, proxies], axis=0)
    dtype = dtype_name(nodes)
    cos = dml.matmul(nodes, ops.transpose(nodes))
    size = ops.shape(cos)[0]
    eye = ops.eye(size, dtype=dtype)
    s = ops.where(eye > 0, ops.zeros((), dtype), ops.exp(2.0 * ops.relu(cos)))
    # Every off-diagonal weight is >= 1: the degrees are >= N + K - 1 (> 0 but for one node).
    inv_sqrt_degree = ops.rsqrt(ops.sum(s, axis=1))
    s_bar = inv_sqrt_degree[:, None] * s * inv_sqrt_degree[None, :]
    # The eigenvalues of I - alpha S_bar are >= 1 - alpha > 0. A NaN or Inf node (whose loss
    # is NaN anyway) would make TensorFlow's inverse raise: its weights are set to 0 instead.
    s_bar = ops.where(ops.isfinite(s_bar), s_bar, ops.zeros((), dtype))
    return (1.0 - alpha) * ops.linalg.inv(eye - alpha * s_bar)


def _hinge_softplus(scores, target, margin):
    """Per row ``log(1 + sum_{j != y, z_j >= 0} exp(z_j))`` with ``z_j = s_j - s_y + margin``."""
    dtype = dtype_name(scores)
    own = ops.sum(ops.where(target, scores, ops.zeros((), dtype)), axis=1)
    z = scores - own[:, None] + ops.convert_to_tensor(margin, dtype)
    keep = ops.logical_and(ops.logical_not(target), z >= 0)
    values, _ = dml.masked_logsumexp(z, keep, add_one=True)
    return values


def _unit_rows(f):
    return f / ops.sqrt(ops.sum(ops.square(f), axis=1, keepdims=True))


def _manifold_losses(inputs, lambda_c, alpha, margin):
    """The ``[N]`` per-sample losses ``loss_int + lambda_c loss_ctx`` (``loss_ctx`` alone for
    ``lambda_c = inf``), from integer meta classes and unit embeddings and proxies."""
    labels, x, proxies = inputs.labels, inputs.x, inputs.vectors
    num_proxies = proxies.shape[0]
    f = random_walk_similarities(x, proxies, alpha)
    rows = ops.shape(x)[0]
    f_samples, f_proxies = f[:rows], f[rows:]
    target = class_mask(labels, num_proxies)
    # Context: the cosine between a sample's row of F and each proxy's row.
    context = dml.matmul(_unit_rows(f_samples), ops.transpose(_unit_rows(f_proxies)))
    loss_ctx = _hinge_softplus(context, target, margin)
    if math.isinf(lambda_c):
        return loss_ctx
    loss_int = _hinge_softplus(f_samples[:, rows:], target, margin)
    return loss_int + lambda_c * loss_ctx


def _checked(lambda_c, alpha, margin):
    """The loss's own arguments, checked, by name."""
    return {"lambda_c": check_number("lambda_c", lambda_c, low=0),  # inf: context only
            "alpha": check_number("alpha", alpha, low=0, high=1, low_open=True, high_open=True),
            "margin": check_number("margin", margin, finite=True)}


def _check_sizes(dim, k, proxies=None, y_pred=None):
    """``(l, k)`` checked (``dim`` is ``l``); ``proxies`` must be ``[k, l]`` and ``y_pred``
    ``[B, l]``."""
    dim, k = check_int("l", dim), check_int("k", k)
    if proxies is not None:
        shape = tuple(ops.convert_to_tensor(proxies).shape)
        if len(shape) != 2 or shape[0] not in (None, k) or shape[1] not in (None, dim):
            raise ValueError(f"`proxies` must have shape [k, l] = [{k}, {dim}]. "
                             f"Received: proxies.shape={shape}")
    if y_pred is not None:
        shape = tuple(ops.convert_to_tensor(y_pred).shape)
        if shape[-1] is not None and shape[-1] != dim:
            raise ValueError(f"`y_pred` must have l = {dim} columns (the embedding size). "
                             f"Received: y_pred.shape={shape}")
    return dim, k


def manifold_loss(y_true, y_pred, proxies, l, k=50, lambda_c=1.0, alpha=0.8,  # noqa: E741
                  margin=5e-4):
    """Functional form of :class:`ManifoldLoss`, with the proxies given.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` meta classes: each sample's proxy, in
            ``[0, k)``.
        y_pred: ``[B, l]`` embeddings (normalized here).
        proxies: ``[k, l]`` (normalized here).
        l, k, lambda_c, alpha, margin: as in :class:`ManifoldLoss`.

    Returns:
        The mean over the batch (dtype of ``y_pred``); NaN when an embedding
        or a proxy is NaN or Inf, or (traced) when a meta class is outside
        ``[0, k)``.

    Raises:
        ValueError: for bad arguments or shapes, or (eagerly) a meta class
            outside ``[0, k)``.
    """
    _check_sizes(l, k, proxies, y_pred)
    return functional_class_loss(_manifold_losses, y_true, y_pred, proxies,
                                 vectors_name="proxies", **_checked(lambda_c, alpha, margin))


@keras.saving.register_keras_serializable(package="tfdml")
@fill_doc(CLASS_LOSS_ARGS=CLASS_LOSS_ARGS)
class ManifoldLoss(ClassVectorLoss):
    """Manifold loss: intrinsic and context losses of a random walk over samples and proxies.

    The embeddings ``x_1..x_N`` and ``K`` learned proxies are the nodes of a
    graph with weights ``S_ij = exp(2 max(cos_ij, 0))`` (``i != j``, unit
    vectors). With ``S_bar = D^-1/2 S D^-1/2`` (``D`` the degrees), the random
    walk's similarities are ``F = (1 - alpha) (I - alpha S_bar)^-1``. Each
    sample ``i`` has a meta class ``y_i`` (``y_true``: the index of its proxy)
    and, per score ``s_ij`` over the proxies ``j``,
    ``h(s)_i = log(1 + sum_{j != y_i, z_ij >= 0} exp(z_ij))`` with
    ``z_ij = s_ij - s_iy_i + margin``::

        L_i = h(F[i, N + j])_i + lambda_c h(cos(F[i, :], F[N + j, :]))_i

    the intrinsic loss (the walk's similarity of a sample to the proxies)
    and the context loss (the cosine between its row of ``F`` and each
    proxy's row), averaged over the batch. ``lambda_c = 0`` gives the
    intrinsic loss only, ``lambda_c = inf`` the context loss only.

    Every sample enters the random walk, so a sample's loss depends on the
    whole batch; ``sample_weight`` and ``reduction="none"`` act on the
    per-sample losses ``L_i``. The cost is one ``(N + K) x (N + K)`` matrix
    inverse per batch, computed in float32 (float64 for float64 embeddings).

    The proxies are a variable of the loss's state (``loss.class_vectors``,
    ``[k, l]``). Train with :class:`tfdml.models.MetricModel`, which owns it.

    Start the proxies in the data. The edge weight ``exp(2 max(cos, 0))``
    is 1, with a zero gradient, at every cosine ``<= 0``. Random proxies
    (the default initializer; pytorch-metric-learning's are standard
    normal) against embeddings that fill a narrow cone (a network on
    non-negative pixels, say) are pushed out of it: the hinge terms of the
    ``k - 1`` other proxies outweigh the pull of a sample's own, and the
    context loss, whose gradient is 10-40x the intrinsic one's, pushes the
    hardest. Once no sample or other proxy has a positive cosine with a
    proxy, the walk cannot tell the proxies apart: each term is
    ``log(1 + (k - 1) e^margin)``, about ``ln k``, with a zero gradient, a
    plateau that training does not leave (about ``2 ln k`` in all for
    ``lambda_c = 1``). On scikit-learn's digits
    (``python examples/digits_manifold.py``: the 16-d linear embedding of
    ``examples/digits_losses.py``, ``k = 6`` proxies, one per training
    digit, 10 x 40 steps of Adam 1e-3, seed 0), the defaults' loss over 40
    fixed batches rises from 2.56 to 3.33 (intrinsic 1.40 -> 1.79,
    ``ln 6 = 1.79``; the image-proxy cosines above 0 fall from 48% to 3%).
    With each proxy set before training to the mean unit embedding of its
    meta class under the untrained network, it falls from 0.81 to 0.21
    (0.39 -> 0.046 with ``lambda_c=0``); Recall@1 on the held-out digits
    goes 95.1 (the untrained embedding) -> 95.9 (96.1 with ``lambda_c=0``)
    against 95.5 for random proxies, all below the 99.4 of cosine on the raw
    pixels: the digits show the plateau, not what the loss learns::

        loss.build_state(l)
        e = embedder.predict(x_train)
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        loss.class_vectors.assign(
            np.stack([e[meta_train == j].mean(axis=0) for j in range(k)]))

    Args:
        l: the embedding size.
        k: the number of proxies; the meta classes ``y_true`` must be in
            ``[0, k)``. Defaults to `50`.
        lambda_c: the weight of the context loss, ``>= 0`` or ``inf``.
            Defaults to `1.0`.
        alpha: the random walk's parameter, in ``(0, 1)``. Defaults to `0.8`.
        margin: added to each proxy's score against the sample's own.
            Defaults to `5e-4`.
        initializer: a Keras initializer for the proxies. Defaults to `None`:
            normal with standard deviation ``1 / sqrt(l)``.
        {CLASS_LOSS_ARGS}
        name: name of the loss. Defaults to `"manifold_loss"`.

    Examples:

    >>> loss = tfdml.losses.ManifoldLoss(l=128, k=64)
    >>> model = tfdml.models.MetricModel(embedder, loss)  # y: each sample's proxy

    Reference:
        Aziere, Todorovic, "Ensemble deep manifold similarity learning using
        hard proxies", CVPR 2019.
    """

    vector_name = "proxies"

    def __init__(self, l, k=50, lambda_c=1.0, alpha=0.8, margin=5e-4,  # noqa: E741
                 initializer=None, *, average="anchors", reduction="sum_over_batch_size",
                 name="manifold_loss", dtype=None):
        dim, k = _check_sizes(l, k)
        super().__init__(k, dim, initializer, **_checked(lambda_c, alpha, margin),
                         average=average, reduction=reduction, name=name, dtype=dtype)

    @property
    def l(self):  # noqa: E743 (the paper's and pytorch-metric-learning's name)
        """The embedding size."""
        return self.embedding_dim

    @property
    def k(self):
        """The number of proxies."""
        return self.num_classes

    def terms(self, inputs):
        return sample_terms(inputs, _manifold_losses(inputs, self.lambda_c, self.alpha,
                                                     self.margin))

    def get_config(self):
        config = super().get_config()
        config["k"] = config.pop("num_classes")
        config["l"] = config.pop("embedding_dim")
        return config

