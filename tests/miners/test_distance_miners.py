"""PairMarginMiner, TripletMarginMiner and BatchEasyHardMiner: the index sets
pytorch-metric-learning 2.9 selects on the same batches (tests/fixtures/pml_2.9.npz), NumPy
references on others, every loss taking them, compiled = eager, config round trip and bad
arguments."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, compiled, enable_float64, to_numpy
from harness import slow_beyond
from pml_data import DATA

import tfdml
from tfdml.miners import (
    AngularMiner,
    BatchEasyHardMiner,
    HDCMiner,
    PairMarginMiner,
    Pairs,
    TripletMarginMiner,
    Triplets,
)

pytestmark = pytest.mark.multibackend

BATCHES = ("uneven", "pk", "pairs")

MINERS = {
    "pair_margin": lambda: PairMarginMiner(0.2, 0.8),
    "pair_margin_wide": lambda: PairMarginMiner(1.2, 1.35),
    **{f"triplet_margin_{kind}": (lambda kind=kind: TripletMarginMiner(0.2, kind))
       for kind in ("all", "hard", "semihard", "easy")},
}
MINERS["hdc"] = lambda: HDCMiner(0.5)
MINERS["hdc_0.3"] = lambda: HDCMiner(0.3)
# The settings of tests/fixtures/make_pml_fixtures.py's BATCH_EASY_HARD.
for _pos, _neg, _pos_range, _neg_range in [
        ("easy", "semihard", None, None), ("hard", "hard", None, None),
        ("easy", "easy", None, None), ("semihard", "hard", None, None),
        ("semihard", "easy", None, None), ("all", "hard", None, None),
        ("easy", "all", None, None), ("all", "all", None, None),
        ("hard", "semihard", None, None), ("easy", "hard", (0.6, 1.3), (1.0, 1.45))]:
    MINERS[f"batch_easy_hard_{_pos}_{_neg}" + ("_ranges" if _pos_range else "")] = (
        lambda p=_pos, n=_neg, pr=_pos_range, nr=_neg_range: BatchEasyHardMiner(p, n, pr, nr))


def _index_sets(mined):
    """pml's selection as sets of index tuples: ``(positive pairs, negative pairs)`` or
    ``triplets``."""
    if isinstance(mined, Pairs):
        return tuple({tuple(ij) for ij in np.argwhere(to_numpy(m))} for m in mined)
    assert isinstance(mined, Triplets)
    if mined.positive is None:
        assert mined.negative is None
        return {tuple(t) for t in np.argwhere(to_numpy(mined.mask))}
    # One positive and one negative per anchor: pml's (a, p, a, n) pairs.
    kept = np.flatnonzero(to_numpy(mined.mask)[:, 0, 0])
    p, n = (to_numpy(t)[:, 0] for t in (mined.positive, mined.negative))
    return {(a, p[a]) for a in kept}, {(a, n[a]) for a in kept}


def _recorded_sets(name, batch):
    if f"miner/{name}/{batch}/a1" in DATA.files:  # pairs
        parts = [DATA[f"miner/{name}/{batch}/{k}"] for k in ("a1", "p", "a2", "n")]
        return tuple(set(zip(parts[i], parts[i + 1], strict=True)) for i in (0, 2))
    a, p, n = (DATA[f"miner/{name}/{batch}/{k}"] for k in ("a", "p", "n"))
    return set(zip(a, p, n, strict=True))


def _mine(miner, labels, x):
    scores = tfdml.ops.pairwise_similarity(x)  # ignored: the miners use the embeddings
    return miner.mine(scores, labels, embeddings=x)


#: On every commit every miner on the uneven batch, and one miner of each class (two of
#: BatchEasyHardMiner: a semihard positive selects differently) on the other two; the other
#: miners on those batches in the slow tier.
ON_EVERY_BATCH = ("pair_margin", "triplet_margin_semihard", "hdc",
                  "batch_easy_hard_easy_semihard", "batch_easy_hard_semihard_hard")


@pytest.mark.parametrize("name,batch", slow_beyond(
    [pytest.param(name, batch, id=f"{name}-{batch}") for batch in BATCHES
     for name in sorted(MINERS)],
    {*(f"{name}-uneven" for name in MINERS),
     *(f"{name}-{batch}" for name in ON_EVERY_BATCH for batch in ("pk", "pairs"))}))
def test_selects_what_pytorch_metric_learning_selects(name, batch):
    with enable_float64():
        labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
        got = _index_sets(_mine(MINERS[name](), labels, x))
    want = _recorded_sets(name, batch)
    if name.startswith("hdc"):
        got, want = _mirror_ties(got, want, DATA[f"{batch}/embeddings"])
    assert got == want
    if not (batch == "pairs" and name.startswith("batch_easy_hard_")):  # some select none
        assert (sum(len(s) for s in want) if isinstance(want, tuple) else len(want)) > 0


def _reference_triplets(labels, x, margin, kind):
    d = ref.pairwise_distance(ref.l2_normalize(x))

    def keep(a, p, n):
        t = d[a, n] - d[a, p]
        return {"all": t <= margin, "hard": t <= 0, "semihard": 0 < t <= margin,
                "easy": t > margin}[kind]

    return ref.triplets_where(labels, keep)


# "hard" and "easy" (slow tier) are one-sided cuts of the same margin test as "semihard";
# eagerly every kind is checked on every commit by test_selects_what_pytorch_metric_learning_
# selects.
@pytest.mark.parametrize("kind", slow_beyond(["all", "hard", "semihard", "easy"],
                                             {"all", "semihard"}))
def test_triplet_margin_miner_matches_the_reference_compiled(kind):
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 4, size=13)
    x = rng.normal(size=(13, 6)).astype("float32")
    miner = TripletMarginMiner(0.3, kind)
    eager = _index_sets(_mine(miner, labels, x))
    assert eager == _reference_triplets(labels, x.astype(np.float64), 0.3, kind)
    if BACKEND != "torch":
        mask = compiled(lambda y, e: _mine(miner, y, e).mask)(labels, x)
        assert {tuple(t) for t in np.argwhere(to_numpy(mask))} == eager


def test_pair_margin_miner_matches_the_reference():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, size=11)
    x = rng.normal(size=(11, 4))
    d = ref.pairwise_distance(ref.l2_normalize(x))
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(11, dtype=bool)
    with enable_float64():
        positive, negative = _index_sets(_mine(PairMarginMiner(1.0, 1.4), labels, x))
    assert positive == {tuple(ij) for ij in np.argwhere(same & off & (d > 1.0))}
    assert negative == {tuple(ij) for ij in np.argwhere(~same & (d < 1.4))}


LOSSES_WITH_A_MINER = {
    "contrastive": lambda m: tfdml.losses.ContrastiveLoss(miner=m),
    "triplet_margin": lambda m: tfdml.losses.TripletMarginLoss(miner=m),
    "multi_similarity": lambda m: tfdml.losses.MultiSimilarityLoss(miner=m),
    "nca": lambda m: tfdml.losses.TripletNCALoss(miner=m),
}


# On every commit: each miner once, each loss, and pairs and triplets each into a pair loss
# and a triplet loss; the other pairs of miner and loss in the slow tier.
@pytest.mark.parametrize("name,make_loss", slow_beyond(
    [pytest.param(name, make, id=f"{name}-{loss}")
     for loss, make in LOSSES_WITH_A_MINER.items()
     for name in ("pair_margin_wide", "triplet_margin_semihard", "hdc",
                  "batch_easy_hard_easy_semihard", "batch_easy_hard_all_hard",
                  "batch_easy_hard_easy_hard_ranges")],
    {"pair_margin_wide-contrastive", "hdc-triplet_margin",
     "triplet_margin_semihard-multi_similarity", "batch_easy_hard_easy_semihard-nca",
     "batch_easy_hard_all_hard-contrastive", "batch_easy_hard_easy_hard_ranges-triplet_margin"}))
def test_every_loss_takes_them_and_round_trips(name, make_loss):
    labels, x = DATA["pk/labels"], DATA["pk/embeddings"].astype("float32")
    loss = make_loss(MINERS[name]())
    value = to_numpy(loss(labels, x))
    assert np.isfinite(value) and value > 0
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(clone.miner) is type(loss.miner)
    assert clone.miner.get_config() == loss.miner.get_config()
    np.testing.assert_allclose(to_numpy(clone(labels, x)), value, rtol=1e-6)


def _reference_easy_hard(labels, x, pos, neg):
    """BatchEasyHardMiner by loops: ``{anchor: (positive, negative)}`` (no "all")."""
    d = ref.pairwise_distance(ref.l2_normalize(x))
    n = len(labels)
    out = {}

    def choose(candidates, strategy, a):
        """The closest candidate ("easy") or the farthest ("hard"), the lowest index at ties."""
        if not candidates:
            return None
        sign = 1.0 if strategy == "easy" else -1.0
        return min(candidates, key=lambda j: (sign * d[a, j], j))

    for a in range(n):
        positives = [j for j in range(n) if j != a and labels[j] == labels[a]]
        negatives = [j for j in range(n) if labels[j] != labels[a]]
        neg_key = {"hard": "easy", "semihard": "easy", "easy": "hard"}[neg]  # closest first
        if pos == "semihard":
            k = choose(negatives, neg_key, a)
            p = None if k is None else choose([j for j in positives if d[a, j] < d[a, k]],
                                              "hard", a)
        else:
            p = choose(positives, pos, a)
            pool = negatives if neg != "semihard" or p is None else [
                j for j in negatives if d[a, j] > d[a, p]]
            k = choose(pool, neg_key, a)
        if p is not None and k is not None:
            out[a] = (p, k)
    return out


# Each strategy of each side on every commit; hard-semihard in the slow tier (and eagerly on
# every commit in test_selects_what_pytorch_metric_learning_selects).
@pytest.mark.parametrize("pos,neg", slow_beyond(
    [pytest.param(p, n, id=f"{p}-{n}") for p, n in [
        ("easy", "semihard"), ("hard", "hard"), ("easy", "easy"), ("semihard", "hard"),
        ("hard", "semihard")]],
    {"easy-semihard", "hard-hard", "easy-easy", "semihard-hard"}))
def test_batch_easy_hard_miner_matches_the_reference_compiled(pos, neg):
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 4, size=15)
    x = rng.normal(size=(15, 5)).astype("float32")
    miner = BatchEasyHardMiner(pos, neg)
    want = _reference_easy_hard(labels, x.astype(np.float64), pos, neg)
    assert want
    got = _index_sets(_mine(miner, labels, x))
    assert got == ({(a, p) for a, (p, _) in want.items()}, {(a, k) for a, (_, k) in want.items()})
    if BACKEND != "torch":
        mined = compiled(lambda y, e: tuple(_mine(miner, y, e)))(labels, x)
        assert _index_sets(Triplets(*mined)) == got


def _mirror_ties(got, want, x):
    """HDCMiner's cut through the batch's pairs ranked by distance often falls between a pair
    ``(i, j)`` and its mirror ``(j, i)``, at the same distance: tfdml keeps the first in
    row-major order, pml's ``torch.topk`` either. Where the two selections differ only by
    such mirrors, ``want`` is returned as ``got``."""
    d = ref.pairwise_distance(ref.l2_normalize(x))
    fixed = []
    for g, w in zip(got, want, strict=True):
        extra, missing = g - w, w - g
        if {(j, i) for i, j in extra} == missing and all(
                abs(d[i, j] - d[j, i]) < 1e-12 for i, j in extra):
            w = g
        fixed.append(w)
    return got, tuple(fixed)


def _reference_hdc(labels, x, share):
    d = ref.pairwise_distance(ref.l2_normalize(x))
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(len(labels), dtype=bool)
    out = []
    for mask, sign in ((same & off, -1.0), (~same, 1.0)):  # farthest positives, closest negatives
        pairs = sorted((sign * d[i, j], i, j) for i, j in np.argwhere(mask))
        out.append({(i, j) for _, i, j in pairs[:int(np.ceil(share * len(pairs)))]})
    return tuple(out)


# share 0.5 (slow tier) is a cut between 0.25 and all pairs; eagerly it is checked on every
# commit by test_selects_what_pytorch_metric_learning_selects.
@pytest.mark.parametrize("share", slow_beyond([0.25, 0.5, 1.0], {"0.25", "1.0"}))
def test_hdc_miner_matches_the_reference_compiled(share):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 3, size=14)
    x = rng.normal(size=(14, 5)).astype("float32")
    miner = HDCMiner(share)
    got = _index_sets(_mine(miner, labels, x))
    assert got == _reference_hdc(labels, x.astype(np.float64), share)
    if BACKEND != "torch":
        mined = compiled(lambda y, e: tuple(_mine(miner, y, e)))(labels, x)
        assert _index_sets(Pairs(*mined)) == got


def _reference_angular(labels, x, angle, normalize=True):
    """The triplets whose angle at the negative exceeds ``angle``. ``normalize=False``:
    pml 2.9's reading, on the embeddings as given, with ``pairwise_distance``'s 1e-6
    offset (``|u - v + 1e-6|``)."""
    x = ref.l2_normalize(x) if normalize else np.asarray(x, np.float64)
    eps = 0.0 if normalize else 1e-6

    def wide(a, p, n):
        c = (x[a] + x[p]) / 2
        return np.arctan(np.linalg.norm(x[a] - x[p] + eps)
                         / (2 * np.linalg.norm(x[n] - c + eps))) > angle

    return ref.triplets_where(labels, wide)


@pytest.mark.parametrize("batch", ["uneven", "pk", "pairs"])
@pytest.mark.parametrize("degrees", [20, 40])
def test_angular_miner_normalizes_where_pytorch_metric_learning_does_not(degrees, batch):
    """pml measures the angle on the embeddings as given; the paper (and tfdml) on unit
    vectors. The reference with pml's reading gives pml's triplets exactly; tfdml gives the
    reference's own, which differ on these (not unit-norm) batches."""
    labels, x = DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"]
    recorded = _recorded_sets(f"angular_{degrees}", batch)
    assert _reference_angular(labels, x, np.radians(degrees), normalize=False) == recorded
    with enable_float64():
        got = _index_sets(_mine(AngularMiner(np.radians(degrees)), labels, x))
    assert got == _reference_angular(labels, x, np.radians(degrees))
    assert got != recorded


def test_angular_miner_compiled_equals_eager():
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 3, size=12)
    x = rng.normal(size=(12, 5)).astype("float32")
    miner = AngularMiner(0.5)
    eager = _index_sets(_mine(miner, labels, x))
    assert eager == _reference_angular(labels, x.astype(np.float64), 0.5)
    if BACKEND != "torch":
        mask = compiled(lambda y, e: _mine(miner, y, e).mask)(labels, x)
        assert {tuple(t) for t in np.argwhere(to_numpy(mask))} == eager


def test_without_embeddings_is_a_value_error():
    with pytest.raises(ValueError, match="embeddings"):
        PairMarginMiner().mine(np.eye(3, dtype="float32"), np.array([0, 0, 1]))


@pytest.mark.parametrize("make,match", [
    (lambda: PairMarginMiner(pos_margin=float("nan")), "pos_margin"),
    (lambda: PairMarginMiner(neg_margin="1"), "neg_margin"),
    (lambda: PairMarginMiner(distance="dot"), "distance"),
    (lambda: TripletMarginMiner(margin=float("inf")), "margin"),
    (lambda: TripletMarginMiner(type_of_triplets="semi-hard"), "type_of_triplets"),
    (lambda: HDCMiner(0.0), "filter_percentage"), (lambda: HDCMiner(1.5), "filter_percentage"),
    (lambda: AngularMiner(20), "angle"), (lambda: AngularMiner(0.0), "angle"),
    (lambda: BatchEasyHardMiner("semihard", "semihard"), "semihard"),
    (lambda: BatchEasyHardMiner("all", "semihard"), "semihard"),
    (lambda: BatchEasyHardMiner("random"), "pos_strategy"),
    (lambda: BatchEasyHardMiner(neg_strategy="distance_weighted"), "neg_strategy"),
    (lambda: BatchEasyHardMiner(allowed_pos_range=(1.0,)), "allowed_pos_range"),
    (lambda: BatchEasyHardMiner(allowed_neg_range=(1.4, 0.2)), "allowed_neg_range"),
    (lambda: BatchEasyHardMiner(allowed_neg_range=(0.0, float("nan"))), "allowed_neg_range"),
])
def test_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- margins with which nothing can be mined ----------------------------------------------------


@pytest.mark.parametrize("make,match", [
    (lambda: PairMarginMiner(pos_margin=-1, neg_margin=-1), "neg_margin=-1"),
    (lambda: PairMarginMiner(neg_margin=0.0), "neg_margin=0.0"),
    (lambda: PairMarginMiner(pos_margin=2.0), "pos_margin=2.0"),
    (lambda: PairMarginMiner(pos_margin=2.0, distance="cosine"), "pos_margin=2.0"),
    (lambda: PairMarginMiner(pos_margin=4, distance="squared_l2"), "pos_margin=4"),
    (lambda: TripletMarginMiner(margin=-5), "margin=-5"),
    (lambda: TripletMarginMiner(margin=-2.01, type_of_triplets="hard"), "margin=-2.01"),
    (lambda: TripletMarginMiner(margin=-4.5, distance="squared_l2"), "margin=-4.5"),
    (lambda: TripletMarginMiner(margin=0.0, type_of_triplets="semihard"), "margin=0.0"),
    (lambda: TripletMarginMiner(margin=-0.2, type_of_triplets="semihard"), "margin=-0.2"),
    (lambda: TripletMarginMiner(margin=2, type_of_triplets="easy"), "margin=2"),
    (lambda: BatchEasyHardMiner(allowed_pos_range=(-1.0, -0.5)), "allowed_pos_range"),
    (lambda: BatchEasyHardMiner(allowed_neg_range=(2.5, 3.0)), "allowed_neg_range"),
    (lambda: BatchEasyHardMiner(allowed_neg_range=(4.5, 5.0), distance="squared_l2"),
     "allowed_neg_range"),
])
def test_margins_that_can_mine_nothing_are_refused(make, match):
    """The distances of L2-normalized embeddings lie in [0, 2] ("l2", "cosine") or [0, 4]
    ("squared_l2"); a margin or range with which no pair or triplet can be kept would leave
    the loss at 0 on every batch."""
    with pytest.raises(ValueError, match=match):
        make()


def test_the_extreme_margins_accepted_still_mine():
    """At the ends of the distances' range: an antipodal positive (d = 2) and a duplicate
    negative (d = 0) of anchor 0."""
    e = np.eye(3, dtype="float32")[0]
    labels, x = np.array([0, 0, 1]), np.stack([e, -e, e])
    pairs = _mine(PairMarginMiner(pos_margin=1.99, neg_margin=0.01), labels, x)
    assert to_numpy(pairs.positive)[0, 1] and to_numpy(pairs.negative)[0, 2]
    # A negative pos_margin / a neg_margin beyond 2 keep every pair, as pml.
    pairs = _mine(PairMarginMiner(pos_margin=-1.0, neg_margin=3.0), labels, x)
    np.testing.assert_array_equal(to_numpy(pairs.positive),
                                  (labels[:, None] == labels[None]) & ~np.eye(3, dtype=bool))
    np.testing.assert_array_equal(to_numpy(pairs.negative), labels[:, None] != labels[None])
    # The triplets: (a, p, n) = (0, 1, 2) with d_an - d_ap = 0 - 2, (1, 0, 2) with 2 - 2.
    for kind, margin, want in (("all", -2.0, (0, 1, 2)), ("hard", -2.0, (0, 1, 2)),
                               ("easy", -0.01, (1, 0, 2))):
        mask = to_numpy(_mine(TripletMarginMiner(margin, kind), labels, x).mask)
        assert mask[want] and mask.sum() == 1, kind
    # A duplicate positive and an antipodal negative: d_an - d_ap = 2 > 1.99.
    mask = to_numpy(_mine(TripletMarginMiner(1.99, "easy"), labels, np.stack([e, e, -e])).mask)
    assert mask[0, 1, 2] and mask[1, 0, 2] and mask.sum() == 2
    triplets = _mine(BatchEasyHardMiner("hard", "hard", allowed_pos_range=(2.0, 3.0),
                                        allowed_neg_range=(-1.0, 0.0)), labels, x)
    assert to_numpy(triplets.mask)[0, 0, 0]
