"""The one list of loss configurations the contract suite runs (``tests/losses/test_loss_base.py``)
and the recorded values and gradients check (``tests/losses/test_recorded_losses.py``).

To cover a new loss (or loss + miner configuration), add one line to ``LOSS_CASES``; a public
loss class that is in no case must be in ``test_loss_base.EXEMPT``, with the reason. A
:class:`Case` says what sets its loss apart from a pair loss on class ids and embeddings
(class vectors, a state sized by the embeddings, two views, no terms per anchor), and the
contract tests that cannot apply to it skip, saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
from harness import LossCase

from tfdml.losses import (
    AngularLoss,
    ArcFaceLoss,
    BarlowTwinsLoss,
    CircleLoss,
    ContrastiveLoss,
    CosFaceLoss,
    CrossBatchMemory,
    DynamicSoftMarginLoss,
    FAPPYLoss,
    FastAPLoss,
    GeneralizedLiftedStructureLoss,
    HistogramLoss,
    HPHNTripletLoss,
    InstanceLoss,
    IntraPairVarianceLoss,
    LargeMarginSoftmaxLoss,
    LiftedStructureLoss,
    LoOpLoss,
    MarginLoss,
    MultipleLosses,
    MultiSimilarityLoss,
    NormalizedSoftmaxLoss,
    NPairsLoss,
    NTXentLoss,
    P2SGradLoss,
    PNLoss,
    PNPLoss,
    ProxyAnchorLoss,
    ProxyNCALoss,
    RankedListLoss,
    SelfSupervisedLoss,
    SmoothAPLoss,
    SNRContrastiveLoss,
    SoftNearestNeighborLoss,
    SoftTripleLoss,
    SphereFaceLoss,
    SubCenterArcFaceLoss,
    SupConLoss,
    ThresholdConsistentMarginLoss,
    TrimmedLoss,
    TripletMarginLoss,
    TripletNCALoss,
    TupletMarginLoss,
    VICRegLoss,
)
from tfdml.miners import MultiSimilarityMiner, TripletMiner


@dataclass(frozen=True)
class Case(LossCase):
    """A :class:`harness.LossCase`, with what sets its loss apart from a pair loss.

    Attributes:
        class_ids: class ids must be in ``[0, class_ids)`` (a loss with class vectors);
            None for any id.
        sized_state: the loss's state is sized by the embedding size (class vectors, a
            memory bank): it is built before a traced call, and the fuzz tests (traced with
            a dynamic embedding size) skip it.
        per_anchor: the loss has terms per anchor (``per_anchor``, ``reduction="none"``);
            False for a sum over proxies, a sum of reduced losses, a loss of the whole batch.
        two_views: the loss takes two stacked views (an even number of rows) and ignores
            the labels.
        signed: the loss's value can be negative.
    """

    class_ids: int | None = None
    sized_state: bool = False
    per_anchor: bool = True
    two_views: bool = False
    signed: bool = False


# -- the one list of loss configurations -------------------------------------------------------

# Short aliases keep each case on one line.
NCA, Margin, Miner = TripletNCALoss, TripletMarginLoss, TripletMiner
WuMargin, MS, MSMiner, Con, Trim = (
    MarginLoss, MultiSimilarityLoss, MultiSimilarityMiner, ContrastiveLoss, TrimmedLoss
)

#: The initial class vectors of the cases with learned ones (the same in every copy).
SEEDED = keras.initializers.RandomNormal(stddev=0.5, seed=11)
VECTORS = dict(class_ids=8, sized_state=True, zero_without_triplet=False)

LOSS_CASES = [
    Case("nca_order1", lambda: NCA(order=1)),
    Case("nca_order2", lambda: NCA(order=2)),
    Case("nca_t0.1", lambda: NCA(temperature=0.1)),
    Case("margin_squared_l2", lambda: Margin(distance="squared_l2")),
    Case("margin_l2", lambda: Margin(distance="l2")),
    Case("margin_cosine", lambda: Margin(distance="cosine")),
    Case("nca2_easy_hard", lambda: NCA(2, miner=Miner("easy", "hard"))),
    Case("margin_easy_hard", lambda: Margin(miner=Miner("easy", "hard"))),
    Case("nca2_easy_semihard", lambda: NCA(2, miner=Miner("easy", "semihard"))),
    Case("margin_easy_semihard", lambda: Margin(miner=Miner("easy", "semihard"))),
    Case("nca1_hard_hard", lambda: NCA(1, miner=Miner("hard", "hard"))),
    Case("margin_l2_easy_easy", lambda: Margin(0.5, "l2", Miner("easy", "easy"))),
    Case("nca2_all_semihard", lambda: NCA(2, miner=Miner("all", "semihard"))),
    Case("nca1_all_all", lambda: NCA(1, miner=Miner("all", "all"))),
    Case("margin_all_all", lambda: Margin(miner=Miner("all", "all"))),
    Case("nca2_random", lambda: NCA(2, miner=Miner("random", "random", seed=7))),
    Case("margin_cos_random", lambda: Margin(0.1, "cosine", Miner("random", "random", seed=3))),
    Case("nca2_disjoint_easy_hard", lambda: NCA(2, miner=Miner("easy", "hard", disjoint=True))),
    Case("margin_disjoint_semihard", lambda: Margin(miner=Miner("easy", "semihard", True))),
    Case("nca2_easy_dw", lambda: NCA(2, miner=Miner("easy", "distance_weighted", seed=6))),
    Case("margin_disjoint_dw", lambda: Margin(miner=Miner("easy", "distance_weighted", True, 2))),
    Case("wu_default", lambda: WuMargin(miner=Miner("random", "distance_weighted", seed=5))),
    Case("wu_eps_dw", lambda: WuMargin(miner=Miner("easy", "distance_weighted", seed=1))),
    Case("wu_all_dw", lambda: WuMargin(miner=Miner("all", "distance_weighted", seed=2))),
    Case("wu_ms_pairs", lambda: WuMargin(miner=MSMiner())),
    Case("wu_fixed_easy_hard", lambda: WuMargin(0.1, 1.0, False, miner=Miner("easy", "hard"))),
    Case("wu_cosine_all_all", lambda: WuMargin(0.3, 0.9, distance="cosine", miner=Miner("all", "all"))),
    Case("ms_default", lambda: MS()),
    Case("ms_eps", lambda: MS(miner=MSMiner(positive="easy"))),
    Case("ms_all_positives", lambda: MS(1.0, 20.0, 1.0, MSMiner(0.05, "all"))),
    Case("ms_easy_semihard", lambda: MS(miner=Miner("easy", "semihard"))),
    Case("ms_all_semihard", lambda: MS(miner=Miner("all", "semihard"))),
    Case("contrastive_all_pairs", lambda: Con(), zero_without_triplet=False),
    Case("contrastive_sq_l2", lambda: Con(0.1, 1.0, "squared_l2"), zero_without_triplet=False),
    Case("contrastive_ms_eps", lambda: Con(miner=MSMiner(positive="easy"))),
    Case("contrastive_easy_hard", lambda: Con(0.0, 0.8, "cosine", Miner("easy", "hard"))),
    Case("trimmed_margin_random", lambda: Trim(Margin(miner=Miner("random", "random", seed=4)))),
    Case("trimmed_nca2", lambda: Trim(NCA(2), 0.5)),
    Case("trimmed_wu_eps", lambda: Trim(WuMargin(miner=Miner("easy", "hard")), 0.3)),
    Case("loop_triplet", lambda: LoOpLoss("triplet")),
    Case("loop_hphn", lambda: LoOpLoss("hphn_triplet", 0.3)),
    Case("loop_lifted", lambda: LoOpLoss("lifted_structure")),
    Case("loop_ms", lambda: LoOpLoss("multi_similarity", epsilon=-0.02)),
    Case("loop_triplet_segments", lambda: LoOpLoss("triplet", normalize=False)),
    Case("loop_ms_segments", lambda: LoOpLoss("multi_similarity", 0.4, normalize=False)),
    Case("hphn_triplet", lambda: HPHNTripletLoss()),
    Case("supcon", lambda: SupConLoss()),
    Case("supcon_ms_eps", lambda: SupConLoss(0.5, MSMiner(positive="easy"))),
    Case("ntxent", lambda: NTXentLoss()),
    Case("circle", lambda: CircleLoss()),
    Case("soft_nearest_neighbor", lambda: SoftNearestNeighborLoss()),
    Case("pn", lambda: PNLoss()),
    Case("lifted_structure", lambda: LiftedStructureLoss(0.5, normalize=False)),
    Case("fappy", lambda: FAPPYLoss()),
    Case("fappy_0.003", lambda: FAPPYLoss(0.003)),
    Case("histogram", lambda: HistogramLoss()),
    Case("histogram_0.05", lambda: HistogramLoss(0.05)),
    Case("generalized_lifted", lambda: GeneralizedLiftedStructureLoss()),
    Case("angular", lambda: AngularLoss()),
    Case("angular_hard_pairs", lambda: AngularLoss(0.8, Miner("hard", "hard"))),
    Case("tuplet_margin", lambda: TupletMarginLoss()),
    Case("snr_contrastive", lambda: SNRContrastiveLoss(), zero_without_triplet=False),
    Case("snr_contrastive_easy_hard", lambda: SNRContrastiveLoss(0.1, 0.8, Miner("easy", "hard"))),
    Case("tuplet_margin_ms_pairs", lambda: TupletMarginLoss(0.2, 32.0, MSMiner())),
    Case("generalized_lifted_ms_pairs",
             lambda: GeneralizedLiftedStructureLoss(0.6, 0.1, MSMiner(positive="easy"))),
    Case("instance_4", lambda: InstanceLoss(4.0), zero_without_triplet=False),
    Case("instance_8_unnormalized", lambda: InstanceLoss(8.0, normalize=False),
             zero_without_triplet=False),
    Case("n_pairs", lambda: NPairsLoss()),
    Case("n_pairs_unnormalized", lambda: NPairsLoss(normalize=False)),
    Case("tcm", lambda: ThresholdConsistentMarginLoss(), zero_without_triplet=False),
    Case("tcm_hard_pairs", lambda: ThresholdConsistentMarginLoss(0.5, 2.0, 0.8, 0.2, Miner("hard", "hard"))),
    Case("ipv", lambda: IntraPairVarianceLoss(), zero_without_triplet=False),
    Case("ipv_halves", lambda: IntraPairVarianceLoss(0.1, 0.05, average="halves"), zero_without_triplet=False),
    Case("ranked_list", lambda: RankedListLoss(0.4, 10.0), zero_without_triplet=False),
    Case("ranked_list_tp", lambda: RankedListLoss(0.5, 5.0, 0.3, 1.1, 2.0), zero_without_triplet=False),
    Case("contrastive_halves", lambda: Con(0.0, 1.0, average="halves"), zero_without_triplet=False),
    Case("fast_ap", lambda: FastAPLoss()),
    Case("fast_ap_4", lambda: FastAPLoss(4)),
    Case("pnp_O", lambda: PNPLoss(), cubic=True),
    Case("pnp_Dq", lambda: PNPLoss(2, 1.5, 0.05, "Dq"), cubic=True),
    Case("smooth_ap", lambda: SmoothAPLoss(), cubic=True),
    # Learned class vectors: ids in [0, 8); seeded vectors, so that two copies compute alike.
    Case("normalized_softmax", lambda: NormalizedSoftmaxLoss(8, initializer=SEEDED), **VECTORS),
    Case("cosface", lambda: CosFaceLoss(8, initializer=SEEDED), **VECTORS),
    Case("arcface", lambda: ArcFaceLoss(8, initializer=SEEDED), **VECTORS),
    Case("subcenter_arcface", lambda: SubCenterArcFaceLoss(8, initializer=SEEDED), **VECTORS),
    Case("soft_triple", lambda: SoftTripleLoss(8, centers_per_class=3, initializer=SEEDED),
         **VECTORS),
    Case("large_margin_softmax", lambda: LargeMarginSoftmaxLoss(8, margin=3, initializer=SEEDED),
         **VECTORS),
    Case("sphereface", lambda: SphereFaceLoss(8, margin=2, initializer=SEEDED), **VECTORS),
    Case("p2s_grad", lambda: P2SGradLoss(8, initializer=SEEDED), **VECTORS),
    Case("proxy_nca", lambda: ProxyNCALoss(8, initializer=SEEDED), **VECTORS),
    Case("proxy_anchor", lambda: ProxyAnchorLoss(8, initializer=SEEDED), per_anchor=False,
         **VECTORS),
    # A running histogram; x = d_ap - d_an weighted by its CDF can be negative.
    Case("dynamic_soft_margin", lambda: DynamicSoftMarginLoss(num_bins=8), signed=True),
    # Wrappers and losses of two views.
    Case("xbm_nca2_bank64", lambda: CrossBatchMemory(NCA(2), memory_size=64), sized_state=True),
    Case("multiple_nca_contrastive", lambda: MultipleLosses([NCA(2), Con()], weights=[1.0, 0.5]),
         per_anchor=False, zero_without_triplet=False),
    Case("self_supervised_ntxent", lambda: SelfSupervisedLoss(NTXentLoss(0.5)), two_views=True,
         zero_without_triplet=False),
    Case("vicreg", lambda: VICRegLoss(), two_views=True, per_anchor=False,
         zero_without_triplet=False),
    Case("barlow_twins", lambda: BarlowTwinsLoss(), two_views=True, per_anchor=False,
         zero_without_triplet=False),
]

CASES = {case.id: case for case in LOSS_CASES}


def _miner_kind(loss):
    """The miner's class and strategies (a wrapper's inner loss's miner); None without one."""
    miner = getattr(loss, "miner", None)
    inner = getattr(loss, "loss", None)
    if miner is None and isinstance(inner, keras.losses.Loss):
        return _miner_kind(inner)
    if miner is None:
        return None
    config = miner.get_config()
    return (type(miner).__name__, *(config.get(k) for k in ("positive", "negative", "disjoint")))


def _first_of_each(key, start=()):
    chosen, seen = list(start), {key(case.make()) for case in start}
    for case in LOSS_CASES:
        if (kind := key(case.make())) not in seen:
            seen.add(kind)
            chosen.append(case)
    return tuple(chosen)


#: The first case of each loss class, for the checks of what a class shares with every other
#: loss (its config, save and load, reductions, class ids, eager evaluation): one case per
#: class.
ONE_PER_CLASS = _first_of_each(lambda loss: type(loss).__name__)
#: ONE_PER_CLASS and the first case of each miner kind (class, strategies, disjoint) that
#: it lacks, for the checks where the loss and its miner meet (degenerate batches, no
#: triplet, no B^3 tensor): every loss class and every miner kind once.
ONE_PER_CLASS_AND_MINER = _first_of_each(_miner_kind, ONE_PER_CLASS)
