"""Every loss gives the values and gradients recorded in ``tests/fixtures/recorded_losses.npz``,
under every backend, eager and compiled.

The record was made under TensorFlow before the losses were declared as specs and must stay
as it is: a change to how losses are declared, reduced or mined that moves any number fails
here. ``tests/fixtures/make_recorded_losses.py`` writes it.

* TensorFlow: every recorded array (float64 and float32; with and without sample weights;
  the gradients of the learned variables; the per-anchor values of ``call``). Exact
  (bit-identical) where ``TFDML_EXACT_RECORD=1``, as it was checked on the machine that
  recorded it; otherwise within a few units in the last place, so that another CPU's kernels
  (FMA, vector width) do not fail it.
* JAX and PyTorch: the same arrays but the learned variables' gradients, within the
  tolerance of another backend's kernels (``BACKEND_TOLERANCE``). PyTorch checks every case
  eagerly; eager JAX compiles each op for each shape and dtype, so it checks the float64
  arrays of one case per loss class eagerly.
* Compiled (``tf.function(jit_compile=True)``, ``jax.jit``; PyTorch has no compiled path):
  the float32 value and embedding gradient of one case per loss class and per miner kind
  and of the cases outside the contract list (row blocks, memory banks, ``compat.tfa``) on
  every commit; every other deterministic case in the slow tier (``make test-slow``). The
  functional forms are compiled under JAX.

A case whose miner draws at random (``random``, ``distance_weighted``) draws from another
stream under JAX and PyTorch, and compiled: there the miner-against-reference tests check
what it mined (``tests/miners/test_miners.py``, ``recorded_mining.run_recorded``) and this
file skips it, and the cases of ``tfdml.compat.tfa`` (TensorFlow tensors) under
another backend.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, enable_float64
from harness import is_deterministic
from loss_cases import LOSS_CASES, ONE_PER_CLASS, ONE_PER_CLASS_AND_MINER
from recorded_losses import FUNCTIONAL, cases, compiled_case, record_case, record_functional

pytestmark = pytest.mark.multibackend

RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                      "recorded_losses.npz")
EXACT = os.environ.get("TFDML_EXACT_RECORD") == "1" and BACKEND == "tensorflow"
#: rtol = atol per dtype: TensorFlow on another CPU, and another backend's kernels.
TF_TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}
BACKEND_TOLERANCE = {np.float64: 1e-9, np.float32: 2e-4}


@pytest.fixture(scope="module")
def recorded():
    with np.load(RECORD) as data:
        return dict(data)


def _compare(got: dict, recorded: dict, prefix: str):
    want = {k: v for k, v in recorded.items() if k.startswith(prefix + "/")}
    if BACKEND != "tensorflow":
        # A learned variable's gradient (grad1, grad2, ...) is TensorFlow's alone.
        want = {k: v for k, v in want.items()
                if "grad" not in (what := k.split("/")[1]) or what.split("grad")[1][0] == "0"}
    dtypes = {key.rsplit("_", 1)[1] for key in got}
    want = {k: v for k, v in want.items() if k.rsplit("_", 1)[1] in dtypes}
    assert sorted(got) == sorted(want), ("recorded quantities differ",
                                         sorted(set(got) ^ set(want)))
    table = TF_TOLERANCE if BACKEND == "tensorflow" else BACKEND_TOLERANCE
    for key, value in got.items():
        if EXACT:
            np.testing.assert_array_equal(value, want[key], err_msg=key)
        else:
            tol = table[np.float64 if value.dtype == np.float64 else np.float32]
            np.testing.assert_allclose(value, want[key], rtol=tol, atol=tol, err_msg=key)


def _skip_unless_recorded(name, recorded):
    if not any(key.startswith(name + "/") for key in recorded):
        pytest.fail(f"{name!r} is not in the record: run "
                    "tests/fixtures/make_recorded_losses.py --add-missing under TensorFlow")
    if BACKEND != "tensorflow" and name.startswith("tfa_"):
        pytest.skip("tfdml.compat.tfa takes TensorFlow tensors")
    if BACKEND != "tensorflow" and not is_deterministic(cases()[name]):
        pytest.skip("a random miner draws another stream under this backend")


#: Eager JAX compiles each op for each shape and dtype (seconds per loss): it checks the
#: float64 record of one case per loss class eagerly, and the compiled cases below.
EAGER_DTYPES = ("float64",) if BACKEND == "jax" else ("float64", "float32")
EAGER_JAX = {case.id for case in ONE_PER_CLASS}
#: Compiled on every commit (XLA under TensorFlow, jax.jit under JAX): one case per loss
#: class and per miner kind, and the cases outside the contract list (row blocks, memory
#: banks, tfdml.compat.tfa): each path through the compiler. The other deterministic cases
#: are compiled in the slow tier (`make test-slow`); TensorFlow checks every case eagerly.
COMPILED = ({case.id for case in ONE_PER_CLASS_AND_MINER}
            | set(cases()) - {case.id for case in LOSS_CASES})


@pytest.mark.parametrize("name", sorted(cases()))
def test_loss_values_and_gradients_are_the_recorded_ones(name, recorded):
    _skip_unless_recorded(name, recorded)
    if BACKEND == "jax" and name not in EAGER_JAX:
        pytest.skip("eager JAX: one case per loss class (every case is compiled below)")
    with warnings.catch_warnings(), enable_float64():
        warnings.simplefilter("ignore")
        got = record_case(name, cases()[name], EAGER_DTYPES)
    _compare(got, recorded, name)


def _check_compiled(name, recorded):
    _skip_unless_recorded(name, recorded)
    if not is_deterministic(cases()[name]):
        pytest.skip("a random miner draws another stream when compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled_case(name, cases()[name])
    tol = TF_TOLERANCE if BACKEND == "tensorflow" and EXACT else BACKEND_TOLERANCE
    for key, value in got.items():
        np.testing.assert_allclose(value, recorded[key], rtol=tol[np.float32],
                                   atol=tol[np.float32], err_msg=key)


@pytest.mark.skipif(not CAN_COMPILE, reason="no compiled path under PyTorch")
@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_loss_values_and_gradients_are_the_recorded_ones(name, recorded):
    _check_compiled(name, recorded)


@pytest.mark.slow
@pytest.mark.skipif(not CAN_COMPILE, reason="no compiled path under PyTorch")
@pytest.mark.parametrize("name", sorted(set(cases()) - COMPILED))
def test_the_other_compiled_loss_values_are_the_recorded_ones(name, recorded):
    _check_compiled(name, recorded)


def test_every_recorded_case_is_still_computed(recorded):
    """A case of the record that no configuration computes any more (renamed, removed) fails
    here, rather than being skipped; a case missing from the record fails above."""
    names = {key.split("/")[0] for key in recorded}
    assert names - set(cases()) - {"fn_" + name for name in FUNCTIONAL} == set()


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_values_and_gradients_are_the_recorded_ones(name, recorded):
    if BACKEND != "tensorflow" and name.startswith("tfa_"):
        pytest.skip("TensorFlow Addons' functions take TensorFlow tensors")
    fn, kwargs = FUNCTIONAL[name]
    with warnings.catch_warnings(), enable_float64():
        warnings.simplefilter("ignore")
        got = record_functional("fn_" + name, fn, kwargs, jit_compile=BACKEND == "jax")
    _compare(got, recorded, "fn_" + name)
