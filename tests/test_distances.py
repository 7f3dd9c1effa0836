"""One vocabulary of distance names (tfdml.ops.DISTANCES) in the losses, metrics, callbacks
and search: the old ``"euclidean"`` means ``"l2"`` where an argument took it, with a
DeprecationWarning that names the new spelling; other names raise a ValueError that names
the argument and the accepted values."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tfdml import metrics, search
from tfdml import ops as dml
from tfdml.callbacks import RecallAtK
from tfdml.losses import ContrastiveLoss

pytestmark = pytest.mark.multibackend


def _data(seed=0, n=40, dim=5, classes=5):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    x = rng.normal(size=(classes, dim))[labels] + 1.2 * rng.normal(size=(n, dim))
    return (x * rng.uniform(0.2, 5.0, size=(n, 1))).astype(np.float32), labels


def _deprecated(call):
    """``call()``, checking that it warns once, at this call, naming ``metric='l2'``."""
    with pytest.warns(DeprecationWarning, match="`metric='euclidean'` is deprecated: use "
                                                "`metric='l2'`") as record:
        value = call()
    ours = [w for w in record if "'euclidean'" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is DeprecationWarning
    assert ours[0].filename == __file__  # the user's call, not tfdml's own code
    return value


# -- tfdml.ops.check_distance ---------------------------------------------------------------------


def test_vocabulary():
    assert dml.DISTANCES == ("cosine", "dot", "l2", "squared_l2")
    assert set(dml.LOSS_DISTANCES) <= set(dml.DISTANCES)
    assert set(metrics.METRICS) <= set(dml.DISTANCES)
    assert set(search.METRICS) <= set(dml.DISTANCES)
    assert dml.DEPRECATED_DISTANCES == {"euclidean": "l2"}


def test_check_distance_defaults_to_the_loss_distances():
    for name in dml.LOSS_DISTANCES:
        assert dml.check_distance(name) == name
    for bad in ("dot", "euclidean", "L2", None, 2):
        with pytest.raises(ValueError) as info:
            dml.check_distance(bad)
        assert str(info.value) == (f"`distance` must be one of ('squared_l2', 'l2', 'cosine'). "
                                   f"Received: distance={bad!r}")


def test_check_distance_maps_the_old_spelling_where_accepted():
    accepted = ("cosine", "l2", "euclidean")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dml.check_distance("l2", accepted, "metric") == "l2"
    with pytest.warns(DeprecationWarning, match="`metric='euclidean'` is deprecated: use "
                                                "`metric='l2'`"):
        assert dml.check_distance("euclidean", accepted, "metric") == "l2"
    with pytest.raises(ValueError, match=r"^`metric` must be one of \('cosine', 'l2'\)\. "
                                         r"Received: metric='dot'$"):
        dml.check_distance("dot", accepted, name="metric")


def test_losses_do_not_take_the_old_spelling():
    with pytest.raises(ValueError, match="`distance` must be one of .* distance='euclidean'"):
        ContrastiveLoss(distance="euclidean")


# -- metrics and callbacks ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["recall_at_k", "map_at_r", "r_precision"])
def test_retrieval_metrics_give_the_same_results_for_euclidean_and_l2(name):
    x, labels = _data()
    fn = getattr(metrics, name)
    want = fn(x, labels, metric="l2")
    assert want != fn(x, labels, metric="cosine")  # the data tell the metrics apart
    assert _deprecated(lambda: fn(x, labels, metric="euclidean")) == want


def test_cmc_and_vehicleid_give_the_same_results_for_euclidean_and_l2():
    x, labels = _data(1)
    args = (x[:15], labels[:15], x[15:], labels[15:])
    want = metrics.cmc(*args, top_k=5, metric="l2")
    np.testing.assert_array_equal(
        _deprecated(lambda: metrics.cmc(*args, top_k=5, metric="euclidean")), want)
    want = metrics.vehicleid_match_rate(x, labels, num_draws=3, metric="l2")
    with pytest.warns(DeprecationWarning) as record:
        got = metrics.vehicleid_match_rate(x, labels, num_draws=3, metric="euclidean")
    assert got == want
    assert len([w for w in record if "'euclidean'" in str(w.message)]) == 1  # not per draw


@pytest.mark.parametrize("name", ["nmi", "f1_clustering"])
def test_clustering_metrics_give_the_same_results_for_euclidean_and_l2(name):
    x, labels = _data(2)
    fn = getattr(metrics, name)
    want = fn(x, labels, seed=1, metric="l2")
    assert _deprecated(lambda: fn(x, labels, seed=1, metric="euclidean")) == want


@pytest.mark.parametrize("call", [
    lambda x, y: metrics.recall_at_k(x, y, metric="dot"),
    lambda x, y: metrics.nmi(x, y, metric="squared_l2"),
    lambda x, y: RecallAtK((x, y), metric="manhattan"),
])
def test_metrics_name_the_argument_and_the_accepted_values(call):
    x, labels = _data()
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'l2'\)\. "
                                         r"Received: metric="):
        call(x, labels)


def test_recall_callback_takes_l2_and_the_old_spelling():
    x, labels = _data()
    assert RecallAtK((x, labels), metric="l2").metric == "l2"
    assert _deprecated(lambda: RecallAtK((x, labels), metric="euclidean")).metric == "l2"


# -- search -------------------------------------------------------------------------------------


def test_index_and_neighbours_take_the_old_spelling_as_l2():
    x, _ = _data(3)
    index = _deprecated(lambda: search.Index("euclidean"))
    assert index.metric == "l2"
    index.add(x)
    want = search.Index("l2")
    want.add(x)
    for got, expected in zip(index.search(x[:7], k=4), want.search(x[:7], k=4), strict=True):
        np.testing.assert_array_equal(got, expected)
    [(_, scores, indices)] = _deprecated(
        lambda: list(search.neighbours(x, x, 3, metric="euclidean")))
    [(_, want_scores, want_indices)] = list(search.neighbours(x, x, 3, metric="l2"))
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(scores, want_scores)


def test_search_names_the_argument_and_the_accepted_values():
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'dot', 'l2'\)\. "
                                         r"Received: metric='squared_l2'"):
        search.Index("squared_l2")
    x, _ = _data()
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'dot', 'l2'\)"):
        next(search.neighbours(x, x, 1, metric="manhattan"))
