"""A weighted sum of losses, each with its own miner: :class:`MultipleLosses`."""

from __future__ import annotations

import keras
from keras import ops

from tfdml._argument_checks import check_number
from tfdml.losses.base import MetricLoss, dtype_config, resolve_loss
from tfdml.losses.ownership import check_loss_state
from tfdml.losses.state import LossState
from tfdml.losses.wrapper import LossWrapper
from tfdml.miners import Miner

__all__ = ["MultipleLosses"]


def _per_sample(loss) -> bool:
    """Whether ``loss`` returns one value per sample (``reduction="none"``), not a scalar."""
    if isinstance(loss, MultipleLosses):
        return _per_sample(loss.losses[0])
    return loss.reduction == "none"


def _check_reductions(losses):
    """All the losses reduce to a scalar, or none does (``reduction="none"``): a scalar added
    to per-sample values would broadcast onto each of them."""
    per_sample = [_per_sample(loss) for loss in losses]
    if any(per_sample) and not all(per_sample):
        reductions = [loss.reduction for loss in losses]
        raise ValueError(
            "`losses` must all reduce to a scalar, or all have reduction='none' (one value per "
            "sample): a scalar added to per-sample values would be added to each of them. "
            f"Received: losses with reduction={reductions!r}")


def _check_losses(losses, weights, miners):
    if isinstance(losses, MetricLoss) or not isinstance(losses, (list, tuple)) or not losses:
        raise ValueError("`losses` must be a non-empty list of tfdml losses. Received: "
                         f"losses={losses!r}")
    losses = [resolve_loss(loss) for loss in losses]
    if weights is None:
        weights = [1.0] * len(losses)
    if not isinstance(weights, (list, tuple)) or len(weights) != len(losses):
        raise ValueError(f"`weights` must be None or one number per loss ({len(losses)}). "
                         f"Received: weights={weights!r}")
    weights = [check_number("weights", w, finite=True) for w in weights]
    if not any(weights):
        raise ValueError(f"`weights` cannot all be 0: the sum would always be 0. Received: "
                         f"weights={weights!r}")
    _check_reductions(losses)
    if miners is not None:
        if not isinstance(miners, (list, tuple)) or len(miners) != len(losses):
            raise ValueError(f"`miners` must be None or one miner (or None) per loss "
                             f"({len(losses)}). Received: miners={miners!r}")
        for loss, miner in zip(losses, miners, strict=True):
            if miner is None:
                continue
            if not isinstance(miner, Miner) or "miner" not in loss.arguments:
                raise ValueError(f"`miners`: {miner!r} is not a tfdml miner, or loss "
                                 f"{loss.name!r} takes none.")
            loss.miner = miner
    return losses, weights


@keras.saving.register_keras_serializable(package="tfdml")
class MultipleLosses(LossWrapper):
    """A weighted sum of tfdml losses: ``sum_i weights[i] * losses[i](y_true, y_pred)``.

    Each loss computes, mines and reduces as it would alone (its own miner,
    ``average`` and ``reduction``). Either every loss reduces to a scalar
    (any reductions but ``"none"``; the sum is a scalar) or every loss has
    ``reduction="none"`` (each gives its ``[B]`` values; the sum is ``[B]``);
    a mix is refused, when the sum is built and when it is called (a
    reduction changed afterwards). The losses' states (learned class
    vectors, memory banks, random miners' seeds) are held together in this
    loss's state, so a :class:`tfdml.models.MetricModel` trains, saves and
    restores all of them.

    Args:
        losses: a list of tfdml losses (or their serialized configs).
        weights: one number per loss. Defaults to `None` (all 1).
        miners: one :class:`tfdml.miners.Miner` (or None: the loss's own)
            per loss; a miner given here becomes that loss's ``miner``.
            Defaults to `None`.
        name: name of the loss. Defaults to `"multiple_losses"`.
        dtype: dtype of the returned value. Defaults to `None` (floatx).

    Raises:
        ValueError: for losses that mix ``reduction="none"`` with scalar
            reductions (naming ``losses`` and their ``reduction``), weights
            that are not finite numbers or all 0, or miners that do not fit
            their losses.

    Examples:

    >>> loss = tfdml.losses.MultipleLosses(
    ...     [tfdml.losses.MultiSimilarityLoss(), tfdml.losses.ArcFaceLoss(num_classes=100)],
    ...     weights=[1.0, 0.5])
    >>> model = tfdml.models.MetricModel(embedder, loss)
    >>> model.compile(optimizer="adam")
    """

    def __init__(self, losses, weights=None, miners=None, *, name="multiple_losses", dtype=None):
        losses, weights = _check_losses(losses, weights, miners)
        super().__init__(name=name, dtype=dtype, losses=losses, weights=weights)

    @property
    def wrapped_losses(self):
        """The losses summed (their states are held in this loss's state)."""
        return tuple(self.losses)

    @property
    def takes_reference_set(self) -> bool:
        """False: it sums reduced losses, with no terms to compute against a reference set."""
        return False

    def make_state(self):
        children = [loss.state for loss in self.wrapped_losses]
        if all(child is None for child in children):
            return None
        return LossState(children=children, name=f"{self.name}_state")

    def __call__(self, y_true, y_pred, sample_weight=None, training=True):
        check_loss_state(self, y_pred)
        _check_reductions(self.losses)
        with keras.name_scope(self.name):
            total = None
            for loss, weight in zip(self.losses, self.weights, strict=True):
                value = ops.cast(loss(y_true, y_pred, sample_weight, training=training),
                                 self.dtype) * weight
                total = value if total is None else total + value
            return total

    def call(self, y_true, y_pred):
        total = None
        for loss, weight in zip(self.losses, self.weights, strict=True):
            value = ops.cast(loss.call(y_true, y_pred), self.dtype) * weight
            total = value if total is None else total + value
        return total

    def compute_terms(self, *args, **kwargs):
        raise NotImplementedError(
            "MultipleLosses sums reduced losses; it has no terms per anchor to wrap. Wrap "
            "each loss instead (e.g. MultipleLosses([CrossBatchMemory(a), b])).")

    def get_config(self):
        config = {"name": self.name,
                  "losses": [keras.saving.serialize_keras_object(loss) for loss in self.losses],
                  "weights": list(self.weights)}
        config.update(dtype_config(self._config_dtype))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["losses"] = [resolve_loss(loss) for loss in config["losses"]]
        return cls(**config)
