"""tfdml.search.Index against a NumPy brute force: exact answers, ties to the lower index.

Embeddings with many exact ties (small integer coordinates, duplicated rows) make the
order among equal scores visible; every chunk size must give the same answers. The
search is written in keras.ops, so these tests run under every backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from backends import BACKEND
from harness import slow_beyond

from tfdml.search import METRICS, Index, calibrate, plot_calibration

pytestmark = pytest.mark.multibackend


def _tied_data(num, dim, seed, metric):
    """Small integers (entries +-1 for cosine: equal norms, so that normalized rows and
    their dot products are exact in float32 and equal scores are exact ties)."""
    rng = np.random.default_rng(seed)
    if metric == "cosine":
        x = rng.choice([-1.0, 1.0], size=(num, dim)).astype(np.float32)
    else:
        x = rng.integers(-2, 3, size=(num, dim)).astype(np.float32)
    x[rng.integers(0, num, num // 4)] = x[0]  # duplicates of row 0
    return x


def brute_force(queries, gallery, k, metric):
    """Scores of every pair in float64, then a stable sort: nearest first, lower index first."""
    q, g = queries.astype(np.float64), gallery.astype(np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)
    if metric == "l2":
        values = np.sqrt(((q[:, None, :] - g[None, :, :]) ** 2).sum(-1))
        order = np.argsort(values, axis=1, kind="stable")[:, :k]
    else:
        values = q @ g.T
        order = np.argsort(-values, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(values, order, axis=1), order


CHUNKINGS = [(1, 1), (3, 7), (64, 5), (1024, 16384)]


# Every chunking and every metric on every commit (the metric scores, the chunking merges);
# the other pairs in the slow tier.
@pytest.mark.parametrize("chunks,metric", slow_beyond(
    [pytest.param(c, m, id=f"chunks{i}-{m}") for i, c in enumerate(CHUNKINGS) for m in METRICS],
    {"chunks0-dot", "chunks1-cosine", "chunks2-l2", "chunks3-cosine"}))
def test_exact_answers_with_ties_across_chunk_sizes(metric, chunks):
    gallery = _tied_data(45, 4, 0, metric)
    queries = np.concatenate([_tied_data(10, 4, 1, metric), gallery[:3]])
    index = Index(metric, chunk_size=chunks[0], gallery_chunk_size=chunks[1])
    index.add(gallery[:20])
    index.add(gallery[20:])  # adds append, in order
    scores, indices = index.search(queries, k=9)
    want_scores, want_indices = brute_force(queries, gallery, 9, metric)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    assert scores.dtype == np.float32 and indices.dtype == np.int64
    assert len(index) == 45


# On every commit each k (each cut of the groups) and each metric; the other pairs in the slow
# tier.
@pytest.mark.parametrize("k,metric", slow_beyond(
    [pytest.param(k, m, id=f"{k}-{m}") for m in ("cosine", "l2") for k in (1, 3, 7, 30)],
    {"1-cosine", "3-l2", "7-cosine", "30-l2"}))
def test_wide_blocks_and_a_ragged_last_block_are_exact(metric, k):
    """Gallery blocks much wider than k, one chunk or two of odd sizes (501 and 502): the
    group pre-selection runs on the whole groups of a block (all but k = 30 here, and k = 7
    with the two blocks), the remainder is merged as it is."""
    gallery = _tied_data(1003, 4, 4, metric)
    queries = np.concatenate([_tied_data(9, 4, 5, metric), gallery[[0, 500, 1002]]])
    want_scores, want_indices = brute_force(queries, gallery, k, metric)
    for gallery_chunk in (16384, 501):
        index = Index(metric, chunk_size=5, gallery_chunk_size=gallery_chunk)
        index.add(gallery)
        scores, indices = index.search(queries, k=k)
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep", [1, 2, 5])
def test_group_preselection_holds_the_top_k_with_ties_to_the_lower_column(keep):
    """Scores of few distinct values, so that equal maxima fall in many groups and the
    k-th place is a tie; the top-k of the candidates must be the top-k of the whole row."""
    from keras import ops

    from tfdml.ops import top_k
    from tfdml.search.exact import GROUP, _block_candidates, _preselects

    rng = np.random.default_rng(keep)
    width = 8 * GROUP * keep + 3 * GROUP
    assert _preselects(width, keep) and not _preselects(width + 1, keep)
    scores = rng.integers(0, 4, size=(40, width)).astype(np.float32)
    scores[:5] = 0.0  # rows of one value: every group ties
    scores[5:10, -1] = 9.0  # a unique best in the last column
    values, cols = _block_candidates(ops.convert_to_tensor(scores), keep)
    assert ops.shape(cols) == (40, keep * GROUP)
    best, pos = top_k(values, keep)
    got = np.take_along_axis(ops.convert_to_numpy(cols), ops.convert_to_numpy(pos), axis=1)
    want = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ops.convert_to_numpy(best),
                                  np.take_along_axis(scores, want, axis=1))


def test_lookup_labels_ids_and_save_load(tmp_path):
    rng = np.random.default_rng(2)
    gallery = rng.normal(size=(30, 6)).astype(np.float32)
    labels = rng.integers(0, 5, 30)
    ids = np.array([f"img_{i:03d}.jpg" for i in range(30)])
    index = Index("l2", chunk_size=4, gallery_chunk_size=8)
    index.add(gallery[:12], labels=labels[:12], ids=ids[:12])
    index.add(gallery[12:], labels=labels[12:], ids=ids[12:])
    queries = rng.normal(size=(7, 6)).astype(np.float32)
    found = index.lookup(queries, k=4)
    _, want = brute_force(queries, gallery, 4, "l2")
    np.testing.assert_array_equal(found.indices, want)
    np.testing.assert_array_equal(found.labels, labels[want])
    np.testing.assert_array_equal(found.ids, ids[want])

    path = tmp_path / "gallery.npz"
    index.save(path)
    loaded = Index.load(path)
    assert (loaded.metric, loaded.chunk_size, loaded.gallery_chunk_size) == ("l2", 4, 8)
    again = loaded.lookup(queries, k=4)
    for a, b in zip(again, found, strict=True):
        np.testing.assert_array_equal(a, b)
    loaded.add(gallery[:2], labels=labels[:2], ids=ids[:2])  # a loaded index keeps growing
    assert len(loaded) == 32


def test_an_index_without_labels_or_ids():
    index = Index()
    index.add(np.eye(3, dtype=np.float32))
    found = index.lookup(np.array([[0.0, 2.0, 0.1]], np.float32), k=2)
    assert found.labels is None and found.ids is None
    np.testing.assert_array_equal(found.indices, [[1, 2]])


def test_errors_name_the_problem():
    index = Index("dot")
    with pytest.raises(ValueError, match="empty"):
        index.search(np.ones((1, 3), np.float32))
    index.add(np.ones((4, 3), np.float32), labels=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="`k` must be at most the size"):
        index.search(np.ones((1, 3), np.float32), k=5)
    with pytest.raises(ValueError, match="3 columns"):
        index.add(np.ones((2, 4), np.float32), labels=[0, 1])
    with pytest.raises(ValueError, match="has labels"):
        index.add(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="one entry per embedding"):
        index.add(np.ones((2, 3), np.float32), labels=[0])
    bad = np.ones((3, 3), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="`queries` contains 1 non-finite row .*index 1"):
        index.search(bad)
    with pytest.raises(ValueError, match="`embeddings` contains 1 non-finite row"):
        index.add(bad, labels=[0, 1, 2])
    with pytest.raises(ValueError, match="`metric`"):
        Index("manhattan")
    with pytest.raises(ValueError, match="`chunk_size`"):
        Index(chunk_size=0)


# -- calibrate and match -----------------------------------------------------------------------


def _calibration_brute_force(scores, correct, target, metric):
    """Every distinct nearest score as a threshold; the loosest with precision >= target."""
    points = []
    for t in np.unique(scores):
        accepted = scores <= t if metric == "l2" else scores >= t
        precision = correct[accepted].mean()
        recall = correct[accepted].sum() / max(correct.sum(), 1)
        points.append((t, precision, recall))
    points.sort(key=lambda p: p[0] if metric == "l2" else -p[0])  # strictest first
    ok = [p for p in points if p[1] >= target]
    return points, (ok[-1] if ok else None)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_calibrate_picks_the_loosest_threshold_reaching_the_precision(metric):
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(5, 8))
    gallery_labels = np.repeat(np.arange(5), 10)
    gallery = (centers[gallery_labels] + rng.normal(size=(50, 8))).astype(np.float32)
    query_labels = rng.integers(0, 5, 80)
    queries = (centers[query_labels] + 1.6 * rng.normal(size=(80, 8))).astype(np.float32)
    queries[:5] = gallery[:5]  # exact duplicates: equal scores share one threshold
    query_labels[:5] = gallery_labels[:5]
    index = Index(metric)
    index.add(gallery, labels=gallery_labels)
    nearest = index.lookup(queries, 1)
    correct = nearest.labels[:, 0] == query_labels
    assert 0.5 < correct.mean() < 0.95  # thresholds matter here
    scores = nearest.scores[:, 0].astype(np.float64)
    for target in (0.9, 0.97):
        got = calibrate(index, queries, query_labels, target)
        points, want = _calibration_brute_force(scores, correct, target, metric)
        np.testing.assert_allclose(got.thresholds, [p[0] for p in points], rtol=1e-12)
        np.testing.assert_allclose(got.precisions, [p[1] for p in points], rtol=1e-12)
        np.testing.assert_allclose(got.recalls, [p[2] for p in points], rtol=1e-12)
        assert got.reached and want is not None
        assert (got.threshold, got.precision, got.recall) == pytest.approx(want, rel=1e-12)
        # match: the nearest label within the threshold, else -1.
        matched = index.match(queries, got.threshold)
        accepted = scores <= got.threshold if metric == "l2" else scores >= got.threshold
        np.testing.assert_array_equal(matched, np.where(accepted, nearest.labels[:, 0], -1))
        assert (matched[accepted] == query_labels[accepted]).mean() == pytest.approx(
            got.precision)


def test_calibrate_reports_an_unreachable_target():
    index = Index("l2")
    index.add(np.array([[0.0], [1.0]], np.float32), labels=[0, 1])
    queries = np.array([[0.05], [0.2], [0.9]], np.float32)  # nearest: 0 (wrong), 0, 1
    got = calibrate(index, queries, [1, 1, 1], target_precision=0.99)
    assert not got.reached
    # From the strictest threshold (distances 0.05, 0.1, 0.2): precision 0/1, 1/2, 1/3.
    np.testing.assert_allclose(got.precisions, [0.0, 0.5, 1 / 3])
    assert got.threshold == pytest.approx(0.1, abs=1e-6) and got.precision == 0.5
    with pytest.raises(ValueError, match="target_precision"):
        calibrate(index, queries, [1, 1, 1], target_precision=0.0)
    with pytest.raises(ValueError, match="one entry per query"):
        calibrate(index, queries, [1, 1])
    unlabelled = Index()
    unlabelled.add(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="labels"):
        unlabelled.match(np.ones((1, 2), np.float32), 0.5)


def test_plot_calibration(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    index = Index("l2")
    index.add(np.array([[0.0], [1.0]], np.float32), labels=[0, 1])
    got = calibrate(index, np.array([[0.1], [0.8], [0.45]], np.float32), [0, 1, 1], 0.9)
    ax = plot_calibration(got, target_precision=0.9)
    assert len(ax.lines) == 4
    ax.figure.savefig(tmp_path / "calibration.png")


# -- the faiss backend -------------------------------------------------------------------------


@pytest.mark.skipif(BACKEND != "tensorflow", reason="backend-independent; faiss and PyTorch "
                    "load two OpenMP runtimes")
@pytest.mark.parametrize("metric", METRICS)
def test_faiss_backend_gives_the_same_answers(metric, tmp_path):
    pytest.importorskip("faiss")
    gallery = _tied_data(300, 4, 0, metric)  # ties far past k: faiss is asked for more
    queries = np.concatenate([_tied_data(20, 4, 1, metric), gallery[:3]])
    want_scores, want_indices = brute_force(queries, gallery, 12, metric)
    default, with_faiss = Index(metric), Index(metric, backend="faiss")
    for index in (default, with_faiss):
        index.add(gallery[:100], labels=np.arange(100) % 7)
        index.add(gallery[100:], labels=np.arange(100, 300) % 7)
        scores, indices = index.search(queries, k=12)
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    path = tmp_path / "faiss.npz"
    with_faiss.save(path)
    loaded = Index.load(path)
    assert loaded.backend == "faiss"
    np.testing.assert_array_equal(loaded.lookup(queries, 12).labels,
                                  default.lookup(queries, 12).labels)


def test_faiss_backend_without_faiss_names_the_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` fails
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        Index(backend="faiss")
    with pytest.raises(ValueError, match="`backend`"):
        Index(backend="annoy")


# Real training (slow tier); calibrate on every commit: test_calibrate_picks_the_loosest_
# threshold_reaching_the_precision and the other calibrate tests above.
@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="trains a model: one backend suffices")
def test_calibrated_threshold_holds_its_precision_on_held_out_digits():
    """A 16-d embedding of scikit-learn's digits (300 steps of 2nd-order triplet NCA on
    500 images); the index holds 400 others. The threshold calibrated on 450 more images
    for a precision of 0.98 and 0.99 gives, on the last 447, a precision within one point
    of the target, while turning some queries away (the threshold is binding)."""
    import keras
    from sklearn.datasets import load_digits

    import tfdml

    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    x, y = x[order], y[order]
    keras.utils.set_random_seed(0)
    embedder = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16)])
    embedder.compile(optimizer=keras.optimizers.Adam(1e-3),
                     loss=tfdml.losses.TripletNCALoss(order=2))
    train_x, train_y = x[:500], y[:500]
    for _ in range(300):  # P x K batches: 6 digits x 4 images
        classes = rng.choice(10, 6, replace=False)
        batch = np.concatenate([rng.choice(np.flatnonzero(train_y == c), 4) for c in classes])
        embedder.train_on_batch(train_x[batch], train_y[batch])
    index = Index("cosine")
    index.add(embedder.predict(x[500:900], verbose=0), labels=y[500:900])
    calibration_x = embedder.predict(x[900:1350], verbose=0)
    held_out_x, held_out_y = embedder.predict(x[1350:], verbose=0), y[1350:]
    for target in (0.98, 0.99):
        calibration = calibrate(index, calibration_x, y[900:1350], target)
        assert calibration.reached
        matched = index.match(held_out_x, calibration.threshold)
        accepted = matched != -1
        precision = (matched[accepted] == held_out_y[accepted]).mean()
        assert abs(precision - target) <= 0.01, (target, precision)
        assert 0.5 < accepted.mean() < 1.0, accepted.mean()


def _saved(tmp_path, metric="cosine", n=20):
    rng = np.random.default_rng(7)
    index = Index(metric)
    index.add(rng.normal(size=(n, 4)).astype(np.float32), labels=np.arange(n) % 3,
              ids=np.arange(n) + 100)
    path = tmp_path / "index.npz"
    index.save(path)
    with np.load(path) as data:
        return path, {name: data[name] for name in data.files}


def _rewrite(path, fields):
    with open(path, "wb") as f:
        np.savez(f, **fields)


@pytest.mark.parametrize(("change", "field"), [
    (lambda f: f.pop("embeddings"), "embeddings"),
    (lambda f: f.update(embeddings=np.where(np.arange(4) == 1, np.nan, f["embeddings"])),
     "embeddings"),
    (lambda f: f.update(embeddings=f["embeddings"] * 20.0), "embeddings"),  # not unit rows
    (lambda f: f.update(embeddings=f["embeddings"][:, 0]), "embeddings"),  # 1-D
    (lambda f: f.update(labels=np.concatenate([f["labels"], f["labels"]])), "labels"),
    (lambda f: f.update(labels=f["labels"][:5]), "labels"),
    (lambda f: f.update(labels=f["labels"].astype(np.float32)), "labels"),
    (lambda f: f.update(labels=f["labels"][:, None]), "labels"),
    (lambda f: f.update(ids=f["ids"][:3]), "ids"),
    (lambda f: f.update(metric=np.array("hamming")), "metric"),
    (lambda f: f.update(chunk_sizes=np.array([0, 8])), "chunk_sizes"),
])
def test_load_validates_what_it_reads_and_names_file_and_field(tmp_path, change, field):
    path, fields = _saved(tmp_path)
    change(fields)
    _rewrite(path, fields)
    with pytest.raises(ValueError, match=rf"index\.npz: field `{field}`"):
        Index.load(path)


def test_load_of_a_truncated_or_foreign_file_names_the_file(tmp_path):
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"index\.npz: not a readable index file"):
        Index.load(path)
    path.write_text("not an index")
    with pytest.raises(ValueError, match=r"index\.npz: not a readable index file"):
        Index.load(path)
    with pytest.raises(FileNotFoundError):
        Index.load(tmp_path / "missing.npz")


def test_save_replaces_the_file_whole(tmp_path, monkeypatch):
    path, _ = _saved(tmp_path)
    before = path.read_bytes()
    index = Index.load(path)
    index.add(np.ones((2, 4), np.float32), labels=[0, 1], ids=[1, 2])

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array", fail)
    with pytest.raises(OSError, match="disk full"):
        index.save(path)
    assert path.read_bytes() == before  # the old file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["index.npz"]  # no temporary left


def test_empty_index_saves_loads_and_grows_and_zero_queries_find_nothing(tmp_path):
    path = tmp_path / "empty.npz"
    Index("dot").save(path)
    index = Index.load(path)
    assert len(index) == 0 and index.dim is None and index.metric == "dot"
    index.add(np.eye(3, dtype=np.float32), labels=[0, 1, 2])
    scores, indices = index.search(np.zeros((0, 3), np.float32), k=2)
    assert scores.shape == (0, 2) and indices.shape == (0, 2) and indices.dtype == np.int64
    assert index.match(np.zeros((0, 3), np.float32), threshold=0.5).shape == (0,)
    assert index.search(np.eye(3, dtype=np.float32)[:1], k=1)[1].tolist() == [[0]]


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), "0.5", None])
def test_match_needs_a_finite_threshold(threshold):
    index = Index()
    index.add(np.eye(3, dtype=np.float32), labels=[0, 1, 2])
    with pytest.raises(ValueError, match="threshold"):
        index.match(np.eye(3, dtype=np.float32), threshold=threshold)


def test_calibrate_without_queries_says_so():
    index = Index()
    index.add(np.eye(3, dtype=np.float32), labels=[0, 1, 2])
    with pytest.raises(ValueError, match="at least one query"):
        calibrate(index, np.zeros((0, 3), np.float32), np.zeros(0, np.int64))


# -- query buckets -----------------------------------------------------------------------------


def test_query_bucket_is_the_next_power_of_two_within_the_chunk():
    from tfdml.search import MIN_BUCKET, query_bucket

    assert MIN_BUCKET == 16
    got = [query_bucket(n, 1024) for n in (1, 15, 16, 17, 100, 512, 513, 1000, 1024)]
    assert got == [16, 16, 16, 32, 128, 512, 1024, 1024, 1024]
    assert [query_bucket(n, 1000) for n in (1, 600, 1000)] == [16, 1000, 1000]
    assert [query_bucket(n, 5) for n in (1, 3, 5)] == [5, 5, 5]  # never past the chunk
    sizes = {query_bucket(n, 1024) for n in range(1, 1025)}
    assert sizes == {16, 32, 64, 128, 256, 512, 1024}


@pytest.mark.parametrize("metric", METRICS)
def test_query_buckets_give_the_answers_of_the_unpadded_search(metric):
    """Exact data (ties everywhere): the padded search returns the very same indices and
    scores as the unpadded one and the brute force, for batches that fill chunks or not."""
    gallery = _tied_data(16, 4, 6, metric)
    padded = Index(metric, chunk_size=16, query_buckets=True)
    plain = Index(metric, chunk_size=16, query_buckets=False)
    for index in (padded, plain):
        index.add(gallery)
    queries = np.concatenate([gallery[:4], _tied_data(15, 4, 7, metric)])
    for num in (3, 19):  # part of a chunk; a full chunk and a part (few shapes: JAX compiles)
        got = padded.search(queries[:num], k=6)
        want = plain.search(queries[:num], k=6)
        want_scores, want_indices = brute_force(queries[:num], gallery, 6, metric)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])  # bit for bit: exact products
        np.testing.assert_array_equal(got[1], want_indices)
        np.testing.assert_allclose(got[0], want_scores, rtol=1e-6, atol=1e-6)
        assert got[0].shape == (num, 6) and got[1].dtype == np.int64


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_query_buckets_on_random_data_match_up_to_rounding(metric):
    rng = np.random.default_rng(8)
    gallery = rng.normal(size=(16, 4)).astype(np.float32)
    queries = rng.normal(size=(3, 4)).astype(np.float32)
    found = []
    for buckets in (True, False):
        index = Index(metric, chunk_size=16, query_buckets=buckets)
        index.add(gallery)
        found.append(index.search(queries, k=5))
    np.testing.assert_array_equal(found[0][1], found[1][1])
    np.testing.assert_allclose(found[0][0], found[1][0], rtol=1e-5, atol=1e-6)
    _, want = brute_force(queries, gallery, 5, metric)
    np.testing.assert_array_equal(found[0][1], want)


def test_neighbours_with_buckets_and_exclude_self_never_return_a_padding_row():
    """exclude_self drops query i's own index i; with padding, the padding rows (zeros,
    as near as anything to a zero row) are cut before that, whatever they score."""
    from tfdml.search import neighbours

    x = _tied_data(37, 3, 9, "dot")
    x[5] = 0.0  # a zero row in the data: as near to the padding as can be
    for exclude_self in (False, True):
        answers = [list(neighbours(x, x, 4, "dot", exclude_self, chunk_size=20,
                                   query_buckets=buckets)) for buckets in (True, False)]
        for (s1, a, i1), (s2, b, i2) in zip(*answers, strict=True):
            assert s1 == s2 and len(i1) == len(i2) == min(20, 37 - s1)
            np.testing.assert_array_equal(i1, i2)
            np.testing.assert_array_equal(a, b)
            assert i1.max() < 37


def test_query_buckets_bound_the_shapes_that_are_computed(monkeypatch):
    """Every number of queries from 1 to 50 reaches the matrix products and the
    normalization in chunks of 16 or 32 rows only (chunk_size 32)."""
    import tfdml.search.exact as search

    rows = set()
    compiled = search.compiled  # the merge and the normalization a bucketed search runs

    def recording(name):
        run = compiled(name)

        def record(x, *args):
            rows.add((name, int(x.shape[0])))
            return run(x, *args)

        return record

    index = Index("cosine", chunk_size=32, query_buckets=True)
    index.add(_tied_data(40, 4, 10, "cosine"))
    monkeypatch.setattr(search, "compiled", recording)
    queries = _tied_data(50, 4, 11, "cosine")
    for num in (1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 50):
        assert index.search(queries[:num], k=2)[1].shape == (num, 2)
    assert rows == {(name, size) for name in ("merge", "normalize") for size in (16, 32)}


def test_query_buckets_default_to_jax_and_are_checked():
    assert Index().query_buckets == (BACKEND == "jax")
    assert Index(query_buckets=False).query_buckets is False
    with pytest.raises(ValueError, match="`query_buckets`.*Received: query_buckets='yes'"):
        Index(query_buckets="yes")
    index = Index("l2", query_buckets=True)
    index.add(np.ones((4, 3), np.float32))
    bad = np.ones((3, 3), np.float32)
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"`queries` contains 1 non-finite row .*out of 3.*index 1"):
        index.search(bad)
    beyond = np.ones((2, 3), np.float64)
    beyond[1, 0] = 1e39  # finite in float64, Inf in float32
    with pytest.raises(ValueError, match=r"`queries` contains 1 non-finite row .*index 1"):
        index.search(beyond)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX is the backend that compiles each shape")
def test_under_jax_new_query_counts_in_a_bucket_compile_nothing(caplog):
    import logging

    import jax

    index = Index("cosine", chunk_size=32)
    index.add(_tied_data(23, 5, 12, "cosine"))  # 5 columns: shapes no other test uses
    queries = _tied_data(40, 5, 13, "cosine")
    index.search(queries[:17], k=3)  # compiles the 32-row bucket
    with jax.log_compiles(), caplog.at_level(logging.DEBUG, logger="jax"):
        for num in (18, 25, 31, 32, 40):  # 40: a full chunk and 8 rows in the 16-row bucket
            if num == 40:
                assert [r for r in caplog.records if "Compiling" in r.getMessage()] == []
            index.search(queries[:num], k=3)
    assert [r for r in caplog.records if "Compiling" in r.getMessage()]  # the check can fail


# -- calibration on queries that are in the index ----------------------------------------------


def _labelled_clusters(seed, num=60, dim=6):
    rng = np.random.default_rng(seed)
    labels = np.arange(num) % 4
    centres = rng.normal(size=(4, dim))
    x = (centres[labels] + 0.8 * rng.normal(size=(num, dim))).astype(np.float32)
    return x, labels


@pytest.mark.parametrize("metric", METRICS)
def test_calibrate_warns_when_the_queries_are_in_the_index(metric):
    x, labels = _labelled_clusters(14)
    if metric == "dot":  # rows of one norm: each row's largest dot product is with itself
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = Index(metric)
    index.add(x[:25], labels=labels[:25])
    index.add(x[25:], labels=labels[25:])  # copies are looked for in every added block
    with pytest.warns(UserWarning, match=r"60 of the 60 calibration queries \(100%\) are "
                                          r"copies.*held-out queries"):
        got = calibrate(index, x, labels, 0.99)
    assert got.precision == 1.0  # the symptom: every query finds itself
    # The same inputs embedded again with rounding differences count as copies too.
    again = x * np.float32(1 + 2e-7)
    with pytest.warns(UserWarning, match="60 of the 60"):
        calibrate(index, again, labels, 0.99)


def test_calibrate_warns_from_a_tenth_of_copies_on():
    """8 copies among 80 queries (10 %) warn; 7 (8.75 %, a few duplicates in held-out data)
    do not. The count is that of a NumPy reference of the rule."""
    import warnings

    from tfdml.search import COPY_TOLERANCE, SELF_MATCH_SHARE

    assert (SELF_MATCH_SHARE, COPY_TOLERANCE) == (0.1, 1e-5)
    x, labels = _labelled_clusters(15, num=100)
    index = Index("l2")
    index.add(x[:20], labels=labels[:20])
    held_out, held_labels = x[20:].copy(), labels[20:]
    near = held_out.copy()
    near[:3] = x[:3] * np.float32(1 + 3e-6)  # copies within the tolerance
    near[3:8] = x[3:8]
    near[8] = x[8] * np.float32(1 + 1e-3)  # near, but not a copy
    found = index.lookup(near, 1)
    g = x[:20][found.indices[:, 0]].astype(np.float64)
    q = near.astype(np.float64)
    reference = np.linalg.norm(q - g, axis=1) <= 1e-5 * np.maximum(
        np.linalg.norm(q, axis=1), np.linalg.norm(g, axis=1))
    assert reference.sum() == 8
    with pytest.warns(UserWarning, match=r"8 of the 80 calibration queries \(10%\)"):
        calibrate(index, near, held_labels, 0.9)
    near[7] = held_out[7]  # 7 copies
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        calibrate(index, near, held_labels, 0.9)
        calibrate(index, held_out, held_labels, 0.9)  # no copy at all


def test_plot_calibration_without_matplotlib_names_the_install_command(monkeypatch):
    import sys

    index = Index("l2")
    index.add(np.array([[0.0], [1.0]], np.float32), labels=[0, 1])
    got = calibrate(index, np.array([[0.1], [0.8]], np.float32), [0, 1], 0.9)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r'pip install matplotlib.*pip install "\.\[plot\]"') as err:
        plot_calibration(got)
    assert type(err.value) is ImportError and "Plotting needs matplotlib" in str(err.value)
