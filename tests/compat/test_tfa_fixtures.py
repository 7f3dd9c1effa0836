"""The TensorFlow Addons ground-truth fixtures are well-formed and self-consistent.

``tests/fixtures/tfa_0.23.npz`` and its index ``tfa_0.23.json`` are produced by
``tests/fixtures/make_tfa_fixtures.py`` in a separate TF 2.15 / TFA 0.23 environment. These
tests need neither TensorFlow nor TFA: they only check the files themselves, so that the
parity tests built on them can trust every key, shape and flag they read.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
INDEX_PATH = os.path.join(FIXTURES, "tfa_0.23.json")
NPZ_PATH = os.path.join(FIXTURES, "tfa_0.23.npz")

FLOAT_ARGS = ("y_pred", "embeddings", "feature")
FUNCTIONS = {
    "tfa.losses.triplet_semihard_loss",
    "tfa.losses.triplet_hard_loss",
    "tfa.losses.lifted_struct_loss",
    "tfa.losses.contrastive_loss",
    "tfa.losses.npairs_loss",
    "tfa.losses.npairs_multilabel_loss",
    "tfa.losses.metric_learning.pairwise_distance",
    "tfa.losses.metric_learning.angular_distance",
    "tfa.losses.TripletSemiHardLoss",
    "tfa.losses.TripletHardLoss",
    "tfa.losses.LiftedStructLoss",
    "tfa.losses.ContrastiveLoss",
    "tfa.losses.NpairsLoss",
}


@pytest.fixture(scope="module")
def index():
    with open(INDEX_PATH) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def arrays():
    with np.load(NPZ_PATH, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def ok_cases(index):
    return [c for c in index["cases"] if c["status"] == "ok"]


def _float_arg(case):
    (name,) = [k for k in case["inputs"] if k in FLOAT_ARGS]
    return name


def test_files_exist_and_are_small():
    assert os.path.isfile(INDEX_PATH)
    assert os.path.isfile(NPZ_PATH)
    assert os.path.getsize(NPZ_PATH) < 1_200_000


def test_versions_recorded(index):
    v = index["versions"]
    assert v["tensorflow_addons"].startswith("0.23.")
    major, minor = (int(p) for p in v["tensorflow"].split(".")[:2])
    assert major == 2 and 13 <= minor <= 15
    for key in ("numpy", "python"):
        assert isinstance(v[key], str) and v[key]
    assert index["npz"] == os.path.basename(NPZ_PATH)


def test_class_default_reductions_recorded(index):
    red = index["class_default_reductions"]
    assert red["ContrastiveLoss"] == "sum_over_batch_size"
    for name in ("TripletSemiHardLoss", "TripletHardLoss", "LiftedStructLoss", "NpairsLoss"):
        assert red[name] == "none"


def test_every_indexed_key_exists(index, arrays):
    for batch in index["batches"].values():
        for key in batch["arrays"].values():
            assert key in arrays, key
    for case in index["cases"]:
        for key in case["inputs"].values():
            assert key in arrays, (case["id"], key)
        for key in case["outputs"].values():
            assert key in arrays, (case["id"], key)


def test_no_orphan_arrays(index, arrays):
    used = set()
    for batch in index["batches"].values():
        used.update(batch["arrays"].values())
    for case in index["cases"]:
        used.update(case["inputs"].values())
        used.update(case["outputs"].values())
    assert set(arrays) == used


def test_no_object_arrays(arrays):
    for key, arr in arrays.items():
        assert arr.dtype != object, key


def test_case_ids_unique_and_functions_known(index):
    ids = [c["id"] for c in index["cases"]]
    assert len(ids) == len(set(ids))
    for case in index["cases"]:
        assert case["function"] in FUNCTIONS, case["function"]
        assert case["status"] in ("ok", "error")
        assert isinstance(case["kwargs"], dict)


def test_every_function_has_ok_cases(ok_cases):
    assert {c["function"] for c in ok_cases} == FUNCTIONS


def test_error_cases_are_float64_dtype_errors(index):
    errors = [c for c in index["cases"] if c["status"] == "error"]
    assert errors, "float64 failures in TFA's triplet/lifted/pairwise code are expected"
    for case in errors:
        assert case["outputs"] == {}
        assert case["error_type"] == "TypeError"
        assert "float64" in case["error_message"]
        assert case["input_dtypes"][_float_arg(case)] == "float64"


def test_input_dtypes_match_arrays(index, arrays):
    for case in index["cases"]:
        for name, key in case["inputs"].items():
            if name == "cotangent":
                continue
            assert str(arrays[key].dtype) == case["input_dtypes"][name], (case["id"], name)


def test_values_match_recorded_metadata(ok_cases, arrays):
    for case in ok_cases:
        value = arrays[case["outputs"]["value"]]
        assert list(value.shape) == case["value_shape"], case["id"]
        assert value.dtype.name == case["value_dtype"], case["id"]
        assert bool(np.all(np.isfinite(value))) == case["value_is_finite"], case["id"]
        # Every TFA function returns the dtype of its float input.
        float_in = arrays[case["inputs"][_float_arg(case)]]
        assert value.dtype == float_in.dtype, case["id"]


def test_gradients_present_with_input_shape_and_dtype(ok_cases, arrays):
    for case in ok_cases:
        arg = _float_arg(case)
        gkey = case["outputs"].get(f"grad_{arg}")
        assert gkey is not None, case["id"]
        grad = arrays[gkey]
        x = arrays[case["inputs"][arg]]
        assert grad.shape == x.shape, case["id"]
        assert grad.dtype == x.dtype, case["id"]


def test_gradients_finite_where_values_finite(ok_cases, arrays):
    for case in ok_cases:
        if not case["value_is_finite"]:
            continue
        grad = arrays[case["outputs"][f"grad_{_float_arg(case)}"]]
        assert np.all(np.isfinite(grad)), case["id"]


def test_non_scalar_outputs_have_cotangent(ok_cases, arrays):
    for case in ok_cases:
        if case["value_shape"]:
            cot = arrays[case["inputs"]["cotangent"]]
            assert cot.shape == tuple(case["value_shape"]), case["id"]
        else:
            assert "cotangent" not in case["inputs"], case["id"]


def test_documented_nan_cases_present(ok_cases):
    """The edge cases the notes describe are recorded with non-finite values."""
    nonfinite = {c["id"].split("_", 1)[1] for c in ok_cases if not c["value_is_finite"]}
    for stem in (
        "triplet_semihard__all_distinct__L2__m1.0",
        "lifted_struct__all_distinct__m1.0",
        "lifted_struct__single_class__m1.0",
        "npairs__rand12_labels_col",
    ):
        assert stem in nonfinite, stem
    finite = {c["id"].split("_", 1)[1] for c in ok_cases if c["value_is_finite"]}
    assert "triplet_hard__all_distinct__L2__softFalse" in finite
    assert "triplet_semihard__single_class__L2__m1.0" in finite


def _values_by(ok_cases, arrays, function, kwargs_key):
    out = defaultdict(dict)
    for case in ok_cases:
        if case["function"] != function:
            continue
        batch = case["inputs"][_float_arg(case)].split("/")[1]
        out[kwargs_key(case)][batch] = arrays[case["outputs"]["value"]]
    return out


@pytest.mark.parametrize(
    "function",
    [
        "tfa.losses.triplet_semihard_loss",
        "tfa.losses.triplet_hard_loss",
        "tfa.losses.lifted_struct_loss",
    ],
)
def test_label_layout_and_dtype_do_not_change_values(ok_cases, arrays, function):
    """Labels [B], [B, 1] and int64 give identical values on the same embeddings."""
    grouped = _values_by(
        ok_cases, arrays, function, lambda c: json.dumps(c["kwargs"], sort_keys=True)
    )
    assert grouped
    checked = 0
    for per_batch in grouped.values():
        if "rand12_labels_col" not in per_batch:
            continue
        ref = per_batch["rand12_float32"]
        np.testing.assert_array_equal(per_batch["rand12_labels_col"], ref)
        np.testing.assert_array_equal(per_batch["rand12_labels_int64"], ref)
        checked += 1
    assert checked >= 2


def test_class_forms_match_function_forms(ok_cases, arrays):
    """Each class (default reduction) reproduces its function on the same inputs."""
    defaults = {
        "tfa.losses.TripletSemiHardLoss": (
            "tfa.losses.triplet_semihard_loss",
            {"margin": 1.0, "distance_metric": "L2"},
        ),
        "tfa.losses.TripletHardLoss": (
            "tfa.losses.triplet_hard_loss",
            {"margin": 1.0, "soft": False, "distance_metric": "L2"},
        ),
        "tfa.losses.LiftedStructLoss": ("tfa.losses.lifted_struct_loss", {"margin": 1.0}),
        "tfa.losses.NpairsLoss": ("tfa.losses.npairs_loss", {}),
    }

    def key(case):
        return tuple(sorted(case["inputs"].values()))

    by_fn = {}
    for case in ok_cases:
        if case["function"].split(".")[-1][0].islower():
            by_fn[(case["function"], json.dumps(case["kwargs"], sort_keys=True), key(case))] = case
    checked = 0
    for case in ok_cases:
        if case["function"] not in defaults:
            continue
        fn, kw = defaults[case["function"]]
        kw = {**kw, **case["kwargs"]}
        twin = by_fn.get((fn, json.dumps(kw, sort_keys=True), key(case)))
        if twin is None:
            continue
        np.testing.assert_allclose(
            arrays[case["outputs"]["value"]],
            arrays[twin["outputs"]["value"]],
            rtol=1e-6,
            equal_nan=True,
        )
        checked += 1
    assert checked >= 8


def test_contrastive_class_is_mean_of_function(ok_cases, arrays):
    fn = {}
    for case in ok_cases:
        if case["function"] == "tfa.losses.contrastive_loss":
            fn[(case["kwargs"]["margin"], case["inputs"]["y_pred"], case["inputs"]["y_true"])] = (
                case
            )
    checked = 0
    for case in ok_cases:
        if case["function"] != "tfa.losses.ContrastiveLoss":
            continue
        margin = case["kwargs"].get("margin", 1.0)
        twin = fn[(margin, case["inputs"]["y_pred"], case["inputs"]["y_true"])]
        per_pair = arrays[twin["outputs"]["value"]]
        np.testing.assert_allclose(arrays[case["outputs"]["value"]], per_pair.mean(), rtol=1e-6)
        checked += 1
    assert checked >= 4


def test_multilabel_one_hot_matches_npairs(ok_cases, arrays):
    vals = {}
    for case in ok_cases:
        if case["function"] in ("tfa.losses.npairs_loss", "tfa.losses.npairs_multilabel_loss"):
            vals[case["id"].split("_", 1)[1]] = arrays[case["outputs"]["value"]]
    for dt in ("float32", "float64"):
        np.testing.assert_allclose(
            vals[f"npairs_multilabel_onehot__rand12_{dt}"], vals[f"npairs__rand12_{dt}"], rtol=1e-6
        )


def test_distance_matrices_are_well_formed(ok_cases, arrays):
    for case in ok_cases:
        if case["function"] == "tfa.losses.metric_learning.pairwise_distance":
            d = arrays[case["outputs"]["value"]]
            assert np.all(d >= 0), case["id"]
            np.testing.assert_array_equal(np.diag(d), 0.0)
            np.testing.assert_allclose(d, d.T, rtol=1e-5, atol=1e-5)
        elif case["function"] == "tfa.losses.metric_learning.angular_distance":
            d = arrays[case["outputs"]["value"]]
            assert np.all(d >= 0) and np.all(d <= 2 + 1e-6), case["id"]
