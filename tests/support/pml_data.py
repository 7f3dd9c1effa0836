"""The values recorded from pytorch-metric-learning 2.9 (``tests/fixtures/pml_2.9.npz``, written
by ``tests/fixtures/make_pml_fixtures.py``) and the batches the per-loss tests share."""

from __future__ import annotations

import os

import numpy as np
import pytest
from backends import BACKEND

_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(_TESTS_DIR, "fixtures", "pml_2.9.npz")
DATA = np.load(FIXTURE)

#: The recorded batches, as pytest params; under JAX only ``uneven`` (eager JAX compiles
#: every op once per new batch shape).
BATCHES = [pytest.param(b, marks=pytest.mark.skipif(
    BACKEND == "jax" and b != "uneven", reason="JAX: one batch (each shape compiles every op)"))
    for b in ("uneven", "pk", "pairs")]


def recorded(case, batch):
    """``(labels, embeddings, (value, grad))`` of a recorded loss on a recorded batch."""
    return DATA[f"{batch}/labels"], DATA[f"{batch}/embeddings"], (
        DATA[f"{case}/{batch}/value"], DATA[f"{case}/{batch}/grad"])


def uneven_batch(seed=0, dim=7):
    """12 samples of uneven classes, one a singleton (label 5), float64, B != D."""
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 5, 3, 3], np.int64)
    return labels, np.random.default_rng(seed).normal(size=(12, dim))
