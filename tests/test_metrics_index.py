"""Retrieval metrics and RecallAtK through an approximate index (``index=``).

An IVF index with flat codes that probes every list searches exactly, so through it every
metric equals the exact one: that checks the plumbing (self-exclusion, groups, padding,
labels) exactly. Coarser settings check the reported recall of the exact neighbours.
Under TensorFlow, JAX and PyTorch.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

pytest.importorskip("faiss")
pytestmark = pytest.mark.multibackend

import tfdml  # noqa: E402
from tfdml import metrics  # noqa: E402
from tfdml.search import Index  # noqa: E402


def _data(num=600, dim=12, classes=20, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 1.5
    labels = rng.integers(0, classes, num)
    x = (centres[labels] + rng.normal(size=(num, dim))).astype(np.float32)
    return x, labels


def _exhaustive(metric="cosine"):
    return Index(metric, approximate="IVF8,Flat", parameters={"nprobe": 8})


def _all_metrics(x, y, **kwargs):
    """Every retrieval metric, self-retrieval (with groups) and with a gallery, as arrays."""
    groups = np.arange(len(y)) // 3
    q, qy, g, gy = x[:150], y[:150], x[150:], y[150:]
    values = [
        metrics.recall_at_k(x, y, (1, 4), **kwargs),
        metrics.precision_at_k(x, y, (1, 5), groups=groups, **kwargs),
        metrics.map_at_k(q, qy, (1, 5), g, gy, **kwargs),
        metrics.map_at_r(x, y, **kwargs),
        metrics.r_precision(q, qy, g, gy, **kwargs),
        metrics.cmc(q, qy, g, gy, 5, **kwargs),
    ]
    return [np.asarray(list(v.values()) if isinstance(v, dict) else v) for v in values]


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_an_index_that_searches_everything_gives_the_exact_metrics(metric):
    x, y = _data()
    exact = _all_metrics(x, y, metric=metric)
    through = _all_metrics(x, y, metric=metric, index=_exhaustive(metric))
    for want, got in zip(exact, through, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_recall_of_the_exact_neighbours_is_logged_and_warned_below_0_9(caplog):
    x, y = _data(2000, classes=40)
    with caplog.at_level(logging.INFO, logger="tfdml"), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning above 0.9
        metrics.recall_at_k(x, y, (1,), index=_exhaustive())
    assert "found 1.0000 of the exact 2 nearest neighbours of 1000 sampled queries" in caplog.text
    coarse = Index("cosine", approximate="IVF64,Flat", parameters={"nprobe": 1})
    with pytest.warns(UserWarning, match=r"found 0\.\d+ of the exact 21 nearest neighbours.*"
                                         r"Search more of it"):
        got = metrics.recall_at_k(x, y, (1, 20), index=coarse)
    exact = metrics.recall_at_k(x, y, (1, 20))
    assert 0 <= got[20] <= 1 and got[20] < exact[20]  # missing items (-1) count as misses


def test_an_index_given_as_a_configuration_stays_empty_and_a_string_works():
    x, y = _data(400)
    config = Index("cosine", approximate="HNSW16", parameters={"efSearch": 64})
    first = metrics.recall_at_k(x, y, (1, 2), index=config)
    assert len(config) == 0
    assert metrics.recall_at_k(x, y, (1, 2), index=config) == first
    assert metrics.recall_at_k(x, y, (1, 2), index="HNSW16")[1] == pytest.approx(first[1],
                                                                                abs=0.05)


def test_bad_indexes_name_the_argument():
    x, y = _data(100)
    full = Index("cosine", approximate="HNSW16")
    full.add(x)
    for bad, match in ((full, "an empty tfdml.search.Index"), (Index("cosine"), "approximate"),
                       (3, "factory string"),
                       (Index("l2", approximate="HNSW16"), "measures 'l2', the metric 'cosine'")):
        with pytest.raises(ValueError, match=f"`index`.*{match}"):
            metrics.recall_at_k(x, y, (1,), index=bad)
    with pytest.raises(ValueError, match="`approximate`: faiss cannot build"):
        metrics.recall_at_k(x, y, (1,), index="NoSuchIndex")
    bad_rows = x.copy()
    bad_rows[3] = np.nan
    with pytest.raises(ValueError, match=r"`embeddings` contains 1 non-finite row"):
        metrics.recall_at_k(bad_rows, y, (1,), index="HNSW16")


def test_recall_callback_through_an_index_logs_its_recall():
    x, y = _data(300)
    config = _exhaustive()
    callback = tfdml.callbacks.RecallAtK((x, y), ks=(1, 2), index=config, verbose=0,
                                         groups=np.arange(300) // 2)
    import keras

    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8)])
    callback.set_model(model)
    values = callback.evaluate()
    assert set(values) == {"val_recall@1", "val_recall@2", "val_index_recall"}
    assert values["val_index_recall"] == 1.0 and len(config) == 0
    want = metrics.recall_at_k(model.predict(x, verbose=0), y, (1, 2), groups=np.arange(300) // 2)
    assert [values["val_recall@1"], values["val_recall@2"]] == [want[1], want[2]]
    assert callback.evaluate() == values
