"""Non-finite embeddings: every public metric raises a ValueError naming the argument.

The contract (docs/metrics.md, "Non-finite embeddings"): a NaN or an Inf in a
row of any embedding argument raises a ``ValueError`` whose message starts with
"`<argument>` contains <n> non-finite row(s)". The self-exclusion of the
retrieval metrics is by index, so even a search that gets NaN scores (the
check bypassed) never returns a query as its own neighbour.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras import ops

from tfdml import metrics
from tfdml import ops as dml
from tfdml.metrics import _neighbours

MB = pytest.mark.multibackend  # also run under JAX and PyTorch (see conftest.py)
# JAX without x64 converts float64 inputs to float32 with a RuntimeWarning on overflow.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

N = 40
NUM_CLASSES = 8


def _clean(seed=0, n=N):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % NUM_CLASSES
    x = rng.normal(size=(NUM_CLASSES, 6))[labels] + 0.5 * rng.normal(size=(n, 6))
    return x.astype(np.float32), labels.astype(np.int32)


def _nan_row(x):
    x = x.copy()
    x[3, 1] = np.nan
    return x, 1


def _inf_rows(x):
    x = x.copy()
    x[2, 0] = np.inf
    x[5, 4] = -np.inf
    return x, 2


def _all_nan(x):
    return np.full_like(x, np.nan), len(x)


def _float64_overflow(x):
    # Finite in float64, Inf once converted to float32 (the metrics compute in float32).
    x = x.astype(np.float64)
    x[4, 2] = 1e300
    return x, 1


CORRUPTIONS = {"nan_row": _nan_row, "inf_rows": _inf_rows, "all_nan": _all_nan,
               "float64_overflow": _float64_overflow}


# Each case: (metric, argument that gets the bad rows, call(x_clean, y, bad) -> result).
def _self(fn, **kw):
    return lambda x, y, bad: fn(bad, y, **kw)


def _gallery_query(fn, **kw):
    return lambda x, y, bad: fn(bad[:10], y[:10], gallery_embeddings=x, gallery_labels=y, **kw)


def _gallery_side(fn, **kw):
    return lambda x, y, bad: fn(x[:10], y[:10], gallery_embeddings=bad, gallery_labels=y, **kw)


CASES = [
    ("recall_at_k", "embeddings", _self(metrics.recall_at_k, ks=(1, 2))),
    ("recall_at_k", "embeddings", _self(metrics.recall_at_k, ks=(1,), metric="l2",
                                        chunk_size=7, gallery_chunk_size=5)),
    ("recall_at_k", "gallery_embeddings", _gallery_side(metrics.recall_at_k, ks=(1,))),
    ("map_at_r", "embeddings", _self(metrics.map_at_r)),
    ("map_at_r", "gallery_embeddings", _gallery_side(metrics.map_at_r)),
    ("r_precision", "embeddings", _self(metrics.r_precision, metric="l2")),
    ("r_precision", "gallery_embeddings", _gallery_side(metrics.r_precision)),
    ("cmc", "query_embeddings", lambda x, y, bad: metrics.cmc(bad, y, x, y, top_k=3)),
    ("cmc", "gallery_embeddings", lambda x, y, bad: metrics.cmc(x, y, bad, y, top_k=3)),
    ("vehicleid_match_rate", "embeddings",
     _self(metrics.vehicleid_match_rate, ks=(1, 2), num_draws=2)),
    ("nmi", "embeddings", _self(metrics.nmi)),
    ("f1_clustering", "embeddings", _self(metrics.f1_clustering, metric="l2")),
]


@MB
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
@pytest.mark.parametrize(("name", "arg", "call"), CASES,
                         ids=[f"{name}-{arg}-{i}" for i, (name, arg, _) in enumerate(CASES)])
def test_every_metric_rejects_nonfinite_embeddings(name, arg, call, corruption):
    x, y = _clean()
    bad, count = CORRUPTIONS[corruption](x)
    rows = "row" if count == 1 else "rows"
    with pytest.raises(ValueError, match=f"^`{arg}` contains {count} non-finite {rows} "
                                         r"\(NaN or Inf\)") as info:
        call(x, y, bad)
    assert "Received:" in str(info.value) and arg in str(info.value).split("Received:")[1]


@MB
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
@pytest.mark.parametrize("fn", [metrics.recall_at_k, metrics.map_at_r, metrics.r_precision])
def test_query_side_of_a_separate_gallery(fn, corruption):
    x, y = _clean()
    bad, count = CORRUPTIONS[corruption](x)
    count = min(count, 10)  # the queries are the first 10 rows
    rows = "row" if count == 1 else "rows"
    with pytest.raises(ValueError, match=f"^`embeddings` contains {count} non-finite {rows}"):
        _gallery_query(fn)(x, y, bad)


@MB
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_all_nan_embeddings_do_not_score_perfectly_at_n_200(metric):
    # The reported case: with a -inf score for the query itself, tf.math.top_k returned the
    # query as its own nearest neighbour on NaN rows, and Recall@1 came out as 1.0.
    _, y = _clean(n=200)
    x = np.full((200, 4), np.nan, np.float32)
    with pytest.raises(ValueError, match="`embeddings` contains 200 non-finite rows"):
        metrics.recall_at_k(x, y, (1,), metric=metric)


@MB
@pytest.mark.parametrize("fn", [metrics.nmi_score, metrics.pairwise_f1_score])
@pytest.mark.parametrize("arg", ["labels", "clusters"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_labelings_with_nonfinite_values(fn, arg, value):
    good = np.array([0.0, 0.0, 1.0, 1.0, 2.0])
    bad = good.copy()
    bad[2] = value
    kwargs = {"labels": good, "clusters": good, arg: bad}
    with pytest.raises(ValueError, match=f"^`{arg}` contains 1 non-finite value .*index 2"):
        fn(**kwargs)


# -- self-exclusion by index ---------------------------------------------------------------------


def _search(x, k, metric, chunk_size, gallery_chunk_size):
    """All neighbour indices of the self-excluding search, bypassing the finiteness check."""
    q = dml.l2_normalize(x) if metric == "cosine" else x
    parts = [idx for _, idx in _neighbours.neighbour_chunks(q, q, k, True, metric, chunk_size,
                                                            gallery_chunk_size)]
    return np.concatenate(parts)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize(("n", "chunk_size", "gallery_chunk_size"),
                         [pytest.param(10, 1024, 16384, marks=MB),
                          pytest.param(10, 7, 5, marks=MB), (10, 1, 1),
                          pytest.param(200, 1024, 16384, marks=MB), (200, 64, 48)])
def test_a_query_is_never_its_own_neighbour_even_on_nan_rows(metric, n, chunk_size,
                                                            gallery_chunk_size):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[1::3] = x[0]  # many exact duplicates: ties between a query and its copies
    x[[2, 7]] = np.nan  # NaN rows: every score of these queries is NaN
    x[5, 0] = np.inf
    k = 4
    idx = _search(ops.convert_to_tensor(x), k, metric, chunk_size, gallery_chunk_size)
    assert idx.shape == (n, k)
    assert not np.any(idx == np.arange(n)[:, None])
    # Every row lists k distinct gallery items.
    assert all(len(set(row)) == k for row in idx)
