"""Retrieval metrics at scale: exclusions by group, Precision@K, MAP@K, FNMR@FMR and PCF.

Each metric against the plain references of tests/support/references/ (all pairs, loops), on
inputs with exact ties, with and without a separate gallery and groups; every chunking
gives the same result; the score blocks stay within the chunk sizes; open-metric-learning's
definitions where they differ (tfdml does not depend on it: its formulas are written out).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import references as ref
from backends import BACKEND
from harness import slow_beyond
from metric_cases import assert_metric_close, tied_embeddings

from tfdml import metrics, search
from tfdml.metrics import verification

MB = pytest.mark.multibackend  # also under JAX and PyTorch (see conftest.py)

RANKED = ("recall", "precision", "map_at_k", "map_at_r", "r_precision")
AT_K = {"recall": metrics.recall_at_k, "precision": metrics.precision_at_k,
        "map_at_k": metrics.map_at_k}
# JAX compiles every eager op once per shape: there, one chunking (a gallery chunk below k).
CHUNKINGS = [(1024, 65536), (1, 7), (4, 3), (7, 16)] if BACKEND == "tensorflow" else [(4, 3)]


def _random(seed, n, dim, num_classes):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n).astype(np.int32)
    x = rng.normal(size=(num_classes, dim))[labels] + 1.2 * rng.normal(size=(n, dim))
    return x.astype(np.float32), labels


def _groups(seed, n, num_groups):
    return np.random.default_rng(seed).integers(0, num_groups, size=n).astype(np.int64)


def _call(name, *args, **kwargs):
    """tfdml's metric ``name`` (``ks`` dropped for the R-based ones)."""
    if name in AT_K:
        return AT_K[name](*args, **kwargs)
    kwargs.pop("ks", None)
    return getattr(metrics, name)(*args, **kwargs)


def _cases(seed, n=26):
    """(data, groups) keyword arguments of a self-retrieval and a separate-gallery case."""
    x, y = tied_embeddings(seed, n, 4, pool=15)
    groups = _groups(seed + 1, n, 9)
    self_case = ({"embeddings": x, "labels": y}, {"groups": groups})
    split = ({"embeddings": x[:9], "labels": y[:9], "gallery_embeddings": x[9:],
              "gallery_labels": y[9:]}, {"groups": groups[:9], "gallery_groups": groups[9:]})
    return [self_case, split]


# -- the retrieval metrics with groups, against the reference ----------------------------------


# Every metric with cosine scores, and l2 scores (the same grouping code) with one of them,
# on every commit; the other l2 pairs in the slow tier.
@pytest.mark.parametrize("metric,name", slow_beyond(
    [pytest.param(m, n, id=f"{m}-{n}", marks=[MB] if m == "cosine" else [])
     for m in ("cosine", "l2") for n in RANKED],
    {*(f"cosine-{n}" for n in RANKED), "l2-recall"}))
def test_ranked_metrics_with_groups_match_the_reference(name, metric):
    for data, groups in _cases(3):
        want = ref.grouped_metric(name, **data, ks=(1, 2, 5), metric=metric, **groups)
        for chunks in CHUNKINGS:
            got = _call(name, **data, ks=(1, 2, 5), metric=metric, chunk_size=chunks[0],
                        gallery_chunk_size=chunks[1], **groups)
            assert_metric_close(got, want)
        # Without groups: the plain reference (self-exclusion only).
        assert_metric_close(_call(name, **data, ks=(1, 2, 5), metric=metric),
               ref.grouped_metric(name, **data, ks=(1, 2, 5), metric=metric))


@MB
@pytest.mark.parametrize("name", ["precision", "map_at_k"])
@pytest.mark.parametrize("split", [False, True])
def test_new_metrics_on_random_data(name, split):
    x, y = _random(5, 30, 5, 6)
    data = {"embeddings": x, "labels": y}
    if split:
        data = {"embeddings": x[:11], "labels": y[:11], "gallery_embeddings": x[11:],
                "gallery_labels": y[11:]}
    for unmatched in ("exclude", "miss"):
        want = ref.grouped_metric(name, **data, ks=(1, 3, 7), unmatched=unmatched)
        got = _call(name, **data, ks=(1, 3, 7), unmatched=unmatched, chunk_size=4,
                    gallery_chunk_size=5)
        assert_metric_close(got, want)
        assert 0.0 < min(want.values()) < 1.0  # meaningful data


@MB
def test_cmc_with_groups():
    x, y = tied_embeddings(8, 30, 5)
    groups = _groups(9, 30, 6)
    q, g, qg, gg = x[:10], x[10:], groups[:10], groups[10:]
    got = metrics.cmc(q, y[:10], g, y[10:], top_k=6, chunk_size=3, gallery_chunk_size=4,
                      groups=qg, gallery_groups=gg)
    want = ref.grouped_metric("recall", q, y[:10], range(1, 7), g, y[10:], groups=qg,
                              gallery_groups=gg)
    np.testing.assert_allclose(got, [want[k] for k in range(1, 7)], atol=1e-12)
    assert got.dtype == np.float64 and (np.diff(got) >= 0).all()


@MB
def test_one_group_per_item_is_self_exclusion():
    x, y = tied_embeddings(11, 24, 4)
    alone = np.arange(24)
    for name in RANKED:
        base = _call(name, x, y, ks=(1, 4))
        assert _call(name, x, y, ks=(1, 4), groups=alone) == base
        # A gallery that copies the queries, each item in its query's group: the same.
        assert _call(name, x, y, ks=(1, 4), gallery_embeddings=x, gallery_labels=y,
                     groups=alone, gallery_groups=alone) == base


def test_groups_leave_items_out_of_the_ranking():
    # Query 0's two nearest items are of its class but in its group: recall@1 is then decided
    # by the third item, and R counts only the item outside the group.
    q = np.array([[1.0, 0.0]])
    g = np.array([[1.0, 0.05], [1.0, 0.1], [1.0, 0.4], [1.0, 0.5]])
    labels = [0, 0, 1, 0]
    kwargs = {"groups": [7], "gallery_groups": [7, 7, 1, 2]}
    assert metrics.recall_at_k(q, [0], (1, 2), g, labels, **kwargs) == {1: 0.0, 2: 1.0}
    assert metrics.r_precision(q, [0], g, labels, **kwargs) == 0.0  # R = 1, rank 1 is class 1
    assert metrics.map_at_r(q, [0], g, labels, **kwargs) == 0.0
    assert metrics.map_at_k(q, [0], (2,), g, labels, **kwargs) == {2: 0.5}  # (1/2) / min(2, 1)
    assert metrics.precision_at_k(q, [0], (2,), g, labels, **kwargs) == {2: 0.5}
    with pytest.raises(ValueError, match=r"`ks` asks for 3 .* offers only 2 .* `groups`"):
        metrics.recall_at_k(q, [0], (3,), g, labels, **kwargs)


def test_a_group_that_holds_the_whole_gallery_for_one_query():
    x, y = tied_embeddings(13, 12, 3)
    q, g = x[:4], x[4:]
    qg = np.array([0, 1, 1, 2])
    gg = np.zeros(8, np.int64)  # query 0's group is the whole gallery: it sees nothing
    for name in ("map_at_r", "r_precision"):  # query 0 has R = 0: left out
        for unmatched in ("exclude", "miss"):
            got = _call(name, q, y[:4], g, y[4:], unmatched=unmatched, groups=qg,
                        gallery_groups=gg, chunk_size=2, gallery_chunk_size=3)
            assert_metric_close(got, ref.grouped_metric(name, q, y[:4], (), g, y[4:], unmatched=unmatched,
                                           groups=qg, gallery_groups=gg))
    with pytest.raises(ValueError, match="offers only 0 to some query: 8 of its 8 items"):
        metrics.recall_at_k(q, y[:4], (1,), g, y[4:], groups=qg, gallery_groups=gg)
    got = metrics.fnmr_at_fmr(q, y[:4], (0.2, 0.5), g, y[4:], groups=qg, gallery_groups=gg)
    assert_metric_close(got, ref.fnmr_at_fmr(q, y[:4], (0.2, 0.5), g, y[4:], groups=qg, gallery_groups=gg))


# -- open-metric-learning's definitions ----------------------------------------------------------


def _oml_example():
    """Three equal queries of classes 0, 1, 2 against 10 gallery items at decreasing cosine:
    the relevance of the top 2 is [1, 0], [0, 1], [0, 0] and R is 2, 3, 5 (the example of
    open-metric-learning's ``calc_map`` and ``calc_precision`` docstrings)."""
    q = np.array([[1.0, 0.0]] * 3)
    g = np.stack([np.ones(10), 0.1 * np.arange(10)], axis=1)
    return q, [0, 1, 2], g, [0, 1, 0, 1, 1, 2, 2, 2, 2, 2]


@MB
def test_map_at_k_is_open_metric_learnings_map():
    q, ql, g, gl = _oml_example()
    # OML: map@1 = [1, 0, 0], map@2 = [0.5, 0.25, 0] per query.
    got = metrics.map_at_k(q, ql, (1, 2), g, gl)
    assert got == pytest.approx({1: 1 / 3, 2: 0.75 / 3}, abs=1e-15)
    # precision@2 = [0.5, 0.5, 0]: k <= R for every query, so both definitions agree.
    assert metrics.precision_at_k(q, ql, (1, 2), g, gl) == pytest.approx({1: 1 / 3, 2: 1 / 3})
    assert metrics.recall_at_k(q, ql, (1, 2), g, gl) == pytest.approx({1: 1 / 3, 2: 2 / 3})


def test_precision_at_k_differs_from_oml_only_where_r_is_below_k():
    x, y = tied_embeddings(17, 30, 6)
    ks = (1, 3, 8)
    rankings = ref.visible_rankings(x)
    rels = [[y[g] == y[i] for g in ranking] for i, ranking in enumerate(rankings)]
    kept = [rel for rel in rels if sum(rel) > 0]
    oml = {k: np.mean([sum(rel[:k]) / min(k, sum(rel)) for rel in kept]) for k in ks}
    plain = {k: np.mean([sum(rel[:k]) / k for rel in kept]) for k in ks}
    got = metrics.precision_at_k(x, y, ks)
    assert_metric_close(got, {k: float(v) for k, v in plain.items()})
    assert got[1] == pytest.approx(oml[1], abs=1e-12)  # K = 1 <= every R: the same
    assert got[8] < oml[8] - 0.05  # queries with R < 8 score at most R/8 here, up to 1 in OML


@MB
def test_fnmr_at_fmr_on_the_oml_example():
    genuine = [0, 0, 1, 1, 2, 2, 5, 5, 9, 9]
    impostor = [3, 3, 4, 4, 6, 6, 7, 7, 8, 8]
    gallery = np.array(genuine + impostor, np.float32)[:, None]
    labels = [0] * 10 + [1] * 10
    got = metrics.fnmr_at_fmr(np.zeros((1, 1)), [0], (0.1, 0.5), gallery, labels, metric="l2")
    assert got == {0.1: 0.4, 0.5: 0.2}  # OML's docstring: [0.4, 0.2]
    assert got == ref.oml_fnmr_at_fmr(genuine, impostor, (0.1, 0.5))
    # Where OML's interpolated quantile falls between two impostor distances with a genuine
    # pair in the gap, the definitions part. A genuine pair at 3.2: FMR 0.15 allows 1 of the
    # 10 impostors, but the two nearest are tied at 3, so tfdml's threshold stays below 3 and
    # rejects 3.2, 5, 5, 9, 9. OML's quantile is 3.35 (between the 2nd and 3rd impostor
    # distances): it accepts 3.2 and both impostors at 3, an FMR of 0.2 above the target.
    gallery[0] = 3.2
    genuine[0] = 3.2
    got = metrics.fnmr_at_fmr(np.zeros((1, 1)), [0], (0.15,), gallery, labels, metric="l2")
    assert got == {0.15: 0.5}
    assert ref.oml_fnmr_at_fmr(genuine, impostor, (0.15,)) == {0.15: 0.4}
    assert np.quantile(impostor, 0.15) == pytest.approx(3.35)


@MB
def test_pcf_on_the_oml_example():
    # OML's calc_pcf docstring: eye(4, 10) gives 0.2 at 0.5 (2 of the 3 equal components).
    # At 1.0 OML counts one component more than the 3 that reach it exactly (0.5 there).
    assert metrics.pcf(np.eye(4, 10), (0.5, 1.0)) == {0.5: 0.2, 1.0: 0.3}
    assert metrics.pcf(np.eye(4, 10), 0.5) == 0.2


# -- FNMR@FMR --------------------------------------------------------------------------------


FMRS = (0.01, 0.1, 0.25, 0.5, 0.9)


# l2 (slow tier): the same thresholds and groups as cosine; l2 scores on every commit in
# test_fnmr_at_fmr_on_random_data_and_integer_l2.
@pytest.mark.parametrize("metric", slow_beyond([pytest.param("cosine", marks=MB), "l2"],
                                               {"cosine"}))
def test_fnmr_at_fmr_matches_the_reference(metric):
    for data, groups in _cases(21, n=24):
        for extra in ({}, groups):
            want = ref.fnmr_at_fmr(**data, fmrs=FMRS, metric=metric, **extra)
            for chunks in CHUNKINGS:
                got = metrics.fnmr_at_fmr(**data, fmr=FMRS, metric=metric, chunk_size=chunks[0],
                                          gallery_chunk_size=chunks[1], **extra)
                assert got == want
            assert len(set(want.values())) >= 3  # meaningful data
    # One query and one gallery item per block.
    x, y = tied_embeddings(22, 12, 3)
    assert metrics.fnmr_at_fmr(x, y, FMRS, chunk_size=1, gallery_chunk_size=1) == \
        ref.fnmr_at_fmr(x, y, FMRS)


@MB
def test_fnmr_at_fmr_on_random_data_and_integer_l2():
    x, y = _random(23, 36, 4, 5)
    want = ref.fnmr_at_fmr(x, y, FMRS)
    assert metrics.fnmr_at_fmr(x, y, FMRS, chunk_size=5, gallery_chunk_size=7) == want
    assert len(set(want.values())) > 2
    # Integer embeddings, l2: many equal distances, all exact.
    z = np.random.default_rng(24).integers(-2, 3, size=(30, 3)).astype(np.float32)
    want = ref.fnmr_at_fmr(z[:12], y[:12], FMRS, z[12:], y[12:30], metric="l2")
    got = metrics.fnmr_at_fmr(z[:12], y[:12], FMRS, z[12:], y[12:30], metric="l2",
                              chunk_size=5, gallery_chunk_size=4)
    assert got == want


def test_fnmr_at_fmr_thresholds_on_huge_and_negative_scores():
    # l2 on entries near the float32 limit (scored scaled by a power of two) and cosine
    # scores of both signs: the keys order every float32 value.
    x, y = tied_embeddings(25, 20, 3)
    huge = x * np.float32(2.0**63)  # squared distances beyond float32: searched scaled
    assert search.score_scale(2.0**63, 6, "l2") < 1.0
    assert metrics.fnmr_at_fmr(huge, y, FMRS, metric="l2") == ref.fnmr_at_fmr(x, y, FMRS,
                                                                             metric="l2")
    scores = np.array([-2.0, -1.0, -0.0, 0.0, 1e-30, 0.5, 3e38], np.float32)
    keys = verification._keys(scores)
    assert (np.diff(keys.astype(np.int64)) >= 0).all() and keys[2] == keys[3]


def test_fnmr_at_fmr_degenerate_cases():
    x, y = tied_embeddings(27, 16, 3)
    with pytest.raises(ValueError, match="and 0 impostor pairs"):
        metrics.fnmr_at_fmr(x, np.zeros(16, np.int32))  # one class
    with pytest.raises(ValueError, match="Received: 0 genuine and"):
        metrics.fnmr_at_fmr(x, np.arange(16))
    # Every pair at the same score: no threshold accepts some impostors and not all, so
    # every genuine pair is rejected below FMR 1.
    same = np.ones((16, 3), np.float32)
    assert metrics.fnmr_at_fmr(same, y, (0.1, 0.9)) == {0.1: 1.0, 0.9: 1.0}
    assert metrics.fnmr_at_fmr(x, y, 0.5) == ref.fnmr_at_fmr(x, y, (0.5,))  # a number


# -- PCF ------------------------------------------------------------------------------------


@MB
def test_pcf_matches_the_reference():
    rng = np.random.default_rng(31)
    scales = np.array([9.0, 5.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.1])
    x = (rng.normal(size=(300, 8)) * scales + 40.0).astype(np.float32)  # an offset, too
    shares = (0.3, 0.6, 0.8, 0.95, 0.99, 1.0)
    want = ref.pcf(x, shares)
    for chunk_size in (1, 7, 65536):
        assert metrics.pcf(x, shares, chunk_size=chunk_size) == want
    assert len(set(want.values())) > 3


def test_pcf_of_collapsed_and_degenerate_embeddings():
    rng = np.random.default_rng(32)
    # Rank 1 (a full collapse), exact in float32: integers times integers.
    line = (rng.integers(-5, 6, size=(50, 1)) * rng.integers(1, 4, size=(1, 16))).astype(
        np.float32)
    assert metrics.pcf(line, (0.5, 1.0)) == {0.5: 1 / 16, 1.0: 1 / 16}
    spread = rng.normal(size=(400, 16))
    assert metrics.pcf(spread, 0.5) > 0.3
    for flat in (np.full((20, 5), 0.1, np.float32), np.ones((1, 5))):
        assert math.isnan(metrics.pcf(flat))  # no variance: no principal components
        assert all(math.isnan(v) for v in metrics.pcf(flat, (0.5, 1.0)).values())


# -- memory, validation, non-finite rows ------------------------------------------------------


def test_score_blocks_are_bounded_by_the_chunk_sizes(monkeypatch):
    shapes = []
    original = search.exact.block_scores

    def spy(queries, gallery, metric):
        out = original(queries, gallery, metric)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(search.exact, "block_scores", spy)
    x, y = tied_embeddings(41, 50, 5)
    groups = _groups(42, 50, 20)
    calls = [
        lambda **kw: metrics.precision_at_k(x, y, (1, 8), groups=groups, **kw),
        lambda **kw: metrics.map_at_k(x, y, (1, 8), groups=groups, **kw),
        lambda **kw: metrics.map_at_r(x, y, groups=groups, **kw),
        lambda **kw: metrics.fnmr_at_fmr(x, y, (0.1,), groups=groups, **kw),
        lambda **kw: metrics.fnmr_at_fmr(x[:20], y[:20], (0.1,), x[20:], y[20:], **kw),
    ]
    for call in calls:
        shapes.clear()
        got = call(chunk_size=8, gallery_chunk_size=16)
        assert shapes and max(s[0] for s in shapes) <= 8 and max(s[1] for s in shapes) <= 16
        assert got == call()
    # The host counts a block a few rows at a time: the same result.
    want = metrics.fnmr_at_fmr(x, y, FMRS, groups=groups, chunk_size=8, gallery_chunk_size=16)
    monkeypatch.setattr(verification, "_HOST_PAIRS", 5)
    assert metrics.fnmr_at_fmr(x, y, FMRS, groups=groups, chunk_size=8,
                               gallery_chunk_size=16) == want
    # fnmr_at_fmr streams every block twice, and skips the blocks under the diagonal.
    shapes.clear()
    metrics.fnmr_at_fmr(x, y, (0.1,), chunk_size=10, gallery_chunk_size=10)
    assert len(shapes) == 2 * 15  # the 15 blocks (i, j) with j >= i of a 5 x 5 grid


def test_the_public_names():
    assert {"precision_at_k", "map_at_k", "fnmr_at_fmr", "pcf"} <= set(metrics.__all__)
    assert metrics.fnmr_at_fmr is verification.fnmr_at_fmr and metrics.pcf is verification.pcf
    for fn in (metrics.precision_at_k, metrics.map_at_k, metrics.map_at_r, metrics.cmc):
        assert "{" + "GROUPS}" not in fn.__doc__ and "gallery_groups" in fn.__doc__


@MB
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, y, g: metrics.recall_at_k(x, y, groups=g.astype(float)), "groups.dtype"),
        (lambda x, y, g: metrics.map_at_r(x, y, groups=np.where(g >= 2, np.nan, g)),
         "`groups` contains .* non-finite"),
        (lambda x, y, g: metrics.map_at_k(x, y, groups=g[:, None]), r"groups.shape=\(12, 1\)"),
        (lambda x, y, g: metrics.precision_at_k(x, y, groups=g[:5]), "one group id per row"),
        (lambda x, y, g: metrics.r_precision(x, y, gallery_groups=g), "without `groups`"),
        (lambda x, y, g: metrics.recall_at_k(x, y, (1,), groups=g, gallery_groups=g),
         "without `gallery_embeddings`"),
        (lambda x, y, g: metrics.recall_at_k(x, y, (1,), x, y, groups=g),
         "gallery_groups=None"),
        (lambda x, y, g: metrics.cmc(x, y, x, y, groups=g, gallery_groups=g[:4].tolist()),
         "`gallery_groups` must have one group id"),
        (lambda x, y, g: metrics.recall_at_k(x, y, (1,), groups=[True] * 12), "dtype=bool"),
        (lambda x, y, g: metrics.precision_at_k(x, y, (12,)), "ks"),
        (lambda x, y, g: metrics.map_at_k(x, y, (0,)), "ks"),
        (lambda x, y, g: metrics.fnmr_at_fmr(x, y, (0.0,)), r"fmr=\(0.0,\)"),
        (lambda x, y, g: metrics.fnmr_at_fmr(x, y, 1.0), "fmr=1.0"),
        (lambda x, y, g: metrics.fnmr_at_fmr(x, y, ()), "fmr"),
        (lambda x, y, g: metrics.fnmr_at_fmr(x, y, metric="dot"), "metric='dot'"),
        (lambda x, y, g: metrics.fnmr_at_fmr(x, y, chunk_size=0), "chunk_size=0"),
        (lambda x, y, g: metrics.pcf(x, 0.0), "explained_variance=0.0"),
        (lambda x, y, g: metrics.pcf(x, (0.5, 1.5)), "explained_variance"),
        (lambda x, y, g: metrics.pcf(x, chunk_size=0), "chunk_size=0"),
        (lambda x, y, g: metrics.pcf(x[:0]), "empty"),
        (lambda x, y, g: metrics.pcf(x[0]), "embeddings.shape"),
    ],
)
def test_validation_errors(call, match):
    x, y = tied_embeddings(51, 12, 3)
    with pytest.raises(ValueError, match=match) as info:
        call(x, y, _groups(52, 12, 4))
    assert "Received:" in str(info.value)


@MB
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nonfinite_rows_are_refused(value):
    x, y = tied_embeddings(61, 14, 3)
    bad = x.copy()
    bad[3, 1] = value
    calls = {
        "embeddings": [lambda e: metrics.precision_at_k(e, y),
                       lambda e: metrics.map_at_k(e, y, (1,)),
                       lambda e: metrics.fnmr_at_fmr(e, y),
                       lambda e: metrics.pcf(e),
                       lambda e: metrics.precision_at_k(e[:5], y[:5], (1,), x, y)],
        "gallery_embeddings": [lambda e: metrics.map_at_k(x[:5], y[:5], (1,), e, y),
                               lambda e: metrics.fnmr_at_fmr(x[:5], y[:5], 0.1, e, y)],
    }
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError, match=f"^`{name}` contains 1 non-finite row"):
                fn(bad)
