"""tfdml.metrics.recall_at_k against the naive reference of tests/support/references/."""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import BACKEND, to_numpy
from harness import slow_beyond
from keras import ops
from metric_cases import assert_metric_close, tied_embeddings

from tfdml.metrics import recall_at_k

# The tests marked multibackend also run under JAX and PyTorch (see conftest.py). JAX compiles
# every eager op once per shape, so that subset leaves out some chunkings and seeds.
MB = pytest.mark.multibackend


def _data(seed, n, dim, num_classes):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n).astype(np.int32)
    # Class centres plus noise, so that recall is neither 0 nor 1.
    centres = rng.normal(size=(num_classes, dim))
    return centres[labels] + 1.2 * rng.normal(size=(n, dim)), labels


@MB
@pytest.mark.parametrize("chunk_size", [1024, 7])
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_recall_without_gallery(metric, chunk_size):
    x, labels = _data(0, 30, 5, 6)
    ks = (1, 2, 4, 8)
    got = recall_at_k(x, labels, ks, metric=metric, chunk_size=chunk_size)
    want = ref.recall_at_k(x, labels, ks, metric=metric)
    assert set(got) == set(ks) and all(isinstance(v, float) for v in got.values())
    for k in ks:
        assert got[k] == pytest.approx(want[k], abs=1e-12)
    assert 0.0 < want[1] < want[8] < 1.0  # the data makes the comparison meaningful


@MB
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_recall_with_gallery(metric):
    queries, q_labels = _data(1, 12, 4, 5)
    gallery, g_labels = _data(2, 25, 4, 5)
    ks = (1, 3, 10)
    got = recall_at_k(queries, q_labels, ks, gallery, g_labels, metric=metric, chunk_size=5)
    want = ref.recall_at_k(queries, q_labels, ks, gallery, g_labels, metric=metric)
    for k in ks:
        assert got[k] == pytest.approx(want[k], abs=1e-12)
    assert want[1] < 1.0


def test_cosine_and_l2_differ_on_unnormalized_data():
    # Cosine ignores the length of the embeddings; l2 does not.
    x, labels = _data(6, 30, 4, 5)
    x = x * np.random.default_rng(7).uniform(0.2, 5.0, size=(30, 1))
    ks = (1, 2, 4)
    cos = recall_at_k(x, labels, ks, metric="cosine")
    euc = recall_at_k(x, labels, ks, metric="l2")
    assert cos == pytest.approx(ref.recall_at_k(x, labels, ks, metric="cosine"), abs=1e-12)
    assert euc == pytest.approx(ref.recall_at_k(x, labels, ks, metric="l2"), abs=1e-12)
    assert cos != euc


@MB
def test_query_is_excluded_from_its_own_neighbours():
    # Every query's nearest other item has another label: recall@1 must be 0
    # (it would be 1 if the query matched itself).
    x = np.array([[0.0, 1.0], [0.1, 1.1], [1.0, 0.05], [1.1, -0.1]])
    labels = np.array([0, 1, 0, 1])
    for metric in ("cosine", "l2"):
        got = recall_at_k(x, labels, (1, 2, 3), metric=metric)
        assert got == ref.recall_at_k(x, labels, (1, 2, 3), metric=metric)
        assert got[1] == 0.0 and got[3] == 1.0


@MB
def test_gallery_copy_of_queries_includes_self():
    # With an explicit gallery nothing is excluded: a query finds itself.
    x, labels = _data(3, 10, 3, 4)
    got = recall_at_k(x, labels, (1,), x, labels)
    assert got == {1: 1.0}


@MB
def test_float_and_column_labels():
    x, labels = _data(4, 15, 3, 3)
    base = recall_at_k(x, labels, (1, 2))
    assert recall_at_k(x, labels[:, None].astype(np.float32), (1, 2)) == base


@MB
def test_invalid_ks():
    x, labels = _data(5, 6, 3, 2)
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(x, labels, (6,))  # only 5 other items per query
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(x, labels, (0, 1))
    assert set(recall_at_k(x, labels, (5,))) == {5}


# -- the full metric set: references, ties, singletons, query/gallery splits, chunking ----------

import math  # noqa: E402

from sklearn.cluster import KMeans  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score  # noqa: E402
from sklearn.metrics.cluster import pair_confusion_matrix  # noqa: E402
from sklearn.neighbors import NearestNeighbors  # noqa: E402

from tfdml import metrics, search  # noqa: E402
from tfdml import ops as dml  # noqa: E402

# JAX compiles every eager op once per shape: other backends try one chunking (a gallery chunk
# smaller than k, the hardest case of the running top-k).
CHUNKINGS = [(1024, 16384), (4, 3), (1, 7)] if BACKEND == "tensorflow" else [(1, 7)]

RETRIEVAL = ("recall", "map_at_r", "r_precision")


def _with_singletons(seed, n, dim):
    """Random data where classes 100, 101 and 102 have a single sample each."""
    x, labels = _data(seed, n, dim, 5)
    labels[:3] = [100, 101, 102]
    return x, labels


def _as_kwargs(args, kwargs):
    names = ("embeddings", "labels", "gallery_embeddings", "gallery_labels")
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _tf_metric(name, *args, **kwargs):
    kwargs = _as_kwargs(args, kwargs)
    args = ()
    if name == "recall":
        return metrics.recall_at_k(*args, **kwargs)
    kwargs.pop("ks", None)
    return getattr(metrics, name)(*args, **kwargs)


def _ref_metric(name, *args, **kwargs):
    kwargs = _as_kwargs(args, kwargs)
    args = ()
    if name == "recall":
        return ref.recall_at_k_unmatched(*args, **kwargs)
    kwargs.pop("ks", None)
    return getattr(ref, name)(*args, **kwargs)


# On every commit each metric self-retrieving and against a separate gallery, with each score
# once; the other pairs of score and gallery in the slow tier.
@MB
@pytest.mark.parametrize("split,metric,name", slow_beyond(
    [pytest.param(split, metric, name, id=f"{split}-{metric}-{name}")
     for split in (False, True) for metric in ("cosine", "l2") for name in RETRIEVAL],
    {"False-cosine-recall", "True-l2-recall", "False-l2-map_at_r", "True-cosine-map_at_r",
     "False-cosine-r_precision", "True-l2-r_precision"}))
def test_retrieval_metrics_match_reference_on_random_data(name, metric, split):
    x, labels = _data(11, 28, 5, 6)
    kwargs = {"ks": (1, 3, 5), "metric": metric}
    if split:
        # Queries 0..9 against a gallery of the rest (asymmetric sizes, B != D).
        args = (x[:10], labels[:10], x[10:], labels[10:])
    else:
        args = (x, labels)
    want = _ref_metric(name, *args, **kwargs)
    got = _tf_metric(name, *args, chunk_size=4, gallery_chunk_size=5, **kwargs)
    assert_metric_close(got, want)
    values = list(want.values()) if isinstance(want, dict) else [want]
    assert 0.0 < min(values) < 1.0  # meaningful data


# On every commit: the first draw of tied data, every metric with cosine scores and recall
# with l2 scores (the ranking and its tie-breaking are shared by the metrics); a second draw
# (seed 1) and the other l2 pairs in the slow tier.
@pytest.mark.parametrize("seed,metric,name", slow_beyond(
    [pytest.param(seed, metric, name, id=f"{seed}-{metric}-{name}",
                  marks=[MB] if seed == 0 else [])
     for seed in (0, 1) for metric in ("cosine", "l2") for name in RETRIEVAL],
    {*(f"0-cosine-{name}" for name in RETRIEVAL), "0-l2-recall"}))
def test_retrieval_metrics_break_ties_by_gallery_index(name, metric, seed):
    x, labels = tied_embeddings(seed, 30, 4)
    assert len(np.unique(x, axis=0)) < 10  # many duplicates, hence many exact ties
    for args in [(x, labels), (x[:9], labels[:9], x[9:], labels[9:])]:
        want = _ref_metric(name, *args, ks=(1, 2, 5), metric=metric)
        for chunks in CHUNKINGS:
            got = _tf_metric(name, *args, ks=(1, 2, 5), metric=metric, chunk_size=chunks[0],
                             gallery_chunk_size=chunks[1])
            assert_metric_close(got, want)


@MB
def test_top_k_puts_the_lower_index_first_among_ties():
    # tf.math.top_k and jax.lax.top_k promise it; torch.topk does not (tfdml sorts stably).
    scores = np.random.default_rng(0).integers(0, 3, size=(8, 2000)).astype(np.float32)
    values, pos = dml.top_k(ops.convert_to_tensor(scores), 300)
    want = np.argsort(-scores, axis=1, kind="stable")[:, :300]
    np.testing.assert_array_equal(to_numpy(pos), want)
    np.testing.assert_array_equal(to_numpy(values), np.take_along_axis(scores, want, axis=1))


@MB
def test_ties_are_resolved_by_lower_index_not_by_luck():
    # Query 0 has three identical neighbours; only the one of lowest index counts at K=1.
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], np.float32)
    q, g = x[:1], x[1:4]
    for g_labels, want in [([0, 1, 1], 1.0), ([1, 0, 0], 0.0), ([1, 1, 0], 0.0)]:
        got = metrics.recall_at_k(q, [0], (1,), g, g_labels, gallery_chunk_size=1)
        assert got == {1: want}
    # The reversed gallery: the hit at position 0 counts.
    assert metrics.recall_at_k(q, [0], (1,), g[::-1], [1, 1, 0]) == {1: 0.0}
    assert metrics.recall_at_k(q, [0], (1,), g[::-1], [0, 1, 1]) == {1: 1.0}


@MB
@pytest.mark.parametrize("name", RETRIEVAL)
@pytest.mark.parametrize("unmatched", ["exclude", "miss"])
def test_singleton_classes(name, unmatched):
    x, labels = _with_singletons(21, 25, 4)
    got = _tf_metric(name, x, labels, ks=(1, 4), unmatched=unmatched, chunk_size=6)
    want = _ref_metric(name, x, labels, ks=(1, 4), unmatched=unmatched)
    assert_metric_close(got, want)
    # Three of the 25 queries have no match: "miss" averages them in as zeros.
    other = _tf_metric(name, x, labels, ks=(1, 4),
                       unmatched="miss" if unmatched == "exclude" else "exclude")
    if isinstance(got, dict):
        got, other = got[4], other[4]
    if unmatched == "miss":
        assert got == pytest.approx(other * 22 / 25, abs=1e-12)
    else:
        assert other == pytest.approx(got * 22 / 25, abs=1e-12)


@pytest.mark.parametrize("name", RETRIEVAL)
def test_queries_whose_class_is_not_in_the_gallery(name):
    x, labels = _data(31, 30, 4, 6)
    gallery_mask = labels != labels[0]  # class of query 0 absent from the gallery
    q, q_labels = x[:12], labels[:12]
    g, g_labels = x[12:][gallery_mask[12:]], labels[12:][gallery_mask[12:]]
    for unmatched in ("exclude", "miss"):
        got = _tf_metric(name, q, q_labels, g, g_labels, ks=(1, 2), unmatched=unmatched)
        want = _ref_metric(name, q, q_labels, g, g_labels, ks=(1, 2), unmatched=unmatched)
        assert_metric_close(got, want)


@MB
def test_all_queries_unmatched_gives_nan():
    x, _ = _data(3, 6, 3, 2)
    labels = np.arange(6)
    recalls = metrics.recall_at_k(x, labels, (1, 2), unmatched="exclude")
    assert all(math.isnan(v) for v in recalls.values())
    assert math.isnan(metrics.map_at_r(x, labels))
    assert math.isnan(metrics.r_precision(x, labels))
    assert metrics.r_precision(x, labels, unmatched="miss") == 0.0
    assert metrics.recall_at_k(x, labels, (1, 2)) == {1: 0.0, 2: 0.0}  # default: misses


def test_unmatched_defaults():
    # Recall@K and CMC average over all queries (a lone query is a miss); MAP@R and
    # R-precision leave queries with R = 0 out.
    x, labels = _with_singletons(22, 20, 4)
    assert metrics.recall_at_k(x, labels) == metrics.recall_at_k(x, labels, unmatched="miss")
    assert metrics.map_at_r(x, labels) == metrics.map_at_r(x, labels, unmatched="exclude")
    assert metrics.r_precision(x, labels) == metrics.r_precision(x, labels, unmatched="exclude")
    q, g = x[:8], x[8:]
    ql, gl = labels[:8], labels[8:]  # queries 0-2 have identities absent from the gallery
    assert np.array_equal(metrics.cmc(q, ql, g, gl, top_k=3),
                          metrics.cmc(q, ql, g, gl, top_k=3, unmatched="miss"))
    in_gallery = np.isin(ql, gl)
    assert 0 < in_gallery.sum() < 8
    assert metrics.cmc(q, ql, g, gl, top_k=12)[-1] == pytest.approx(in_gallery.mean())
    assert metrics.cmc(q, ql, g, gl, top_k=12, unmatched="exclude")[-1] == 1.0


@MB
def test_known_values():
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9], [0.7, 0.7]])
    y = [0, 0, 1, 1, 1]
    # Query 4 ranks 3 (class 1) then 1 (class 0): AP 1/2, R-precision 1/2; the rest are 1.
    assert metrics.map_at_r(x, y) == pytest.approx(0.9)
    assert metrics.r_precision(x, y) == pytest.approx(0.9)
    # MAP@R punishes order where R-precision does not: ranks (wrong, right) vs (right, wrong).
    q = np.array([[1.0, 0.0]])
    g = np.array([[0.9, 0.1], [0.8, 0.2], [0.0, 1.0]])
    assert metrics.r_precision(q, [0], g, [1, 0, 0]) == 0.5
    assert metrics.map_at_r(q, [0], g, [1, 0, 0]) == pytest.approx(0.25)  # (0 + 1/2) / 2
    assert metrics.map_at_r(q, [0], g, [0, 1, 0]) == pytest.approx(0.5)  # (1 + 0) / 2


def test_recall_matches_sklearn_brute_force():
    x, labels = _data(41, 60, 8, 7)
    nn = NearestNeighbors(n_neighbors=9, algorithm="brute", metric="euclidean").fit(x)
    _, idx = nn.kneighbors(x)  # includes the query itself at rank 0 (no duplicates here)
    assert (idx[:, 0] == np.arange(60)).all()
    hits = labels[idx[:, 1:]] == labels[:, None]
    want = {k: float(hits[:, :k].any(axis=1).mean()) for k in (1, 2, 4, 8)}
    assert metrics.recall_at_k(x, labels, metric="l2", chunk_size=7) == pytest.approx(want)


def test_score_blocks_are_bounded_by_the_chunk_sizes(monkeypatch):
    shapes = []
    original = search.exact.block_scores

    def spy(queries, gallery, metric):
        out = original(queries, gallery, metric)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(search.exact, "block_scores", spy)
    x, labels = _data(51, 50, 4, 5)
    got = metrics.recall_at_k(x, labels, (1, 8), chunk_size=8, gallery_chunk_size=16)
    chunked, shapes[:] = list(shapes), []
    assert got == metrics.recall_at_k(x, labels, (1, 8))
    assert shapes == [(50, 50)]
    shapes = chunked
    assert max(s[0] for s in shapes) == 8 and max(s[1] for s in shapes) == 16
    assert len(shapes) > 7 * 4 - 1  # every (query chunk, gallery chunk) block


@pytest.mark.parametrize("metric", [pytest.param("cosine", marks=MB), "l2"])
def test_cmc(metric):
    x, labels = tied_embeddings(61, 36, 6)
    q, ql, g, gl = x[:14], labels[:14], x[14:], labels[14:]
    got = metrics.cmc(q, ql, g, gl, top_k=6, metric=metric, chunk_size=5, gallery_chunk_size=3)
    want = ref.cmc(q, ql, g, gl, 6, metric)
    assert got.shape == (6,) and np.allclose(got, want, atol=1e-12)
    assert (np.diff(got) >= 0).all()
    x, labels = _data(62, 40, 5, 8)
    got = metrics.cmc(x[:15], labels[:15], x[15:], labels[15:], top_k=25, metric=metric)
    assert np.allclose(got, ref.cmc(x[:15], labels[:15], x[15:], labels[15:], 25, metric))
    assert got[-1] == 1.0 and got[0] < 1.0


@pytest.mark.parametrize("seed", [pytest.param(0, marks=MB), 5])
def test_vehicleid_match_rate(seed):
    x, labels = _data(71, 45, 6, 9)
    labels[0] = 50  # an identity with a single image: only ever a gallery distractor
    got = metrics.vehicleid_match_rate(x, labels, ks=(1, 5), num_draws=4, seed=seed)
    want = ref.vehicleid_match_rate(x, labels, (1, 5), 4, seed)
    assert_metric_close(got, want)
    # A different seed draws different galleries.
    other = metrics.vehicleid_match_rate(x, labels, ks=(1, 5), num_draws=4, seed=seed + 1)
    assert other != got


def _partition(seed, n, num_labels, num_clusters):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_labels, size=n)
    clusters = rng.integers(0, num_clusters, size=n)
    clusters[: n // 2] = labels[: n // 2]  # partly agreeing
    return labels, clusters


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nmi_and_f1_scores_match_references_and_sklearn(seed):
    labels, clusters = _partition(seed, 60, 5, 7 + seed)
    labels[0] = 99  # a singleton class
    nmi = metrics.nmi_score(labels, clusters)
    assert nmi == pytest.approx(ref.nmi_score(labels, clusters), abs=1e-12)
    assert nmi == pytest.approx(normalized_mutual_info_score(labels, clusters), abs=1e-12)
    f1 = metrics.pairwise_f1_score(labels, clusters)
    assert f1 == pytest.approx(ref.pairwise_f1_score(labels, clusters), abs=1e-12)
    # sklearn's pair confusion matrix counts ordered pairs: [[TN, FP], [FN, TP]] x 2.
    (_, fp), (fn, tp) = pair_confusion_matrix(labels, clusters)
    assert f1 == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)
    assert 0.0 < f1 < 1.0 and 0.0 < nmi < 1.0


def test_nmi_and_f1_scores_edge_cases():
    assert metrics.nmi_score([3, 3, 3], [1, 1, 1]) == 1.0 == ref.nmi_score([3, 3, 3], [1, 1, 1])
    assert metrics.nmi_score([0, 0, 1, 1], [5, 5, 7, 7]) == pytest.approx(1.0)
    assert metrics.pairwise_f1_score([0, 0, 1, 1], [5, 5, 7, 7]) == 1.0
    assert metrics.pairwise_f1_score([0, 1, 2], [0, 0, 0]) == 0.0  # every class a singleton
    assert metrics.pairwise_f1_score([0, 0, 1, 1], [0, 1, 2, 3]) == 0.0  # every cluster alone
    # One cluster for two equal classes of 2: TP 2, FP 4, FN 0 -> P 1/3, R 1, F1 1/2.
    assert metrics.pairwise_f1_score([0, 0, 1, 1], [0, 0, 0, 0]) == pytest.approx(0.5)


@pytest.mark.parametrize("metric", [pytest.param("cosine", marks=MB), "l2"])
def test_nmi_and_f1_clustering_use_seeded_kmeans(metric):
    x, labels = _data(81, 80, 6, 5)
    points = x / np.linalg.norm(x, axis=1, keepdims=True) if metric == "cosine" else x
    for num_clusters, k in [(None, 5), (12, 12)]:
        clusters = KMeans(n_clusters=k, n_init=1, random_state=3).fit_predict(
            points.astype(np.float32))
        nmi = metrics.nmi(x, labels, num_clusters=num_clusters, seed=3, metric=metric)
        f1 = metrics.f1_clustering(x, labels, num_clusters=num_clusters, seed=3, metric=metric)
        assert nmi == pytest.approx(normalized_mutual_info_score(labels, clusters), abs=1e-6)
        assert f1 == pytest.approx(ref.pairwise_f1_score(labels, clusters), abs=1e-6)
        assert 0.0 < f1 < 1.0 and 0.0 < nmi < 1.0


def test_nmi_on_separated_classes_and_nmi_plus():
    rng = np.random.default_rng(9)
    centres = 10.0 * np.eye(4)
    labels = np.repeat(np.arange(4), 10)
    x = centres[labels] + 0.01 * rng.normal(size=(40, 4))
    assert metrics.nmi(x, labels) == pytest.approx(1.0)
    assert metrics.f1_clustering(x, labels) == pytest.approx(1.0)
    # More clusters than classes (NMI+) splits classes: lower NMI and F1, same labels.
    assert metrics.nmi(x, labels, num_clusters=8) < 1.0
    assert metrics.f1_clustering(x, labels, num_clusters=8) < 1.0


@MB
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, y: metrics.recall_at_k(x, y, metric="l1"), "metric='l1'"),
        (lambda x, y: metrics.map_at_r(x, y, unmatched="zero"), "unmatched='zero'"),
        (lambda x, y: metrics.r_precision(x, y, chunk_size=0), "chunk_size=0"),
        (lambda x, y: metrics.recall_at_k(x, y, gallery_chunk_size=2.5), "gallery_chunk_size"),
        (lambda x, y: metrics.recall_at_k(x, y, (1,), x), "gallery_labels"),
        (lambda x, y: metrics.recall_at_k(x, y, (1,), None, y), "gallery_labels"),
        (lambda x, y: metrics.map_at_r(x, y[:5]), "labels"),
        (lambda x, y: metrics.recall_at_k(x, y, (1,), x[:, :2], y), "embedding size"),
        (lambda x, y: metrics.cmc(x, y, x, y, top_k=11), "top_k"),
        (lambda x, y: metrics.cmc(x, y, None, None), "gallery_embeddings"),
        (lambda x, y: metrics.nmi(x, y, num_clusters=11), "num_clusters=11"),
        (lambda x, y: metrics.f1_clustering(x, y, num_clusters=0), "num_clusters=0"),
        (lambda x, y: metrics.nmi(x, y, seed=0.5), "seed=0.5"),
        (lambda x, y: metrics.vehicleid_match_rate(x, y, num_draws=0), "num_draws=0"),
        (lambda x, y: metrics.vehicleid_match_rate(x, np.arange(10)), "one image per"),
        (lambda x, y: metrics.vehicleid_match_rate(x, y, ks=(4,)), "ks"),
        (lambda x, y: metrics.recall_at_k(x[0], y), "embeddings.shape"),
    ],
)
def test_validation_errors(call, match):
    x, labels = _data(91, 10, 3, 3)
    with pytest.raises(ValueError, match=match):
        call(x, labels)
