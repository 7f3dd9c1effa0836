"""Shared pytest setup: puts tests/ and tests/support/ on sys.path, hypothesis profiles,
dtype-policy hygiene.

Hypothesis profiles (select with ``HYPOTHESIS_PROFILE=<name>``):

* ``ci`` (default): derandomized, no deadline, few examples; reproducible on 2 CPU cores.
* ``thorough``: 300 random examples per test, for local bug hunting.

Tests that set ``@settings(max_examples=...)`` themselves keep their own count.
"""

import os
import sys
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# jit_compile tests spend most of their time in XLA's LLVM backend; its optimization level
# changes speed, not results, and level 0 halves the compile time on CPU. An XLA_FLAGS
# already set by the user wins.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# tests/support holds the helpers (references, harness, backends, pml_data), imported by
# their plain names.
for _path in (os.path.join(_TESTS_DIR, "support"), _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=20, deadline=None, derandomize=True, suppress_health_check=_SLOW_CHECKS
)
settings.register_profile(
    "thorough", max_examples=300, deadline=None, suppress_health_check=_SLOW_CHECKS
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def float64():
    """float64 tensors under JAX too (``jax_enable_x64``; a no-op under TensorFlow and PyTorch)."""
    from backends import enable_float64

    with enable_float64():
        yield


@pytest.fixture(autouse=True)
def _restore_dtype_policy():
    """A test that changes the global Keras dtype policy cannot leak it into the next one."""
    policy = keras.config.dtype_policy()
    yield
    if keras.config.dtype_policy().name != policy.name:
        keras.config.set_dtype_policy(policy)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "multibackend: runs under every Keras backend (KERAS_BACKEND=tensorflow, jax, torch); "
        "under JAX and PyTorch only these tests run",
    )


def _share(nodeid, share):
    """``share`` is ``"K/N"``: True for the tests whose stable hash is ``K`` modulo ``N``."""
    k, n = (int(part) for part in share.split("/"))
    return zlib.crc32(nodeid.encode()) % n == k % n


def pytest_collection_modifyitems(config, items):
    """Under a backend other than TensorFlow, keep only the tests marked ``multibackend``.

    ``TFDML_TEST_SHARE=K/N`` keeps one share of them: the tests whose ``crc32`` of the test
    id is ``K`` modulo ``N``. ``make test`` (CI) runs a share under TensorFlow and JAX, ``K``
    taken from the commit, so that successive commits run different shares; ``make
    test-full`` runs every test.
    """
    share = os.environ.get("TFDML_TEST_SHARE", "").strip()
    on_tf = keras.backend.backend() == "tensorflow"
    keep, drop = [], []
    for item in items:
        wanted = on_tf or item.get_closest_marker("multibackend")
        if wanted and share:
            wanted = _share(item.nodeid, share)
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
