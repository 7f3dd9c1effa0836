"""One vocabulary of distance names (tfdml.ops.DISTANCES) in the losses, metrics, callbacks
and search: any other name, the old ``"euclidean"`` included, raises a ValueError that names
the argument and the accepted values."""

from __future__ import annotations

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


# -- tfdml.ops.check_distance ---------------------------------------------------------------------


def test_vocabulary():
    assert dml.DISTANCES == ("cosine", "dot", "l2", "squared_l2")
    assert set(dml.LOSS_DISTANCES) <= set(dml.DISTANCES)
    assert set(metrics.METRICS) <= set(dml.DISTANCES)
    assert set(search.METRICS) <= set(dml.DISTANCES)


def test_check_distance_defaults_to_the_loss_distances():
    for name in dml.LOSS_DISTANCES:
        assert dml.check_distance(name) == name
    for bad in ("dot", "euclidean", "L2", None, 2, ["l2"]):
        with pytest.raises(ValueError) as info:
            dml.check_distance(bad)
        assert str(info.value) == (f"`distance` must be one of ('squared_l2', 'l2', 'cosine'). "
                                   f"Received: distance={bad!r}")


def test_check_distance_names_the_argument():
    assert dml.check_distance("l2", ("cosine", "l2"), "metric") == "l2"
    with pytest.raises(ValueError, match=r"^`metric` must be one of \('cosine', 'l2'\)\. "
                                         r"Received: metric='dot'$"):
        dml.check_distance("dot", ("cosine", "l2"), name="metric")


def test_losses_do_not_take_the_old_spelling():
    with pytest.raises(ValueError, match="`distance` must be one of .* distance='euclidean'"):
        ContrastiveLoss(distance="euclidean")


# -- metrics and callbacks ----------------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda x, y: metrics.recall_at_k(x, y, metric="dot"),
    lambda x, y: metrics.map_at_r(x, y, metric="euclidean"),
    lambda x, y: metrics.r_precision(x, y, metric="euclidean"),
    lambda x, y: metrics.nmi(x, y, metric="squared_l2"),
    lambda x, y: metrics.f1_clustering(x, y, metric="euclidean"),
    lambda x, y: metrics.cmc(x[:15], y[:15], x[15:], y[15:], top_k=5, metric="euclidean"),
    lambda x, y: metrics.vehicleid_match_rate(x, y, num_draws=3, metric="euclidean"),
    lambda x, y: RecallAtK((x, y), metric="manhattan"),
    lambda x, y: RecallAtK((x, y), metric="euclidean"),
])
def test_metrics_name_the_argument_and_the_accepted_values(call):
    x, labels = _data()
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'l2'\)\. "
                                         r"Received: metric="):
        call(x, labels)


def test_metrics_tell_l2_from_cosine():
    x, labels = _data()
    assert metrics.recall_at_k(x, labels, metric="l2") != metrics.recall_at_k(x, labels)
    assert RecallAtK((x, labels), metric="l2").metric == "l2"


# -- search -------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["squared_l2", "euclidean"])
def test_search_names_the_argument_and_the_accepted_values(metric):
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'dot', 'l2'\)\. "
                                         f"Received: metric='{metric}'"):
        search.Index(metric)
    x, _ = _data()
    with pytest.raises(ValueError, match=r"`metric` must be one of \('cosine', 'dot', 'l2'\)"):
        next(search.neighbours(x, x, 1, metric=metric))
