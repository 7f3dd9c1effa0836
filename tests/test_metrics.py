"""tfdml.metrics.recall_at_k against the naive reference of tests/references.py."""

from __future__ import annotations

import numpy as np
import pytest
import references as ref

from tfdml.metrics import recall_at_k


def _data(seed, n, dim, num_classes):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n).astype(np.int32)
    # Class centres plus noise, so that recall is neither 0 nor 1.
    centres = rng.normal(size=(num_classes, dim))
    return centres[labels] + 1.2 * rng.normal(size=(n, dim)), labels


@pytest.mark.parametrize("chunk_size", [1024, 7])
@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_recall_without_gallery(metric, chunk_size):
    x, labels = _data(0, 30, 5, 6)
    ks = (1, 2, 4, 8)
    got = recall_at_k(x, labels, ks, metric=metric, chunk_size=chunk_size)
    want = ref.recall_at_k(x, labels, ks, metric=metric)
    assert set(got) == set(ks) and all(isinstance(v, float) for v in got.values())
    for k in ks:
        assert got[k] == pytest.approx(want[k], abs=1e-12)
    assert 0.0 < want[1] < want[8] < 1.0  # the data makes the comparison meaningful


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_recall_with_gallery(metric):
    queries, q_labels = _data(1, 12, 4, 5)
    gallery, g_labels = _data(2, 25, 4, 5)
    ks = (1, 3, 10)
    got = recall_at_k(queries, q_labels, ks, gallery, g_labels, metric=metric, chunk_size=5)
    want = ref.recall_at_k(queries, q_labels, ks, gallery, g_labels, metric=metric)
    for k in ks:
        assert got[k] == pytest.approx(want[k], abs=1e-12)
    assert want[1] < 1.0


def test_cosine_and_euclidean_differ_on_unnormalized_data():
    # Cosine ignores the length of the embeddings; euclidean does not.
    x, labels = _data(6, 30, 4, 5)
    x = x * np.random.default_rng(7).uniform(0.2, 5.0, size=(30, 1))
    ks = (1, 2, 4)
    cos = recall_at_k(x, labels, ks, metric="cosine")
    euc = recall_at_k(x, labels, ks, metric="euclidean")
    assert cos == pytest.approx(ref.recall_at_k(x, labels, ks, metric="cosine"), abs=1e-12)
    assert euc == pytest.approx(ref.recall_at_k(x, labels, ks, metric="euclidean"), abs=1e-12)
    assert cos != euc


def test_query_is_excluded_from_its_own_neighbours():
    # Every query's nearest other item has another label: recall@1 must be 0
    # (it would be 1 if the query matched itself).
    x = np.array([[0.0, 1.0], [0.1, 1.1], [1.0, 0.05], [1.1, -0.1]])
    labels = np.array([0, 1, 0, 1])
    for metric in ("cosine", "euclidean"):
        got = recall_at_k(x, labels, (1, 2, 3), metric=metric)
        assert got == ref.recall_at_k(x, labels, (1, 2, 3), metric=metric)
        assert got[1] == 0.0 and got[3] == 1.0


def test_gallery_copy_of_queries_includes_self():
    # With an explicit gallery nothing is excluded: a query finds itself.
    x, labels = _data(3, 10, 3, 4)
    got = recall_at_k(x, labels, (1,), x, labels)
    assert got == {1: 1.0}


def test_float_and_column_labels():
    x, labels = _data(4, 15, 3, 3)
    base = recall_at_k(x, labels, (1, 2))
    assert recall_at_k(x, labels[:, None].astype(np.float32), (1, 2)) == base


def test_invalid_ks():
    x, labels = _data(5, 6, 3, 2)
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(x, labels, (6,))  # only 5 other items per query
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(x, labels, (0, 1))
    assert set(recall_at_k(x, labels, (5,))) == {5}
