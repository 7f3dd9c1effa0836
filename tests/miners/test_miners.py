"""TripletMiner against the naive reference miner of tests/support/references/.

Backend-generic (``keras.ops`` and tests/support/backends.py). Every test runs under
TensorFlow; the tests (and parameter rows) marked ``multibackend`` also run
under JAX and PyTorch. Large parameter grids run in full under TensorFlow and
thinned elsewhere (eager JAX compiles every op for every new shape).
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, compiled, to_numpy, value_and_grad
from harness import slow_beyond
from keras import ops

from tfdml import ops as dml
from tfdml.miners import TripletMiner, Triplets, gather_triplet_scores

POSITIVES = ("easy", "hard", "random", "all")
NEGATIVES = ("hard", "semihard", "easy", "random", "all")
SINGLE_COMBOS = [(p, n) for p in POSITIVES if p != "all" for n in NEGATIVES if n != "all"]

MULTIBACKEND = pytest.mark.multibackend


def _grid(rows, every_backend, fast=None):
    """``pytest.param`` rows; those with ``every_backend(*row)`` are marked ``multibackend``.

    With ``fast``, the rows with neither ``every_backend(*row)`` nor ``fast(*row)`` run in
    the slow tier (:func:`harness.slow_beyond`).
    """
    params = [pytest.param(*row, marks=[MULTIBACKEND] if every_backend(*row) else [],
                           id="-".join(str(v) for v in row)) for row in rows]
    if fast is None:
        return params
    return slow_beyond(params, {p.id for row, p in zip(rows, params, strict=True)
                                if every_backend(*row) or fast(*row)})


#: Every positive and every negative strategy once, single choices and "all" on both sides:
#: the fast tier's rows of a case beside the one that runs every combination.
COVER = {("easy", "hard"), ("hard", "semihard"), ("random", "easy"), ("all", "random"),
         ("easy", "all"), ("all", "all")}
#: The same for single choices (disjoint mining).
SINGLE_COVER = {("easy", "hard"), ("hard", "semihard"), ("random", "easy"), ("easy", "random")}


def _t(x, dtype=None):
    """A backend tensor (``dtype``: NumPy's conversion of ``x`` when None)."""
    return ops.convert_to_tensor(np.asarray(x, dtype))


def _arrays(triplets: Triplets):
    return to_numpy(triplets.positive), to_numpy(triplets.negative), to_numpy(triplets.mask)


_COMPILED = {}


def _compiled_mine(miner, ref_offset=0):
    """``(scores, labels, ref_labels=None, embeddings=None, ref_embeddings=None) -> mine(...)``
    compiled as ``jit_compile=True`` would compile it (PyTorch: eager).

    Under JAX a traced function cannot update the miner's seed state in place: the state
    goes in and comes out explicitly (``keras.StatelessScope``), as Keras' JAX trainer
    passes its variables, and is written back after each call. One compilation serves
    every miner of a configuration (the seed only sets the initial state).
    """
    def mine(m, scores, labels, ref_labels=None, embeddings=None, ref_embeddings=None):
        return m.mine(scores, labels, ref_labels, ref_offset, embeddings=embeddings,
                      ref_embeddings=ref_embeddings)

    if BACKEND != "jax" or miner._seed_generator is None:
        return compiled(functools.partial(mine, miner))
    import jax

    config = dict(miner.get_config(), seed=None)
    key = (type(miner), tuple(sorted(config.items())), ref_offset)
    if key not in _COMPILED:
        template = type(miner).from_config(config)
        template_state = template._seed_generator.state

        def stateless(seed, *args):
            with keras.StatelessScope(state_mapping=[(template_state, seed)]) as scope:
                out = mine(template, *args)
            return out, scope.get_current_value(template_state)

        _COMPILED[key] = jax.jit(stateless)
    jitted = _COMPILED[key]
    state = miner._seed_generator.state

    def call(*args):
        out, seed = jitted(state.value, *args)
        state.assign(seed)
        return out

    return call


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
        _t(scores, np.float32),
        _t(labels),
        None if ref_labels is None else _t(ref_labels),
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


# Every combination with ref_offset_3 (under every backend, on every commit); the other cases
# on every commit with COVER (and, for ref_offset_none, every "all" positive).
@pytest.mark.parametrize("positive,negative,case", _grid(
    [(p, n, c) for c in sorted(CASES) for n in NEGATIVES for p in POSITIVES],
    lambda p, n, c: c == "ref_offset_3" or (p == "all" and c == "ref_offset_none"),
    lambda p, n, c: (p, n) in COVER))
def test_miner_matches_reference(positive, negative, case):
    got = _check_against_reference(positive, negative, False, case)
    assert got  # every case has some triplets


@pytest.mark.parametrize("positive,negative,case", _grid(
    [(p, n, c) for c in sorted(CASES) for p, n in SINGLE_COMBOS],
    lambda p, n, c: c == "ref_offset_3" or (c == "ref_offset_none" and p == n == "random"),
    lambda p, n, c: c == "batch" and (p, n) in SINGLE_COVER))
def test_disjoint_miner_matches_reference(positive, negative, case):
    got = _check_against_reference(positive, negative, True, case)
    assert got
    # No sample in two triplets.
    anchors_offset = {"batch": 0, "ref_offset_3": 3, "ref_offset_none": None}[case]
    seen = []
    for a, p, n in got:
        seen += [p, n] + ([] if anchors_offset is None else [a + anchors_offset])
    assert len(seen) == len(set(seen))


@MULTIBACKEND
def test_semihard_cases_exercise_missing_negatives():
    """The fixtures include pairs without a semi-hard negative (so that branch is tested)."""
    scores, labels, ref_labels, ref_offset = _disjoint_ref_case()
    with_hard = ref.mine_triplets(scores, labels, ref_labels, ref_offset, "all", "hard")
    with_semihard = ref.mine_triplets(scores, labels, ref_labels, ref_offset, "all", "semihard")
    assert len(with_semihard) < len(with_hard)
    got = _check_against_reference("all", "semihard", False, "ref_offset_none")
    assert got == with_semihard


@pytest.mark.parametrize("max_elements,case", _grid(
    [(m, c) for c in sorted(CASES) for m in (1, 20)], lambda m, c: c == "ref_offset_3"))
def test_semihard_all_in_row_blocks_matches_reference(case, max_elements, monkeypatch):
    """Large batches mine semi-hard negatives in row blocks: same triplets."""
    monkeypatch.setattr(dml, "ROW_BLOCK_ELEMENTS", max_elements)
    assert _check_against_reference("all", "semihard", False, case)


@MULTIBACKEND
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
        t = TripletMiner(positive, negative).mine(_t(scores), _t(labels))
        assert ref.triplet_set(*_arrays(t)) == want, (positive, negative)
        assert ref.mine_triplets(scores, labels, positive=positive, negative=negative) == want
    # Disjoint EPHN: anchor 0 takes (0, 1, 3); anchors 1 and 3 are then used, and anchor 2
    # has neither a free positive nor a free negative left.
    t = TripletMiner("easy", "hard", disjoint=True).mine(_t(scores), _t(labels))
    assert ref.triplet_set(*_arrays(t)) == {(0, 1, 3)}


@MULTIBACKEND
def test_gather_triplet_scores_layout():
    scores, labels, _, _ = _batch_case()
    s = scores.astype(np.float32)
    scores = _t(s)
    for positive, negative in [("easy", "hard"), ("all", "semihard"), ("easy", "all"),
                               ("all", "all")]:
        t = TripletMiner(positive, negative).mine(scores, _t(labels))
        s_ap, s_an = gather_triplet_scores(scores, t)
        s_ap = np.broadcast_to(to_numpy(s_ap), tuple(t.mask.shape))
        s_an = np.broadcast_to(to_numpy(s_an), tuple(t.mask.shape))
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


@pytest.mark.parametrize("positive,negative,disjoint", _grid(
    RANDOM_COMBOS, lambda p, n, d: (p, n, d) in {("random", "hard", False),
                                                 ("all", "random", False),
                                                 ("random", "random", True)},
    lambda p, n, d: not d))  # disjoint on every commit: random-random-True
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


@MULTIBACKEND
def test_random_choices_depend_on_seed_and_call():
    scores, labels, ref_labels = _uniformity_problem()
    miner = TripletMiner("random", "random", seed=1)
    first = _arrays(_mine(miner, scores, labels, ref_labels, None))
    second = _arrays(_mine(miner, scores, labels, ref_labels, None))
    other = _arrays(_mine(TripletMiner("random", "random", seed=2), scores, labels,
                          ref_labels, None))
    assert not np.array_equal(first[0], second[0])  # a new draw each call
    assert not np.array_equal(first[0], other[0])  # another seed, other draws


@MULTIBACKEND
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


@MULTIBACKEND
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


@MULTIBACKEND
@pytest.mark.parametrize("positive,negative,disjoint", [("all", "semihard", False),
                                                        ("easy", "semihard", True)])
def test_miner_under_xla_matches_reference(positive, negative, disjoint):
    scores, labels, ref_labels, ref_offset = _ref_offset_case()
    scores = scores.astype(np.float32)
    miner = TripletMiner(positive, negative, disjoint=disjoint)
    mine = compiled(lambda s, lab, rl: miner.mine(s, lab, rl, ref_offset))
    t = mine(_t(scores), _t(labels), _t(ref_labels))
    want = ref.mine_triplets(scores, labels, ref_labels, ref_offset, positive, negative,
                             disjoint=disjoint)
    assert ref.triplet_set(*_arrays(t)) == want


@pytest.mark.parametrize("jit", _grid([(False,), (True,)], lambda jit: jit))
def test_semihard_all_counts_ties_as_not_more_similar(jit):
    """Integer-valued scores tie often: a negative as similar as the positive is semi-hard."""
    rng = np.random.default_rng(11)
    miner = TripletMiner("all", "semihard")
    mine = compiled(miner.mine) if jit else miner.mine
    for _ in range(3):
        scores = rng.integers(-3, 4, size=(30, 30)).astype(np.float32)
        labels = rng.integers(0, 4, size=30).astype(np.int32)
        got = mine(_t(scores), _t(labels))
        mask, negative = to_numpy(got.mask)[:, :, 0], to_numpy(got.negative)
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


# == pair mining, pairs <-> triplets, distance-weighted sampling ==================================

import math  # noqa: E402

import scipy.stats  # noqa: E402

import tfdml  # noqa: E402
from tfdml.miners import MultiSimilarityMiner, Pairs, as_pairs, as_triplets  # noqa: E402


def _ms_random_case(seed):
    labels, x = ref.make_batch([4, 3, 3, 2, 1], 6, seed=seed)  # B=13, D=6
    return ref.nca_scores(x), labels, None, 0


MS_CASES = dict(CASES)
MS_CASES.update({f"seed_{s}": (lambda s=s: _ms_random_case(s)) for s in (10, 11, 12)})


def _mine_pairs(miner, scores, labels, ref_labels, ref_offset):
    pairs = _mine(miner, scores, labels, ref_labels, ref_offset)
    assert isinstance(pairs, Pairs)
    pos, neg = to_numpy(pairs.positive), to_numpy(pairs.negative)
    assert pos.dtype == bool and neg.dtype == bool
    assert pos.shape == neg.shape == scores.shape
    return pos, neg


# Every epsilon with the reference-set cases; with the others each positive strategy once.
@pytest.mark.parametrize("case,positive,epsilon", _grid(
    [(c, p, e) for e in (0.1, 0.0, 0.3) for p in ("hard", "easy", "all") for c in sorted(MS_CASES)],
    lambda c, p, e: c in ("ref_offset_3", "ref_offset_none"),
    lambda c, p, e: (p, e) in {("hard", 0.1), ("easy", 0.0), ("all", 0.3)}))
def test_multi_similarity_miner_matches_reference(case, positive, epsilon):
    scores, labels, ref_labels, ref_offset = MS_CASES[case]()
    scores = scores.astype(np.float32)
    miner = MultiSimilarityMiner(epsilon=epsilon, positive=positive)
    pos, neg = _mine_pairs(miner, scores, labels, ref_labels, ref_offset)
    want_pos, want_neg = ref.multi_similarity_pairs(scores, labels, ref_labels, ref_offset,
                                                    epsilon, positive)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(neg, want_neg)
    # Every pair is a real positive / negative pair.
    all_pos, all_neg = ref.label_masks(labels, ref_labels, ref_offset)
    assert not np.any(pos & ~all_pos) and not np.any(neg & ~all_neg)
    assert neg.any() and pos.any()


@pytest.mark.parametrize("case", _grid([(c,) for c in sorted(MS_CASES)],
                                      lambda c: c in ("ref_offset_3", "seed_10")))
def test_multi_similarity_mining_is_selective(case):
    """The fixtures exercise both filters: some pairs are dropped, some kept."""
    scores, labels, ref_labels, ref_offset = MS_CASES[case]()
    scores = scores.astype(np.float32)
    all_pos, all_neg = ref.label_masks(labels, ref_labels, ref_offset)
    pos, neg = _mine_pairs(MultiSimilarityMiner(0.1, "hard"), scores, labels, ref_labels,
                           ref_offset)
    assert neg.sum() < (all_neg & all_pos.any(axis=1, keepdims=True)).sum()
    easy_pos, _ = _mine_pairs(MultiSimilarityMiner(0.1, "easy"), scores, labels, ref_labels,
                              ref_offset)
    np.testing.assert_array_equal(easy_pos.sum(axis=1), all_pos.any(axis=1).astype(int))


@MULTIBACKEND
def test_multi_similarity_miner_hand_example():
    # labels 0 0 0 1 1, epsilon 1/8; all values exact in float32 (ties are real ties).
    scores = np.array(
        [
            [1.0, 0.75, 0.375, 0.25, 0.0625],
            [0.75, 1.0, 0.625, 0.6875, 0.1875],
            [0.375, 0.625, 1.0, 0.5, 0.4375],
            [0.25, 0.6875, 0.5, 1.0, 0.875],
            [0.0625, 0.1875, 0.4375, 0.875, 1.0],
        ],
        np.float32,
    )
    labels = np.array([0, 0, 0, 1, 1])
    # Anchor 0: min S_ap = 0.375; negative kept if S + 0.125 > 0.375: 3 (0.25) ties -> no.
    #   Hard positives: S_ap - 0.125 < max S_an = 0.25: 2 (0.375) ties -> no; 1 no.
    # Anchor 1: min S_ap = 0.625 -> negative 3 (0.6875) kept, 4 not; max S_an = 0.6875 ->
    #   positives 0 (0.75 - 0.125 < 0.6875) and 2 (0.625) kept.
    # Anchor 2: min S_ap = 0.375 -> negatives 3 (0.5) and 4 (0.4375) kept; max S_an = 0.5 ->
    #   positive 0 (0.375) kept, 1 (0.625 - 0.125 = 0.5, a tie) dropped.
    # Anchor 3: its one positive 4 (0.875) -> negatives need S > 0.75: none; max S_an = 0.6875:
    #   0.875 - 0.125 not < 0.6875 -> no positive either.
    # Anchor 4: positive 3 (0.875); negatives need S > 0.75: none; max S_an 0.4375: none.
    want_hard_pos = {(1, 0), (1, 2), (2, 0)}
    want_neg = {(1, 3), (2, 3), (2, 4)}
    pos, neg = _mine_pairs(MultiSimilarityMiner(0.125, "hard"), scores, labels, None, 0)
    assert set(zip(*np.nonzero(pos), strict=True)) == want_hard_pos
    assert set(zip(*np.nonzero(neg), strict=True)) == want_neg
    pos, neg = _mine_pairs(MultiSimilarityMiner(0.125, "easy"), scores, labels, None, 0)
    assert set(zip(*np.nonzero(pos), strict=True)) == {(0, 1), (1, 0), (2, 1), (3, 4), (4, 3)}
    assert set(zip(*np.nonzero(neg), strict=True)) == want_neg
    ref_pos, ref_neg = ref.multi_similarity_pairs(scores, labels, epsilon=0.125, positive="hard")
    assert set(zip(*np.nonzero(ref_pos), strict=True)) == want_hard_pos
    assert set(zip(*np.nonzero(ref_neg), strict=True)) == want_neg


@MULTIBACKEND
def test_multi_similarity_easy_ties_pick_lowest_index():
    scores = np.array([[1.0, 0.5, 0.5, 0.1], [0.5, 1.0, 0.2, 0.3], [0.5, 0.2, 1.0, 0.0],
                       [0.1, 0.3, 0.0, 1.0]], np.float32)
    labels = np.array([0, 0, 0, 1])
    pos, _ = _mine_pairs(MultiSimilarityMiner(0.1, "easy"), scores, labels, None, 0)
    assert pos[0].tolist() == [False, True, False, False]


@MULTIBACKEND
def test_multi_similarity_anchor_without_positive_or_negative():
    scores = np.array([[1.0, 0.2, 0.9], [0.2, 1.0, 0.1], [0.9, 0.1, 1.0]], np.float32)
    labels = np.array([0, 1, 1])  # anchor 0 has no positive
    for positive in ("hard", "easy", "all"):
        pos, neg = _mine_pairs(MultiSimilarityMiner(5.0, positive), scores, labels, None, 0)
        assert not pos[0].any() and not neg[0].any()
    one_class = np.zeros(3, np.int32)  # no negative anywhere: no pair at all
    for positive in ("hard", "easy", "all"):
        pos, neg = _mine_pairs(MultiSimilarityMiner(5.0, positive), scores, one_class, None, 0)
        assert not pos.any() and not neg.any()
    # The same anchors with a negative available keep their positives.
    with_negative = np.concatenate([scores, np.full((3, 1), 0.5, np.float32)], axis=1)
    pos, neg = _mine_pairs(MultiSimilarityMiner(5.0, "all"), with_negative, one_class,
                           np.array([0, 0, 0, 1]), 0)
    assert pos.sum() == 6 and neg[:, 3].all()


@MULTIBACKEND
def test_multi_similarity_miner_invalid_arguments():
    for epsilon in (-0.1, "0.1", None, True, float("nan")):
        with pytest.raises(ValueError, match="epsilon"):
            MultiSimilarityMiner(epsilon=epsilon)
    for positive in ("random", "semihard", None):
        with pytest.raises(ValueError, match="positive"):
            MultiSimilarityMiner(positive=positive)


# -- as_pairs / as_triplets ------------------------------------------------------------------------

PAIR_COMBOS = [("easy", "hard", False), ("hard", "semihard", False), ("all", "semihard", False),
               ("all", "hard", False), ("easy", "all", False), ("all", "all", False),
               ("random", "random", False), ("all", "random", False),
               ("easy", "hard", True), ("random", "semihard", True)]


# Every combination with ref_offset_3; with the other cases each layout of Triplets (indices or
# None for the positives and for the negatives) once.
@pytest.mark.parametrize("positive,negative,disjoint,case", _grid(
    [(*combo, c) for c in sorted(CASES) for combo in PAIR_COMBOS],
    lambda p, n, d, c: c == "ref_offset_3",
    lambda p, n, d, c: (p, n, d) in {("easy", "hard", False), ("all", "semihard", False),
                                     ("easy", "all", False), ("all", "all", False)}))
def test_as_pairs_matches_reference(positive, negative, disjoint, case):
    scores, labels, ref_labels, ref_offset = CASES[case]()
    scores = scores.astype(np.float32)
    triplets = _mine(TripletMiner(positive, negative, disjoint=disjoint, seed=4), scores,
                     labels, ref_labels, ref_offset)
    got_set = ref.triplet_set(*_arrays(triplets))
    pairs = as_pairs(triplets, num_ref=scores.shape[1])
    want_pos, want_neg = ref.pairs_from_triplets(got_set, *scores.shape)
    np.testing.assert_array_equal(to_numpy(pairs.positive), want_pos)
    np.testing.assert_array_equal(to_numpy(pairs.negative), want_neg)
    assert want_pos.any()
    if triplets.positive is None or triplets.negative is None:  # num_ref read from the mask
        again = as_pairs(triplets)
        np.testing.assert_array_equal(to_numpy(again.positive), want_pos)
        np.testing.assert_array_equal(to_numpy(again.negative), want_neg)
    else:
        with pytest.raises(ValueError, match="num_ref"):
            as_pairs(triplets)


@MULTIBACKEND
@pytest.mark.parametrize("positive", ["hard", "easy", "all"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_as_triplets_matches_reference(case, positive):
    scores, labels, ref_labels, ref_offset = CASES[case]()
    scores = scores.astype(np.float32)
    pairs = _mine(MultiSimilarityMiner(0.2, positive), scores, labels, ref_labels, ref_offset)
    triplets = as_triplets(pairs)
    assert triplets.positive is None and triplets.negative is None
    assert triplets.mask.shape == (scores.shape[0], scores.shape[1], scores.shape[1])
    want = ref.triplets_from_pairs(to_numpy(pairs.positive), to_numpy(pairs.negative))
    assert want
    assert ref.triplet_set(*_arrays(triplets)) == want
    assert as_pairs(pairs) is pairs
    # Round trip: the pairs of the triplets are the pairs of anchors with both kinds.
    back = as_pairs(triplets)
    both = to_numpy(pairs.positive).any(axis=1) & to_numpy(pairs.negative).any(axis=1)
    pair_pos, pair_neg = to_numpy(pairs.positive), to_numpy(pairs.negative)
    np.testing.assert_array_equal(to_numpy(back.positive), pair_pos & both[:, None])
    np.testing.assert_array_equal(to_numpy(back.negative), pair_neg & both[:, None])


@MULTIBACKEND
def test_as_triplets_passes_triplets_through():
    scores, labels, _, _ = _batch_case()
    t = TripletMiner("easy", "hard").mine(_t(scores, np.float32), _t(labels))
    assert as_triplets(t) is t


# -- distance-weighted sampling --------------------------------------------------------------------

DW_DIM = 6


def _unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _at_distance(anchor, d, rng):
    """A unit vector at Euclidean distance ``d`` from the unit vector ``anchor``."""
    u = rng.normal(size=anchor.shape)
    u = _unit(u - np.dot(u, anchor) * anchor)
    cos = 1.0 - d * d / 2.0
    return cos * anchor + math.sqrt(max(1.0 - cos * cos, 0.0)) * u


def _dw_problem(copies, seed=0):
    """3 distinct anchors (classes 0, 1, 2), each repeated ``copies`` times, against a
    reference set of 14 unit vectors; the anchors are not in the reference set."""
    rng = np.random.default_rng(seed)
    ref_x = _unit(rng.normal(size=(14, DW_DIM))).astype(np.float32)
    ref_labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6], np.int32)
    anchors = _unit(rng.normal(size=(3, DW_DIM))).astype(np.float32)
    anchor_labels = np.array([0, 1, 2], np.int32)
    x = np.repeat(anchors, copies, axis=0)
    labels = np.repeat(anchor_labels, copies)
    return x, labels, ref_x, ref_labels


def _dw_target(x, labels, ref_x, ref_labels, rows, **cutoffs):
    """Reference probabilities over the reference rows for each anchor row in ``rows``."""
    out = {}
    for a in rows:
        negatives = ref.negatives_of(a, [int(v) for v in labels], [int(v) for v in ref_labels])
        out[a] = ref.distance_weighted_probabilities(x[a], ref_x, negatives, **cutoffs)
    return out


def _chi2_statistic(counts, probs):
    """Pearson's statistic and degrees of freedom; cells with expected count < 5 are pooled.

    A draw from a zero-probability cell fails the test outright.
    """
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    assert np.all(counts[probs == 0] == 0), (counts, probs)
    total = counts.sum()
    expected = probs * total
    keep = expected >= 5
    obs = list(counts[keep])
    exp = list(expected[keep])
    rest = (probs > 0) & ~keep
    if rest.any():
        obs.append(counts[rest].sum())
        exp.append(expected[rest].sum())
    obs, exp = np.array(obs), np.array(exp)
    return float(np.sum((obs - exp) ** 2 / exp)), len(obs) - 1


def _chi2_pvalue(groups):
    """Combined goodness-of-fit p-value of independent ``(counts, probs)`` groups."""
    stat, dof = 0.0, 0
    for counts, probs in groups:
        s, d = _chi2_statistic(counts, probs)
        stat += s
        dof += d
    assert dof > 0
    return float(scipy.stats.chi2.sf(stat, dof))


def _uniform_over_support(probs):
    support = np.asarray(probs) > 0
    return support / support.sum()


def _mine_dw(miner, x, labels, ref_x, ref_labels, ref_offset=None, scores=None):
    if scores is None:
        scores = x @ ref_x.T
    args = (_t(scores, np.float32), _t(labels), _t(ref_labels), _t(x), _t(ref_x))
    if BACKEND == "jax":  # one XLA compilation per configuration, not one per op and shape
        return _compiled_mine(miner, ref_offset)(*args)
    return miner.mine(*args[:3], ref_offset, embeddings=args[3], ref_embeddings=args[4])


COPIES = 1500


@MULTIBACKEND
def test_distance_weighted_reference_is_normalized_and_follows_formula():
    """Sanity check of the reference on one hand-made anchor (dimension 4)."""
    rng = np.random.default_rng(0)
    anchor = _unit(rng.normal(size=4))
    distances = [0.3, 0.9, 1.2, 1.5]
    ref_x = np.stack([_at_distance(anchor, d, rng) for d in distances])
    probs = ref.distance_weighted_probabilities(anchor, ref_x, [0, 1, 2, 3])
    # n = 4: w = 1/q = d^-2 (1 - d^2/4)^(-1/2); d = 0.3 is clipped to 0.5; 1.5 >= 1.4 excluded.
    w = [0.5 ** -2 / math.sqrt(1 - 0.0625), 0.9 ** -2 / math.sqrt(1 - 0.2025),
         1.2 ** -2 / math.sqrt(1 - 0.36)]
    np.testing.assert_allclose(probs, np.array(w + [0.0]) / sum(w), rtol=1e-9)


@MULTIBACKEND
def test_distance_weighted_easy_positive_matches_target():
    x, labels, ref_x, ref_labels = _dw_problem(COPIES)
    t = _mine_dw(TripletMiner("easy", "distance_weighted", seed=3), x, labels, ref_x, ref_labels)
    pos, neg, mask = _arrays(t)
    assert mask.all()
    scores = (x @ ref_x.T).astype(np.float32)
    targets = _dw_target(x, labels, ref_x, ref_labels, [0, COPIES, 2 * COPIES])
    groups, uniform_groups = [], []
    for k, first in enumerate([0, COPIES, 2 * COPIES]):
        rows = slice(first, first + COPIES)
        # The positive is the easy (most similar) one for every copy.
        want_p = ref.most_similar(scores[first].tolist(),
                                  ref.positives_of(first, list(labels), list(ref_labels), None))
        assert np.all(pos[rows, 0] == want_p), k
        counts = np.bincount(neg[rows, 0], minlength=len(ref_labels))
        groups.append((counts, targets[first]))
        uniform_groups.append((counts, _uniform_over_support(targets[first])))
    assert _chi2_pvalue(groups) > 1e-3
    # The test has power: the same draws reject uniform sampling among the candidates.
    assert _chi2_pvalue(uniform_groups) < 1e-6


@MULTIBACKEND
def test_distance_weighted_all_positives_matches_target():
    x, labels, ref_x, ref_labels = _dw_problem(COPIES // 3)
    copies = COPIES // 3
    t = _mine_dw(TripletMiner("all", "distance_weighted", seed=8), x, labels, ref_x, ref_labels)
    pos, neg, mask = _arrays(t)
    assert pos is None
    all_pos, _ = ref.label_masks(labels, ref_labels, None)
    np.testing.assert_array_equal(mask[:, :, 0], all_pos)  # one triplet per positive pair
    targets = _dw_target(x, labels, ref_x, ref_labels, [0, copies, 2 * copies])
    groups, uniform_groups = [], []
    for first in (0, copies, 2 * copies):
        rows = slice(first, first + copies)
        draws = neg[rows][mask[rows, :, 0]]
        assert len(draws) == 3 * copies  # 3 positives per anchor
        counts = np.bincount(draws, minlength=len(ref_labels))
        groups.append((counts, targets[first]))
        uniform_groups.append((counts, _uniform_over_support(targets[first])))
    assert _chi2_pvalue(groups) > 1e-3
    assert _chi2_pvalue(uniform_groups) < 1e-6

    # Draws are independent per (anchor, positive): the chance that the 3 positives of an
    # anchor get the same negative is sum_k p_k^3, not 1.
    first = 0
    p_same = float(np.sum(targets[first] ** 3))
    rows = neg[:copies][mask[:copies, :, 0]].reshape(copies, 3)
    same = int(np.sum((rows[:, 0] == rows[:, 1]) & (rows[:, 1] == rows[:, 2])))
    assert scipy.stats.binomtest(same, copies, p_same).pvalue > 1e-3


@MULTIBACKEND
def test_distance_weighted_disjoint_first_anchor_matches_target():
    x, labels, ref_x, ref_labels = _dw_problem(1)  # 3 anchors, not in the reference set
    miner = TripletMiner("easy", "distance_weighted", disjoint=True, seed=5)
    mine = _compiled_mine(miner, ref_offset=None)
    args = (_t(x @ ref_x.T), _t(labels), _t(ref_labels), _t(x), _t(ref_x))
    draws = []
    for _ in range(1200):
        t = mine(*args)
        mask, negative = to_numpy(t.mask), to_numpy(t.negative)  # NumPy: no op per entry
        assert bool(mask[0, 0, 0])
        draws.append(int(negative[0, 0]))
    counts = np.bincount(draws, minlength=len(ref_labels))
    target = _dw_target(x, labels, ref_x, ref_labels, [0])[0]
    assert _chi2_pvalue([(counts, target)]) > 1e-3
    assert _chi2_pvalue([(counts, _uniform_over_support(target))]) < 1e-4


@MULTIBACKEND
@pytest.mark.parametrize("positive,disjoint", [("easy", False), ("random", False),
                                               ("all", False), ("easy", True)])
def test_distance_weighted_same_seed_same_draws(positive, disjoint):
    # Disjoint: at most 7 triplets from the 14 reference rows, however many anchors (9 anchors
    # get 6), and the eager disjoint mining takes anchor after anchor: 3 copies there.
    x, labels, ref_x, ref_labels = _dw_problem(3 if disjoint else 20)
    runs = []
    for seed in (7, 7) if disjoint else (7, 7, 8):
        miner = TripletMiner(positive, "distance_weighted", disjoint=disjoint, seed=seed)
        runs.append([_arrays(_mine_dw(miner, x, labels, ref_x, ref_labels)) for _ in range(2)])
    for first, second in zip(runs[0], runs[1], strict=True):
        for u, v in zip(first, second, strict=True):
            np.testing.assert_array_equal(u, v)
    if not disjoint:  # 60 anchors: other seeds and later calls draw other negatives
        assert not np.array_equal(runs[0][0][1], runs[2][0][1])
        assert not np.array_equal(runs[0][0][1], runs[0][1][1])


def _constructed_problem(negative_distances, copies, seed=0, positive_distance=0.4):
    """One anchor (class 0) repeated ``copies`` times; reference: one positive and negatives
    (classes 1, 2, ...) at the given Euclidean distances from the anchor."""
    rng = np.random.default_rng(seed)
    anchor = _unit(rng.normal(size=DW_DIM))
    rows = [_at_distance(anchor, positive_distance, rng)]
    rows += [_at_distance(anchor, d, rng) for d in negative_distances]
    ref_x = np.stack(rows).astype(np.float32)
    ref_labels = np.arange(len(rows), dtype=np.int32)
    x = np.repeat(anchor[None].astype(np.float32), copies, axis=0)
    return x, np.zeros(copies, np.int32), ref_x, ref_labels


@MULTIBACKEND
def test_distance_weighted_upper_cutoff_falls_back_to_uniform():
    # Every negative is at least 1.45 away: uniform over all 5 negatives.
    x, labels, ref_x, ref_labels = _constructed_problem([1.45, 1.6, 1.75, 1.9, 1.98], 2000)
    t = _mine_dw(TripletMiner("easy", "distance_weighted", seed=2), x, labels, ref_x, ref_labels)
    counts = np.bincount(_arrays(t)[1][:, 0], minlength=6)
    target = _dw_target(x, labels, ref_x, ref_labels, [0])[0]
    np.testing.assert_allclose(target, [0, 0.2, 0.2, 0.2, 0.2, 0.2])
    assert _chi2_pvalue([(counts, target)]) > 1e-3
    # The weighted distribution over the same 5 (upper_cutoff=None) is far from uniform
    # and is what the miner draws without a cutoff.
    weighted = _dw_target(x, labels, ref_x, ref_labels, [0], upper_cutoff=None)[0]
    assert _chi2_pvalue([(counts, weighted)]) < 1e-6
    t = _mine_dw(TripletMiner("easy", "distance_weighted", seed=2, upper_cutoff=None), x,
                 labels, ref_x, ref_labels)
    counts = np.bincount(_arrays(t)[1][:, 0], minlength=6)
    assert _chi2_pvalue([(counts, weighted)]) > 1e-3


@MULTIBACKEND
def test_distance_weighted_upper_cutoff_excludes_far_negatives():
    # One negative within 1.4: it is always drawn, however likely the far ones would be.
    x, labels, ref_x, ref_labels = _constructed_problem([1.3, 1.5, 1.9, 1.95], 500)
    for positive in ("easy", "all"):
        t = _mine_dw(TripletMiner(positive, "distance_weighted", seed=2), x, labels, ref_x,
                     ref_labels)
        _, neg, mask = _arrays(t)
        drawn = neg[mask[:, :, 0]]
        assert len(drawn) == 500 and np.all(drawn == 1), np.bincount(drawn)
    # A lower upper cutoff (1.2) leaves none within reach: uniform again.
    t = _mine_dw(TripletMiner("easy", "distance_weighted", seed=2, upper_cutoff=1.2), x,
                 labels, ref_x, ref_labels)
    counts = np.bincount(_arrays(t)[1][:, 0], minlength=5)
    assert _chi2_pvalue([(counts, [0, 0.25, 0.25, 0.25, 0.25])]) > 1e-3


@MULTIBACKEND
def test_distance_weighted_lower_cutoff_clips_close_negatives():
    distances = [0.15, 0.3, 0.45, 0.8, 1.1]
    x, labels, ref_x, ref_labels = _constructed_problem(distances, 3000)
    clipped = _dw_target(x, labels, ref_x, ref_labels, [0], lower_cutoff=0.5)[0]
    unclipped = _dw_target(x, labels, ref_x, ref_labels, [0], lower_cutoff=0.1)[0]
    # Below the cutoff all negatives weigh the same.
    np.testing.assert_allclose(clipped[1:4], clipped[1], rtol=1e-9)
    assert unclipped[1] > 5 * unclipped[3]
    results = {}
    for lower in (0.5, 0.1):
        miner = TripletMiner("easy", "distance_weighted", seed=6, lower_cutoff=lower)
        results[lower] = np.bincount(
            _arrays(_mine_dw(miner, x, labels, ref_x, ref_labels))[1][:, 0], minlength=6)
    assert _chi2_pvalue([(results[0.5], clipped)]) > 1e-3
    assert _chi2_pvalue([(results[0.1], unclipped)]) > 1e-3
    assert _chi2_pvalue([(results[0.5], unclipped)]) < 1e-6
    assert _chi2_pvalue([(results[0.1], clipped)]) < 1e-6


@MULTIBACKEND
@pytest.mark.parametrize("positive,disjoint", [("easy", False), ("all", False), ("easy", True)])
def test_distance_weighted_needs_embeddings(positive, disjoint):
    scores, labels, ref_labels, ref_offset = _batch_case()
    miner = TripletMiner(positive, "distance_weighted", disjoint=disjoint, seed=0)
    with pytest.raises(ValueError, match="embeddings"):
        _mine(miner, scores.astype(np.float32), labels, ref_labels, ref_offset)


@MULTIBACKEND
def test_distance_weighted_invalid_cutoffs():
    bad = [dict(lower_cutoff=-0.1), dict(lower_cutoff=2.0), dict(lower_cutoff="0.5"),
           dict(lower_cutoff=None), dict(upper_cutoff=0.5), dict(upper_cutoff=0.3),
           dict(lower_cutoff=1.0, upper_cutoff=0.9), dict(upper_cutoff="1.4"),
           dict(upper_cutoff=True)]
    for kwargs in bad:
        with pytest.raises(ValueError, match="cutoff"):
            TripletMiner("easy", "distance_weighted", **kwargs)
    TripletMiner("easy", "distance_weighted", lower_cutoff=0.0, upper_cutoff=None)  # fine


def _check_distance_weighted_triplets(triplets, x, labels, ref_x, ref_labels, ref_offset):
    """Every mined triplet is valid and its negative is in the support of the target."""
    pos, neg, mask = _arrays(triplets)
    got = ref.triplet_set(pos, neg, mask)
    lab, rlab = [int(v) for v in labels], [int(v) for v in ref_labels]
    anchors_with_triplet = set()
    for a, p, n in got:
        anchors_with_triplet.add(a)
        assert rlab[p] == lab[a] and (ref_offset is None or p != a + ref_offset)
        assert rlab[n] != lab[a]
        target = ref.distance_weighted_probabilities(x[a], ref_x, ref.negatives_of(a, lab, rlab))
        assert target[n] > 0, (a, p, n)
    return got, anchors_with_triplet


_DW_XLA = [("easy", False), ("all", False), ("random", False), ("easy", True)]


def _dw_xla_batch():
    labels, x = ref.make_batch([4, 3, 3, 2, 1], 6, seed=2)
    return labels, _unit(x).astype(np.float32)


@pytest.fixture(scope="module")
def dw_xla_triplets():
    """(positive, disjoint) of _DW_XLA -> the Triplets of three calls of its miner, compiled,
    on :func:`_dw_xla_batch`. Under TensorFlow the four miners run in one XLA program (one
    compilation instead of four); elsewhere each is compiled alone (:func:`_compiled_mine`)."""
    labels, x = _dw_xla_batch()
    miners = {c: TripletMiner(c[0], "distance_weighted", disjoint=c[1], seed=1) for c in _DW_XLA}
    scores, labels, embeddings = _t(x @ x.T), _t(labels), _t(x)
    if BACKEND == "tensorflow":
        every = compiled(lambda s, y, e: [m.mine(s, y, None, 0, embeddings=e)
                                          for m in miners.values()])
        calls = [every(scores, labels, embeddings) for _ in range(3)]
        return {c: [call[i] for call in calls] for i, c in enumerate(miners)}
    out = {}
    for c, miner in miners.items():
        mine = _compiled_mine(miner)
        out[c] = [mine(scores, labels, None, embeddings) for _ in range(3)]
    return out


@MULTIBACKEND
@pytest.mark.parametrize("positive,disjoint", _DW_XLA)
def test_distance_weighted_under_xla_gives_valid_negatives(positive, disjoint, dw_xla_triplets):
    labels, x = _dw_xla_batch()
    for t in dw_xla_triplets[positive, disjoint]:
        got, anchors = _check_distance_weighted_triplets(t, x, labels, x, labels, 0)
        if not disjoint:  # every anchor with a positive has a triplet (all have negatives)
            has_pos = ref.label_masks(labels)[0].any(axis=1)
            assert anchors == set(np.nonzero(has_pos)[0].tolist())
            if positive == "all":
                assert len(got) == ref.label_masks(labels)[0].sum()
        else:
            assert got


# -- two samples per class: easy positives are the only positives -------------------------------


def _two_per_class_batch():
    labels = ref.make_labels([2, 2, 2, 2, 2], seed=6)  # B=10
    x = np.random.default_rng(16).normal(size=(10, 6)).astype(np.float32)
    return labels, x


@pytest.mark.parametrize("negative", _grid(
    [(n,) for n in ("hard", "semihard", "easy", "random", "distance_weighted", "all")],
    lambda n: n in ("random", "distance_weighted", "all")))
def test_two_per_class_easy_positive_equals_random_positive(negative):
    labels, x = _two_per_class_batch()
    xn = _unit(x).astype(np.float32)
    scores = _t(xn @ xn.T)
    chosen = {}
    for positive in ("easy", "random", "hard"):
        miner = TripletMiner(positive, negative, seed=3)
        t = miner.mine(scores, _t(labels), embeddings=_t(xn))
        chosen[positive] = to_numpy(t.positive)[:, 0]
        assert to_numpy(t.mask).any(axis=(1, 2)).all()
    want = [next(j for j in range(10) if j != a and labels[j] == labels[a]) for a in range(10)]
    for positive in ("easy", "random", "hard"):
        np.testing.assert_array_equal(chosen[positive], want)


_LOSS_FACTORIES = {
    "nca": lambda miner: tfdml.losses.TripletNCALoss(order=2, miner=miner),
    "triplet_margin": lambda miner: tfdml.losses.TripletMarginLoss(miner=miner),
    "margin": lambda miner: tfdml.losses.MarginLoss(learn_beta=False, miner=miner),
    "contrastive": lambda miner: tfdml.losses.ContrastiveLoss(miner=miner),
    "multi_similarity": lambda miner: tfdml.losses.MultiSimilarityLoss(miner=miner),
}


# On every commit each loss and each negative strategy once.
@pytest.mark.parametrize("loss_name,negative", _grid(
    [(name, n) for n in ("hard", "semihard", "easy", "all") for name in _LOSS_FACTORIES],
    lambda name, n: n == "semihard" and name in ("nca", "multi_similarity"),
    lambda name, n: (name, n) in {("triplet_margin", "hard"), ("margin", "easy"),
                                  ("contrastive", "all")}))
def test_two_per_class_easy_positive_loss_equals_random_positive_loss(loss_name, negative):
    make_loss = _LOSS_FACTORIES[loss_name]
    labels, x = _two_per_class_batch()
    values = {}
    for positive in ("easy", "random"):
        loss = make_loss(TripletMiner(positive, negative, seed=9))
        values[positive] = value_and_grad(lambda e, loss=loss: loss(labels, e), x)
    assert values["easy"][0] > 0 or negative == "easy"
    assert values["easy"][0] == values["random"][0]
    np.testing.assert_array_equal(values["easy"][1], values["random"][1])


@MULTIBACKEND
@pytest.mark.parametrize("make_loss", [
    lambda miner: tfdml.losses.MultiSimilarityLoss(miner=miner),
    lambda miner: tfdml.losses.ContrastiveLoss(miner=miner),
    lambda miner: tfdml.losses.MarginLoss(learn_beta=False, miner=miner),
], ids=["multi_similarity", "contrastive", "margin"])
def test_two_per_class_multi_similarity_easy_equals_all(make_loss):
    labels, x = _two_per_class_batch()
    xn = _unit(x).astype(np.float32)
    easy = MultiSimilarityMiner(0.1, "easy").mine(_t(xn @ xn.T), _t(labels))
    every = MultiSimilarityMiner(0.1, "all").mine(_t(xn @ xn.T), _t(labels))
    np.testing.assert_array_equal(to_numpy(easy.positive), to_numpy(every.positive))
    np.testing.assert_array_equal(to_numpy(easy.negative), to_numpy(every.negative))
    assert to_numpy(easy.positive).sum() == 10
    value_easy = to_numpy(make_loss(MultiSimilarityMiner(0.1, "easy"))(labels, _t(x)))
    value_all = to_numpy(make_loss(MultiSimilarityMiner(0.1, "all"))(labels, _t(x)))
    assert value_easy > 0 and value_easy == value_all


# -- AllPairsMiner: no mining ---------------------------------------------------------------------


@MULTIBACKEND
@pytest.mark.parametrize("ref_offset", [0, 3, None])
def test_all_pairs_miner_keeps_every_pair(ref_offset):
    from tfdml.miners import AllPairsMiner, Pairs

    labels = np.array([2, 0, 2, 1, 0])
    ref_labels = np.array([0, 1, 2, 2, 0, 1, 2, 2, 0, 5])
    scores = _t(np.random.default_rng(34).normal(size=(5, 10)), np.float32)
    mined = AllPairsMiner()(scores, labels, ref_labels, ref_offset)
    assert isinstance(mined, Pairs)
    pos, neg = ref.label_masks(labels, ref_labels, ref_offset)
    np.testing.assert_array_equal(to_numpy(mined.positive), pos)
    np.testing.assert_array_equal(to_numpy(mined.negative), neg)
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(AllPairsMiner()))
    assert isinstance(again, AllPairsMiner)


@MULTIBACKEND
def test_miner_none_means_no_mining_for_every_loss():
    import tfdml
    from tfdml.miners import AllPairsMiner

    for cls in (tfdml.losses.TripletNCALoss, tfdml.losses.TripletMarginLoss,
                tfdml.losses.MarginLoss, tfdml.losses.MultiSimilarityLoss,
                tfdml.losses.ContrastiveLoss):
        assert isinstance(cls(miner=None).miner, AllPairsMiner), cls
        assert not isinstance(cls().miner, AllPairsMiner) or cls is tfdml.losses.ContrastiveLoss
        assert isinstance(cls(miner="default").miner, type(cls().miner))
        with pytest.raises(ValueError, match="miner"):
            cls(miner="hard")


def test_every_single_choice_strategy_is_in_the_one_table():
    """One table dispatches the strategies: every name but ``"all"`` is in it, and a miner
    has a seed generator exactly when one of its strategies draws noise."""
    from tfdml import miners
    from tfdml.miners import selection

    for role, names in (("positive", miners.POSITIVE_STRATEGIES),
                        ("negative", miners.NEGATIVE_STRATEGIES)):
        assert {name for r, name in selection.STRATEGIES if r == role} == set(names) - {"all"}
    for p in miners.POSITIVE_STRATEGIES:
        for n in miners.NEGATIVE_STRATEGIES:
            draws = any(selection.STRATEGIES.get((role, name), selection.Strategy("")).noise
                        for role, name in (("positive", p), ("negative", n)))
            assert (TripletMiner(p, n).seed_generator is not None) == bool(draws), (p, n)


@MULTIBACKEND
@pytest.mark.parametrize("positive", ["hard", "easy", "all"])
def test_multi_similarity_pairs_is_the_miner_and_takes_other_negatives(positive):
    """The MS miner is one function: ``MultiSimilarityMiner.mine`` is it with the label
    masks, and other negatives (LoOp's pairs of samples) are kept against the same
    threshold, ``S'_an + epsilon > min_p S_ap``, with any sign of epsilon."""
    from tfdml.miners.selection import multi_similarity_pairs

    scores, labels, _, _ = MS_CASES["seed_10"]()
    positive_mask, negative_mask = ref.label_masks(labels, labels, 0)
    masks = (_t(positive_mask), _t(negative_mask))
    got = multi_similarity_pairs(_t(scores, np.float32), *masks, 0.1, positive)
    want = MultiSimilarityMiner(0.1, positive).mine(_t(scores, np.float32), labels)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))

    rng = np.random.default_rng(5)
    scores = np.asarray(scores, np.float32)
    other = rng.uniform(-1, 1, size=(len(labels), 7)).astype(np.float32)
    candidates = rng.uniform(size=other.shape) < 0.7
    for epsilon in (0.1, -0.05):
        pairs = multi_similarity_pairs(_t(scores), *masks, epsilon, positive,
                                       negatives=(_t(other), _t(candidates)))
        least = np.where(positive_mask, scores, np.inf).min(axis=1, keepdims=True)
        want = candidates & (other + np.float32(epsilon) > least) & np.isfinite(least)
        np.testing.assert_array_equal(to_numpy(pairs.negative), want)
        np.testing.assert_array_equal(to_numpy(pairs.positive), to_numpy(
            multi_similarity_pairs(_t(scores), *masks, epsilon, positive).positive))
