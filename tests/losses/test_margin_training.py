"""MarginLoss's learnable beta under model.fit: MetricModel, per-class updates, save/load, XLA."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from harness import assert_keras_save_load, pk_dataset, slow_beyond, small_embedding_model

from tfdml.losses import MarginLoss, TrimmedLoss, margin_loss
from tfdml.miners import TripletMiner
from tfdml.models import MetricModel

EASY_HARD = TripletMiner("easy", "hard")


# What fit does to beta (per-class updates, the learning-rate multiplier, a wrapper's beta, a
# fixed beta, saving) is the same under every mode: eagerly on every commit, under XLA in the
# slow tier.
# test_metric_model_trains_beta trains beta under XLA on every commit.
MODES = slow_beyond(["eager", "xla"], {"eager"})


def _fit(embedder, loss, dataset=None, steps=3, mode="xla", lr=0.05, wrap=True):
    """Fits ``MetricModel(embedder, loss)`` (or the bare model compiled with the loss),
    run ``mode``: "eager", "graph" or "xla"."""
    options = {"run_eagerly": mode == "eager", "jit_compile": mode == "xla"}
    if wrap:
        model = MetricModel(embedder, loss)
        model.compile(optimizer=keras.optimizers.Adam(lr), **options)
    else:
        model = embedder
        model.compile(optimizer=keras.optimizers.Adam(lr), loss=loss, **options)
    dataset = pk_dataset(num_classes=3, per_class=4) if dataset is None else dataset
    model.fit(dataset, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return model


# As a graph in the slow tier: the tests of warnings below train beta as a graph on every
# commit.
@pytest.mark.parametrize("mode", slow_beyond(["xla", "graph"], {"xla"}))
def test_metric_model_trains_beta(mode):
    loss = MarginLoss(miner=EASY_HARD)
    model = _fit(small_embedding_model(), loss, mode=mode)
    assert len(model.trainable_variables) == 3
    assert any(v is loss.trainable_variables[0] for v in model.trainable_variables)
    after = float(loss.beta.numpy())
    assert abs(after - 1.2) > 1e-3, "beta did not move under model.fit"


# A loss warns about its state when a step is traced: the tests of warnings run as a graph on
# every commit, under XLA in the slow tier.
TRACED_MODES = slow_beyond(["graph", "xla"], {"graph"})


@pytest.mark.parametrize("mode", TRACED_MODES)
def test_bare_model_leaves_beta_and_warns(mode):
    loss = MarginLoss(miner=EASY_HARD)
    with pytest.warns(UserWarning, match="learned variables that no model trains"):
        _fit(small_embedding_model(), loss, mode=mode, wrap=False)
    assert float(loss.beta.numpy()) == np.float32(1.2)


@pytest.mark.parametrize("mode", TRACED_MODES)
def test_metric_model_does_not_warn(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fit(small_embedding_model(), MarginLoss(miner=EASY_HARD), steps=1, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_per_class_beta_moves_only_for_classes_in_the_batches(mode):
    # Classes 0..5 appear (two batches of three classes); classes 6..9 never do.
    loss = MarginLoss(0.5, list(np.linspace(1.0, 1.3, 10)), num_classes=10,
                      miner=TripletMiner("all", "all"))
    initial = loss.beta.numpy().copy()
    _fit(small_embedding_model(), loss, steps=4, mode=mode)
    after = loss.beta.numpy()
    assert np.all(np.abs(after[:6] - initial[:6]) > 1e-4), after - initial
    np.testing.assert_array_equal(after[6:], initial[6:])


@pytest.mark.parametrize("mode", MODES)
def test_beta_lr_multiplier_scales_the_adam_step(mode):
    """Adam's first step moves every parameter with a gradient by about lr: beta by m * lr."""
    steps = {}
    for m in (1.0, 10.0):
        loss = MarginLoss(miner=EASY_HARD, beta_lr_multiplier=m)
        _fit(small_embedding_model(), loss, steps=1, mode=mode, lr=1e-3)
        steps[m] = abs(float(loss.beta.numpy()) - 1.2)
    assert steps[1.0] == pytest.approx(1e-3, rel=0.05)
    assert steps[10.0] == pytest.approx(1e-2, rel=0.05)


# A fixed beta leaves the loss without state, about which a traced step would warn.
@pytest.mark.parametrize("mode", MODES)
def test_fixed_beta_has_no_variables_and_adds_none(mode):
    loss = MarginLoss(learn_beta=False, miner=EASY_HARD)
    assert loss.trainable_variables == [] and loss.state is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = _fit(small_embedding_model(), loss, steps=1, mode=mode)
    assert len(model.trainable_variables) == 2
    assert float(loss.beta.numpy()) == pytest.approx(1.2)


@pytest.mark.parametrize("mode", MODES)
def test_trimmed_wrapper_trains_the_inner_beta(mode):
    inner = MarginLoss(miner=EASY_HARD)
    loss = TrimmedLoss(inner, trim=0.25)
    assert loss.trainable_variables == inner.trainable_variables
    _fit(small_embedding_model(), loss, mode=mode)
    assert abs(float(inner.beta.numpy()) - 1.2) > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_save_load_keeps_learned_beta_and_training_resumes(tmp_path, mode):
    loss = MarginLoss(num_classes=6, miner=EASY_HARD)
    model = _fit(small_embedding_model(), loss, steps=3, mode=mode)
    learned = loss.beta.numpy().copy()
    assert not np.allclose(learned, 1.2)
    path = tmp_path / "margin.keras"
    model.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the optimizer's state loads without a mismatch
        loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.metric_loss.beta.numpy(), learned, rtol=1e-6)
    features = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    np.testing.assert_allclose(loaded(features), model(features), rtol=1e-6)
    # Both continue identically: the optimizer's moments for beta were restored.
    for m in (model, loaded):
        m.fit(pk_dataset(num_classes=3, per_class=4), steps_per_epoch=2, shuffle=False,
              verbose=0)
    assert not np.allclose(loaded.metric_loss.beta.numpy(), learned)
    np.testing.assert_allclose(loaded.metric_loss.beta.numpy(), loss.beta.numpy(), rtol=1e-6)


def test_per_class_loss_survives_keras_save_load(tmp_path):
    labels = np.repeat(np.arange(3), 3)
    features = np.random.default_rng(1).normal(size=(9, 6)).astype(np.float32)
    assert_keras_save_load(
        lambda: MarginLoss(num_classes=3, beta=[1.0, 1.1, 1.3], miner=EASY_HARD),
        tmp_path, labels=labels, features=features,
    )


@pytest.mark.slow  # an XLA repeat of the eager per-class check
def test_per_class_beta_under_xla_matches_eager():
    loss = MarginLoss(num_classes=4, beta=[0.9, 1.0, 1.1, 1.2], miner=EASY_HARD)
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3, 3], np.int32)
    x = np.random.default_rng(2).normal(size=(9, 5)).astype(np.float32)
    eager = loss(labels, x).numpy()
    compiled = tf.function(lambda y, e: loss(y, e), jit_compile=True)(labels, x).numpy()
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)


def test_out_of_range_ids_fail_inside_tf_function():
    loss = MarginLoss(num_classes=3, learn_beta=False, miner=EASY_HARD)
    # Traced without AutoGraph: the check is an op of the graph, and converting the loss's
    # code (no control flow on tensors to convert) takes seconds.
    fn = tf.function(lambda y, e: loss(y, e), autograph=False)
    x = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_classes=3"):
        fn(np.array([0, 0, 5, 5], np.int32), x)


@pytest.mark.parametrize("average,want", [("nonzero", -1.0), ("anchors", -0.5)])
def test_custom_loop_differentiates_beta(average, want):
    # With beta = 0.1 every positive term is active and no negative one is. Over the six
    # non-zero terms (the default) dL/dbeta = -6/6; per anchor (1 of its 2 terms) -1/2.
    loss = MarginLoss(beta=0.1, miner=EASY_HARD, average=average)
    labels = np.array([0, 0, 1, 1, 2, 2], np.int32)
    x = tf.constant(np.random.default_rng(4).normal(size=(6, 3)), tf.float32)
    with tf.GradientTape() as tape:
        value = loss(labels, x)
    (grad,) = tape.gradient(value, loss.trainable_variables)
    assert float(grad) == pytest.approx(want)


def test_functional_form_accepts_a_variable_beta():
    beta = tf.Variable([0.1, 0.15, 0.2])
    labels = np.array([0, 0, 1, 1, 2, 2], np.int32)
    x = tf.constant(np.random.default_rng(5).normal(size=(6, 3)), tf.float32)
    with tf.GradientTape() as tape:
        value = margin_loss(labels, x, beta=beta, miner=EASY_HARD)
    grad = tf.convert_to_tensor(tape.gradient(value, beta)).numpy()
    # Two anchors per class, each with one non-zero (positive) term of six: -2/6 per class.
    np.testing.assert_allclose(grad, [-1 / 3] * 3, rtol=1e-6)
    fixed = margin_loss(labels, x, beta=[0.1, 0.15, 0.2], miner=EASY_HARD)
    np.testing.assert_allclose(fixed.numpy(), value.numpy(), rtol=1e-6)
