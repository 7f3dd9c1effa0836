"""tfdml.search.Index with an approximate (faiss) structure: answers, training, tuning,
batches, embeddings on disk, saving and loading, bad input.

faiss gets NumPy arrays; the queries and embeddings may be tensors of the Keras backend.
They run under TensorFlow, JAX and PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faiss")
pytestmark = pytest.mark.multibackend

from harness import slow_beyond  # noqa: E402

from tfdml.search import Index, neighbour_recall  # noqa: E402

STRUCTURES = ("HNSW16", "IVF16,Flat", "IVF16,PQ8x4")


def _clusters(num, dim=16, seed=0, centres=24):
    """Anisotropic Gaussian clusters: each centre with its own random scale per axis."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(centres, dim)) * 3.0
    scales = rng.uniform(0.2, 1.5, size=(centres, dim))
    which = rng.integers(0, centres, num)
    x = means[which] + rng.normal(size=(num, dim)) * scales[which]
    return x.astype(np.float32), which.astype(np.int64)


def _exact(gallery, queries, k, metric):
    index = Index(metric)
    index.add(gallery)
    return index.search(queries, k)


# Each structure and each metric on every commit; the other pairs in the slow tier.
@pytest.mark.parametrize("structure,metric", slow_beyond(
    [pytest.param(s, m, id=f"{s}-{m}") for s in STRUCTURES for m in ("cosine", "l2")],
    {"HNSW16-l2", "IVF16,Flat-cosine", "IVF16,PQ8x4-cosine"}))
def test_tune_reaches_the_target_recall_and_sets_it(structure, metric):
    gallery, _ = _clusters(3000)
    queries, _ = _clusters(200, seed=1)
    index = Index(metric, approximate=structure, rerank=100 if "PQ" in structure else None,
                  train_size=3000)
    index.add(gallery)
    tuning = index.tune(queries, k=10, target_recall=0.9)
    assert tuning.reached and tuning.recall >= 0.9
    assert index.parameters == tuning.parameters
    _, found = index.search(queries, 10)
    _, truth = _exact(gallery, queries, 10, metric)
    assert neighbour_recall(found, truth) == pytest.approx(tuning.recall)
    # The settings tried come cheapest first, and the one chosen is the first that reaches.
    recalls = [r for _, r, _ in tuning.tried]
    assert recalls[-1] >= 0.9 and all(r < 0.9 for r in recalls[:-1])


def test_an_ivf_flat_index_probing_every_list_is_exact():
    gallery, _ = _clusters(2000)
    queries, _ = _clusters(50, seed=1)
    index = Index("l2", approximate="IVF16,Flat", parameters={"nprobe": 16})
    index.add(gallery)
    scores, indices = index.search(queries, 7)
    want_scores, want = _exact(gallery, queries, 7, "l2")
    np.testing.assert_array_equal(indices, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)


def test_rerank_of_every_candidate_gives_the_exact_order():
    gallery, _ = _clusters(1500)
    queries, _ = _clusters(40, seed=2)
    index = Index("cosine", approximate="IVF16,PQ8x4", parameters={"nprobe": 16},
                  rerank=1500, train_size=1500)
    index.add(gallery)
    scores, indices = index.search(queries, 5)
    want_scores, want = _exact(gallery, queries, 5, "cosine")
    np.testing.assert_array_equal(indices, want)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


def test_equal_scores_come_in_index_order():
    gallery, _ = _clusters(500)
    gallery[[10, 20, 30, 40]] = gallery[3]  # five copies of row 3
    index = Index("l2", approximate="HNSW16", parameters={"efSearch": 64})
    index.add(gallery)
    _, indices = index.search(gallery[3:4] + 1e-3, 5)
    assert indices[0].tolist() == [3, 10, 20, 30, 40]


def test_missing_neighbours_are_minus_one_with_the_worst_score():
    gallery, labels = _clusters(400, centres=4)
    index = Index("cosine", approximate="IVF16,Flat", parameters={"nprobe": 1},
                  train_size=400)
    index.add(gallery, labels=labels, ids=[f"item{i}" for i in range(400)])
    found = index.lookup(gallery[:20], 300)  # one list holds far fewer than 300 items
    missing = found.indices < 0
    assert missing.any() and (missing[:, -1]).all()
    assert (found.scores[missing] == -np.inf).all() and np.isfinite(found.scores[~missing]).all()
    assert (found.labels[missing] == -1).all() and (found.ids[missing] == "").all()
    # After the found items only missing ones: the lists are complete up to there.
    assert (np.diff(missing.astype(int), axis=1) >= 0).all()


def test_batches_from_a_generator_equal_one_array():
    gallery, labels = _clusters(2400)
    queries, _ = _clusters(30, seed=3)
    whole = Index("l2", approximate="IVF16,PQ8x4", train_size=2400, vectors=None)
    whole.add(gallery, labels=labels)

    def batches():
        for start in range(0, 2400, 500):
            yield gallery[start : start + 500], labels[start : start + 500]

    streamed = Index("l2", approximate="IVF16,PQ8x4", train_size=2400, vectors=None)
    streamed.add(batches())
    assert len(streamed) == 2400 and streamed.is_trained
    np.testing.assert_array_equal(streamed.labels, labels)
    a, b = whole.search(queries, 5), streamed.search(queries, 5)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])
    # Dicts and (embeddings,) tuples are batches too; a bad batch names itself.
    more = Index("l2", approximate="HNSW16")
    more.add(iter([{"embeddings": gallery[:5], "labels": labels[:5]}]))
    with pytest.raises(ValueError, match=r"Batch 1: .*NaN.* \(5 rows of the earlier"):
        more.add(iter([(gallery[5:10], labels[5:10]), (np.full((2, 16), np.nan, "float32"),
                                                       labels[:2])]))


@pytest.mark.parametrize("structure", ["IVF16,Flat", None])
def test_a_large_array_is_added_block_by_block_all_or_nothing(structure, monkeypatch):
    import tfdml.search.index as index_module

    gallery, labels = _clusters(1000)
    queries, _ = _clusters(20, seed=6)
    whole = Index("l2", approximate=structure, train_size=1000)
    whole.add(gallery, labels=labels)
    monkeypatch.setattr(index_module, "ADD_BLOCK", 128)
    blocks = Index("l2", approximate=structure, train_size=1000)
    bad = gallery.copy()
    bad[[5, 900]] = np.nan
    with pytest.raises(ValueError, match=r"`embeddings` contains 2 non-finite rows .* 5, 900"):
        blocks.add(bad, labels=labels)
    assert len(blocks) == 0 and not blocks.is_trained if structure else len(blocks) == 0
    blocks.add(gallery, labels=labels)
    gallery[:] = 0  # the index keeps its own copy
    np.testing.assert_array_equal(blocks.labels, labels)
    for a, b in zip(whole.search(queries, 6), blocks.search(queries, 6), strict=True):
        np.testing.assert_array_equal(a, b)


def test_train_first_then_add():
    gallery, _ = _clusters(1000)
    index = Index("cosine", approximate="IVF16,Flat")
    assert not index.is_trained
    index.train(gallery[:600])
    assert index.is_trained and len(index) == 0
    index.add(gallery)
    assert len(index) == 1000
    with pytest.raises(ValueError, match="train it before the first add"):
        index.train(gallery)
    with pytest.raises(ValueError, match="exact index has nothing to train"):
        Index("cosine").train(gallery)


# Each structure and each place of the vectors on every commit; the other pairs in the slow
# tier.
@pytest.mark.parametrize("structure,vectors", slow_beyond(
    [pytest.param(s, v, id=f"{s}-{v}") for s in STRUCTURES for v in ("memory", "disk", None)],
    {"HNSW16-memory", "IVF16,Flat-disk", "IVF16,PQ8x4-None"}))
def test_save_and_load_give_the_same_answers(structure, vectors, tmp_path):
    gallery, labels = _clusters(1200)
    queries, _ = _clusters(30, seed=4)
    index = Index("l2", approximate=structure, vectors=vectors, train_size=1200,
                  parameters={"efSearch": 20} if "HNSW" in structure else {"nprobe": 3})
    index.add(gallery, labels=labels, ids=np.arange(1200) * 7)
    index.save(tmp_path / "ann.npz")
    loaded = Index.load(tmp_path / "ann.npz")
    assert (loaded.approximate, loaded.vectors, loaded.parameters) == (
        structure, vectors, index.parameters)
    for a, b in zip(index.lookup(queries, 6), loaded.lookup(queries, 6), strict=True):
        np.testing.assert_array_equal(a, b)
    if vectors is not None:
        np.testing.assert_array_equal(np.asarray(loaded.embeddings), np.asarray(index.embeddings))
        on_disk = Index.load(tmp_path / "ann.npz", vectors="disk")
        np.testing.assert_array_equal(on_disk.search(queries, 6)[1], index.search(queries, 6)[1])


def test_an_exact_index_on_disk_answers_as_in_memory(tmp_path):
    gallery, _ = _clusters(900)
    queries, _ = _clusters(20, seed=5)
    memory = Index("dot", gallery_chunk_size=128)
    disk = Index("dot", vectors="disk", gallery_chunk_size=128)
    for index in (memory, disk):
        index.add(gallery[:400])
        index.add(gallery[400:])
    for a, b in zip(memory.search(queries, 9), disk.search(queries, 9), strict=True):
        np.testing.assert_array_equal(a, b)
    disk.save(tmp_path / "disk.npz")
    np.testing.assert_array_equal(Index.load(tmp_path / "disk.npz").search(queries, 9)[1],
                                  memory.search(queries, 9)[1])


def test_a_disk_index_dropped_without_closing_closes_its_file(tmp_path):
    """Its temporary file is closed (so removed) when the index is collected, with no
    ResourceWarning; a loaded copy's too."""
    import gc
    import warnings

    gallery, _ = _clusters(300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = Index("dot", vectors="disk")
        index.add(gallery)
        index.search(gallery[:3], 2)
        index.save(tmp_path / "disk.npz")
        Index.load(tmp_path / "disk.npz").search(gallery[:3], 2)
        del index
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught


# -- bad input ----------------------------------------------------------------------------------


def test_a_factory_string_faiss_rejects_names_approximate_and_quotes_faiss():
    index = Index("l2", approximate="IVF16,NoSuchCodec")
    with pytest.raises(ValueError, match=r"`approximate`: faiss cannot build 'IVF16,NoSuchCodec'"
                                         r" for 16-dimensional embeddings: .*\S"):
        index.add(_clusters(100)[0], labels=np.zeros(100, np.int64))
    assert len(index) == 0 and index.labels is None and index.dim is None
    with pytest.raises(ValueError, match="`approximate` must be a faiss index factory string"):
        Index("l2", approximate="")
    with pytest.raises(ValueError, match="`rerank` re-orders"):
        Index("l2", rerank=10)
    with pytest.raises(ValueError, match="`parameters`: this structure takes"):
        Index("l2", approximate="HNSW16", parameters={"nprobe": 4}).add(_clusters(50)[0])
    refused = Index("l2", approximate="HNSW16", parameters={"efSearch": 0})
    with pytest.raises(ValueError, match="`parameters`: this structure takes"):
        refused.add(_clusters(50)[0])
    assert len(refused) == 0


def test_searching_an_untrained_or_empty_index_says_why():
    queries = _clusters(5)[0]
    with pytest.raises(ValueError, match="not trained"):
        Index("l2", approximate="IVF16,Flat").search(queries, 1)
    trained = Index("l2", approximate="IVF16,Flat")
    trained.train(_clusters(500)[0])
    with pytest.raises(ValueError, match="The index is empty"):
        trained.search(queries, 1)
    with pytest.raises(ValueError, match="not trained"):
        Index("l2", approximate="IVF16,Flat").tune(queries, 1)


def test_too_few_rows_to_train_leave_an_empty_index():
    index = Index("l2", approximate="IVF64,Flat")
    with pytest.raises(ValueError, match=r"`embeddings`: faiss cannot train 'IVF64,Flat' on 10 "
                                         r"rows: .*Number of training points \(10\) should be at "
                                         r"least as large as number of clusters \(64\)\. Add "
                                         "more rows at once"):
        index.add(_clusters(10)[0], labels=np.zeros(10, np.int64))
    assert len(index) == 0 and index.labels is None
    index.add(_clusters(3000)[0])  # a fresh start, without labels
    assert len(index) == 3000


def test_tune_refuses_bad_targets_and_queries_that_are_in_the_index():
    gallery, _ = _clusters(800)
    index = Index("cosine", approximate="HNSW16")
    index.add(gallery)
    for bad in (0, 1.5, float("nan"), "0.9"):
        with pytest.raises(ValueError, match="`target_recall` must be a number in"):
            index.tune(gallery[:10] + 0.5, 5, bad)
    with pytest.raises(ValueError, match=r"`queries`: 20 of the 20 tuning queries are copies"):
        index.tune(gallery[:20], 5)
    with pytest.raises(ValueError, match="`k` must be at most the size"):
        index.tune(gallery[:3] + 0.5, 801)
    with pytest.raises(ValueError, match="exact index has nothing to tune"):
        Index("cosine").tune(gallery[:3], 1)
    without = Index("cosine", approximate="HNSW16", vectors=None)
    without.add(gallery)
    with pytest.raises(ValueError, match="keeps none"):
        without.tune(gallery[:3] + 0.5, 1)


def test_queries_nan_zero_and_huge():
    gallery, _ = _clusters(300)
    index = Index("l2", approximate="HNSW16")
    index.add(gallery)
    scores, indices = index.search(np.zeros((0, 16), np.float32), 4)
    assert scores.shape == indices.shape == (0, 4)
    bad = gallery[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"`queries` contains 1 non-finite row .* index 1"):
        index.search(bad, 2)
    with pytest.raises(ValueError, match=r"`queries` has entries up to 1e\+30, whose 'l2' "
                                         "scores can overflow float32"):
        index.search(np.full((1, 16), 1e30, np.float32), 2)
    with pytest.raises(ValueError, match="`k` must be at most the size of the index"):
        index.search(gallery[:2], 301)
    # cosine normalizes every finite row exactly: huge rows are fine there.
    cosine = Index("cosine", approximate="HNSW16")
    cosine.add(gallery * np.float32(1e30))
    assert cosine.search(gallery[:2] * np.float32(1e30), 1)[1][:, 0].tolist() == [0, 1]


def _rewrite(path, **changes):
    with np.load(path, allow_pickle=False) as data:
        fields = {name: data[name] for name in data.files}
    fields.update(changes)
    with open(path, "wb") as f:
        np.savez(f, **fields)


def test_load_refuses_another_faiss_version_another_metric_and_a_damaged_structure(tmp_path):
    gallery, _ = _clusters(500)
    index = Index("l2", approximate="HNSW16")
    index.add(gallery)
    path = tmp_path / "ann.npz"
    index.save(path)
    _rewrite(path, faiss_version=np.array("0.0.1"))
    with pytest.raises(ValueError, match=r"ann\.npz: field `faiss_version` says the approximate "
                                         r"structure was written by faiss 0\.0\.1"):
        Index.load(path)
    index.save(path)
    _rewrite(path, metric=np.array("dot"))
    with pytest.raises(ValueError, match=r"ann\.npz: field `faiss_index` measures with faiss "
                                         r"metric 1, not that of the index's metric 'dot'"):
        Index.load(path)
    index.save(path)
    with np.load(path) as data:
        cut = data["faiss_index"][:1000]
    _rewrite(path, faiss_index=cut)
    with pytest.raises(ValueError, match=r"ann\.npz: field `faiss_index` is not a faiss index"):
        Index.load(path)
    index.save(path)
    _rewrite(path, labels=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"ann\.npz: field `labels` must hold 500 integers"):
        Index.load(path)


def test_queries_an_approximate_index_finds_nothing_for_match_nothing():
    from tfdml.search import calibrate

    gallery, labels = _clusters(2000, centres=8)
    index = Index("l2", approximate="IVF32,Flat", parameters={"nprobe": 1})
    index.train(gallery)
    index.add(gallery[labels == 0], labels=labels[labels == 0])  # the other lists stay empty
    far = gallery[labels != 0][:50]
    found = index.lookup(far, 1)
    assert (found.indices[:, 0] == -1).any()
    matched = index.match(far, 1e9)
    np.testing.assert_array_equal(matched[found.indices[:, 0] < 0], -1)
    near = gallery[labels == 0][:50] + 0.01
    queries = np.concatenate([near, far])
    query_labels = np.concatenate([np.zeros(50, np.int64), labels[labels != 0][:50]])
    calibration = calibrate(index, queries, query_labels, 0.9)
    assert np.isfinite(calibration.threshold) and calibration.reached
    found_far = int((found.indices[:, 0] >= 0).sum())
    assert len(np.unique(calibration.thresholds)) <= 50 + found_far
    with pytest.raises(ValueError, match="found no neighbour for any calibration query"):
        calibrate(index, far[found.indices[:, 0] < 0], labels[labels != 0][:50][
            found.indices[:, 0] < 0], 0.9)


def test_adding_batches_shows_progress_with_verbose(capsys):
    gallery, _ = _clusters(600)
    index = Index("l2", approximate="HNSW16")
    index.add((gallery[s : s + 200] for s in range(0, 600, 200)), verbose=1)
    assert "600/Unknown" in capsys.readouterr().out and len(index) == 600
    index.add(gallery[:10])
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="`verbose` must be 0 or 1"):
        index.add(iter([gallery[:2]]), verbose=2)
