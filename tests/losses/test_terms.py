"""tfdml.losses.terms: what a loss averages over and the one reduction path, against NumPy
on hand-made per-anchor terms (the losses' own use of it is checked in test_loss_base)."""

from __future__ import annotations

import numpy as np
import pytest
from backends import to_numpy
from keras import ops

from tfdml.losses.terms import (
    AnchorTerms,
    anchor_terms,
    average_terms,
    check_average,
    check_reduction,
    pair_terms,
    reduce_terms,
    split_pair_terms,
    triplet_terms,
)
from tfdml.miners import Pairs

pytestmark = pytest.mark.multibackend

# Four anchors: two terms summing to 3 (one non-zero), none (inactive), one of 0, three of 6.
TOTAL = np.array([3.0, 0.0, 0.0, 6.0], np.float32)
COUNT = np.array([2.0, 0.0, 1.0, 3.0], np.float32)
NONZERO = np.array([1.0, 0.0, 0.0, 3.0], np.float32)
WEIGHTS = np.array([0.5, 2.0, 1.0, 2.0], np.float32)


def _terms():
    return AnchorTerms(*(ops.convert_to_tensor(t) for t in (TOTAL, COUNT, NONZERO)))


def _want(average, reduction, weights):
    active = COUNT > 0
    mean = np.where(active, TOTAL / np.where(active, COUNT, 1.0), 0.0)
    values, shares = {"anchors": (mean, active.astype(np.float32)),
                      "batch": (mean, np.ones(4, np.float32)),
                      "terms": (TOTAL, COUNT), "nonzero": (TOTAL, NONZERO)}[average]
    w = np.ones(4, np.float32) if weights is None else weights
    if reduction == "none":
        return values * w
    if reduction == "sum":
        return np.sum(values * w)
    denominator = np.sum(shares * w) if reduction == "mean_with_sample_weight" else np.sum(shares)
    return np.sum(values * w) / denominator


@pytest.mark.parametrize("weights", [None, WEIGHTS], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean_with_sample_weight", "sum",
                                       "none"])
@pytest.mark.parametrize("average", ["anchors", "batch", "terms", "nonzero"])
def test_every_average_and_reduction_against_numpy(average, reduction, weights):
    got = reduce_terms(_terms(), average, (np.ones((4, 2), np.float32),), sample_weight=weights,
                       reduction=reduction)
    np.testing.assert_allclose(to_numpy(got), _want(average, reduction, weights), rtol=1e-6)


def test_no_active_anchor_gives_zero_and_a_nan_input_nan():
    empty = AnchorTerms(*(ops.zeros((3,)) for _ in range(3)))
    for average in ("anchors", "batch", "terms", "nonzero"):
        assert float(to_numpy(reduce_terms(empty, average, (np.ones((3, 2), "float32"),)))) == 0
    bad = np.ones((4, 2), np.float32)
    bad[2, 1] = np.nan
    assert np.isnan(to_numpy(reduce_terms(_terms(), "anchors", (bad,))))


def test_triplet_pair_and_anchor_terms_count_what_the_masks_hold():
    tensor = ops.convert_to_tensor
    values = tensor(np.array([[1.0, 0.0, 2.0], [4.0, 5.0, 6.0]], np.float32))
    mask = np.array([[True, True, False], [False, False, False]])
    got = [to_numpy(t) for t in triplet_terms(values, tensor(mask))]
    np.testing.assert_allclose(got, [[1.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    pairs = Pairs(tensor(mask), tensor(~mask))
    got = [to_numpy(t) for t in pair_terms(values, 10.0 * values, pairs)]
    np.testing.assert_allclose(got, [[21.0, 150.0], [3.0, 3.0], [2.0, 3.0]])
    got = [to_numpy(t) for t in anchor_terms(tensor(np.array([0.0, 2.0, 3.0], np.float32)),
                                             tensor(np.array([True, True, False])))]
    np.testing.assert_allclose(got, [[0.0, 2.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    values, shares = average_terms(AnchorTerms(*got), "anchors")
    np.testing.assert_allclose(to_numpy(values), [0.0, 2.0, 0.0])
    np.testing.assert_allclose(to_numpy(shares), [1.0, 1.0, 0.0])


def test_unknown_average_or_reduction_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="average"):
        check_average("mean")
    with pytest.raises(ValueError, match="reduction"):
        check_reduction("avg")


# -- average="halves": positive and negative pairs averaged apart ------------------------------

# Column 0: the anchor's positive pairs, column 1: its negative pairs (split_pair_terms).
SPLIT_TOTAL = np.array([[2.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.5, 4.5]], np.float32)
SPLIT_COUNT = np.array([[2.0, 1.0], [0.0, 0.0], [1.0, 0.0], [2.0, 3.0]], np.float32)
SPLIT_NONZERO = np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 2.0]], np.float32)


def _split(total=SPLIT_TOTAL, count=SPLIT_COUNT, nonzero=SPLIT_NONZERO):
    return AnchorTerms(*(ops.convert_to_tensor(t) for t in (total, count, nonzero)))


def _want_halves(reduction, weights, total=SPLIT_TOTAL, nonzero=SPLIT_NONZERO):
    """``nonzero``: what each half is averaged over (the counts for ``"halves_terms"``)."""
    w = np.ones(len(total)) if weights is None else np.asarray(weights, np.float64)
    total, nonzero = np.float64(total), np.float64(nonzero)
    if reduction == "mean_with_sample_weight":
        numerator, denominator = w @ total, w @ nonzero
        return sum(n / d if d else 0.0 for n, d in zip(numerator, denominator, strict=True))
    counts = nonzero.sum(axis=0)
    values = sum(total[:, k] / counts[k] if counts[k] else 0.0 * total[:, k] for k in (0, 1))
    return values * w if reduction == "none" else np.sum(values * w)


@pytest.mark.parametrize("weights", [None, WEIGHTS], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean", "mean_with_sample_weight",
                                       "sum", "none"])
@pytest.mark.parametrize("average", ["halves", "halves_terms"])
def test_halves_every_reduction_against_numpy(average, reduction, weights):
    got = reduce_terms(_split(), average, (np.ones((4, 2), np.float32),), sample_weight=weights,
                       reduction=reduction)
    counts = SPLIT_NONZERO if average == "halves" else SPLIT_COUNT
    np.testing.assert_allclose(to_numpy(got), _want_halves(reduction, weights, nonzero=counts),
                               rtol=1e-6)
    if reduction == "sum_over_batch_size" and weights is None:  # the two means added
        want = 3.5 / 2 + 5.5 / 3 if average == "halves" else 3.5 / 5 + 5.5 / 4
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-6)


def test_halves_none_adds_up_to_the_sum_and_a_weight_scales_its_anchor():
    none = to_numpy(reduce_terms(_split(), "halves", (None,), sample_weight=WEIGHTS,
                                 reduction="none"))
    total = to_numpy(reduce_terms(_split(), "halves", (None,), sample_weight=WEIGHTS,
                                  reduction="sum"))
    np.testing.assert_allclose(np.sum(none), total, rtol=1e-6)
    values, shares = average_terms(_split(), "halves")
    np.testing.assert_allclose(to_numpy(values) * WEIGHTS, none, rtol=1e-6)
    np.testing.assert_allclose(np.sum(to_numpy(shares)), 1.0, rtol=1e-6)


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean_with_sample_weight", "sum"])
def test_halves_an_empty_half_adds_zero(reduction):
    total, count, nonzero = SPLIT_TOTAL.copy(), SPLIT_COUNT.copy(), SPLIT_NONZERO.copy()
    total[:, 1], nonzero[:, 1] = 0.0, 0.0  # no non-zero negative-pair term
    got = to_numpy(reduce_terms(_split(total, count, nonzero), "halves", (None,),
                                sample_weight=WEIGHTS, reduction=reduction))
    np.testing.assert_allclose(got, _want_halves(reduction, WEIGHTS, total, nonzero), rtol=1e-6)
    assert np.isfinite(got)
    count[:, 1] = 0.0  # no negative pair at all
    got = to_numpy(reduce_terms(_split(total, count, nonzero), "halves_terms", (None,),
                                sample_weight=WEIGHTS, reduction=reduction))
    np.testing.assert_allclose(got, _want_halves(reduction, WEIGHTS, total, count), rtol=1e-6)
    empty = AnchorTerms(*(ops.zeros((3, 2)) for _ in range(3)))
    for average in ("halves", "halves_terms"):
        assert float(to_numpy(reduce_terms(empty, average, (None,), reduction=reduction))) == 0


def test_halves_nan_input_gives_nan():
    bad = np.ones((4, 2), np.float32)
    bad[1, 0] = np.nan
    for reduction in ("sum_over_batch_size", "mean_with_sample_weight", "sum"):
        assert np.isnan(to_numpy(reduce_terms(_split(), "halves", (bad,), reduction=reduction)))
    assert np.all(np.isnan(to_numpy(reduce_terms(_split(), "halves", (bad,), reduction="none"))))


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean_with_sample_weight", "sum",
                                       "none"])
@pytest.mark.parametrize("average", ["anchors", "batch", "terms", "nonzero"])
def test_split_terms_under_other_averages_are_the_added_halves_exactly(average, reduction):
    merged = AnchorTerms(*(ops.convert_to_tensor(t.sum(axis=-1))
                           for t in (SPLIT_TOTAL, SPLIT_COUNT, SPLIT_NONZERO)))
    got, want = (to_numpy(reduce_terms(t, average, (None,), sample_weight=WEIGHTS,
                                       reduction=reduction)) for t in (_split(), merged))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(to_numpy(_split().active), [True, False, True, True])


def test_split_pair_terms_are_pair_terms_apart():
    tensor = ops.convert_to_tensor
    values = tensor(np.array([[1.0, 0.0, 2.0], [4.0, 5.0, 6.0]], np.float32))
    mask = np.array([[True, True, False], [False, False, True]])
    pairs = Pairs(tensor(mask), tensor(~mask))
    split = split_pair_terms(values, 10.0 * values, pairs)
    assert split.split and not pair_terms(values, 10.0 * values, pairs).split
    got = [to_numpy(t) for t in split]
    np.testing.assert_allclose(got, [[[1.0, 20.0], [6.0, 90.0]], [[2.0, 1.0], [1.0, 2.0]],
                                     [[1.0, 1.0], [1.0, 2.0]]])
    np.testing.assert_array_equal([to_numpy(t) for t in split.merged()],
                                  [to_numpy(t) for t in pair_terms(values, 10.0 * values, pairs)])


@pytest.mark.parametrize("average", ["halves", "halves_terms"])
def test_halves_on_terms_that_do_not_split_is_a_value_error(average):
    with pytest.raises(ValueError, match=average):
        reduce_terms(_terms(), average, (None,))
    with pytest.raises(ValueError, match=average):
        average_terms(_terms(), average)
