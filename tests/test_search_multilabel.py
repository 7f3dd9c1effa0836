"""tfdml.search with [N, L] multi-hot labels: the index stores label sets, and a neighbour
is correct when its set is relevant to the query's (they share a label, or with
``min_jaccard`` their Jaccard similarity reaches it), against plain loops over Python sets.

The index round-trips the label sets through save/load; retrieve, match and calibrate
take them; a set of one label per sample gives the answers of its class ids.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tfdml import metrics
from tfdml.search import Index, calibrate, match

pytestmark = pytest.mark.multibackend  # NumPy work on top of the search: every backend

L, D = 7, 5


def _relevant(a, b, min_jaccard=None):
    """Two multi-hot rows are relevant when their sets share a label (or, with
    ``min_jaccard``, when |A & B| / |A | B| >= min_jaccard)."""
    a, b = set(np.flatnonzero(a)), set(np.flatnonzero(b))
    if min_jaccard is None:
        return bool(a & b)
    return Fraction(len(a & b), len(a | b)) >= Fraction(min_jaccard)


def _data(seed, n, most=3):
    rng = np.random.default_rng(seed)
    hot = np.zeros((n, L), np.int64)
    for i in range(n):
        hot[i, rng.choice(L, rng.integers(1, most + 1), replace=False)] = 1
    centres = np.random.default_rng(99).normal(size=(L, D))
    x = hot @ centres / hot.sum(axis=1, keepdims=True) + 0.6 * rng.normal(size=(n, D))
    return x.astype(np.float32), hot


def _index(metric="cosine", n=40, **kwargs):
    gx, ghot = _data(1, n)
    index = Index(metric, **kwargs)
    index.add(gx, labels=ghot, ids=np.arange(n) + 500)
    return index, gx, ghot


# -- lookup, retrieve and the results' metrics --------------------------------------------------


@pytest.mark.parametrize("min_jaccard", [None, 0.5])
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_retrieve_marks_the_relevant_neighbours(metric, min_jaccard):
    index, gx, ghot = _index(metric)
    qx, qhot = _data(2, 13)
    found = index.lookup(qx, 6)
    assert found.labels.shape == (13, 6, L) and found.labels.dtype == bool
    np.testing.assert_array_equal(found.labels, ghot[found.indices].astype(bool))
    got = index.retrieve(qx, 6, query_labels=qhot, min_jaccard=min_jaccard)
    want = [[_relevant(qhot[q], ghot[g], min_jaccard) for g in row]
            for q, row in enumerate(got.indices)]
    np.testing.assert_array_equal(got.correct, want)
    counts = [sum(_relevant(q, g, min_jaccard) for g in ghot) for q in qhot]
    np.testing.assert_array_equal(got.num_relevant, counts)
    assert 0 < got.correct.mean() < 1
    kw = dict(gallery_embeddings=gx, gallery_labels=ghot, metric=metric,
              min_jaccard=min_jaccard)
    assert got.recall_at_k((1, 3, 6)) == pytest.approx(
        metrics.recall_at_k(qx, qhot, (1, 3, 6), **kw), abs=1e-12)
    assert got.precision_at_k((1, 3, 6)) == pytest.approx(
        metrics.precision_at_k(qx, qhot, (1, 3, 6), **kw), abs=1e-12)
    assert got.map_at_k((1, 3, 6)) == pytest.approx(
        metrics.map_at_k(qx, qhot, (1, 3, 6), **kw), abs=1e-12)


def test_retrieve_of_the_index_itself_excludes_each_query():
    index, gx, ghot = _index()
    got = index.retrieve(gx, 5, query_labels=ghot, exclude_self=True)
    counts = [sum(_relevant(ghot[q], ghot[g]) for g in range(len(ghot)) if g != q)
              for q in range(len(ghot))]
    np.testing.assert_array_equal(got.num_relevant, counts)
    assert got.map_at_k((1, 5)) == pytest.approx(metrics.map_at_k(gx, ghot, (1, 5)), abs=1e-12)


def test_cut_threshold_and_reorder_move_the_label_sets_along():
    index, _, ghot = _index()
    qx, qhot = _data(3, 9)
    got = index.retrieve(qx, 6, query_labels=qhot)
    cut = got.threshold(float(np.median(got.scores)))
    assert (~cut.kept).any() and cut.kept.any()
    np.testing.assert_array_equal(cut.labels, ghot[cut.indices].astype(bool) & cut.kept[..., None])
    assert not cut.labels[~cut.kept].any()  # an empty slot holds the empty set
    np.testing.assert_array_equal(cut.correct, [
        [k and _relevant(qhot[q], ghot[g]) for g, k in zip(row, keep, strict=True)]
        for q, (row, keep) in enumerate(zip(cut.indices, cut.kept, strict=True))])
    flipped = got.reorder(np.tile(np.arange(6)[::-1], (9, 1)))
    np.testing.assert_array_equal(flipped.labels, got.labels[:, ::-1])
    np.testing.assert_array_equal(flipped.correct, got.correct[:, ::-1])


def test_one_label_per_sample_retrieves_as_class_ids():
    gx, _ = _data(4, 30)
    qx, _ = _data(5, 11)
    rng = np.random.default_rng(6)
    gids, qids = rng.integers(0, 4, 30), rng.integers(0, 4, 11)
    by_id, by_set = Index("cosine"), Index("cosine")
    by_id.add(gx, labels=gids)
    by_set.add(gx, labels=np.eye(4, dtype=np.int32)[gids])
    a = by_id.retrieve(qx, 5, query_labels=qids)
    b = by_set.retrieve(qx, 5, query_labels=np.eye(4)[qids])
    np.testing.assert_array_equal(a.correct, b.correct)
    np.testing.assert_array_equal(a.num_relevant, b.num_relevant)
    assert a.map_at_k((1, 5)) == b.map_at_k((1, 5))
    for target in (0.6, 0.9):
        assert calibrate(by_id, qx, qids, target)[:4] == calibrate(by_set, qx, np.eye(4)[qids],
                                                                   target)[:4]


# -- match and calibrate ------------------------------------------------------------------------


def test_match_gives_the_nearest_label_set_or_the_empty_set():
    index, _, ghot = _index("l2")
    qx, _ = _data(7, 15)
    found = index.lookup(qx, 1)
    threshold = float(np.median(found.scores[:, 0]))
    got = match(index, qx, threshold)
    near = found.scores[:, 0] <= threshold
    assert got.shape == (15, L) and got.dtype == bool and 0 < near.sum() < 15
    np.testing.assert_array_equal(got[near], ghot[found.indices[near, 0]].astype(bool))
    assert not got[~near].any()
    with pytest.raises(ValueError, match="`unknown`"):
        index.match(qx, threshold, unknown=0)


def _calibration_loop(scores, correct, target):
    """Every distinct nearest similarity as a threshold, strictest first; the loosest with
    precision >= target (else the most precise, ties to the loosest), and whether one is."""
    points = []
    for t in sorted(set(scores.tolist()), reverse=True):
        accepted = scores >= t
        points.append((t, correct[accepted].mean(), correct[accepted].sum() / correct.sum()))
    ok = [p for p in points if p[1] >= target]
    if ok:
        return points, ok[-1], True
    best = max(p[1] for p in points)
    return points, [p for p in points if p[1] == best][-1], False


@pytest.mark.parametrize("min_jaccard", [None, 0.5])
def test_calibrate_counts_a_relevant_nearest_item_as_correct(min_jaccard):
    index, _, ghot = _index(n=60)
    qx, qhot = _data(8, 70)
    found = index.lookup(qx, 1)
    correct = np.array([_relevant(q, ghot[g], min_jaccard)
                        for q, g in zip(qhot, found.indices[:, 0], strict=True)])
    assert 0.3 < correct.mean() < 0.95
    scores = found.scores[:, 0].astype(np.float64)
    reached = []
    for target in (0.3, 0.8, 0.95):
        got = calibrate(index, qx, qhot, target, min_jaccard=min_jaccard)
        points, want, ok = _calibration_loop(scores, correct, target)
        np.testing.assert_allclose(got.thresholds, [p[0] for p in points], rtol=1e-12)
        np.testing.assert_allclose(got.precisions, [p[1] for p in points], rtol=1e-12)
        np.testing.assert_allclose(got.recalls, [p[2] for p in points], rtol=1e-12)
        assert (got.threshold, got.precision, got.recall) == pytest.approx(want, rel=1e-12)
        assert got.reached == ok
        reached.append(ok)
    assert any(reached)


# -- storing the label sets ---------------------------------------------------------------------


@pytest.mark.parametrize("vectors", ["memory", "disk"])
def test_save_and_load_keep_the_label_sets(tmp_path, vectors):
    index, _, ghot = _index(vectors=vectors)
    path = tmp_path / "index.npz"
    index.save(path)
    loaded = Index.load(path)
    assert loaded.labels.dtype == bool and loaded.labels.shape == (40, L)
    np.testing.assert_array_equal(loaded.labels, ghot.astype(bool))
    qx, qhot = _data(9, 6)
    a = index.retrieve(qx, 4, query_labels=qhot)
    b = loaded.retrieve(qx, 4, query_labels=qhot)
    np.testing.assert_array_equal(a.correct, b.correct)
    np.testing.assert_array_equal(a.ids, b.ids)
    loaded.add(qx, labels=qhot, ids=np.arange(6))  # and it grows with label sets
    np.testing.assert_array_equal(loaded.labels[40:], qhot.astype(bool))


@pytest.mark.parametrize("bad", [
    lambda labels: np.where(labels, 2, 0),
    lambda labels: np.concatenate([labels[:-1], np.zeros((1, L), labels.dtype)]),
    lambda labels: labels[:-1],
    lambda labels: labels.astype(np.float32) / 2,
])
def test_load_refuses_bad_label_sets_naming_the_field(tmp_path, bad):
    index, _, _ = _index()
    path = tmp_path / "index.npz"
    index.save(path)
    with np.load(path) as data:
        fields = {name: data[name] for name in data.files}
    fields["labels"] = bad(fields["labels"])
    with open(path, "wb") as f:
        np.savez(f, **fields)
    with pytest.raises(ValueError, match=r"index\.npz: field `labels`"):
        Index.load(path)


def test_label_sets_added_in_batches_and_in_blocks(monkeypatch):
    gx, ghot = _data(10, 25)
    batches = Index()
    batches.add((gx[i : i + 7], ghot[i : i + 7]) for i in range(0, 25, 7))
    np.testing.assert_array_equal(batches.labels, ghot.astype(bool))
    monkeypatch.setattr("tfdml.search.index.ADD_BLOCK", 8)
    blocks = Index()
    blocks.add(gx, labels=ghot)
    np.testing.assert_array_equal(blocks.labels, ghot.astype(bool))


# -- bad inputs ---------------------------------------------------------------------------------


def test_bad_label_sets_name_the_argument():
    gx, ghot = _data(11, 12)
    index = Index()
    bad_value, empty = ghot * 2, ghot.copy()
    empty[4] = 0
    for labels, match_text in ((bad_value, "multi-hot"), (empty, "empty label set"),
                               (ghot[:5], "one entry per embedding")):
        with pytest.raises(ValueError, match=f"`labels`.*{match_text}|{match_text}"):
            index.add(gx, labels=labels)
    assert len(index) == 0
    index.add(gx, labels=ghot)
    with pytest.raises(ValueError, match="`labels` must be labels of the form"):
        index.add(gx, labels=np.arange(12))
    with pytest.raises(ValueError, match="`labels` must have the number of labels L"):
        index.add(gx, labels=np.pad(ghot, ((0, 0), (0, 1))))
    with pytest.raises(ValueError, match="`query_labels` must be labels of the form"):
        index.retrieve(gx[:3], 2, query_labels=[0, 1, 2])
    with pytest.raises(ValueError, match="`query_labels` must have the number of labels L"):
        index.retrieve(gx[:3], 2, query_labels=np.pad(ghot[:3], ((0, 0), (0, 1))))
    with pytest.raises(ValueError, match="`labels` must be labels of the form"):
        calibrate(index, gx[:3], [0, 1, 2])
    with pytest.raises(ValueError, match="`min_jaccard`"):
        calibrate(index, gx[:3], ghot[:3], min_jaccard=0.0)
    with pytest.raises(ValueError, match="`min_jaccard`"):
        index.retrieve(gx[:3], 2, query_labels=ghot[:3], min_jaccard=2)
    by_id = Index()
    by_id.add(gx, labels=np.arange(12))
    with pytest.raises(ValueError, match="`labels` must be labels of the form"):
        by_id.add(gx, labels=ghot)
    with pytest.raises(ValueError, match="`query_labels` must be labels of the form"):
        by_id.retrieve(gx[:3], 2, query_labels=ghot[:3])
