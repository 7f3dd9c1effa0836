"""tfdml losses: ``keras.losses.Loss`` subclasses taking int labels and embeddings.

Every loss has a functional form (same arguments, returns the scalar mean over
anchors that have something to learn from) and a class for ``model.compile``.
"""

from tfdml.losses.base import MetricLoss
from tfdml.losses.triplet import (
    TripletMarginLoss,
    TripletNCALoss,
    triplet_margin_loss,
    triplet_nca_loss,
)

__all__ = [
    "MetricLoss",
    "TripletMarginLoss",
    "TripletNCALoss",
    "triplet_margin_loss",
    "triplet_nca_loss",
]
