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
