"""tfdml losses: ``keras.losses.Loss`` subclasses taking int labels and embeddings.

Every loss has a functional form (same arguments, returns the scalar mean over
anchors that have something to learn from) and a class for ``model.compile``.
Every class is written to one contract (:mod:`tfdml.losses.base`).
"""

from tfdml.losses import extend
from tfdml.losses.angular import AngularLoss, TupletMarginLoss, angular_loss, tuplet_margin_loss
from tfdml.losses.base import MetricLoss
from tfdml.losses.class_vectors import ClassVectorLoss, ClassVectors
from tfdml.losses.classification import (
    ArcFaceLoss,
    CosFaceLoss,
    NormalizedSoftmaxLoss,
    P2SGradLoss,
    SoftTripleLoss,
    SubCenterArcFaceLoss,
    arcface_loss,
    cosface_loss,
    normalized_softmax_loss,
    p2s_grad_loss,
    soft_triple_loss,
    subcenter_arcface_loss,
)
from tfdml.losses.contrastive import (
    ContrastiveLoss,
    SNRContrastiveLoss,
    contrastive_loss,
    snr_contrastive_loss,
)
from tfdml.losses.dynamic_soft_margin import DynamicSoftMarginLoss, dynamic_soft_margin_loss
from tfdml.losses.fappy import FAPPYLoss, HistogramLoss, false_positive_probability
from tfdml.losses.functional import functional_form
from tfdml.losses.instance import InstanceLoss, instance_loss
from tfdml.losses.large_margin import (
    LargeMarginSoftmaxLoss,
    SphereFaceLoss,
    large_margin_softmax_loss,
    sphereface_loss,
)
from tfdml.losses.lifted import (
    GeneralizedLiftedStructureLoss,
    LiftedStructureLoss,
    generalized_lifted_structure_loss,
    lifted_structure_loss,
)
from tfdml.losses.loop import HPHNTripletLoss, LoOpLoss, hphn_triplet_loss, loop_loss
from tfdml.losses.manifold import ManifoldLoss, manifold_loss
from tfdml.losses.margin import MarginLoss, margin_loss
from tfdml.losses.moco import KeyQueue, MoCoLoss, moco_loss
from tfdml.losses.multi_similarity import MultiSimilarityLoss, multi_similarity_loss
from tfdml.losses.multiple import MultipleLosses
from tfdml.losses.n_pairs import NPairsLoss, n_pairs_loss
from tfdml.losses.pair_statistics import (
    IntraPairVarianceLoss,
    RankedListLoss,
    ThresholdConsistentMarginLoss,
    intra_pair_variance_loss,
    ranked_list_loss,
    threshold_consistent_margin_loss,
)
from tfdml.losses.proxies import ProxyAnchorLoss, ProxyNCALoss, proxy_anchor_loss, proxy_nca_loss
from tfdml.losses.ranking import (
    FastAPLoss,
    PNPLoss,
    SmoothAPLoss,
    fast_ap_loss,
    pnp_loss,
    smooth_ap_loss,
)
from tfdml.losses.self_supervised import (
    BarlowTwinsLoss,
    BYOLLoss,
    SimSiamLoss,
    VICRegLoss,
    barlow_twins_loss,
    byol_loss,
    simsiam_loss,
    vicreg_loss,
)
from tfdml.losses.state import LossState
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
from tfdml.losses.two_views import SelfSupervisedLoss
from tfdml.losses.xbm import CrossBatchMemory, MemoryBank

__all__ = [
    "extend",
    "functional_form",
    "AngularLoss",
    "ArcFaceLoss",
    "BYOLLoss",
    "BarlowTwinsLoss",
    "CircleLoss",
    "ClassVectorLoss",
    "ClassVectors",
    "ContrastiveLoss",
    "CosFaceLoss",
    "CrossBatchMemory",
    "DynamicSoftMarginLoss",
    "FAPPYLoss",
    "FastAPLoss",
    "GeneralizedLiftedStructureLoss",
    "HPHNTripletLoss",
    "HistogramLoss",
    "InstanceLoss",
    "IntraPairVarianceLoss",
    "KeyQueue",
    "LargeMarginSoftmaxLoss",
    "LiftedStructureLoss",
    "LoOpLoss",
    "LossState",
    "ManifoldLoss",
    "MarginLoss",
    "MemoryBank",
    "MetricLoss",
    "MoCoLoss",
    "MultiSimilarityLoss",
    "MultipleLosses",
    "NPairsLoss",
    "NTXentLoss",
    "NormalizedSoftmaxLoss",
    "P2SGradLoss",
    "PNLoss",
    "PNPLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "RankedListLoss",
    "SNRContrastiveLoss",
    "SelfSupervisedLoss",
    "SimSiamLoss",
    "SmoothAPLoss",
    "SoftNearestNeighborLoss",
    "SoftTripleLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "SupConLoss",
    "ThresholdConsistentMarginLoss",
    "TrimmedLoss",
    "TripletMarginLoss",
    "TripletNCALoss",
    "TupletMarginLoss",
    "VICRegLoss",
    "angular_loss",
    "arcface_loss",
    "barlow_twins_loss",
    "byol_loss",
    "circle_loss",
    "contrastive_loss",
    "cosface_loss",
    "dynamic_soft_margin_loss",
    "false_positive_probability",
    "fast_ap_loss",
    "generalized_lifted_structure_loss",
    "hphn_triplet_loss",
    "instance_loss",
    "intra_pair_variance_loss",
    "large_margin_softmax_loss",
    "lifted_structure_loss",
    "loop_loss",
    "manifold_loss",
    "margin_loss",
    "moco_loss",
    "multi_similarity_loss",
    "multiple_negatives_ranking_loss",
    "n_pairs_loss",
    "normalized_softmax_loss",
    "ntxent_loss",
    "p2s_grad_loss",
    "pn_loss",
    "pnp_loss",
    "proxy_anchor_loss",
    "proxy_nca_loss",
    "ranked_list_loss",
    "simsiam_loss",
    "smooth_ap_loss",
    "snr_contrastive_loss",
    "soft_nearest_neighbor_loss",
    "soft_triple_loss",
    "sphereface_loss",
    "subcenter_arcface_loss",
    "supcon_loss",
    "threshold_consistent_margin_loss",
    "triplet_margin_loss",
    "triplet_nca_loss",
    "tuplet_margin_loss",
    "vicreg_loss",
]
