"""tfdml.compat.tfa.npairs_multilabel_loss / NpairsMultilabelLoss: TFA 0.23's multi-label N-pairs.

The reference below is written from the definition: ``T = Y Y^T`` with rows normalized, the
mean over rows of the softmax cross-entropy of ``y_pred`` against ``T``; rows without labels
(a 0/0 in TFA) are left out of the mean, their columns still count in the softmax.
"""

from __future__ import annotations

import json
import pathlib
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from harness import small_embedding_model

from tfdml.compat import tfa

B, C = 10, 7  # B != C


def reference(y_true, y_pred):
    """float64 value and analytic gradient w.r.t. ``y_pred`` (label-less rows left out)."""
    y = np.asarray(y_true, np.float64)
    s = np.asarray(y_pred, np.float64)
    shared = y @ y.T
    row_sum = shared.sum(axis=1)
    kept = row_sum != 0
    top = s.max(axis=1, keepdims=True)
    log_p = s - (top + np.log(np.exp(s - top).sum(axis=1, keepdims=True)))
    target = shared[kept] / row_sum[kept, None]
    n = int(kept.sum())
    grad = np.zeros_like(s)
    if n == 0:
        return 0.0, grad
    value = float(np.mean(-(target * log_p[kept]).sum(axis=1)))
    grad[kept] = (np.exp(log_p[kept]) - target) / n
    return value, grad


def multilabel(seed, b=B, c=C, empty=()):
    """A ``[b, c]`` int32 indicator with 2 to 4 labels per sample; rows in ``empty`` all zero."""
    rng = np.random.default_rng(seed)
    y = np.zeros((b, c), np.int32)
    for i in range(b):
        y[i, rng.choice(c, size=rng.integers(2, 5), replace=False)] = 1
    y[list(empty)] = 0
    return y


def logits(seed, b=B):
    return np.random.default_rng(seed + 100).normal(size=(b, b)) * 2.0  # not symmetric


def _value_and_grad(fn, y, s):
    s = tf.constant(s)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = fn(y, s)
    return value, tape.gradient(value, s)


_COMPILED = tf.function(tfa.npairs_multilabel_loss, jit_compile=True)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_reference(dtype, sparse):
    rtol = 1e-5 if dtype == "float32" else 1e-10
    for seed in range(3):
        y, s = multilabel(seed), logits(seed).astype(dtype)
        want, _ = reference(y, s)
        y_true = tf.sparse.from_dense(y) if sparse else y
        got = tfa.losses.npairs_multilabel_loss(y_true, s)
        assert got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol)
        got = tfa.losses.NpairsMultilabelLoss()(y_true, tf.constant(s))
        assert got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol)


def test_sparse_indices_in_any_order():
    y, s = multilabel(4), logits(4)
    dense = tf.sparse.from_dense(y)
    shuffled = np.random.default_rng(0).permutation(int(dense.indices.shape[0]))
    sparse = tf.SparseTensor(tf.gather(dense.indices, shuffled), tf.gather(dense.values, shuffled),
                             dense.dense_shape)
    np.testing.assert_allclose(tfa.npairs_multilabel_loss(sparse, s).numpy(),
                               reference(y, s)[0], rtol=1e-10)


def test_weights_and_bool_labels():
    """Entries other than 0/1 are weights (as TFA); bool indicators are 0/1."""
    y, s = multilabel(5), logits(5)
    weighted = y * np.random.default_rng(5).integers(1, 4, size=y.shape)
    np.testing.assert_allclose(tfa.npairs_multilabel_loss(weighted, s).numpy(),
                               reference(weighted, s)[0], rtol=1e-10)
    assert not np.isclose(reference(weighted, s)[0], reference(y, s)[0])
    np.testing.assert_allclose(tfa.npairs_multilabel_loss(y.astype(bool), s).numpy(),
                               reference(y, s)[0], rtol=1e-10)


@pytest.mark.parametrize("empty", [(), (3, 7)], ids=["all_labelled", "label_less_rows"])
def test_gradients_match_reference_and_finite_differences(empty):
    y, s = multilabel(6, empty=empty), logits(6)
    value, grad = _value_and_grad(tfa.npairs_multilabel_loss, y, s)
    want_value, want_grad = reference(y, s)
    np.testing.assert_allclose(value.numpy(), want_value, rtol=1e-10)
    assert np.all(np.isfinite(grad.numpy()))
    np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-10, atol=1e-12)
    theoretical, numerical = tf.test.compute_gradient(
        lambda x: tfa.npairs_multilabel_loss(y, x), [tf.constant(s)], delta=1e-6)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_hot_equals_npairs_loss(dtype):
    labels = np.random.default_rng(7).integers(0, C, size=B)
    labels[:3] = labels[3]  # some repeated classes for sure
    y = np.eye(C, dtype=np.int32)[labels]
    s = logits(7).astype(dtype)
    rtol = 1e-6 if dtype == "float32" else 1e-12
    value, grad = _value_and_grad(tfa.npairs_multilabel_loss, y, s)
    want, want_grad = _value_and_grad(tfa.npairs_loss, labels, s)
    np.testing.assert_allclose(value.numpy(), want.numpy(), rtol=rtol)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=rtol, atol=rtol * 1e-2)


def test_label_less_samples_are_left_out_but_stay_candidates():
    empty = (2, 5)
    y, s = multilabel(8, empty=empty), logits(8)
    value, grad = _value_and_grad(tfa.npairs_multilabel_loss, y, s)
    want, want_grad = reference(y, s)
    np.testing.assert_allclose(value.numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-10, atol=1e-12)
    grad = grad.numpy()
    assert np.all(grad[list(empty)] == 0.0)  # their rows are not in the loss
    kept = [i for i in range(B) if i not in empty]
    assert np.all(grad[np.ix_(kept, list(empty))] > 0)  # their columns are (pure negatives)
    # Not the same as dropping the samples altogether: their columns count in the softmax.
    dropped, _ = reference(y[kept], s[np.ix_(kept, kept)])
    assert not np.isclose(value.numpy(), dropped)
    # The mean is over the labelled rows only (B - 2 of them).
    y_full = multilabel(8)
    assert not np.isclose(value.numpy(), reference(y_full, s)[0])


def test_no_labelled_sample_gives_zero_with_zero_gradient():
    y, s = np.zeros((B, C), np.int32), logits(9)
    for fn in (tfa.npairs_multilabel_loss, tfa.NpairsMultilabelLoss(), _COMPILED):
        value, grad = _value_and_grad(fn, tf.constant(y), s)
        assert value.numpy() == 0.0
        assert np.all(grad.numpy() == 0.0)
    sparse = tf.SparseTensor(np.zeros((0, 2), np.int64), np.zeros((0,), np.int32), [B, C])
    assert tfa.npairs_multilabel_loss(sparse, s).numpy() == 0.0


@pytest.mark.parametrize("position", [(0, 4), (2, 6), (6, 2), (2, 2)],
                         ids=["labelled_row", "label_less_row", "label_less_column",
                              "label_less_diagonal"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_logits_give_nan(bad, position):
    """NaN or Inf anywhere in y_pred gives NaN, also in a row that is left out (row 2)."""
    y = multilabel(10, empty=(2,))
    s = logits(10).astype(np.float32)
    s[position] = bad
    assert np.isnan(tfa.npairs_multilabel_loss(y, s).numpy())
    assert np.isnan(tfa.NpairsMultilabelLoss()(y, s).numpy())
    assert np.isnan(_COMPILED(tf.constant(y), tf.constant(s)).numpy())


def test_valid_labels_never_give_nan():
    """Large logits, single-sample classes, label-less rows: finite value and gradient."""
    y = multilabel(11, empty=(0, 9))
    y[4] = 0
    y[4, 0] = 1  # possibly a label no other sample has
    s = logits(11) * 500.0
    for dtype in ("float32", "float64"):
        value, grad = _value_and_grad(tfa.npairs_multilabel_loss, y, s.astype(dtype))
        assert np.isfinite(value.numpy()) and np.all(np.isfinite(grad.numpy()))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_xla_matches_eager(dtype):
    y, s = multilabel(12, empty=(1,)), logits(12).astype(dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-10
    eager = tfa.npairs_multilabel_loss(y, s).numpy()
    np.testing.assert_allclose(_COMPILED(tf.constant(y), tf.constant(s)).numpy(), eager, rtol=rtol)
    unknown = tf.function(tfa.npairs_multilabel_loss, jit_compile=True, input_signature=[
        tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], dtype)])
    np.testing.assert_allclose(unknown(tf.constant(y), tf.constant(s)).numpy(), eager, rtol=rtol)
    sparse = tf.function(tfa.npairs_multilabel_loss, jit_compile=True)(
        tf.sparse.from_dense(y), tf.constant(s))
    np.testing.assert_allclose(sparse.numpy(), eager, rtol=rtol)


def test_matches_tensorflow_addons_fixtures():
    """The outputs recorded from TFA 0.23 (tests/fixtures/make_tfa_fixtures.py)."""
    fixtures = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
    index = json.loads((fixtures / "tfa_0.23.json").read_text())
    data = np.load(fixtures / "tfa_0.23.npz")
    cases = [c for c in index["cases"] if c["status"] == "ok"
             and c["function"] == "tfa.losses.npairs_multilabel_loss"]
    assert len(cases) == 4
    for case in cases:
        y = data[case["inputs"]["y_true"]]
        s = data[case["inputs"]["y_pred"]]
        assert np.all(y.sum(axis=1) > 0)  # TFA's NaN for label-less rows is not recorded
        value, grad = _value_and_grad(tfa.npairs_multilabel_loss, tf.constant(y), s)
        rtol, atol = (2e-5, 2e-5) if s.dtype == np.float32 else (1e-9, 1e-12)
        np.testing.assert_allclose(value.numpy(), data[case["outputs"]["value"]],
                                   rtol=rtol, atol=atol)
        np.testing.assert_allclose(grad.numpy(), data[case["outputs"]["grad_y_pred"]],
                                   rtol=10 * rtol, atol=10 * atol)


def test_bad_input():
    y, s = multilabel(13), logits(13)
    with pytest.raises(ValueError, match="`y_true` must be a rank-2"):
        tfa.npairs_multilabel_loss(np.arange(B), s)
    with pytest.raises(ValueError, match="`y_true` must be a rank-2"):
        tfa.npairs_multilabel_loss(y[:, :, None], s)
    with pytest.raises(ValueError, match="`y_true` must be a rank-2"):
        tfa.npairs_multilabel_loss(tf.sparse.from_dense(np.arange(B)), s)
    with pytest.raises(ValueError, match="`y_pred` must be a square"):
        tfa.npairs_multilabel_loss(y, s[:, :-1])
    with pytest.raises(ValueError, match="`y_pred` must be a square"):
        tfa.npairs_multilabel_loss(y, s[0])
    with pytest.raises(ValueError, match="`y_pred` must be a square"):
        tfa.npairs_multilabel_loss(y, s[:, :, None])
    with pytest.raises(ValueError, match="`y_pred` must have a floating dtype"):
        tfa.npairs_multilabel_loss(y, np.ones((B, B), np.int32))
    with pytest.raises(ValueError, match="`y_true` and `y_pred` must have the same batch size"):
        tfa.npairs_multilabel_loss(y[:-1], s)
    with pytest.raises(ValueError, match="`y_true` and `y_pred` must have the same batch size"):
        tfa.NpairsMultilabelLoss()(y, s[:-1, :-1])


def test_config_and_registration():
    loss = tfa.losses.NpairsMultilabelLoss()
    assert loss.name == "npairs_multilabel_loss" and loss.reduction == "none"
    config = loss.get_config()
    assert config["name"] == "npairs_multilabel_loss" and "reduction" not in config
    named = tfa.NpairsMultilabelLoss.from_config(tfa.NpairsMultilabelLoss(name="ml").get_config())
    assert type(named) is tfa.NpairsMultilabelLoss and named.name == "ml"
    assert named.get_config() == tfa.NpairsMultilabelLoss(name="ml").get_config()
    assert tfa.NpairsMultilabelLoss(reduction="sum").reduction == "none"  # as TFA: always none
    registered = keras.saving.get_registered_name(tfa.NpairsMultilabelLoss)
    assert registered == "Addons>NpairsMultilabelLoss"
    assert keras.saving.get_registered_object(registered) is tfa.NpairsMultilabelLoss
    assert tfa.losses.npairs_multilabel_loss is tfa.npairs_multilabel_loss
    assert {"NpairsMultilabelLoss", "npairs_multilabel_loss"} <= set(tfa.__all__)
    assert "NpairsMultilabelLoss" in tfa.__doc__
    y, s = multilabel(14), logits(14)
    weights = np.linspace(0.5, 2.0, B)
    np.testing.assert_allclose(loss(y, s, sample_weight=weights).numpy(),
                               reference(y, s)[0] * weights.mean(), rtol=1e-10)


def test_readme_lists_it():
    readme = (pathlib.Path(__file__).parents[2] / "docs" / "losses.md").read_text()
    section = readme.split("## Migrating from TensorFlow Addons", 1)[1].split("\n## ", 1)[0]
    available = [line for line in section.splitlines() if line.startswith("- Available:")]
    assert available and "NpairsMultilabelLoss" in section.split("- Same semantics")[0]


@keras.saving.register_keras_serializable(package="test_tfa_npairs_multilabel")
class _Similarities(keras.layers.Layer):
    """``[B, D]`` embeddings to the ``[B, B]`` logits ``E E^T``."""

    def call(self, embeddings):
        return keras.ops.matmul(embeddings, keras.ops.transpose(embeddings))


def test_model_fit_and_keras_round_trip(tmp_path):
    features = np.random.default_rng(15).normal(size=(16, 6)).astype(np.float32)
    y = multilabel(15, b=16, c=5, empty=(3,))
    model = keras.Sequential([small_embedding_model(), _Similarities()])
    model.compile(optimizer="sgd", loss=tfa.losses.NpairsMultilabelLoss())
    history = model.fit(features, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    path = tmp_path / "m.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        assert "Addons>NpairsMultilabelLoss" in archive.read("config.json").decode()
    loaded = keras.models.load_model(path)
    assert type(loaded.loss) is tfa.NpairsMultilabelLoss
    assert loaded.loss.get_config() == model.loss.get_config()
    want = reference(y[:8], model(features[:8]).numpy())[0]
    np.testing.assert_allclose(loaded.evaluate(features[:8], y[:8], batch_size=8, verbose=0),
                               want, rtol=1e-5)
