"""tfdml losses: ``keras.losses.Loss`` subclasses taking int labels and embeddings.

Every loss has a functional form (same arguments, returns the scalar mean over
anchors that have something to learn from) and a class for ``model.compile``.
"""

from tfdml.losses.angular import AngularLoss, TupletMarginLoss, angular_loss, tuplet_margin_loss
from tfdml.losses.base import LossState, MetricLoss
from tfdml.losses.class_weights import ClassWeightLoss, ClassWeights
from tfdml.losses.classification import (
    ArcFaceLoss,
    CosFaceLoss,
    LargeMarginSoftmaxLoss,
    NormalizedSoftmaxLoss,
    P2SGradLoss,
    SoftTripleLoss,
    SphereFaceLoss,
    SubCenterArcFaceLoss,
    arcface_loss,
    cosface_loss,
    large_margin_softmax_loss,
    normalized_softmax_loss,
    p2s_grad_loss,
    soft_triple_loss,
    sphereface_loss,
    subcenter_arcface_loss,
)
from tfdml.losses.contrastive import (
    ContrastiveLoss,
    SNRContrastiveLoss,
    contrastive_loss,
    snr_contrastive_loss,
)
from tfdml.losses.fappy import FAPPYLoss, HistogramLoss, false_positive_probability
from tfdml.losses.lifted import GeneralizedLiftedStructureLoss, generalized_lifted_structure_loss
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
from tfdml.losses.multiple import MultipleLosses
from tfdml.losses.proxies import ProxyAnchorLoss, ProxyNCALoss, proxy_anchor_loss, proxy_nca_loss
from tfdml.losses.supervised_contrastive import (
    CircleLoss,
    NTXentLoss,
    SoftNearestNeighborLoss,
    SupConLoss,
    circle_loss,
    multiple_negatives_ranking_loss,
    ntxent_loss,
    soft_nearest_neighbor_loss,
    supcon_loss,
)
from tfdml.losses.trimmed import TrimmedLoss
from tfdml.losses.triplet import (
    PNLoss,
    TripletMarginLoss,
    TripletNCALoss,
    pn_loss,
    triplet_margin_loss,
    triplet_nca_loss,
)
from tfdml.losses.xbm import CrossBatchMemory, MemoryBank

__all__ = [
    "AngularLoss",
    "ArcFaceLoss",
    "CircleLoss",
    "ClassWeightLoss",
    "ClassWeights",
    "ContrastiveLoss",
    "CosFaceLoss",
    "CrossBatchMemory",
    "FAPPYLoss",
    "GeneralizedLiftedStructureLoss",
    "HPHNTripletLoss",
    "HistogramLoss",
    "LargeMarginSoftmaxLoss",
    "LiftedStructureLoss",
    "LoOpLoss",
    "LossState",
    "MarginLoss",
    "MemoryBank",
    "MetricLoss",
    "MultiSimilarityLoss",
    "MultipleLosses",
    "NTXentLoss",
    "NormalizedSoftmaxLoss",
    "P2SGradLoss",
    "PNLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "SNRContrastiveLoss",
    "SoftNearestNeighborLoss",
    "SoftTripleLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "SupConLoss",
    "TrimmedLoss",
    "TripletMarginLoss",
    "TripletNCALoss",
    "TupletMarginLoss",
    "angular_loss",
    "arcface_loss",
    "circle_loss",
    "contrastive_loss",
    "cosface_loss",
    "false_positive_probability",
    "generalized_lifted_structure_loss",
    "hphn_triplet_loss",
    "large_margin_softmax_loss",
    "lifted_structure_loss",
    "loop_loss",
    "margin_loss",
    "multi_similarity_loss",
    "multiple_negatives_ranking_loss",
    "normalized_softmax_loss",
    "ntxent_loss",
    "p2s_grad_loss",
    "pn_loss",
    "proxy_anchor_loss",
    "proxy_nca_loss",
    "snr_contrastive_loss",
    "soft_nearest_neighbor_loss",
    "soft_triple_loss",
    "sphereface_loss",
    "subcenter_arcface_loss",
    "supcon_loss",
    "triplet_margin_loss",
    "triplet_nca_loss",
    "tuplet_margin_loss",
]
