"""Shared pytest setup: puts tests/, tests/support/ and examples/ on sys.path, hypothesis
profiles, dtype-policy hygiene.

Hypothesis profiles (select with ``HYPOTHESIS_PROFILE=<name>``):

* ``ci`` (default): derandomized, no deadline, few examples; reproducible on 2 CPU cores.
* ``thorough``: 300 random examples per test, for local bug hunting.

Tests that set ``@settings(max_examples=...)`` themselves keep their own count.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# jit_compile tests spend most of their time in XLA's LLVM backend; its optimization level
# changes speed, not results, and level 0 halves the compile time on CPU. An XLA_FLAGS
# already set by the user wins.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# tests/support holds the helpers (references, harness, backends, pml_data), imported by
# their plain names; examples/ the example scripts' training loop, imported as
# `experiments` (examples/experiments/), as the scripts import it.
_EXAMPLES_DIR = os.path.join(os.path.dirname(_TESTS_DIR), "examples")
for _path in (_EXAMPLES_DIR, os.path.join(_TESTS_DIR, "support"), _TESTS_DIR):
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


#: The global seed each test starts from (Python's ``random``, NumPy's global generator and
#: the backend's, through ``keras.utils.set_random_seed``). A test's result must not depend
#: on it: a test that draws without its own seed or generator gives the same result at
#: ``TFDML_TEST_SEED=1`` as at the default, or it is a flaky test.
TEST_SEED = int(os.environ.get("TFDML_TEST_SEED", "0"))


@pytest.fixture(autouse=True)
def _global_seed():
    keras.utils.set_random_seed(TEST_SEED)


@pytest.fixture(autouse=True)
def _restore_dtype_policy():
    """A test that changes the global Keras dtype policy cannot leak it into the next one."""
    policy = keras.config.dtype_policy()
    yield
    if keras.config.dtype_policy().name != policy.name:
        keras.config.set_dtype_policy(policy)


#: The fixed set of backend-generic tests that the fast tier runs under JAX and PyTorch on
#: every commit (test-id prefixes): every loss configuration's values and gradients against
#: the float64 record, eager and compiled; every miner against its reference; the ops, the
#: distances and the retrieval metrics against theirs. The other tests marked
#: ``multibackend`` run under JAX and PyTorch in the slow tier (``make test-slow``).
CORE = (
    "tests/losses/test_recorded_losses.py::",
    "tests/losses/test_loss_base.py::test_every_public_loss_is_a_contract_case_or_exempt",
    "tests/miners/test_miners.py::test_miner_matches_reference",
    "tests/miners/test_miners.py::test_disjoint_miner_matches_reference",
    "tests/miners/test_miners.py::test_miner_under_xla_matches_reference",
    "tests/miners/test_miners.py::test_multi_similarity_miner_matches_reference",
    "tests/miners/test_miners.py::test_as_pairs_matches_reference",
    "tests/miners/test_miners.py::test_as_triplets_matches_reference",
    "tests/miners/test_miners.py::test_same_seed_same_choices",
    "tests/miners/test_miners.py::test_random_choices",
    "tests/miners/test_miners.py::test_distance_weighted_",
    "tests/miners/test_distance_miners.py::test_selects_what_pytorch_metric_learning_selects",
    "tests/miners/test_distance_miners.py::test_batch_easy_hard_miner_matches_the_reference",
    "tests/miners/test_uniform_histogram_miner.py::test_bins_and_filled_bins_agree_with_pml",
    "tests/miners/test_packaged_triplets.py::test_triplet_margin_loss_with_it_equals_pytorch",
    "tests/test_ops.py::",
    "tests/test_distances.py::",
    "tests/test_metrics.py::test_retrieval_metrics_match_reference_on_random_data",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "multibackend: runs under every Keras backend (KERAS_BACKEND=tensorflow, jax, torch); "
        "under JAX and PyTorch only these tests run",
    )
    config.addinivalue_line(
        "markers",
        "core: set by conftest.CORE: the backend-generic tests that run under JAX and PyTorch "
        "on every commit (`make test`); the other `multibackend` ones run in `make test-slow`",
    )


def pytest_collection_modifyitems(config, items):
    """Under a backend other than TensorFlow, keep only the tests marked ``multibackend``;
    mark those of :data:`CORE` ``core``."""
    on_tf = keras.backend.backend() == "tensorflow"
    keep, drop = [], []
    for item in items:
        backend_generic = item.get_closest_marker("multibackend") is not None
        if backend_generic and item.nodeid.startswith(CORE):
            item.add_marker(pytest.mark.core)
        (keep if on_tf or backend_generic else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
