"""DynamicSoftMarginLoss (Zhang & Rusinkiewicz 2019): triplets weighted by a running CDF.

Parity with pytorch-metric-learning 2.9 over a recorded sequence of batches (the histogram
evolves), and its differences, each shown exactly by a NumPy reference of its reading
(``references.dynamic_soft_margin(..., reading="pml")`` reproduces every recorded value,
gradient and histogram): the batch histogram is normalized before the momentum mix (pml's
raw counts are the paper's update with the momentum ``m T / (1 - m + m T)``), the CDF weight
is a constant of the gradient (pml's carries one), and values off the grid are clipped (pml
raises). The contract tests of the loss cases, written here for a loss with state: config,
``.keras`` round trip with the histogram, compiled = eager with the state update, NaN and
degenerate batches, mixed precision.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    CAN_COMPILE,
    compiled,
    reference_gradient,
    to_numpy,
    value_and_grad,
)
from harness import assert_config_roundtrip, run_under_policy, small_embedding_model
from pml_data import DATA

from tfdml.losses import DynamicSoftMarginLoss, dynamic_soft_margin_loss
from tfdml.miners import TripletMiner
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

#: The recorded cases: name -> (min_val, num_bins, momentum), as in make_pml_fixtures.py.
CASES = {"dsm": (-2.0, 10, 0.01), "dsm_args": (-2.5, 7, 0.3)}
STEPS = 4


def _step(t):
    return DATA[f"dsm_seq/{t}/labels"], DATA[f"dsm_seq/{t}/embeddings"]


def _recorded(name, t):
    return (float(DATA[f"{name}/{t}/value"]), DATA[f"{name}/{t}/grad"],
            DATA[f"{name}/{t}/hist"])


def _functional(labels, x, hist, min_val, momentum):
    """``(value, grad, new_histogram)`` of the functional form, as NumPy."""
    def value(e):
        return dynamic_soft_margin_loss(labels, e, hist, min_val=min_val,
                                        momentum=momentum)[0]

    v, g = value_and_grad(value, x)
    _, new = dynamic_soft_margin_loss(labels, x, hist, min_val=min_val, momentum=momentum)
    return float(v), g, to_numpy(new)


# -- pytorch-metric-learning's reading, exactly -----------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_numpy_reading_of_pml_reproduces_the_recorded_sequence(name):
    """Values, gradients (through the histogram's shares) and histograms of every step."""
    min_val, num_bins, momentum = CASES[name]
    hist = np.zeros(num_bins)
    for t in range(STEPS):
        labels, x = _step(t)
        value, grad, pml_hist = _recorded(name, t)
        got, new, _, _ = ref.dynamic_soft_margin(labels, x, hist, min_val, momentum, "pml")
        np.testing.assert_allclose(got, value, rtol=1e-12)
        np.testing.assert_allclose(new, pml_hist, rtol=1e-12, atol=1e-15)
        # pml's gradient: the histogram (hence the weights) moves with the embeddings.
        slopes = ref.dynamic_soft_margin_pml_slopes(labels, x, hist, min_val, momentum)
        expected = reference_gradient(
            lambda e, labels=labels, w=slopes: ref.dynamic_soft_margin_weighted(labels, e, w), x)
        np.testing.assert_allclose(grad, expected, rtol=1e-7, atol=1e-10)
        hist = new


# -- tfdml against pml: the same first step, the paper's update after it -----------------------


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name", list(CASES))
def test_sequence_against_pml(name):
    min_val, num_bins, momentum = CASES[name]
    hist = np.zeros(num_bins)
    for t in range(STEPS):
        labels, x = _step(t)
        value, grad, new = _functional(labels, x, hist, min_val, momentum)
        pml_value, pml_grad, pml_hist = _recorded(name, t)
        expected, expected_hist, weights, gaps = ref.dynamic_soft_margin(
            labels, x, hist, min_val, momentum)
        np.testing.assert_allclose(value, expected, rtol=1e-9)
        np.testing.assert_allclose(new, expected_hist, rtol=1e-9, atol=1e-15)
        # The paper's gradient: the CDF weights are constants.
        paper_grad = reference_gradient(
            lambda e, labels=labels, w=weights: ref.dynamic_soft_margin_weighted(labels, e, w),
            x)
        np.testing.assert_allclose(grad, paper_grad, rtol=1e-7, atol=1e-10)
        assert np.abs(grad - pml_grad).max() > 1e-4 * np.abs(pml_grad).max()
        if t == 0:  # the first batch sets the histogram: pml's value and histogram
            np.testing.assert_allclose(value, pml_value, rtol=1e-9)
            np.testing.assert_allclose(new, pml_hist, rtol=1e-9, atol=1e-15)
        else:  # pml mixes raw counts in: another histogram
            assert np.abs(new - pml_hist).max() > 1e-3
        hist = new


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name", list(CASES))
def test_pml_update_is_the_paper_update_with_momentum_m_t(name):
    """pml's ``((1 - m) h + m counts) / (1 - m + m T)`` is tfdml's update with momentum
    ``m T / (1 - m + m T)`` (``T`` triplets): with it, tfdml gives pml's values and
    histograms at every step."""
    min_val, num_bins, momentum = CASES[name]
    hist = np.zeros(num_bins)
    for t in range(STEPS):
        labels, x = _step(t)
        count = len(ref.triplets_where(labels, lambda a, p, n: True))
        effective = momentum * count / (1.0 - momentum + momentum * count)
        value, new = to_numpy(dynamic_soft_margin_loss(labels, x, hist, min_val=min_val,
                                                       momentum=effective))
        pml_value, _, pml_hist = _recorded(name, t)
        np.testing.assert_allclose(value, pml_value, rtol=1e-9)
        np.testing.assert_allclose(new, pml_hist, rtol=1e-9, atol=1e-15)
        hist = new


@pytest.mark.usefixtures("float64")
def test_values_off_the_grid_are_clipped_where_pml_raises():
    # x = d_ap - d_an: the anchor's positive opposite it, its negative next to it.
    labels = np.array([0, 0, 1, 1, 1])
    x = np.array([[1.0, 0.0], [-1.0, 0.05], [0.98, 0.2], [0.0, 1.0], [0.05, 1.0]])
    gaps = ref._dsm_gaps(labels, x)
    assert gaps.max() > 1.6  # past pml's last node (2 - 0.4): pml's scatter_add fails
    with pytest.raises(IndexError):
        ref.dynamic_soft_margin(labels, x, np.zeros(10), reading="pml")
    for min_val in (-2.0, -1.0):  # -1: some values below min_val too
        expected, expected_hist, _, _ = ref.dynamic_soft_margin(labels, x, np.zeros(10),
                                                                min_val)
        value, new = to_numpy(dynamic_soft_margin_loss(labels, x, np.zeros(10),
                                                       min_val=min_val))
        np.testing.assert_allclose(value, expected, rtol=1e-12)
        np.testing.assert_allclose(new, expected_hist, rtol=1e-12, atol=1e-15)
    # min_val=-1: values below -1 and above 0.8 are at the end nodes.
    assert gaps.min() < -1.0 and expected_hist[0] > 0 and expected_hist[-1] > 0


# -- the class: its state ---------------------------------------------------------------------


def _hist(loss):
    return np.array(to_numpy(loss.histogram))


def test_class_steps_like_the_functional_form_and_evaluation_leaves_the_state():
    loss = DynamicSoftMarginLoss(min_val=-2.5, num_bins=7, momentum=0.3)
    assert loss.state.histogram.trainable is False
    np.testing.assert_array_equal(_hist(loss), np.zeros(7))
    hist = np.zeros(7)
    for t in range(STEPS):
        labels, x = _step(t)
        x = x.astype(np.float32)
        expected, hist = to_numpy(dynamic_soft_margin_loss(labels, x.astype(np.float64), hist,
                                                           min_val=-2.5, momentum=0.3))
        before = _hist(loss)
        evaluated = to_numpy(loss(labels, x, training=False))
        np.testing.assert_array_equal(_hist(loss), before)  # evaluation: unchanged
        trained = to_numpy(loss(labels, x))
        np.testing.assert_allclose(evaluated, trained, rtol=1e-7)
        np.testing.assert_allclose(trained, expected, rtol=2e-6)
        np.testing.assert_allclose(_hist(loss), hist, rtol=2e-6, atol=1e-7)
    assert not np.allclose(_hist(loss), before)


def test_nan_batch_gives_nan_and_leaves_the_histogram():
    loss = DynamicSoftMarginLoss()
    labels, x = _step(0)
    loss(labels, x.astype(np.float32))
    before = _hist(loss)
    for bad in (np.nan, np.inf):
        x2 = x.astype(np.float32)
        x2[3, 1] = bad
        assert np.isnan(to_numpy(loss(labels, x2)))
        np.testing.assert_array_equal(_hist(loss), before)
        value, new = to_numpy(dynamic_soft_margin_loss(labels, x2, before))
        assert np.isnan(value)
        np.testing.assert_array_equal(new, before)


@pytest.mark.filterwarnings("ignore:Loss .dynamic_soft_margin_loss.:UserWarning")
@pytest.mark.parametrize("kind", ["one_class", "singletons", "duplicates", "two"])
def test_degenerate_batches_give_finite_values_and_gradients(kind):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    labels = {"one_class": np.zeros(6), "singletons": np.arange(6),
              "duplicates": np.array([0, 0, 1, 1, 2, 2]), "two": np.array([0, 1, 1, 2, 3, 4])
              }[kind].astype(np.int32)
    if kind == "duplicates":
        x[1], x[3] = x[0], x[0]  # a positive at distance 0, a negative at distance 0
    loss = DynamicSoftMarginLoss()
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    if kind in ("one_class", "singletons"):  # no triplet: 0, the histogram unchanged
        assert value == 0 and not np.any(grad)
        np.testing.assert_array_equal(_hist(loss), np.zeros(10))
    else:
        np.testing.assert_allclose(_hist(loss).sum(), 1.0, rtol=1e-6)


def test_compiled_step_equals_eager_with_the_state_update():
    if not CAN_COMPILE:
        pytest.skip("PyTorch runs eagerly")
    eager = DynamicSoftMarginLoss(momentum=0.2)
    jitted = DynamicSoftMarginLoss(momentum=0.2)
    variable = jitted.state.histogram

    def step(hist, labels, x):  # a stateless step, as MetricModel's under JAX
        with keras.StatelessScope(state_mapping=[(variable, hist)]) as scope:
            value = jitted(labels, x)
        return value, scope.get_current_value(variable)

    step = compiled(step)
    hist = keras.ops.convert_to_tensor(to_numpy(variable))
    for t in range(3):
        labels, x = _step(t)
        x = x.astype(np.float32)
        value, hist = step(hist, labels, x)
        np.testing.assert_allclose(to_numpy(value), to_numpy(eager(labels, x)), rtol=1e-5)
        np.testing.assert_allclose(to_numpy(hist), _hist(eager), rtol=1e-5, atol=1e-7)
    x[0, 0] = np.nan  # NaN: NaN out, the histogram kept, compiled too
    value, new = step(hist, labels, x)
    assert np.isnan(to_numpy(value))
    np.testing.assert_array_equal(to_numpy(new), to_numpy(hist))


def test_fit_updates_the_histogram_and_save_load_keeps_it(tmp_path):
    loss = DynamicSoftMarginLoss(num_bins=12, momentum=0.1)
    model = MetricModel(small_embedding_model(input_dim=7, embed_dim=5), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.01), jit_compile=CAN_COMPILE)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(24, 7)).astype(np.float32)
    y = np.tile(np.repeat(np.arange(3), 2), 4).astype(np.int32)
    model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
    trained = _hist(loss)
    np.testing.assert_allclose(trained.sum(), 1.0, rtol=1e-5)
    model.evaluate(x, y, batch_size=6, verbose=0)
    np.testing.assert_array_equal(_hist(loss), trained)  # evaluate does not update it
    path = tmp_path / "dsm.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(_hist(loaded.metric_loss), trained)
    assert loaded.metric_loss.get_config() == loss.get_config()


def test_mixed_precision():
    labels, x = _step(0)
    expected = float(to_numpy(DynamicSoftMarginLoss()(labels, x.astype(np.float32))))
    with run_under_policy("mixed_float16"):
        loss = DynamicSoftMarginLoss()
        value = loss(labels, keras.ops.convert_to_tensor(x.astype(np.float16)))
        assert keras.backend.standardize_dtype(value.dtype) == "float32"
        np.testing.assert_allclose(float(to_numpy(value)), expected, rtol=5e-3)
        assert keras.backend.standardize_dtype(loss.histogram.dtype) == "float32"
    loss = DynamicSoftMarginLoss(dtype="float16")
    assert keras.backend.standardize_dtype(loss(labels, x).dtype) == "float16"
    with run_under_policy("mixed_bfloat16"):  # a model's step updates the float32 state
        loss = DynamicSoftMarginLoss(momentum=0.5)
        model = MetricModel(small_embedding_model(input_dim=8, embed_dim=6), loss)
        model.compile(optimizer="sgd", jit_compile=CAN_COMPILE)
        history = model.fit(x.astype(np.float32), labels.astype(np.int32), batch_size=16,
                            epochs=2, verbose=0)
        assert np.all(np.isfinite(history.history["loss"]))
        np.testing.assert_allclose(_hist(loss).sum(), 1.0, rtol=1e-5)


def test_a_random_miner_keeps_its_seed_in_the_state():
    miner = TripletMiner("random", "random", seed=3)
    loss = DynamicSoftMarginLoss(miner=miner)
    assert miner.seed_generator in loss.state.seed_generators
    labels, x = _step(1)
    assert np.isfinite(to_numpy(loss(labels, x.astype(np.float32))))
    mined = DynamicSoftMarginLoss(miner=TripletMiner("hard", "hard"))
    value = to_numpy(mined(labels, x.astype(np.float32)))
    assert np.isfinite(value) and value != to_numpy(DynamicSoftMarginLoss()(labels, x))


def test_arguments_and_config():
    for kwargs, name in [({"num_bins": 0}, "num_bins"), ({"num_bins": 2.5}, "num_bins"),
                         ({"min_val": 0.0}, "min_val"), ({"min_val": 1.0}, "min_val"),
                         ({"min_val": -np.inf}, "min_val"), ({"momentum": 0.0}, "momentum"),
                         ({"momentum": 1.5}, "momentum"), ({"momentum": -0.1}, "momentum")]:
        with pytest.raises(ValueError, match=name):
            DynamicSoftMarginLoss(**kwargs)
    with pytest.raises(ValueError, match="momentum"):
        dynamic_soft_margin_loss([0, 0, 1], np.ones((3, 2)), np.zeros(4), momentum=2.0)
    with pytest.raises(ValueError, match="histogram"):
        dynamic_soft_margin_loss([0, 0, 1], np.ones((3, 2)), np.zeros((2, 2)))
    DynamicSoftMarginLoss(momentum=1.0)  # the bounds that are allowed
    clone = assert_config_roundtrip(DynamicSoftMarginLoss(min_val=-1.5, num_bins=20,
                                                          momentum=0.05, average="anchors"))
    assert (clone.min_val, clone.num_bins, clone.momentum) == (-1.5, 20, 0.05)
    assert clone.histogram.shape == (20,)
    assert BACKEND in ("tensorflow", "jax", "torch")


@pytest.mark.skipif(BACKEND != "jax", reason="JAX: a compiled step cannot assign the histogram")
def test_compiled_jax_call_outside_a_metric_model_warns_that_the_histogram_stays():
    labels, x = DATA["uneven/labels"], DATA["uneven/embeddings"].astype("float32")
    loss = DynamicSoftMarginLoss()
    loss(labels, x)  # eagerly: builds the state
    with pytest.warns(UserWarning, match="running state"):
        compiled(lambda e: loss(labels, e))(x)
