"""Every loss gives the values and gradients recorded in ``tests/fixtures/recorded_losses.npz``.

The record was made before the losses were declared as specs (one per-anchor function
plus its arguments, from which the class, its config and the functional form come) and
must stay as it is: a change to how losses are declared, reduced or mined that moves any
number fails here. Exact (bit-identical) where ``TFDML_EXACT_RECORD=1``, as it was checked
on the machine that recorded it; otherwise within a few units in the last place, so that
another CPU's kernels (FMA, vector width) do not fail it. TensorFlow only (the numbers are
one backend's); ``tests/fixtures/make_recorded_losses.py`` writes the record.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from backends import BACKEND
from recorded_losses import FUNCTIONAL, cases, record_case, record_functional

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="recorded with TensorFlow")

RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "recorded_losses.npz")
EXACT = os.environ.get("TFDML_EXACT_RECORD") == "1"


@pytest.fixture(scope="module")
def recorded():
    with np.load(RECORD) as data:
        return dict(data)


def _compare(got: dict, recorded: dict, prefix: str):
    want = {k: v for k, v in recorded.items() if k.startswith(prefix + "/")}
    assert sorted(got) == sorted(want), "recorded quantities differ"
    for key, value in got.items():
        if EXACT:
            np.testing.assert_array_equal(value, want[key], err_msg=key)
        else:
            tol = 1e-12 if value.dtype == np.float64 else 1e-5
            np.testing.assert_allclose(value, want[key], rtol=tol, atol=tol, err_msg=key)


@pytest.mark.parametrize("name", sorted(cases()))
def test_loss_values_and_gradients_are_the_recorded_ones(name, recorded):
    if not any(key.startswith(name + "/") for key in recorded):
        pytest.skip("a case added after the record was made (make_recorded_losses.py adds it)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = record_case(name, cases()[name])
    _compare(got, recorded, name)


def test_every_recorded_case_is_still_computed(recorded):
    """A case of the record that no configuration computes any more (renamed, removed) fails
    here, rather than being skipped."""
    names = {key.split("/")[0] for key in recorded}
    assert names - set(cases()) - {"fn_" + name for name in FUNCTIONAL} == set()


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_values_and_gradients_are_the_recorded_ones(name, recorded):
    fn, kwargs = FUNCTIONAL[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = record_functional("fn_" + name, fn, kwargs)
    _compare(got, recorded, "fn_" + name)
