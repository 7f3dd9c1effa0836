"""The one list of loss configurations the contract suite runs (``tests/losses/test_loss_base.py``)
and the recorded values and gradients check (``tests/losses/test_recorded_losses.py``).

To cover a new loss (or loss + miner configuration), add one line to ``LOSS_CASES``.
"""

from __future__ import annotations

from harness import LossCase

from tfdml.losses import (
    AngularLoss,
    CircleLoss,
    ContrastiveLoss,
    FAPPYLoss,
    GeneralizedLiftedStructureLoss,
    HistogramLoss,
    HPHNTripletLoss,
    LiftedStructureLoss,
    LoOpLoss,
    MarginLoss,
    MultiSimilarityLoss,
    NTXentLoss,
    PNLoss,
    SNRContrastiveLoss,
    SoftNearestNeighborLoss,
    SupConLoss,
    TrimmedLoss,
    TripletMarginLoss,
    TripletNCALoss,
    TupletMarginLoss,
)
from tfdml.miners import MultiSimilarityMiner, TripletMiner

# -- the one list of loss configurations -------------------------------------------------------

# Short aliases keep each case on one line.
NCA, Margin, Miner = TripletNCALoss, TripletMarginLoss, TripletMiner
WuMargin, MS, MSMiner, Con, Trim = (
    MarginLoss, MultiSimilarityLoss, MultiSimilarityMiner, ContrastiveLoss, TrimmedLoss
)

LOSS_CASES = [
    LossCase("nca_order1", lambda: NCA(order=1)),
    LossCase("nca_order2", lambda: NCA(order=2)),
    LossCase("nca_t0.1", lambda: NCA(temperature=0.1)),
    LossCase("margin_squared_l2", lambda: Margin(distance="squared_l2")),
    LossCase("margin_l2", lambda: Margin(distance="l2")),
    LossCase("margin_cosine", lambda: Margin(distance="cosine")),
    LossCase("nca2_easy_hard", lambda: NCA(2, miner=Miner("easy", "hard"))),
    LossCase("margin_easy_hard", lambda: Margin(miner=Miner("easy", "hard"))),
    LossCase("nca2_easy_semihard", lambda: NCA(2, miner=Miner("easy", "semihard"))),
    LossCase("margin_easy_semihard", lambda: Margin(miner=Miner("easy", "semihard"))),
    LossCase("nca1_hard_hard", lambda: NCA(1, miner=Miner("hard", "hard"))),
    LossCase("margin_l2_easy_easy", lambda: Margin(0.5, "l2", Miner("easy", "easy"))),
    LossCase("nca2_all_semihard", lambda: NCA(2, miner=Miner("all", "semihard"))),
    LossCase("nca1_all_all", lambda: NCA(1, miner=Miner("all", "all"))),
    LossCase("margin_all_all", lambda: Margin(miner=Miner("all", "all"))),
    LossCase("nca2_random", lambda: NCA(2, miner=Miner("random", "random", seed=7))),
    LossCase("margin_cos_random", lambda: Margin(0.1, "cosine", Miner("random", "random", seed=3))),
    LossCase("nca2_disjoint_easy_hard", lambda: NCA(2, miner=Miner("easy", "hard", disjoint=True))),
    LossCase("margin_disjoint_semihard", lambda: Margin(miner=Miner("easy", "semihard", True))),
    LossCase("nca2_easy_dw", lambda: NCA(2, miner=Miner("easy", "distance_weighted", seed=6))),
    LossCase("margin_disjoint_dw", lambda: Margin(miner=Miner("easy", "distance_weighted", True, 2))),
    LossCase("wu_default", lambda: WuMargin(miner=Miner("random", "distance_weighted", seed=5))),
    LossCase("wu_eps_dw", lambda: WuMargin(miner=Miner("easy", "distance_weighted", seed=1))),
    LossCase("wu_all_dw", lambda: WuMargin(miner=Miner("all", "distance_weighted", seed=2))),
    LossCase("wu_ms_pairs", lambda: WuMargin(miner=MSMiner())),
    LossCase("wu_fixed_easy_hard", lambda: WuMargin(0.1, 1.0, False, miner=Miner("easy", "hard"))),
    LossCase("wu_cosine_all_all", lambda: WuMargin(0.3, 0.9, distance="cosine", miner=Miner("all", "all"))),
    LossCase("ms_default", lambda: MS()),
    LossCase("ms_eps", lambda: MS(miner=MSMiner(positive="easy"))),
    LossCase("ms_all_positives", lambda: MS(1.0, 20.0, 1.0, MSMiner(0.05, "all"))),
    LossCase("ms_easy_semihard", lambda: MS(miner=Miner("easy", "semihard"))),
    LossCase("ms_all_semihard", lambda: MS(miner=Miner("all", "semihard"))),
    LossCase("contrastive_all_pairs", lambda: Con(), zero_without_triplet=False),
    LossCase("contrastive_sq_l2", lambda: Con(0.1, 1.0, "squared_l2"), zero_without_triplet=False),
    LossCase("contrastive_ms_eps", lambda: Con(miner=MSMiner(positive="easy"))),
    LossCase("contrastive_easy_hard", lambda: Con(0.0, 0.8, "cosine", Miner("easy", "hard"))),
    LossCase("trimmed_margin_random", lambda: Trim(Margin(miner=Miner("random", "random", seed=4)))),
    LossCase("trimmed_nca2", lambda: Trim(NCA(2), 0.5)),
    LossCase("trimmed_wu_eps", lambda: Trim(WuMargin(miner=Miner("easy", "hard")), 0.3)),
    LossCase("loop_triplet", lambda: LoOpLoss("triplet")),
    LossCase("loop_hphn", lambda: LoOpLoss("hphn_triplet", 0.3)),
    LossCase("loop_lifted", lambda: LoOpLoss("lifted_structure")),
    LossCase("loop_ms", lambda: LoOpLoss("multi_similarity", epsilon=-0.02)),
    LossCase("loop_triplet_segments", lambda: LoOpLoss("triplet", normalized=False)),
    LossCase("loop_ms_segments", lambda: LoOpLoss("multi_similarity", 0.4, False)),
    LossCase("hphn_triplet", lambda: HPHNTripletLoss()),
    LossCase("supcon", lambda: SupConLoss()),
    LossCase("supcon_ms_eps", lambda: SupConLoss(0.5, MSMiner(positive="easy"))),
    LossCase("ntxent", lambda: NTXentLoss()),
    LossCase("circle", lambda: CircleLoss()),
    LossCase("soft_nearest_neighbor", lambda: SoftNearestNeighborLoss()),
    LossCase("pn", lambda: PNLoss()),
    LossCase("lifted_structure", lambda: LiftedStructureLoss(0.5, normalize=False)),
    LossCase("fappy", lambda: FAPPYLoss()),
    LossCase("fappy_0.003", lambda: FAPPYLoss(0.003)),
    LossCase("histogram", lambda: HistogramLoss()),
    LossCase("histogram_0.05", lambda: HistogramLoss(0.05)),
    LossCase("generalized_lifted", lambda: GeneralizedLiftedStructureLoss()),
    LossCase("angular", lambda: AngularLoss()),
    LossCase("angular_hard_pairs", lambda: AngularLoss(0.8, Miner("hard", "hard"))),
    LossCase("tuplet_margin", lambda: TupletMarginLoss()),
    LossCase("snr_contrastive", lambda: SNRContrastiveLoss(), zero_without_triplet=False),
    LossCase("snr_contrastive_easy_hard", lambda: SNRContrastiveLoss(0.1, 0.8, Miner("easy", "hard"))),
    LossCase("tuplet_margin_ms_pairs", lambda: TupletMarginLoss(0.2, 32.0, MSMiner())),
    LossCase("generalized_lifted_ms_pairs",
             lambda: GeneralizedLiftedStructureLoss(0.6, 0.1, MSMiner(positive="easy"))),
]

CASES = {case.id: case for case in LOSS_CASES}
