"""tfdml losses: ``keras.losses.Loss`` subclasses taking int labels and embeddings.

Every loss has a functional form (same arguments, returns the scalar mean over
anchors that have something to learn from) and a class for ``model.compile``.
"""

from tfdml.losses.base import MetricLoss
from tfdml.losses.contrastive import ContrastiveLoss, contrastive_loss
from tfdml.losses.fappy import FAPPYLoss, HistogramLoss, false_positive_probability
from tfdml.losses.loop import (
    HPHNTripletLoss,
    LiftedStructureLoss,
    LoOpLoss,
    hphn_triplet_loss,
    lifted_structure_loss,
    loop_loss,
)
from tfdml.losses.margin import MarginLoss, margin_loss
from tfdml.losses.multi_similarity import MultiSimilarityLoss, multi_similarity_loss
from tfdml.losses.trimmed import TrimmedLoss
from tfdml.losses.triplet import (
    TripletMarginLoss,
    TripletNCALoss,
    triplet_margin_loss,
    triplet_nca_loss,
)

__all__ = [
    "ContrastiveLoss",
    "FAPPYLoss",
    "HPHNTripletLoss",
    "HistogramLoss",
    "LiftedStructureLoss",
    "LoOpLoss",
    "MarginLoss",
    "MetricLoss",
    "MultiSimilarityLoss",
    "TrimmedLoss",
    "TripletMarginLoss",
    "TripletNCALoss",
    "contrastive_loss",
    "false_positive_probability",
    "hphn_triplet_loss",
    "lifted_structure_loss",
    "loop_loss",
    "margin_loss",
    "multi_similarity_loss",
    "triplet_margin_loss",
    "triplet_nca_loss",
]
