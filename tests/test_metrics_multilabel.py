"""The retrieval metrics with [N, L] multi-hot labels, against plain loops.

A gallery item is relevant to a query (a hit, and counted in R) when their label sets
share a label, or with ``min_jaccard`` when the Jaccard similarity of the sets reaches it
(:func:`tfdml._labels.relevance`); ``map_at_k(graded=True)`` gains that Jaccard similarity
(Kishida's generalized AP). The references (tests/support/references/metrics.py) rank
in float64 and compare Python sets. Queries and gallery differ in size, and L differs from
the embedding size D. One label per sample, as multi-hot rows, gives exactly the result of
the class ids.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras import ops
from references import metrics as ref

from tfdml import metrics
from tfdml.search import results

MB = pytest.mark.multibackend  # also run under JAX and PyTorch (see conftest.py)

L, D = 6, 4


def _sets(rng, n, num_labels=L, most=3):
    """``[n, num_labels]`` int32 multi-hot rows of 1 to ``most`` labels each."""
    hot = np.zeros((n, num_labels), np.int32)
    for i in range(n):
        hot[i, rng.choice(num_labels, rng.integers(1, most + 1), replace=False)] = 1
    return hot


def _data(seed, n, dim=D, num_labels=L):
    """Embeddings near the mean of their labels' centres, and their multi-hot labels."""
    rng = np.random.default_rng(seed)
    hot = _sets(rng, n, num_labels)
    centres = rng.normal(size=(num_labels, dim))
    x = hot @ centres / hot.sum(axis=1, keepdims=True) + 0.7 * rng.normal(size=(n, dim))
    return x, hot


def _gallery_case(gallery):
    """``(x, labels, gallery_x, gallery_labels)``: 17 queries, and 29 gallery items or None."""
    x, hot = _data(0, 17)
    if not gallery:
        return x, hot, None, None
    gx, ghot = _data(1, 29)
    return x, hot, gx, ghot


# -- every metric against its loop ---------------------------------------------------------------


@pytest.mark.parametrize("min_jaccard", [None, 0.5])
@pytest.mark.parametrize("gallery", [False, True])
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_metrics_match_the_loops(metric, gallery, min_jaccard):
    x, hot, gx, ghot = _gallery_case(gallery)
    kw = dict(gallery_embeddings=gx, gallery_labels=ghot, metric=metric, chunk_size=5,
              min_jaccard=min_jaccard)
    want = {name: ref.multilabel_metric(name, x, hot, (1, 3, 7), gx, ghot, metric,
                                        min_jaccard=min_jaccard)
            for name in ("recall", "precision", "map_at_k", "map_at_r", "r_precision")}
    assert metrics.recall_at_k(x, hot, (1, 3, 7), **kw) == pytest.approx(want["recall"],
                                                                         abs=1e-12)
    assert metrics.precision_at_k(x, hot, (1, 3, 7), **kw) == pytest.approx(
        want["precision"], abs=1e-12, nan_ok=True)
    assert metrics.map_at_k(x, hot, (1, 3, 7), **kw) == pytest.approx(want["map_at_k"],
                                                                      abs=1e-12)
    assert metrics.map_at_r(x, hot, **kw) == pytest.approx(want["map_at_r"], abs=1e-12)
    assert metrics.r_precision(x, hot, **kw) == pytest.approx(want["r_precision"], abs=1e-12)
    assert 0.0 < want["recall"][1] < 1.0 and 0.0 < want["map_at_r"] < 1.0  # not trivial


@pytest.mark.parametrize("min_jaccard", [None, 0.4])
@pytest.mark.parametrize("gallery", [False, True])
def test_graded_map_matches_the_loop(gallery, min_jaccard):
    x, hot, gx, ghot = _gallery_case(gallery)
    ks = (1, 2, 5, 9)
    got = metrics.map_at_k(x, hot, ks, gx, ghot, chunk_size=4, min_jaccard=min_jaccard,
                           graded=True)
    want = ref.graded_map_at_k(x, hot, ks, gx, ghot, min_jaccard=min_jaccard)
    assert got == pytest.approx(want, abs=1e-12)
    binary = metrics.map_at_k(x, hot, ks, gx, ghot, min_jaccard=min_jaccard)
    assert any(abs(got[k] - binary[k]) > 1e-3 for k in ks)  # partial overlaps gain less


def test_graded_map_of_a_perfect_ranking_is_one():
    # Each query's gallery items at distances that decrease with their Jaccard similarity.
    hot = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1]])
    query = np.array([[1, 1, 0, 0]])
    gallery = np.array([[0.0], [1.0], [2.0], [3.0], [4.0]])
    got = metrics.map_at_k(np.zeros((1, 1)), query, (1, 2, 4), gallery, hot, metric="l2",
                           graded=True)
    assert got == {1: 1.0, 2: 1.0, 4: 1.0}
    swapped = metrics.map_at_k(np.zeros((1, 1)), query, (2,), gallery[[2, 1, 0, 3, 4]], hot,
                               metric="l2", graded=True)
    assert swapped[2] < 1.0  # the half-overlap first, the equal set second


@pytest.mark.parametrize("gallery", [False, True])
def test_cmc_and_fnmr_match_the_loops(gallery):
    x, hot, gx, ghot = _gallery_case(gallery)
    if gallery:
        want = ref.multilabel_metric("recall", x, hot, range(1, 8), gx, ghot)
        got = metrics.cmc(x, hot, gx, ghot, top_k=7, chunk_size=3)
        assert got.tolist() == pytest.approx([want[k] for k in range(1, 8)], abs=1e-12)
    fmr = (0.05, 0.2, 0.5)
    for min_jaccard in (None, 0.5):
        got = metrics.fnmr_at_fmr(x, hot, fmr, gx, ghot, chunk_size=4, gallery_chunk_size=6,
                                  min_jaccard=min_jaccard)
        want = ref.multilabel_fnmr_at_fmr(x, hot, fmr, gx, ghot, min_jaccard=min_jaccard)
        assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("gallery", [False, True])
def test_groups_leave_items_out_as_for_class_ids(gallery):
    x, hot, gx, ghot = _gallery_case(gallery)
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 5, len(x))
    gallery_groups = None if gx is None else rng.integers(0, 5, len(gx))
    kw = dict(groups=groups, gallery_groups=gallery_groups)
    for name, fn in (("recall", metrics.recall_at_k), ("map_at_k", metrics.map_at_k)):
        got = fn(x, hot, (1, 4), gx, ghot, **kw)
        assert got == pytest.approx(ref.multilabel_metric(name, x, hot, (1, 4), gx, ghot,
                                                          **kw), abs=1e-12)
    got = metrics.map_at_r(x, hot, gx, ghot, **kw)
    assert got == pytest.approx(ref.multilabel_metric("map_at_r", x, hot, (), gx, ghot, **kw),
                                abs=1e-12)
    got = metrics.map_at_k(x, hot, (1, 4), gx, ghot, graded=True, **kw)
    assert got == pytest.approx(ref.graded_map_at_k(x, hot, (1, 4), gx, ghot, **kw), abs=1e-12)


def test_relevant_items_are_counted_in_blocks(monkeypatch):
    x, hot, gx, ghot = _gallery_case(True)
    whole = (metrics.map_at_r(x, hot, gx, ghot), metrics.map_at_k(x, hot, (3,), gx, ghot,
                                                                   graded=True))
    monkeypatch.setattr(results, "RELEVANCE_BLOCK", 40)  # one query (29 items) at a time
    calls = []
    blocks = results.relevance_blocks

    def counted(*args, **kwargs):
        for start, block in blocks(*args, **kwargs):
            calls.append(block.shape)
            yield start, block

    monkeypatch.setattr("tfdml.metrics._neighbours.relevance_blocks", counted)
    assert (metrics.map_at_r(x, hot, gx, ghot),
            metrics.map_at_k(x, hot, (3,), gx, ghot, graded=True)) == whole
    assert calls and all(shape == (1, 29) for shape in calls)


# -- what multi-hot labels reduce to ------------------------------------------------------------


def test_one_label_per_sample_gives_the_class_id_results():
    x, _ = _data(3, 23)
    gx, _ = _data(4, 31)
    rng = np.random.default_rng(6)
    ids, gids = rng.integers(0, 5, len(x)), rng.integers(0, 5, len(gx))
    hot, ghot = np.eye(5, dtype=np.int64)[ids], np.eye(5, dtype=np.float32)[gids]
    for q, g, gq, gg in ((ids, None, hot, None), (ids, gids, hot, ghot)):
        gallery = None if g is None else gx
        for fn, extra in ((metrics.recall_at_k, {}), (metrics.precision_at_k, {}),
                          (metrics.map_at_k, {}), (metrics.map_at_k, {"graded": True})):
            want = fn(x, q, (1, 2, 6), gallery, g, chunk_size=4)
            got = fn(x, gq, (1, 2, 6), gallery, gg, chunk_size=4, **extra)
            assert got == (want if not extra else pytest.approx(want, abs=1e-12)), fn
        for fn in (metrics.map_at_r, metrics.r_precision):
            assert fn(x, gq, gallery, gg) == fn(x, q, gallery, g)
        assert metrics.fnmr_at_fmr(x, gq, (0.1, 0.3), gallery, gg) == metrics.fnmr_at_fmr(
            x, q, (0.1, 0.3), gallery, g)
    np.testing.assert_array_equal(metrics.cmc(x, hot, gx, ghot, top_k=6),
                                  metrics.cmc(x, ids, gx, gids, top_k=6))


def test_min_jaccard_of_one_asks_for_the_same_label_set():
    x, hot = _data(7, 40, num_labels=3)
    _, codes = np.unique(hot, axis=0, return_inverse=True)  # one class per distinct set
    codes = codes.reshape(-1)
    for fn in (metrics.recall_at_k, metrics.precision_at_k, metrics.map_at_k):
        assert fn(x, hot, (1, 5), min_jaccard=1.0) == fn(x, codes, (1, 5))
    assert metrics.map_at_r(x, hot, min_jaccard=1) == metrics.map_at_r(x, codes)
    loose = metrics.map_at_r(x, hot)
    assert loose != metrics.map_at_r(x, hot, min_jaccard=1.0)
    want = ref.multilabel_metric("map_at_r", x, hot, min_jaccard=1 / 3)
    assert metrics.map_at_r(x, hot, min_jaccard=1 / 3) == pytest.approx(want, abs=1e-12)


def test_class_ids_ignore_min_jaccard_and_graded():
    x, hot = _data(8, 20)
    ids = hot.argmax(axis=1)
    assert metrics.map_at_k(x, ids, (1, 4), min_jaccard=0.5, graded=True) == metrics.map_at_k(
        x, ids, (1, 4))


@MB
def test_tensor_labels_and_an_exact_faiss_index_give_the_same_values():
    x, hot, gx, ghot = _gallery_case(True)
    want = metrics.recall_at_k(x, hot, (1, 3), gx, ghot)
    assert metrics.recall_at_k(ops.convert_to_tensor(x), ops.convert_to_tensor(hot), (1, 3),
                               ops.convert_to_tensor(gx), ops.convert_to_tensor(ghot)) == want
    assert metrics.map_at_r(x, hot, gx, ghot, index="Flat") == metrics.map_at_r(x, hot, gx,
                                                                                 ghot)
    assert want == pytest.approx(ref.multilabel_metric("recall", x, hot, (1, 3), gx, ghot),
                                 abs=1e-12)


# -- bad inputs ------------------------------------------------------------------------------------


def _emptied(labels, row=2):
    labels = labels.copy()
    labels[row] = 0
    return labels


@MB
@pytest.mark.parametrize(("change", "name", "match"), [
    (lambda h, g: (_emptied(h), g), "labels", "empty label set"),
    (lambda h, g: (h, _emptied(g, 7)), "gallery_labels", "empty label set"),
    (lambda h, g: (h * 2, g), "labels", "multi-hot"),
    (lambda h, g: (h, np.pad(g, ((0, 0), (0, 1)))), "gallery_labels", "number of labels L"),
    (lambda h, g: (h, g.argmax(axis=1)), "gallery_labels", "form"),
    (lambda h, g: (h.argmax(axis=1), g), "gallery_labels", "form"),
    (lambda h, g: (h, np.where(g == 1, 0.5, 0.0)), "gallery_labels", "multi-hot"),
])
def test_bad_labels_name_the_argument(change, name, match):
    x, hot, gx, ghot = _gallery_case(True)
    hot, ghot = change(hot, ghot)
    for call in (lambda: metrics.recall_at_k(x, hot, (1,), gx, ghot),
                 lambda: metrics.map_at_r(x, hot, gx, ghot),
                 lambda: metrics.fnmr_at_fmr(x, hot, 0.1, gx, ghot)):
        with pytest.raises(ValueError, match=f"`{name}`.*{match}|{match}.*`{name}`"):
            call()


@pytest.mark.parametrize("min_jaccard", [0, 1.5, -0.2, "0.5", True])
def test_bad_min_jaccard(min_jaccard):
    x, hot = _data(9, 10)
    with pytest.raises(ValueError, match="`min_jaccard`"):
        metrics.map_at_r(x, hot, min_jaccard=min_jaccard)


def test_metrics_of_one_class_per_sample_refuse_multi_hot_labels():
    x, hot = _data(10, 12)
    for call in (lambda: metrics.nmi(x, hot), lambda: metrics.f1_clustering(x, hot),
                 lambda: metrics.nmi_score(hot, np.arange(12) % 3),
                 lambda: metrics.pairwise_f1_score(hot, np.arange(12) % 3),
                 lambda: metrics.vehicleid_match_rate(x, hot),
                 lambda: metrics.knn_accuracy(x, hot, x, hot, k=3)):
        with pytest.raises(ValueError, match=r"`labels` must be \[N\] integer"):
            call()


@MB
def test_nonfinite_embeddings_still_raise_with_multi_hot_labels():
    x, hot, gx, ghot = _gallery_case(True)
    x = x.copy()
    x[3, 1] = np.nan
    for call in (lambda: metrics.map_at_r(x, hot), lambda: metrics.recall_at_k(x, hot, (1,)),
                 lambda: metrics.map_at_k(x, hot, (2,), graded=True),
                 lambda: metrics.fnmr_at_fmr(x, hot, 0.1)):
        with pytest.raises(ValueError, match="`embeddings` contains 1 non-finite row"):
            call()
    with pytest.raises(ValueError, match="`gallery_embeddings` contains 29 non-finite rows"):
        metrics.cmc(gx[:5], ghot[:5], np.full((29, D), np.inf), ghot)


def test_recall_callback_takes_multi_hot_labels():
    """RecallAtK in fit: the recall of tfdml.metrics.recall_at_k on the label sets."""
    import keras

    from tfdml.callbacks import RecallAtK

    x, hot = _data(2, 24)
    x = x.astype("float32")
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    callback = RecallAtK((x, hot.astype("int32")), ks=(1, 4))
    model.fit(x, np.zeros((24, 3), "float32"), epochs=1, verbose=0, callbacks=[callback])
    embeddings = ops.convert_to_numpy(model.predict(x, verbose=0))
    want = metrics.recall_at_k(embeddings, hot, (1, 4))
    assert callback.evaluate() == {"val_recall@1": want[1], "val_recall@4": want[4]}
