"""TripletMiner against the naive reference miner of tests/references.py."""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
import tensorflow as tf

from tfdml.miners import TripletMiner, Triplets, gather_triplet_scores

POSITIVES = ("easy", "hard", "random", "all")
NEGATIVES = ("hard", "semihard", "easy", "random", "all")
SINGLE_COMBOS = [(p, n) for p in POSITIVES if p != "all" for n in NEGATIVES if n != "all"]


def _arrays(triplets: Triplets):
    def to_np(t):
        return None if t is None else t.numpy()

    return to_np(triplets.positive), to_np(triplets.negative), triplets.mask.numpy()


def _batch_case():
    labels, x = ref.make_batch([4, 3, 2, 2, 1], 7, seed=0)  # B=12, D=7
    return ref.nca_scores(x), labels, None, 0


def _ref_offset_case():
    # The batch is rows 3..8 of a reference set of 14 (margin-loss style scores).
    ref_labels, rx = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)
    scores = ref.margin_scores(rx[3:9], rx, "squared_l2")
    return scores, ref_labels[3:9], ref_labels, 3


def _disjoint_ref_case():
    # Anchors outside the reference set (ref_offset=None); label 100 has no positive.
    ref_labels, rx = ref.make_batch([4, 3, 3, 2, 1, 1], 5, seed=3)
    rng = np.random.default_rng(9)
    queries = rng.normal(size=(6, 5))
    labels = np.array([1, 4, 7, 100, 1, 16], np.int32)
    return ref.nca_scores(queries, rx), labels, ref_labels, None


CASES = {"batch": _batch_case, "ref_offset_3": _ref_offset_case, "ref_offset_none": _disjoint_ref_case}


def _mine(miner, scores, labels, ref_labels, ref_offset):
    return miner.mine(
        tf.constant(scores, tf.float32),
        tf.constant(labels),
        None if ref_labels is None else tf.constant(ref_labels),
        ref_offset,
    )


def _check_against_reference(positive, negative, disjoint, case):
    scores, labels, ref_labels, ref_offset = CASES[case]()
    # The reference mines from the same float32 values the miner sees.
    scores = scores.astype(np.float32)
    miner = TripletMiner(positive, negative, disjoint=disjoint, seed=11)
    triplets = _mine(miner, scores, labels, ref_labels, ref_offset)
    pos, neg, mask = _arrays(triplets)

    # Layout of the Triplets docstring.
    batch, num_ref = scores.shape
    n_pos = num_ref if positive == "all" else 1
    n_neg = num_ref if negative == "all" else 1
    assert mask.shape == (batch, n_pos, n_neg) and mask.dtype == bool
    assert (pos is None) == (positive == "all")
    assert (neg is None) == (negative == "all")
    for arr in (pos, neg):
        if arr is not None:
            assert arr.shape == (batch, n_pos) and arr.dtype == np.int32

    got = ref.triplet_set(pos, neg, mask)
    chooser = ref.chooser_from(pos, neg, mask, disjoint=disjoint)
    want = ref.mine_triplets(scores, labels, ref_labels, ref_offset, positive, negative,
                             disjoint=disjoint, chooser=chooser)
    assert got == want
    return got


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("negative", NEGATIVES)
@pytest.mark.parametrize("positive", POSITIVES)
def test_miner_matches_reference(positive, negative, case):
    got = _check_against_reference(positive, negative, False, case)
    assert got  # every case has some triplets


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("positive,negative", SINGLE_COMBOS)
def test_disjoint_miner_matches_reference(positive, negative, case):
    got = _check_against_reference(positive, negative, True, case)
    assert got
    # No sample in two triplets.
    anchors_offset = {"batch": 0, "ref_offset_3": 3, "ref_offset_none": None}[case]
    seen = []
    for a, p, n in got:
        seen += [p, n] + ([] if anchors_offset is None else [a + anchors_offset])
    assert len(seen) == len(set(seen))


def test_semihard_cases_exercise_missing_negatives():
    """The fixtures include pairs without a semi-hard negative (so that branch is tested)."""
    scores, labels, ref_labels, ref_offset = _disjoint_ref_case()
    with_hard = ref.mine_triplets(scores, labels, ref_labels, ref_offset, "all", "hard")
    with_semihard = ref.mine_triplets(scores, labels, ref_labels, ref_offset, "all", "semihard")
    assert len(with_semihard) < len(with_hard)
    got = _check_against_reference("all", "semihard", False, "ref_offset_none")
    assert got == with_semihard


def test_hand_made_example():
    """A 4-sample example worked out by hand."""
    # labels: 0 0 0 1; anchor 0 is most similar to 1, then 3, then 2.
    scores = np.array(
        [
            [1.0, 0.9, 0.1, 0.5],
            [0.9, 1.0, 0.3, 0.2],
            [0.1, 0.3, 1.0, 0.6],
            [0.5, 0.2, 0.6, 1.0],
        ],
        np.float32,
    )
    labels = np.array([0, 0, 0, 1])
    expected = {
        ("easy", "hard"): {(0, 1, 3), (1, 0, 3), (2, 1, 3)},
        ("hard", "hard"): {(0, 2, 3), (1, 2, 3), (2, 0, 3)},
        # anchor 0: hard positive 2 (s=0.1) < s_an=0.5 -> no semi-hard negative.
        ("hard", "semihard"): {(1, 2, 3)},
        ("easy", "semihard"): {(0, 1, 3), (1, 0, 3)},
        ("all", "semihard"): {(0, 1, 3), (1, 0, 3), (1, 2, 3)},
    }
    for (positive, negative), want in expected.items():
        t = TripletMiner(positive, negative).mine(tf.constant(scores), tf.constant(labels))
        assert ref.triplet_set(*_arrays(t)) == want, (positive, negative)
        assert ref.mine_triplets(scores, labels, positive=positive, negative=negative) == want
    # Disjoint EPHN: anchor 0 takes (0, 1, 3); anchors 1 and 3 are then used, and anchor 2
    # has neither a free positive nor a free negative left.
    t = TripletMiner("easy", "hard", disjoint=True).mine(tf.constant(scores), tf.constant(labels))
    assert ref.triplet_set(*_arrays(t)) == {(0, 1, 3)}


def test_gather_triplet_scores_layout():
    scores, labels, _, _ = _batch_case()
    scores = tf.constant(scores, tf.float32)
    s = scores.numpy()
    for positive, negative in [("easy", "hard"), ("all", "semihard"), ("easy", "all"),
                               ("all", "all")]:
        t = TripletMiner(positive, negative).mine(scores, tf.constant(labels))
        s_ap, s_an = gather_triplet_scores(scores, t)
        s_ap = np.broadcast_to(s_ap.numpy(), t.mask.shape)
        s_an = np.broadcast_to(s_an.numpy(), t.mask.shape)
        pos, neg, mask = _arrays(t)
        for a, i, j in zip(*np.nonzero(mask), strict=True):
            p = i if pos is None else pos[a, i]
            n = j if neg is None else neg[a, i]
            assert s_ap[a, i, j] == s[a, p] and s_an[a, i, j] == s[a, n]


# -- random strategies ---------------------------------------------------------------------------

RANDOM_COMBOS = [("random", "hard", False), ("easy", "random", False),
                 ("random", "random", False), ("all", "random", False),
                 ("random", "semihard", True), ("random", "random", True)]


def _uniformity_problem():
    # 300 anchors of class 0 against a reference set with 3 positives and 4 negatives:
    # one call gives 300 independent draws.
    rng = np.random.default_rng(5)
    scores = rng.normal(size=(300, 7)).astype(np.float32)
    labels = np.zeros(300, np.int32)
    ref_labels = np.array([0, 1, 0, 1, 1, 0, 1], np.int32)
    return scores, labels, ref_labels


@pytest.mark.parametrize("positive,negative,disjoint", RANDOM_COMBOS)
def test_same_seed_same_choices(positive, negative, disjoint):
    scores, labels, ref_labels, ref_offset = _batch_case()
    runs = []
    for _ in range(2):
        miner = TripletMiner(positive, negative, disjoint=disjoint, seed=123)
        runs.append([_arrays(_mine(miner, scores, labels, ref_labels, ref_offset))
                     for _ in range(2)])
    for first, second in zip(runs[0], runs[1], strict=True):
        for x, y in zip(first, second, strict=True):
            np.testing.assert_array_equal(x, y)


def test_random_choices_depend_on_seed_and_call():
    scores, labels, ref_labels = _uniformity_problem()
    miner = TripletMiner("random", "random", seed=1)
    first = _arrays(_mine(miner, scores, labels, ref_labels, None))
    second = _arrays(_mine(miner, scores, labels, ref_labels, None))
    other = _arrays(_mine(TripletMiner("random", "random", seed=2), scores, labels,
                          ref_labels, None))
    assert not np.array_equal(first[0], second[0])  # a new draw each call
    assert not np.array_equal(first[0], other[0])  # another seed, other draws


def test_random_choices_roughly_uniform():
    scores, labels, ref_labels = _uniformity_problem()
    miner = TripletMiner("random", "random", seed=3)
    pos, neg, mask = _arrays(_mine(miner, scores, labels, ref_labels, None))
    assert mask.all()
    # Valid candidates only (also checks against the reference).
    chooser = ref.chooser_from(pos, neg, mask)
    want = ref.mine_triplets(scores, labels, ref_labels, None, "random", "random",
                             chooser=chooser)
    assert ref.triplet_set(pos, neg, mask) == want
    for chosen, candidates in ((pos[:, 0], [0, 2, 5]), (neg[:, 0], [1, 3, 4, 6])):
        counts = np.array([np.sum(chosen == c) for c in candidates])
        assert counts.sum() == 300
        expected = 300 / len(candidates)
        # Loose: about 3.5 standard deviations of a binomial count.
        assert np.all(np.abs(counts - expected) < 0.35 * expected), counts


# -- arguments -----------------------------------------------------------------------------------


def test_invalid_arguments():
    with pytest.raises(ValueError, match="positive"):
        TripletMiner("medium", "hard")
    with pytest.raises(ValueError, match="negative"):
        TripletMiner("easy", "medium")
    with pytest.raises(ValueError, match="disjoint"):
        TripletMiner("all", "hard", disjoint=True)
    with pytest.raises(ValueError, match="disjoint"):
        TripletMiner("easy", "all", disjoint=True)
    with pytest.raises(ValueError, match="seed"):
        TripletMiner("random", "hard", seed=1.5)


@pytest.mark.parametrize("positive,negative,disjoint", [("all", "semihard", False),
                                                        ("easy", "semihard", True)])
def test_miner_under_xla_matches_reference(positive, negative, disjoint):
    scores, labels, ref_labels, ref_offset = _ref_offset_case()
    scores = scores.astype(np.float32)
    miner = TripletMiner(positive, negative, disjoint=disjoint)
    mine = tf.function(lambda s, lab, rl: miner.mine(s, lab, rl, ref_offset), jit_compile=True)
    t = mine(tf.constant(scores), tf.constant(labels), tf.constant(ref_labels))
    want = ref.mine_triplets(scores, labels, ref_labels, ref_offset, positive, negative,
                             disjoint=disjoint)
    assert ref.triplet_set(*_arrays(t)) == want


@pytest.mark.parametrize("jit", [False, True])
def test_semihard_all_counts_ties_as_not_more_similar(jit):
    """Integer-valued scores tie often: a negative as similar as the positive is semi-hard."""
    rng = np.random.default_rng(11)
    miner = TripletMiner("all", "semihard")
    mine = tf.function(miner.mine, jit_compile=True) if jit else miner.mine
    for _ in range(3):
        scores = rng.integers(-3, 4, size=(30, 30)).astype(np.float32)
        labels = rng.integers(0, 4, size=30).astype(np.int32)
        got = mine(tf.constant(scores), tf.constant(labels))
        mask, negative = got.mask.numpy()[:, :, 0], got.negative.numpy()
        for a in range(30):
            for p in range(30):
                if p == a or labels[p] != labels[a]:
                    assert not mask[a, p]
                    continue
                candidates = [scores[a, n] for n in range(30)
                              if labels[n] != labels[a] and scores[a, n] <= scores[a, p]]
                assert mask[a, p] == bool(candidates)
                if candidates:
                    n = negative[a, p]
                    assert labels[n] != labels[a] and scores[a, n] == max(candidates)
