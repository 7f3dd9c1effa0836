"""tfdml.compat.tfa: TensorFlow Addons' triplet losses, same values, O(B^2) memory."""

from __future__ import annotations

import json
import pathlib

import keras
import numpy as np
import pytest
import references as ref
import tensorflow as tf
from harness import run_under_policy, slow_beyond, small_embedding_model

from tfdml import ops as dml
from tfdml.compat import tfa

METRICS = ["L2", "squared-L2", "angular"]
LABELS = ref.make_labels([4, 3, 2, 2, 1], seed=8)  # B=12, with a singleton
X = np.random.default_rng(21).normal(size=(12, 5)) * 1.7  # B != D, norms far from 1


def _grad_check(fn, x, rtol=1e-4, atol=1e-6, delta=1e-6):
    """The eager gradient of the scalar ``fn`` at the float64 ``x`` against central
    differences (as ``tf.test.compute_gradient``) of ``fn``: every shifted copy of ``x``
    (each entry plus and minus ``delta``) evaluated in one call of one graph."""
    x = tf.constant(x, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = fn(x)
    theoretical = tape.gradient(value, x).numpy()
    x0 = x.numpy()
    shifts = delta * np.eye(x0.size).reshape(x0.size, *x0.shape)
    values = tf.function(lambda b: tf.map_fn(fn, b, fn_output_signature=tf.float64))(
        tf.constant(np.concatenate([x0 + shifts, x0 - shifts]))).numpy()
    numerical = ((values[:x0.size] - values[x0.size:]) / (2.0 * delta)).reshape(x0.shape)
    assert np.all(np.isfinite(theoretical))
    np.testing.assert_allclose(theoretical, numerical, rtol=rtol, atol=atol)


@pytest.mark.parametrize("metric", METRICS)
def test_distances_match_reference(metric):
    if metric == "angular":
        got = tfa.losses.metric_learning.angular_distance(X).numpy()
    else:
        got = tfa.losses.metric_learning.pairwise_distance(X, squared=metric == "squared-L2")
        got = got.numpy()
    np.testing.assert_allclose(got, ref.tfa_distances(X, metric), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.diag(got), 0.0, atol=1e-12)


@pytest.mark.parametrize("margin", slow_beyond([1.0, 0.3], {"1.0"}))  # 0.3: the same code
@pytest.mark.parametrize("metric", METRICS)
def test_semihard_matches_reference(metric, margin):
    for seed in range(4):
        labels = ref.make_labels([3, 3, 2, 2, 1, 1], seed=seed)
        x = np.random.default_rng(seed).normal(size=(12, 7)) * (1 + seed)
        want = ref.tfa_triplet_semihard(labels, x, margin, metric)
        got = tfa.losses.triplet_semihard_loss(labels, x.astype(np.float32), margin, metric)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        loss = tfa.losses.TripletSemiHardLoss(margin=margin, distance_metric=metric)
        np.testing.assert_allclose(loss(labels[:, None], x).numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("metric", METRICS)
def test_hard_matches_reference(metric, soft):
    for seed in range(3):
        labels = ref.make_labels([3, 3, 2, 1, 1], seed=seed)
        x = np.random.default_rng(seed + 10).normal(size=(10, 4))
        want = ref.tfa_triplet_hard(labels, x, 0.7, soft, metric)
        got = tfa.losses.triplet_hard_loss(labels, x.astype(np.float32), 0.7, soft, metric)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("metric", METRICS)
def test_semihard_in_row_blocks_matches_reference(metric, monkeypatch):
    """Large batches search in row blocks (a loop): same values and gradients, XLA too."""
    monkeypatch.setattr(dml, "ROW_BLOCK_ELEMENTS", 30)  # blocks of 2 rows of 12 (last half full)
    labels = ref.make_labels([3, 3, 2, 2, 1, 1], seed=5)
    x = np.random.default_rng(5).normal(size=(12, 7)) * 2
    want = ref.tfa_triplet_semihard(labels, x, 1.0, metric)
    got = tfa.losses.triplet_semihard_loss(labels, x.astype(np.float32), 1.0, metric)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    if metric != "L2":  # the loop is the same for every metric: compile and differentiate once
        return
    compiled = tf.function(lambda y, e: tfa.losses.triplet_semihard_loss(y, e, 1.0, metric),
                           jit_compile=True)(labels, tf.constant(x, tf.float32))
    np.testing.assert_allclose(compiled.numpy(), want, rtol=1e-5, atol=1e-5)
    _grad_check(lambda e: tfa.losses.triplet_semihard_loss(LABELS, e, 1.0, metric), X)


def test_semihard_fallbacks():
    """No farther negative: the farthest negative. No negative at all: the row minimum (0)."""
    x = np.array([[0.0, 0.0], [3.0, 0.0], [0.5, 0.0], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    # Anchor 0, positive 1 (d=3): both negatives are closer, so the farthest (1.0) is used.
    want = ref.tfa_triplet_semihard(labels, x, 1.0, "L2")
    np.testing.assert_allclose(tfa.losses.triplet_semihard_loss(labels, x).numpy(), want)
    one_class = tfa.losses.triplet_semihard_loss(np.zeros(4), x).numpy()
    np.testing.assert_allclose(one_class, ref.tfa_triplet_semihard(np.zeros(4), x), rtol=1e-12)
    assert one_class > 0  # margin + d_ap against a "negative" at distance 0, as in TFA


def test_ties_are_not_farther():
    """A negative exactly as far as the positive is not semi-hard (strictly farther only)."""
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    labels = np.array([0, 0, 1, 1])
    want = ref.tfa_triplet_semihard(labels, x, 1.0, "squared-L2")
    got = tfa.losses.triplet_semihard_loss(labels, x, 1.0, "squared-L2").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_no_positive_pair_gives_zero_not_nan():
    x = tf.constant(X, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = tfa.losses.triplet_semihard_loss(np.arange(12), x)
    assert value.numpy() == 0.0 and np.all(tape.gradient(value, x).numpy() == 0.0)


def test_callable_metric():
    def manhattan(e):
        return tf.reduce_sum(tf.abs(e[:, None, :] - e[None, :, :]), axis=-1)

    dist = np.abs(X[:, None, :] - X[None, :, :]).sum(-1)
    want = ref.tfa_triplet_semihard(LABELS, X, 1.0, dist=dist)
    np.testing.assert_allclose(tfa.losses.triplet_semihard_loss(LABELS, X, 1.0, manhattan),
                               want, rtol=1e-10)


@pytest.mark.parametrize("metric", METRICS)
def test_gradients_match_finite_differences(metric):
    _grad_check(lambda e: tfa.losses.triplet_semihard_loss(LABELS, e, 1.0, metric), X)
    _grad_check(lambda e: tfa.losses.triplet_hard_loss(LABELS, e, 1.0, False, metric), X)
    _grad_check(lambda e: tfa.losses.triplet_hard_loss(LABELS, e, 1.0, True, metric), X)


def test_xla_matches_eager():
    x = tf.constant(X, tf.float32)
    fns = (tfa.losses.triplet_semihard_loss, tfa.losses.triplet_hard_loss)
    # Both losses in one XLA program (one compilation).
    compiled = tf.function(lambda y, e: [fn(y, e) for fn in fns], jit_compile=True)(LABELS, x)
    for fn, got in zip(fns, compiled, strict=True):
        np.testing.assert_allclose(got.numpy(), fn(LABELS, x).numpy(), rtol=1e-5)


def test_low_precision_embeddings_keep_class_ids_and_dtype():
    labels = np.array([256, 257, 256, 257, 4096, 4097, 4096, 4097])
    x = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)
    want = ref.tfa_triplet_semihard(labels, x.astype(np.float64))
    for dtype in ("bfloat16", "float16"):
        value = tfa.losses.triplet_semihard_loss(labels, tf.cast(x, dtype))
        assert value.dtype == dtype
        np.testing.assert_allclose(float(value), want, rtol=2e-2)


def test_model_fit_jit_mixed_precision_and_keras_round_trip(tmp_path):
    features = np.random.default_rng(0).normal(size=(24, 6)).astype(np.float32)
    labels = np.repeat(np.arange(6), 4)
    with run_under_policy("mixed_bfloat16"):
        model = small_embedding_model()
        model.compile(optimizer="adam", loss=tfa.losses.TripletSemiHardLoss(), jit_compile=True)
        history = model.fit(features, labels, batch_size=24, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    model = small_embedding_model()
    model.compile(optimizer="sgd", loss=tfa.losses.TripletHardLoss(margin=0.5, soft=True))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.loss) is tfa.TripletHardLoss
    assert loaded.loss.get_config()["soft"] is True
    assert keras.saving.get_registered_name(tfa.TripletSemiHardLoss) == "Addons>TripletSemiHardLoss"


def test_bad_input():
    with pytest.raises(ValueError, match="distance_metric"):
        tfa.losses.TripletSemiHardLoss(distance_metric="cosine")
    with pytest.raises(ValueError, match="margin"):
        tfa.losses.triplet_hard_loss(LABELS, X, margin="1")
    with pytest.raises(ValueError, match="y_true"):
        tfa.losses.triplet_semihard_loss(LABELS[:5], X)


@pytest.mark.parametrize("margin", slow_beyond([1.0, 0.5], {"1.0"}))  # 0.5: the same code
def test_lifted_struct_matches_reference(margin):
    for seed in range(3):
        labels = ref.make_labels([3, 3, 2, 2, 1], seed=seed)
        x = np.random.default_rng(seed + 30).normal(size=(11, 6))
        want = ref.tfa_lifted_struct(labels, x, margin)
        got = tfa.losses.lifted_struct_loss(labels, x.astype(np.float32), margin).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5)
        loss = tfa.losses.LiftedStructLoss(margin=margin)
        np.testing.assert_allclose(loss(labels, x).numpy(), want, rtol=1e-10)
    _grad_check(lambda e: tfa.losses.lifted_struct_loss(LABELS, e, margin), X)


def test_lifted_struct_without_negatives_or_positives_is_zero():
    assert tfa.losses.lifted_struct_loss(np.zeros(5), X[:5]).numpy() == 0.0
    assert tfa.losses.lifted_struct_loss(np.arange(5), X[:5]).numpy() == 0.0


def test_contrastive_matches_reference():
    y = np.array([1, 0, 0, 1, 0])
    d = np.array([0.3, 0.2, 1.5, 2.0, 0.99])
    np.testing.assert_allclose(tfa.losses.contrastive_loss(y, d, 1.0).numpy(),
                               ref.tfa_contrastive(y, d, 1.0), rtol=1e-12)
    np.testing.assert_allclose(tfa.losses.ContrastiveLoss(margin=0.5)(y, d).numpy(),
                               ref.tfa_contrastive(y, d, 0.5).mean(), rtol=1e-6)


def test_npairs_matches_reference():
    s = X @ X[::-1].T
    np.testing.assert_allclose(tfa.losses.npairs_loss(LABELS, s).numpy(),
                               ref.tfa_npairs(LABELS, s), rtol=1e-10)
    np.testing.assert_allclose(tfa.losses.NpairsLoss()(LABELS[:, None], s).numpy(),
                               ref.tfa_npairs(LABELS, s), rtol=1e-10)


def test_migration_guide_example():
    """The README's "after" code: compile and fit a model with the compat loss."""
    model = small_embedding_model()
    model.compile(optimizer="adam", loss=tfa.losses.TripletSemiHardLoss(margin=1.0))
    features = np.random.default_rng(1).normal(size=(16, 6)).astype(np.float32)
    history = model.fit(features, np.repeat(np.arange(4), 4), batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"][0])


# -- against outputs recorded from TensorFlow Addons 0.23 (tests/fixtures/make_tfa_fixtures.py)

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
_INDEX = json.loads((FIXTURES / "tfa_0.23.json").read_text())
_DATA = np.load(FIXTURES / "tfa_0.23.npz")
_FUNCTIONS = {
    "tfa.losses.triplet_semihard_loss": tfa.losses.triplet_semihard_loss,
    "tfa.losses.triplet_hard_loss": tfa.losses.triplet_hard_loss,
    "tfa.losses.lifted_struct_loss": tfa.losses.lifted_struct_loss,
    "tfa.losses.contrastive_loss": tfa.losses.contrastive_loss,
    "tfa.losses.npairs_loss": tfa.losses.npairs_loss,
    "tfa.losses.metric_learning.pairwise_distance":
        tfa.losses.metric_learning.pairwise_distance,
    "tfa.losses.metric_learning.angular_distance": tfa.losses.metric_learning.angular_distance,
}
_CLASSES = {
    "tfa.losses.TripletSemiHardLoss": tfa.losses.TripletSemiHardLoss,
    "tfa.losses.TripletHardLoss": tfa.losses.TripletHardLoss,
    "tfa.losses.LiftedStructLoss": tfa.losses.LiftedStructLoss,
    "tfa.losses.ContrastiveLoss": tfa.losses.ContrastiveLoss,
    "tfa.losses.NpairsLoss": tfa.losses.NpairsLoss,
}
_CASES = [c for c in _INDEX["cases"] if c["status"] == "ok"
          and (c["function"] in _FUNCTIONS or c["function"] in _CLASSES)]


def test_fixture_cases_cover_every_compat_function():
    covered = {c["function"] for c in _CASES}
    assert covered == set(_FUNCTIONS) | set(_CLASSES)
    assert len(_CASES) > 200


def _has_distance_ties(case, inputs):
    """Whether a triplet loss's distance rows have repeated values (a non-smooth point)."""
    if "triplet" not in case["function"].lower():
        return False
    embeddings = (inputs.get("y_pred") if "y_pred" in inputs else inputs["embeddings"]).numpy()
    metric = case["kwargs"].get("distance_metric", "L2")
    dist = ref.tfa_distances(embeddings.astype(np.float64), metric)
    for row in dist:
        values = np.sort(row)
        if np.any(np.diff(values) <= 1e-6 * (1.0 + np.abs(values[1:]))):
            return True
    return False


def _fast_case_ids(cases):
    """The cases checked on every commit: every function and class with every set of arguments
    on the main batch (``rand12_float32``), and every kind of batch (label formats, dtypes,
    sizes, singletons, ties, duplicates, ...) once per function, with its first arguments
    (classes: the label formats and dtypes; their other batches are those of the functions
    they call). The other cases, the same paths with other arguments, run in the slow tier."""
    fast, seen = set(), set()
    for case in cases:
        batch = case["id"].split("__")[1]
        group = (case["function"], batch)
        is_class = case["function"] in _CLASSES
        other_margin = case["id"].endswith(("__m0.3", "__m0.5"))  # a factor in the same code
        if (batch == "rand12_float32" and not other_margin) or (group not in seen and not (
                is_class and batch.startswith(("rand33", "unit16", "singletons", "all_distinct")))):
            fast.add(case["id"])
        seen.add(group)
    return fast


@pytest.mark.parametrize("case", slow_beyond(_CASES, _fast_case_ids(_CASES),
                                             ids=lambda c: c["id"]))
def test_matches_tensorflow_addons(case):
    inputs = {k: tf.constant(_DATA[v]) for k, v in case["inputs"].items()}
    cotangent = inputs.pop("cotangent", None)
    grad_keys = [k for k in case["outputs"] if k.startswith("grad_")]
    watched = {k[5:]: inputs[k[5:]] for k in grad_keys}
    with tf.GradientTape() as tape:
        for v in watched.values():
            tape.watch(v)
        if case["function"] in _CLASSES:
            value = _CLASSES[case["function"]](**case["kwargs"])(*inputs.values())
        else:
            value = _FUNCTIONS[case["function"]](**inputs, **case["kwargs"])
    expected = _DATA[case["outputs"]["value"]]
    float32 = value.dtype != tf.float64
    rtol, atol = (2e-5, 2e-5) if float32 else (1e-9, 1e-12)
    if np.all(np.isfinite(expected)):
        np.testing.assert_allclose(value.numpy(), expected, rtol=rtol, atol=atol)
    else:
        # TFA's NaN or inf: no positive pair (0 here), a soft hinge overflowing (softplus
        # here), or [B, 1] labels in npairs_loss (handled here). tfdml stays finite.
        np.testing.assert_allclose(value.numpy()[np.isfinite(expected)],
                                   expected[np.isfinite(expected)], rtol=rtol, atol=atol)
        assert np.all(np.isfinite(value.numpy()))
        return
    if _has_distance_ties(case, inputs):
        # At exact ties TFA's reduce_min/max split the gradient among the tied negatives,
        # tfdml gives it to one of them: both are subgradients; values are compared above.
        return
    grads = tape.gradient(value, list(watched.values()), output_gradients=cotangent)
    for key, grad in zip(grad_keys, grads, strict=True):
        want = _DATA[case["outputs"][key]]
        got = np.zeros_like(want) if grad is None else tf.convert_to_tensor(grad).numpy()
        np.testing.assert_allclose(got, want, rtol=10 * rtol, atol=10 * atol)


_NONFINITE = {
    "semihard": lambda y, x: tfa.triplet_semihard_loss(y, x),
    "semihard_angular": lambda y, x: tfa.triplet_semihard_loss(y, x, distance_metric="angular"),
    "hard": lambda y, x: tfa.triplet_hard_loss(y, x),
    "hard_soft": lambda y, x: tfa.triplet_hard_loss(y, x, soft=True),
    "lifted": lambda y, x: tfa.lifted_struct_loss(y, x),
    "semihard_class": lambda y, x: tfa.TripletSemiHardLoss()(y, x),
    "lifted_class": lambda y, x: tfa.LiftedStructLoss()(y, x),
}


@pytest.fixture(scope="module")
def nonfinite_values():
    """bad -> (eager, compiled): each loss of _NONFINITE at a batch with one ``bad`` entry,
    eagerly and under XLA, all the losses in one XLA program (one compilation for all)."""
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 3], np.int32)
    compiled = tf.function(lambda y, x: {name: fn(y, x) for name, fn in _NONFINITE.items()},
                           jit_compile=True)
    out = {}
    for bad in (np.nan, np.inf, -np.inf):
        x = np.random.default_rng(3).normal(size=(8, 5)).astype(np.float32)
        x[4, 2] = bad
        eager = {name: fn(labels, x).numpy() for name, fn in _NONFINITE.items()}
        jit = {name: v.numpy() for name, v in compiled(tf.constant(labels),
                                                       tf.constant(x)).items()}
        out[bad] = (eager, jit)
    return out


@pytest.mark.parametrize("name", list(_NONFINITE))
def test_nonfinite_embeddings_give_nan_like_tfa(name, nonfinite_values):
    """TFA 0.23 returns NaN here; a finite value would keep TerminateOnNaN from firing."""
    for bad, (eager, jit) in nonfinite_values.items():
        assert np.isnan(eager[name]), bad
        assert np.isnan(jit[name]), bad
