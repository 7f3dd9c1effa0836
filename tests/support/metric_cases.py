"""Data and a comparison that the metric tests share (tests/test_metrics*.py).

* :func:`tied_embeddings`: embeddings with many exact ties, the same for tfdml and the
  float64 references of ``references.metrics``;
* :func:`assert_metric_close`: a metric's result (a float or ``{k: float}``) against its
  reference's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest


def tied_embeddings(seed, n, num_classes, pool=7, dim=6):
    """``(x [n, dim] float32, labels [n] int32)``: rows drawn from a small pool of vectors
    with four +-1 entries (norm 2), so many rows are equal.

    Normalized entries are +-0.5 and every dot product or squared distance is exact in
    float32, whatever the summation order, so ties are real ties for tfdml and the reference.
    """
    rng = np.random.default_rng(seed)
    rows = np.zeros((pool, dim), dtype=np.float32)
    for i in range(pool):
        cols = rng.choice(dim, size=4, replace=False)
        rows[i, cols] = rng.choice([-1.0, 1.0], size=4)
    x = rows[rng.integers(0, pool, size=n)]
    return x, rng.integers(0, num_classes, size=n).astype(np.int32)


def assert_metric_close(got, want):
    """``got`` is ``want`` to 1e-12: a Python float (``nan`` where ``want`` is), or a dict of
    them with the same keys."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_metric_close(got[key], want[key])
    elif math.isnan(want):
        assert math.isnan(got)
    else:
        assert isinstance(got, float) and got == pytest.approx(want, abs=1e-12)
