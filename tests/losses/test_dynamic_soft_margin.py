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

The loss never builds the ``[B, P, N]`` tensor of triplet gaps for a miner that returns pairs
(the default): it sorts each anchor's positives and counts by binary search. Its values,
gradients and histograms are checked here against the dense formula it computed before
(:func:`_dense_reference`, every triplet of a ``[B, P, N]`` tensor), with every kind of miner;
``block_size`` against the loss without it; and a TensorFlow graph and XLA program without a
``B^3`` tensor. Peak memory: ``benchmarks/dsm_memory.py``.
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
    enable_float64,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import (
    assert_config_roundtrip,
    large_tensor_ops,
    run_under_policy,
    slow_beyond,
    small_embedding_model,
    trace_loss_graph,
    xla_large_shapes,
)
from keras import ops
from pml_data import DATA

from tfdml import ops as dml
from tfdml._shims import dtype_name
from tfdml.losses import DynamicSoftMarginLoss, dynamic_soft_margin_loss
from tfdml.losses import _soft_margin_counts as dsm_counts
from tfdml.losses.inputs import mined_triplets, prepare_inputs, resolve_miner
from tfdml.miners import (
    AllPairsMiner,
    MultiSimilarityMiner,
    TripletMarginMiner,
    TripletMiner,
    gather_triplet_scores,
)
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


# A check of the NumPy reference against pml's record, not of tfdml: in the slow tier. On
# every commit tfdml meets the record in test_sequence_against_pml (the first step) and in
# test_pml_update_is_the_paper_update_with_momentum_m_t (every step).
@pytest.mark.slow
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


#: The two recorded cases run the same code with other arguments: on every commit the one
#: away from the defaults (the references are differentiated entry by entry, seconds a case).
PML_CASES = slow_beyond(CASES, {"dsm_args"})


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name", PML_CASES)
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


@pytest.mark.slow  # on every commit: test_compiled_blocks_step_equals_eager[None], gradients too
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


@pytest.mark.slow  # training, then a .keras file
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


# -- without the [B, P, N] tensor: the dense formula as the reference -------------------------


def _dense_reference(labels, x, histogram, min_val=-2.0, momentum=0.01, miner="default"):
    """The formula the loss computed on a ``[B, P, N]`` tensor of every mined triplet's gap
    ``x = d_ap - d_an``: each unit mass split between the two nodes around it, the batch
    histogram divided by the triplets and mixed in, the CDF read at the node below each gap.

    Returns ``{average: value}`` for ``"terms"`` (the default), ``"nonzero"`` and
    ``"anchors"``, and the new histogram. Finite inputs only.
    """
    inputs = prepare_inputs(labels, x)
    dist = dml.distance_matrix(inputs.x, inputs.ref, "l2")
    triplets = mined_triplets(inputs, -dist, resolve_miner(miner, AllPairsMiner))
    d_ap, d_an = gather_triplet_scores(dist, triplets)
    mask = triplets.mask
    gaps = ops.broadcast_to(d_ap - d_an, ops.shape(mask))
    dtype = dtype_name(gaps)
    num_bins = len(histogram)
    delta = 2.0 * abs(min_val) / num_bins
    v = ops.clip((ops.stop_gradient(gaps) - min_val) / delta, 0.0, num_bins - 1.0)
    low = dml.floor(v)
    frac = (v - low)[..., None]
    low = ops.cast(low, "int32")
    high = ops.minimum(low + 1, num_bins - 1)
    weight = ops.cast(mask, dtype)
    split = (ops.one_hot(low, num_bins, dtype=dtype) * (1.0 - frac)
             + ops.one_hot(high, num_bins, dtype=dtype) * frac)
    counts = ops.sum(split * weight[..., None], axis=(0, 1, 2))
    total = ops.sum(weight)
    old = ops.convert_to_tensor(np.asarray(histogram), dtype)
    m = momentum if float(np.sum(histogram)) > 0 else 1.0
    new = (1.0 - m) * old + m * counts / ops.maximum(total, 1.0)
    new = ops.where(total > 0, new / ops.maximum(ops.sum(new), 1e-30), old)
    cdf = ops.stop_gradient(dml.cumsum(new))
    terms = ops.where(mask, ops.take(cdf, low) * gaps, ops.zeros((), dtype))
    per_anchor = ops.sum(weight, axis=(1, 2))
    nonzero = ops.sum(ops.cast(ops.logical_and(mask, terms > 0), dtype))
    active = ops.cast(per_anchor > 0, dtype)
    values = {
        "terms": ops.sum(terms) / ops.maximum(total, 1.0),
        "nonzero": ops.sum(terms) / ops.maximum(nonzero, 1.0),
        "anchors": ops.sum(active * ops.sum(terms, axis=(1, 2)) / ops.maximum(per_anchor, 1.0))
        / ops.maximum(ops.sum(active), 1.0),
    }
    return values, new


#: Miners of every path: pairs (sorted), every combination (sorted), single-choice
#: negatives per positive ([B, R, 1]: dense) and a triplet mask of its own ([B, R, R]: dense).
MINERS = {
    "default": lambda: "default",
    "multi_similarity": lambda: MultiSimilarityMiner(epsilon=0.3),
    "triplet_all_all": lambda: TripletMiner("all", "all"),
    "triplet_all_hard": lambda: TripletMiner("all", "hard"),
    "triplet_margin": lambda: TripletMarginMiner(margin=0.3),
}

#: Under JAX (whose eager calls compile every new shape and every loop over blocks) a subset:
#: each path once; the blocks run compiled there (test_compiled_blocks_step_equals_eager).
JAX_CASES = {("default", "float64"), ("default", "float32"), ("multi_similarity", "float64"),
             ("triplet_margin", "float32")}
EAGER_BLOCKS = BACKEND != "jax"

#: (min_val, num_bins, momentum, previous histogram): the first batch; clipped values and a
#: CDF that starts with zeros; most values past the last node.
SETTINGS = [(-2.0, 10, 0.3, None), (-1.0, 10, 0.3, "random"), (-0.6, 7, 0.05, "head")]


def _random_batch(seed, batch=13, dim=5, classes=4, dtype="float64"):
    """Asymmetric (B != D), uneven classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=batch).astype(np.int32)
    return labels, rng.normal(size=(batch, dim)).astype(dtype)


def _previous(kind, num_bins, seed):
    if kind is None:
        return np.zeros(num_bins)
    hist = np.random.default_rng(seed).random(num_bins)
    if kind == "head":
        hist[:3] = 0.0  # the CDF is 0 at the first nodes: those triplets' terms are 0
    return hist / hist.sum()


def _assert_equals_dense(labels, x, hist, average, rtol, **args):
    """The loss's value and gradient (``average``) equal :func:`_dense_reference`'s."""
    def value(e):
        return dynamic_soft_margin_loss(labels, e, hist, average=average, **args)[0]

    def want(e):
        return _dense_reference(labels, e, hist, **args)[0][average]

    (got, grad), (expected, expected_grad) = value_and_grad(value, x), value_and_grad(want, x)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(grad, expected_grad, rtol=rtol,
                               atol=rtol * np.abs(expected_grad).max())
    assert grad.dtype == x.dtype
    return expected


#: On every commit each path of MINERS once and each dtype twice (pairs sorted: "default";
#: every combination sorted, single-choice negatives, a triplet mask: the TripletMiners); the
#: rest in the slow tier.
DENSE_FAST = {"default-float64", "triplet_all_all-float32", "triplet_all_hard-float64",
              "triplet_margin-float32"}


@pytest.mark.parametrize("miner,dtype", slow_beyond(
    [pytest.param(m, d, id=f"{m}-{d}") for m in MINERS for d in ("float32", "float64")],
    DENSE_FAST))
def test_values_gradients_and_histograms_equal_the_dense_formula(miner, dtype):
    if BACKEND == "jax" and (miner, dtype) not in JAX_CASES:
        pytest.skip("the same path as a case of JAX_CASES")
    rtol = 1e-11 if dtype == "float64" else 2e-5
    histograms = []
    with enable_float64():
        for i, (min_val, num_bins, momentum, kind) in enumerate(SETTINGS):
            labels, x = _random_batch(i, dtype=dtype)
            hist = _previous(kind, num_bins, i)
            args = {"min_val": min_val, "momentum": momentum, "miner": MINERS[miner]()}
            if BACKEND == "jax" and (i == 1 or (dtype == "float32" and i > 0)):
                continue  # the first setting only, and the last in float64
            for average in ("terms", "nonzero", "anchors") if i == 2 else ("terms", "nonzero"):
                _assert_equals_dense(labels, x, hist, average, rtol, **args)
            new = to_numpy(dynamic_soft_margin_loss(labels, x, hist, **args)[1])
            histograms.append(to_numpy(_dense_reference(labels, x, hist, **args)[1]))
            np.testing.assert_allclose(new, histograms[-1], rtol=rtol, atol=rtol)
    if miner == "default" and len(histograms) > 1:  # a CDF with zeros first; clipped values
        assert np.all(histograms[0][:2] == 0) and histograms[0][2] > 0
        assert histograms[-1][0] > 0 and histograms[-1][-1] > 0


@pytest.mark.usefixtures("float64")
def test_exact_duplicates_and_ties_on_the_nodes():
    """Gaps exactly on a node (equal distances: x = 0, and a duplicate) count as the dense
    formula counts them."""
    labels = np.array([0, 0, 1, 1, 0, 2, 2], np.int32)
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0],
                  [1.0, 0.0], [0.6, 0.8]])
    for num_bins in (1, 2, 5, 10) if BACKEND != "jax" else (10,):  # x = 0: a node (even)
        hist = np.zeros(num_bins)
        got, new = to_numpy(dynamic_soft_margin_loss(labels, x, hist, min_val=-2.0))
        values, want_new = to_numpy(_dense_reference(labels, x, hist, min_val=-2.0))
        np.testing.assert_allclose(got, values["terms"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(new, want_new, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("entries", [60, 400])
def test_chunks_of_anchors_and_groups_of_nodes(monkeypatch, entries):
    """The searches in chunks of anchors (60 entries: 4 of the 13 anchors at a time, the last
    chunk shifted back) and two of the 4 nodes at a time (400 entries: all anchors), eagerly
    and compiled: the dense formula's values, gradients and histograms."""
    monkeypatch.setattr(dsm_counts, "_GROUP_ENTRIES", entries)
    args = {"min_val": -1.0, "momentum": 0.3}
    labels, x = _random_batch(7)
    hist = _previous("random", 4, 7)
    with enable_float64():
        for average in ("terms", "nonzero") if BACKEND != "jax" else ():  # JAX: compiled
            _assert_equals_dense(labels, x, hist, average, 1e-11, **args)
        if BACKEND != "jax":
            new = to_numpy(dynamic_soft_margin_loss(labels, x, hist, **args)[1])
            np.testing.assert_allclose(
                new, to_numpy(_dense_reference(labels, x, hist, **args)[1]), rtol=1e-11,
                atol=1e-14)
    if not CAN_COMPILE:
        return
    x = x.astype(np.float32)
    step = value_and_grad_function(lambda e: dynamic_soft_margin_loss(
        labels, e, hist.astype(np.float32), average="nonzero", **args)[0], jit_compile=True)
    value, grad = to_numpy(step(x))
    want, want_grad = value_and_grad(
        lambda e: _dense_reference(labels, e, hist.astype(np.float32), **args)[0]["nonzero"], x)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5 * np.abs(want_grad).max())


# -- block_size --------------------------------------------------------------------------------


def _loss_step(loss, labels, x):
    """One training call: ``(value, gradient)`` as NumPy; the histogram moves once."""
    return value_and_grad(lambda e: loss(labels, e), x)


@pytest.mark.parametrize(("miner", "block_size"), slow_beyond(
    [pytest.param(m, b, id=f"{m}-{b}") for m, b in [
        ("default", 3), ("default", 4), ("triplet_easy_all", 4), ("multi_similarity", 3)]],
    {"default-3", "triplet_easy_all-4", "multi_similarity-3"}))  # default-4: another ragged end
def test_blocks_give_the_dense_values_gradients_and_histograms(miner, block_size):
    """B = 11: ragged last blocks (11 = 3 x 3 + 2, 2 x 4 + 3). The histogram moves once per
    step: a second update would mix this batch in twice."""
    if not EAGER_BLOCKS:
        pytest.skip("JAX compiles the blocks at every eager call: see the compiled test")
    make = {"default": lambda: "default", "triplet_easy_all": lambda: TripletMiner("easy", "all"),
            "multi_similarity": lambda: MultiSimilarityMiner(epsilon=0.3)}[miner]
    losses = [DynamicSoftMarginLoss(momentum=0.3, miner=make(), average="nonzero", min_val=-1.0,
                                    block_size=b) for b in (None, block_size)]
    for loss in losses:
        loss.histogram.assign(_previous("random", 10, 4).astype("float32"))
    labels, x = _random_batch(10, batch=11, dim=6, dtype="float32")
    (value, grad), (got, got_grad) = [_loss_step(loss, labels, x) for loss in losses]
    np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, grad, rtol=1e-5, atol=1e-5 * np.abs(grad).max())
    np.testing.assert_allclose(_hist(losses[1]), _hist(losses[0]), rtol=1e-5, atol=1e-7)
    assert value != 0 and np.any(grad)
    assert np.abs(_hist(losses[0]) - _previous("random", 10, 4)).max() > 1e-3


@pytest.mark.usefixtures("float64")
def test_blocks_in_float64_with_anchor_terms():
    if not EAGER_BLOCKS:
        pytest.skip("JAX compiles the blocks at every eager call: see the compiled test")
    labels, x = _random_batch(3, batch=11, dim=4)
    hist = _previous("random", 10, 3)
    for block_size in (4, 10):
        losses = [DynamicSoftMarginLoss(reduction="none", block_size=b, min_val=-1.0)
                  for b in (None, block_size)]
        for loss in losses:
            loss.histogram.assign(hist.astype("float32"))
        (dense, grad), (got, got_grad) = [_loss_step(loss, labels, x) for loss in losses]
        assert dense.shape == (11,)
        np.testing.assert_allclose(got, dense, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got_grad, grad, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(_hist(losses[1]), _hist(losses[0]), rtol=1e-7)


@pytest.mark.parametrize("block_size", [None, 5])
def test_compiled_blocks_step_equals_eager(block_size):
    """A compiled stateless step (as MetricModel's) with blocks of 5 of 16 rows: the value,
    its gradient and the histogram of the eager loss without blocks; NaN keeps it."""
    if not CAN_COMPILE:
        pytest.skip("PyTorch runs eagerly")
    eager = DynamicSoftMarginLoss(momentum=0.2)
    jitted = DynamicSoftMarginLoss(momentum=0.2, block_size=block_size)
    variable = jitted.state.histogram

    def step(hist, labels, x):
        def value(e):
            with keras.StatelessScope(state_mapping=[(variable, hist)]) as scope:
                v = jitted(labels, e)
            return v, scope.get_current_value(variable)

        (v, new), grad = _value_aux_and_grad(value, x)
        return v, grad, new

    step = compiled(step)
    hist = keras.ops.convert_to_tensor(to_numpy(variable))
    for t in range(2):
        labels, x = _step(t)
        x = x.astype(np.float32)
        value, grad, hist = step(hist, labels, x)
        want, want_grad = _loss_step(eager, labels, x)
        np.testing.assert_allclose(to_numpy(value), want, rtol=1e-5)
        np.testing.assert_allclose(to_numpy(grad), want_grad, rtol=1e-4,
                                   atol=1e-5 * np.abs(want_grad).max())
        np.testing.assert_allclose(to_numpy(hist), _hist(eager), rtol=1e-5, atol=1e-7)
    x[0, 0] = np.nan
    value, _, new = step(hist, labels, x)
    assert np.isnan(to_numpy(value))
    np.testing.assert_array_equal(to_numpy(new), to_numpy(hist))


def _value_aux_and_grad(fn, x):
    """``((value, aux), d value / d x)`` of ``fn(x) -> (value, aux)``, inside a compiled
    function (TensorFlow or JAX)."""
    if BACKEND == "jax":
        import jax

        (value, aux), grad = jax.value_and_grad(fn, has_aux=True)(x)
        return (value, aux), grad
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value, aux = fn(x)
    return (value, aux), tape.gradient(value, x)


def test_degenerate_batches_with_blocks():
    """No triplet (one sample per class), B = 1 and a NaN embedding: 0 (or NaN) and the
    histogram unchanged, with and without blocks, and in the functional form."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(7, 3)).astype(np.float32)
    # Under JAX (eager calls compile every new shape) the new case, B = 1, without blocks;
    # the others are test_degenerate_batches_give_finite_values_and_gradients and
    # test_nan_batch_gives_nan_and_leaves_the_histogram there.
    cases = [(np.arange(7), x), (np.array([4]), x[:1])] if EAGER_BLOCKS else [
        (np.array([4]), x[:1])]
    for block_size in (None, 3) if EAGER_BLOCKS else (None,):
        for labels, e in cases:
            loss = DynamicSoftMarginLoss(block_size=block_size)
            with pytest.warns(UserWarning, match="no anchor"):
                value, grad = _loss_step(loss, labels.astype(np.int32), e)
            assert value == 0 and not np.any(grad)
            np.testing.assert_array_equal(_hist(loss), np.zeros(10))
        if not EAGER_BLOCKS:
            continue
        labels = np.array([0, 0, 1, 1, 2, 2, 0], np.int32)
        loss(labels, x)
        before = _hist(loss)
        assert before.sum() > 0.99
        bad = x.copy()
        bad[6, 2] = np.nan
        value, grad = _loss_step(loss, labels, bad)
        assert np.isnan(value)
        np.testing.assert_array_equal(_hist(loss), before)
    value, new = to_numpy(dynamic_soft_margin_loss([3], x[:1], np.full(4, 0.25)))
    assert value == 0
    np.testing.assert_array_equal(new, np.full(4, 0.25))


def test_block_size_config_and_bad_values():
    loss = DynamicSoftMarginLoss(num_bins=7, block_size=64)
    assert loss.get_config()["block_size"] == 64
    assert assert_config_roundtrip(loss).block_size == 64
    assert "block_size" not in DynamicSoftMarginLoss().get_config()
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(ValueError, match="block_size"):
            DynamicSoftMarginLoss(block_size=bad)
    with pytest.raises(ValueError, match="block_size"):
        DynamicSoftMarginLoss(miner=TripletMiner("easy", "hard", disjoint=True), block_size=4)


def test_random_miner_in_blocks_draws_once_per_step():
    if not EAGER_BLOCKS:
        pytest.skip("JAX compiles the blocks at every eager call: see the compiled test")
    miner = TripletMiner("easy", "random", seed=4)
    loss = DynamicSoftMarginLoss(miner=miner, block_size=4, momentum=1.0)
    labels, x = _random_batch(5, batch=11, dim=6, dtype="float32")
    state = to_numpy(miner.seed_generator.state)
    value, grad = _loss_step(loss, labels, x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    moved = to_numpy(miner.seed_generator.state)
    assert not np.array_equal(moved, state)
    # momentum 1: the histogram is this batch's: one triplet per anchor with a triplet.
    np.testing.assert_allclose(_hist(loss).sum(), 1.0, rtol=1e-6)


# -- memory: no B^3 tensor ----------------------------------------------------------------------


@pytest.mark.skipif(BACKEND != "tensorflow", reason="inspects a TensorFlow graph and XLA HLO")
@pytest.mark.parametrize("block_size", [None, 16])
def test_no_cubic_tensor_in_the_graph_or_the_xla_program(block_size):
    # Small batches search all nodes at once: [B, B, num_bins] arrays (and scatter indices of
    # twice that), below B^3 / 2 for num_bins = 4 and B = 64.
    batch, large = 64, 64 ** 3 // 2
    loss = DynamicSoftMarginLoss(num_bins=4, block_size=block_size)
    loss.build_state()
    assert large_tensor_ops(trace_loss_graph(loss, batch=batch), large) == []
    assert xla_large_shapes(loss, large, batch=batch) == []
    if block_size is not None:
        return  # that the walk does see a cubic tensor: checked once, without blocks
    # The check sees the dense path's [B, B, B] where a miner builds one.
    cubic = DynamicSoftMarginLoss(num_bins=4, miner=TripletMarginMiner(margin=0.3))
    cubic.build_state()
    assert large_tensor_ops(trace_loss_graph(cubic, batch=batch), large)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a TensorFlow graph of unknown batch size")
@pytest.mark.parametrize("block_size", [None, 5])
def test_unknown_batch_size_in_a_graph(monkeypatch, block_size):
    """Searches sized at run time, in chunks of 4 anchors (of 17, or of a block of 5)."""
    import tensorflow as tf

    monkeypatch.setattr(dsm_counts, "_DYNAMIC_ROWS", 4)

    labels, x = _random_batch(6, batch=17, dim=5, dtype="float32")
    eager = DynamicSoftMarginLoss(block_size=block_size, min_val=-1.0)
    graph = DynamicSoftMarginLoss(block_size=block_size, min_val=-1.0)
    graph.build_state()
    step = tf.function(lambda y, e: _tf_value_and_grad(graph, y, e), autograph=False,
                       input_signature=[tf.TensorSpec([None], tf.int32),
                                        tf.TensorSpec([None, 5], tf.float32)])
    value, grad = step(labels, x)
    want, want_grad = _loss_step(eager, labels, x)
    np.testing.assert_allclose(value.numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_hist(graph), _hist(eager), rtol=1e-5, atol=1e-7)


def _tf_value_and_grad(loss, labels, x):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(labels, x)
    return value, tape.gradient(value, x)
