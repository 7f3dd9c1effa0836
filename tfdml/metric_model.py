"""Deprecated: :class:`MetricModel` lives in :mod:`tfdml.models` (``tfdml.models.MetricModel``)
and a loss's ownership in :mod:`tfdml.losses.ownership`. Importing this module warns; its
names still work."""

from __future__ import annotations

import warnings

from tfdml.losses.ownership import check_loss_state, claim_loss, loss_owner
from tfdml.models.metric_model import MetricModel, plus_model_losses

__all__ = ["MetricModel", "check_loss_state", "claim_loss", "loss_owner", "plus_model_losses"]

warnings.warn("tfdml.metric_model is deprecated: use tfdml.models.MetricModel (and "
              "tfdml.losses.ownership for a loss's owner).", DeprecationWarning, stacklevel=2)
