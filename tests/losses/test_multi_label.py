"""Multi-hot label sets ``[B, L]`` as ``y_true``: every pair and triplet loss and every miner
takes them through ``tfdml.ops.label_masks`` (positives share a label, negatives share none).

* one label per sample, multi-hot, gives the class-id value and gradient, for every loss case
  that takes label sets, and a clear ValueError for the ones that need one class per sample;
* overlapping label sets against the NumPy references (whose ``labels[p] == labels[a]`` reads
  a :class:`references.LabelSet` as "shares a label");
* Multi-SupCon (``SupConLoss(graded=True)``) values and gradients against its reference;
* blocks, XLA / ``jax.jit``, a bad multi-hot value under compilation (NaN, not a number),
  and the eager errors.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, compiled, to_numpy, value_and_grad, value_and_grad_function
from harness import make_loss, slow_beyond
from loss_cases import LOSS_CASES

import tfdml
from tfdml import ops as dml
from tfdml.losses import (
    CircleLoss,
    ContrastiveLoss,
    CrossBatchMemory,
    IntraPairVarianceLoss,
    MultiSimilarityLoss,
    NTXentLoss,
    SoftNearestNeighborLoss,
    SupConLoss,
    ThresholdConsistentMarginLoss,
    TripletMarginLoss,
    TripletNCALoss,
)
from tfdml.miners import AllPairsMiner, MultiSimilarityMiner, TripletMiner

NUM_LABELS = 6
ONE_LABEL = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 1, 5])  # B = 11, a lone class included


def _label_sets(batch=11, num_labels=NUM_LABELS, seed=0):
    """Random non-empty label sets of 1 to 3 labels: overlapping, not an equivalence."""
    rng = np.random.default_rng(seed)
    rows = [rng.choice(num_labels, rng.integers(1, 4), replace=False) for _ in range(batch)]
    return tfdml.ops.multi_hot(rows, num_labels).astype("float32")


def _embeddings(batch=11, dim=5, seed=1):
    return np.random.default_rng(seed).normal(size=(batch, dim)).astype("float32")


def _takes_label_sets(case):
    return not case.two_views and make_loss(case.factory).multi_label is True


TAKES = [c for c in LOSS_CASES if _takes_label_sets(c)]
REFUSES = [c for c in LOSS_CASES if not c.two_views and not _takes_label_sets(c)]

#: On every commit: the losses that build their own masks (``dml.label_masks``), the wrappers,
#: and, of the losses whose masks come from their miner, one per miner and strategy that no
#: miner test below mines label sets with (all pairs, multi-similarity, random, distance
#: weighted, disjoint); the other cases in the slow tier.
ONE_LABEL_FAST = {
    "fappy", "histogram", "instance_4", "ranked_list", "fast_ap", "pnp_O", "smooth_ap",
    "dynamic_soft_margin", "trimmed_nca2", "xbm_nca2_bank64", "multiple_nca_contrastive",
    "nca_order1", "nca2_random", "margin_disjoint_semihard", "wu_default", "ms_default",
    "contrastive_all_pairs", "contrastive_ms_eps",
}


@pytest.mark.parametrize("case", slow_beyond(TAKES, ONE_LABEL_FAST, ids=lambda c: c.id))
def test_one_label_per_sample_equals_class_ids(case):
    x = _embeddings()
    hot = np.eye(8, dtype="float32")[ONE_LABEL]
    kwargs = {"num_labels": 8} if isinstance(case.make(), CrossBatchMemory) else {}
    ids_loss, hot_loss = case.make(), _with(case.make(), kwargs)
    want, want_grad = value_and_grad(lambda y, e: ids_loss(y, e), ONE_LABEL, x, argnums=1)
    got, got_grad = value_and_grad(lambda y, e: hot_loss(y, e), hot, x, argnums=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-6)


def _with(loss, kwargs):
    if not kwargs:
        return loss
    config = loss.get_config()
    config.update(kwargs)
    return type(loss).from_config(config)


@pytest.mark.parametrize("case", REFUSES, ids=lambda c: c.id)
def test_losses_that_need_one_class_per_sample_refuse_label_sets(case):
    with pytest.raises(ValueError, match="one class id per sample"):
        case.make()(_label_sets(), _embeddings())


def test_functional_forms_that_need_one_class_per_sample_refuse_label_sets():
    y, x = _label_sets(), _embeddings()
    vectors = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    calls = {"LoOpLoss": lambda: tfdml.losses.loop_loss(y, x),
             "HPHNTripletLoss": lambda: tfdml.losses.hphn_triplet_loss(y, x),
             "NPairsLoss": lambda: tfdml.losses.n_pairs_loss(y, x),
             "class-vector": lambda: tfdml.losses.proxy_anchor_loss(y, x, vectors)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"{name} loss needs one class id|{name} needs one"):
            call()


# -- overlapping label sets against the references --------------------------------------------

REFERENCE_CASES = {
    "nca2_easy_hard": (lambda: TripletNCALoss(2, miner=TripletMiner("easy", "hard")),
                       lambda y, x: ref.nca_loss(y, x, order=2)[0]),
    "nca1_all_semihard": (lambda: TripletNCALoss(1, miner=TripletMiner("all", "semihard")),
                          lambda y, x: ref.nca_loss(y, x, 1, positive="all",
                                                    negative="semihard")[0]),
    "margin_all_all": (lambda: TripletMarginLoss(miner=TripletMiner("all", "all")),
                       lambda y, x: ref.margin_loss(y, x, positive="all", negative="all")[0]),
    "supcon": (lambda: SupConLoss(), lambda y, x: ref.supcon_loss(y, x)[0]),
    "supcon_graded": (lambda: SupConLoss(0.2, graded=True),
                      lambda y, x: ref.supcon_loss(y, x, 0.2, graded=True)[0]),
    "ntxent": (lambda: NTXentLoss(), lambda y, x: ref.ntxent_loss(y, x)[0]),
    "circle": (lambda: CircleLoss(), lambda y, x: ref.circle_loss(y, x)[0]),
    "soft_nearest_neighbor": (lambda: SoftNearestNeighborLoss(),
                              lambda y, x: ref.soft_nearest_neighbor_loss(y, x)[0]),
    "tcm": (lambda: ThresholdConsistentMarginLoss(),
            lambda y, x: ref.threshold_consistent_margin_loss(y, x)),
    "ipv": (lambda: IntraPairVarianceLoss(), lambda y, x: ref.intra_pair_variance_loss(y, x)),
    "ms_default": (lambda: MultiSimilarityLoss(), None),
    "contrastive": (lambda: ContrastiveLoss(), None),
}


def _pair_reference(case_id, y, x):
    """The multi-similarity and contrastive references take the mined pair masks."""
    unit = ref.l2_normalize(x)
    if case_id == "ms_default":
        pos, neg = ref.multi_similarity_pairs(unit @ unit.T, y, epsilon=0.1)
        return ref.multi_similarity_loss(x, pos, neg)[0]
    pos, neg = ref.label_masks(y)
    return ref.contrastive_loss(x, pos, neg)[0]


@pytest.mark.parametrize("case_id", sorted(REFERENCE_CASES))
def test_label_sets_against_references(case_id):
    make, reference = REFERENCE_CASES[case_id]
    y, x = _label_sets(), _embeddings()
    got = float(to_numpy(make()(y, x)))
    want = reference(y, x) if reference is not None else _pair_reference(case_id, y, x)
    np.testing.assert_allclose(got, float(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case_id", ["supcon_graded", "nca2_easy_hard", "ntxent"])
def test_label_set_gradients_against_references(case_id):
    make, reference = REFERENCE_CASES[case_id]
    y, x = _label_sets(seed=3), _embeddings(seed=4)
    loss = make()
    _, grad = value_and_grad(lambda e: loss(y, e), x)
    want = ref.finite_difference_gradient(lambda e: float(reference(y, e)),
                                          x.astype(np.float64))
    np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-5)


def test_graded_supcon_weights_partial_overlap_less():
    """Multi-SupCon pulls a positive that shares one label of three less than SupCon does."""
    y = tfdml.ops.multi_hot([[0, 1, 2], [0], [3], [3, 4]], 5)
    x = _embeddings(4, 3, seed=2)
    plain = float(to_numpy(SupConLoss()(y, x)))
    graded = float(to_numpy(SupConLoss(graded=True)(y, x)))
    want = ref.supcon_loss(y, x, graded=True)[0]
    np.testing.assert_allclose(graded, want, rtol=1e-5)
    assert graded < plain


# -- miners -----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [("easy", "hard"), ("hard", "semihard"), ("all", "easy")])
def test_triplet_miner_mines_label_sets_as_the_reference(strategy):
    y, x = _label_sets(seed=5), _embeddings(seed=6)
    unit = ref.l2_normalize(x)
    scores = unit @ unit.T
    mined = TripletMiner(*strategy).mine(scores.astype("float32"), y)
    got = ref.triplet_set(*to_numpy(tuple(mined)))
    assert got == ref.mine_triplets(scores, y, positive=strategy[0], negative=strategy[1])


def test_pair_miners_mine_label_sets_as_the_reference():
    y, x = _label_sets(seed=7), _embeddings(seed=8)
    unit = ref.l2_normalize(x)
    scores = (unit @ unit.T).astype("float32")
    pairs = to_numpy(tuple(AllPairsMiner().mine(scores, y)))
    np.testing.assert_array_equal(pairs, ref.label_masks(y))
    pairs = to_numpy(tuple(MultiSimilarityMiner(0.1).mine(scores, y)))
    np.testing.assert_array_equal(pairs, ref.multi_similarity_pairs(scores, y, epsilon=0.1))


@pytest.mark.parametrize("strategy", [("easy", "hard"), ("all", "all")])
def test_miners_take_min_jaccard(strategy):
    """A positive needs a Jaccard similarity >= 0.5; a pair sharing less is neither."""
    y, x = _label_sets(seed=19), _embeddings(seed=20)
    sets = [ref.JaccardSet(s, 0.5) for s in ref.as_label_list(y)]
    unit = ref.l2_normalize(x)
    scores = unit @ unit.T
    miner = TripletMiner(*strategy, min_jaccard=0.5)
    got = ref.triplet_set(*to_numpy(tuple(miner.mine(scores.astype("float32"), y))))
    assert got == ref.mine_triplets(scores, sets, positive=strategy[0], negative=strategy[1])
    assert got != ref.mine_triplets(scores, y, positive=strategy[0], negative=strategy[1])
    assert TripletMiner.from_config(miner.get_config()).min_jaccard == 0.5
    assert "min_jaccard" not in TripletMiner(*strategy).get_config()  # configs as before


def test_losses_take_min_jaccard_through_their_miner():
    y, x = _label_sets(seed=21), _embeddings(seed=22)
    sets = [ref.JaccardSet(s, 0.4) for s in ref.as_label_list(y)]
    loss = SupConLoss(miner=AllPairsMiner(min_jaccard=0.4))
    value = float(to_numpy(loss(y, x)))
    np.testing.assert_allclose(value, ref.supcon_loss(sets, x)[0], rtol=1e-5)
    assert abs(value - ref.supcon_loss(y, x)[0]) > 1e-3  # not the shared-label value
    loss = TripletNCALoss(2, miner=TripletMiner("easy", "hard", min_jaccard=0.4))
    np.testing.assert_allclose(float(to_numpy(loss(y, x))), ref.nca_loss(sets, x, 2)[0],
                               rtol=1e-5)
    with pytest.raises(ValueError, match="min_jaccard"):
        AllPairsMiner(min_jaccard=0.0)


# -- the one place: label_masks ---------------------------------------------------------------


@pytest.mark.multibackend
def test_label_masks_share_a_label_and_min_jaccard():
    y = _label_sets(9, seed=10)
    sets = ref.as_label_list(y)
    positive, negative = to_numpy(dml.label_masks(y))
    for a in range(9):
        for b in range(9):
            shared = len(sets[a] & sets[b])
            assert positive[a, b] == (shared > 0 and a != b)
            assert negative[a, b] == (shared == 0)
    positive, negative = to_numpy(dml.label_masks(y, min_jaccard=0.5, ref_offset=None))
    jaccard = np.array([[len(s & t) / len(s | t) for t in sets] for s in sets])
    np.testing.assert_array_equal(positive, jaccard >= 0.5)
    np.testing.assert_array_equal(negative, jaccard == 0)
    np.testing.assert_allclose(to_numpy(dml.label_jaccard(y)), jaccard, rtol=1e-6)


def test_label_masks_errors_name_the_argument():
    y = _label_sets(4)
    with pytest.raises(ValueError, match="both be class ids"):
        dml.label_masks(y, np.arange(4))
    with pytest.raises(ValueError, match="same number of labels"):
        dml.label_masks(y, np.eye(7)[:4])
    with pytest.raises(ValueError, match="min_jaccard"):
        dml.label_masks(y, min_jaccard=1.5)


@pytest.mark.parametrize("bad, match", [
    (np.array([[1, 0, 0], [0, 2, 0], [0, 0, 1]]), "every value 0 or 1"),
    (np.array([[1, 0, 0], [0, 0, 0], [0, 0, 1]]), "empty label set"),
    (np.array([[1, 0, 0], [np.nan, 1, 0], [0, 0, 1]]), "every value 0 or 1"),
])
def test_bad_label_sets_raise_naming_y_true(bad, match):
    with pytest.raises(ValueError, match=rf"`y_true`.*{match}"):
        SupConLoss()(bad, _embeddings(3))


def test_multi_hot_converts_padded_ids_and_checks_them():
    hot = tfdml.ops.multi_hot(np.array([[0, 2, -1], [1, -1, -1]]), 3)
    np.testing.assert_array_equal(hot, [[1, 0, 1], [0, 1, 0]])
    with pytest.raises(ValueError, match=r"label_ids.*outside \[0, num_labels=3\)"):
        tfdml.ops.multi_hot(np.array([[0, 3]]), 3)
    with pytest.raises(ValueError, match="empty label set"):
        tfdml.ops.multi_hot(np.array([[0, 1], [-1, -1]]), 3)


# -- blocks, compilation, other backends ------------------------------------------------------


def test_blocks_give_the_whole_batch_value():
    y, x = _label_sets(seed=11), _embeddings(seed=12)
    for make in (lambda **k: SupConLoss(graded=True, **k), lambda **k: MultiSimilarityLoss(**k),
                 lambda **k: TripletNCALoss(2, **k)):
        whole_loss, blocked_loss = make(), make(block_size=4)
        whole, whole_grad = value_and_grad(lambda e, f=whole_loss: f(y, e), x)
        blocked, blocked_grad = value_and_grad(lambda e, f=blocked_loss: f(y, e), x)
        np.testing.assert_allclose(blocked, whole, rtol=1e-5)
        np.testing.assert_allclose(blocked_grad, whole_grad, rtol=1e-4, atol=1e-7)


# Compiled, every loss gets its masks from label_masks (Multi-SupCon: and label_jaccard), the
# code the eager tests check. Multi-SupCon on every commit; a loss with a multi-similarity
# miner and one with a triplet miner in the slow tier.
@pytest.mark.multibackend
@pytest.mark.parametrize("make_loss", slow_beyond(
    [pytest.param(lambda: SupConLoss(graded=True), id="supcon_graded"),
     pytest.param(lambda: MultiSimilarityLoss(), id="multi_similarity"),
     pytest.param(lambda: TripletNCALoss(2), id="nca2")], {"supcon_graded"}))
def test_compiled_label_sets_equal_eager(make_loss):
    y, x = _label_sets(seed=13), _embeddings(seed=14)
    loss = make_loss()
    eager, eager_grad = value_and_grad(lambda e: loss(y, e), x)
    step = value_and_grad_function(lambda t, e: loss(t, e), argnums=1,
                                   jit_compile=BACKEND != "torch")
    value, grad = to_numpy(step(y, x))
    np.testing.assert_allclose(value, eager, rtol=1e-5)
    np.testing.assert_allclose(grad, eager_grad, rtol=1e-4, atol=1e-7)


@pytest.mark.multibackend
def test_compiled_bad_label_sets_give_nan():
    y, x = _label_sets(seed=13), _embeddings(seed=14)
    run = compiled(lambda t, e: SupConLoss()(t, e))
    if BACKEND == "torch":  # eager: checked and raised
        with pytest.raises(ValueError):
            run(np.where(y > 0, 2.0, 0.0).astype("float32"), x)
        return
    for bad in (np.where(y > 0, 2.0, 0.0), np.concatenate([np.zeros_like(y[:1]), y[1:]])):
        assert np.isnan(to_numpy(run(bad.astype("float32"), x)))


@pytest.mark.multibackend
def test_fit_with_label_sets():
    y = _label_sets(16, seed=15)
    features = np.random.default_rng(16).normal(size=(16, 7)).astype("float32")
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss=SupConLoss(graded=True))
    history = model.fit(features, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_cross_batch_memory_keeps_label_sets():
    y, x = _label_sets(seed=17), _embeddings(seed=18)
    xbm = CrossBatchMemory(SupConLoss(), memory_size=11, num_labels=NUM_LABELS)
    xbm(y, x)  # fills the bank
    bank_labels = to_numpy(xbm.bank.labels)
    np.testing.assert_array_equal(bank_labels, y)
    got = float(to_numpy(xbm(y, x)))
    ref_x = np.concatenate([x, x])
    want = ref.supcon_loss(y, x, ref_embeddings=ref_x, ref_labels=np.concatenate([y, y]),
                           ref_offset=0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="num_labels"):
        CrossBatchMemory(SupConLoss(), memory_size=11)(y, x)
