"""ContrastiveModel: self-supervised training on two views, under every backend.

Each algorithm trains (eagerly and compiled) without NaN and reports its collapse monitor;
the momentum (EMA) update follows the papers' sequence; a chunked step (gradient cache,
each sample's two views in one chunk) equals the whole-batch step; ``.keras`` files and a
resumed run equal a straight one; bad arguments are ValueErrors naming them.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, to_numpy
from harness import slow_beyond

import tfdml
from tfdml.losses import MoCoLoss
from tfdml.models import ContrastiveModel, build_predictor, build_projector

pytestmark = pytest.mark.multibackend

MODES = {"tensorflow": ["eager", "compiled"], "jax": ["eager", "compiled"],
         "torch": ["eager"]}[BACKEND]
ALGORITHMS = ["simclr", "simsiam", "barlow", "vicreg", "byol", "moco"]
WITH_PREDICTOR = ("simsiam", "byol", "moco")


def _views(n=24, seed=0):
    rng = np.random.default_rng(seed)
    first = rng.normal(size=(n, 6)).astype("float32")
    return first, first + 0.2 * rng.normal(size=first.shape).astype("float32")


def _backbone(seed=0):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed)),
                             keras.layers.Dense(5, kernel_initializer=init(seed + 1))])


def _model(algorithm, batch_norm=True, seed=0, **kwargs):
    """A small model; without ``batch_norm`` its heads treat rows independently."""
    init = keras.initializers.GlorotUniform
    if batch_norm:
        projector = build_projector(4, hidden_dim=7, num_layers=2)
        predictor = build_predictor(4, 3) if algorithm in WITH_PREDICTOR else None
    else:
        projector = keras.Sequential([keras.layers.Dense(4, kernel_initializer=init(seed + 2))])
        predictor = (keras.Sequential([keras.layers.Dense(4, kernel_initializer=init(seed + 3))])
                     if algorithm in WITH_PREDICTOR else None)
    if algorithm == "moco":
        kwargs.setdefault("loss", MoCoLoss(queue_size=64, seed=seed))
    return ContrastiveModel(_backbone(seed), projector, predictor, algorithm=algorithm,
                            **kwargs)


def _compile(model, mode, optimizer=None):
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1),
                  run_eagerly=mode == "eager", jit_compile=mode == "compiled")
    return model


def _values(variables):
    return [to_numpy(v) for v in variables]


# Eagerly in the slow tier: the compiled step is the one users train with, and the other
# tests here check the eager step's values (chunks, the momentum sequence, a resumed run).
# Compiled, one algorithm of each kind of step trains on every commit: keys (moco) here, two
# views (simclr) in test_monitors_watch_the_projections and targets (byol) in
# test_the_momentum_update_is_the_papers_sequence. The other algorithms run here in the slow
# tier.
@pytest.mark.parametrize("mode", [m if m == "compiled" else pytest.param(m, marks=pytest.mark.slow)
                                  for m in MODES])
@pytest.mark.parametrize("algorithm", slow_beyond(ALGORITHMS, {"moco"}))
def test_each_algorithm_trains_two_epochs_without_nan(algorithm, mode):
    keras.utils.set_random_seed(0)
    model = _compile(_model(algorithm), mode)
    history = model.fit(x=_views(), batch_size=8, epochs=2, verbose=0).history
    assert np.all(np.isfinite(history["loss"])), history
    assert all(0 < s < 1 for s in history["output_std"]), history
    x = _views()[0]
    np.testing.assert_allclose(to_numpy(model.predict(x, verbose=0)),
                               to_numpy(model.backbone(x)), rtol=1e-5, atol=1e-6)


# One algorithm of each kind of step on every commit, byol's target network too: two views
# (simclr), targets (simsiam, byol) and keys (moco); barlow and vicreg (two views) in the slow
# tier.
@pytest.mark.parametrize("algorithm", slow_beyond(ALGORITHMS, {"simclr", "simsiam", "byol",
                                                               "moco"}))
def test_a_chunked_step_equals_the_whole_batch_step(algorithm):
    """Batches of 12 samples in chunks of 5, 5 and 2 (both views of a sample together)."""
    runs = []
    for chunk_size in (None, 5):
        model = _compile(_model(algorithm, batch_norm=False, chunk_size=chunk_size), "eager")
        model.fit(x=_views(24), batch_size=12, epochs=1, shuffle=False, verbose=0)
        runs.append(_values(model.weights))
    for whole, chunked in zip(*runs, strict=True):
        np.testing.assert_allclose(chunked, whole, rtol=2e-5, atol=2e-6)


def test_an_augmenter_makes_the_two_views_in_the_step():
    """Images and an augmenter: the step trains on ``(aug(x), aug(x))``, two draws."""
    x = _views(12)[0]
    runs = []
    for given_views in (False, True):
        model = _model("simclr", batch_norm=False,
                       augmenter=keras.layers.GaussianNoise(0.3, seed=7))
        if given_views:
            noise = keras.layers.GaussianNoise(0.3, seed=7)
            data = {"x": (noise(x, training=True), noise(x, training=True))}
        else:
            data = {"x": x}
        _compile(model, "eager").fit(**data, batch_size=12, epochs=1, shuffle=False,
                                     verbose=0)
        runs.append(_values(model.trainable_weights))
    for a, b in zip(*runs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    chunked = _model("simclr", batch_norm=False, chunk_size=5,
                     augmenter=keras.layers.GaussianNoise(0.3, seed=7))
    history = _compile(chunked, "eager").fit(x=x, batch_size=12, epochs=2, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))


@pytest.mark.parametrize("mode", MODES)
def test_the_momentum_update_is_the_papers_sequence(mode):
    """The target starts at theta_0; after steps 1 and 2 it is theta_0 and
    m theta_0 + (1 - m) theta_1 (the papers' update after each optimizer step)."""
    m = 0.75
    model = _compile(_model("byol", batch_norm=False, momentum=m), mode)
    network = model.embedder
    online = network.backbone.trainable_weights + network.projector.trainable_weights
    target = network.target_backbone.weights + network.target_projector.weights
    theta0 = _values(online)
    np.testing.assert_array_equal(np.concatenate([t.ravel() for t in _values(target)]),
                                  np.concatenate([t.ravel() for t in theta0]))
    views = _views(8)
    model.train_on_batch(x=views)
    theta1 = _values(online)
    assert not np.allclose(theta1[0], theta0[0])
    for t, want in zip(_values(target), theta0, strict=True):
        np.testing.assert_allclose(t, want, rtol=1e-6)
    model.train_on_batch(x=views)
    for t, a, b in zip(_values(target), theta0, theta1, strict=True):
        np.testing.assert_allclose(t, m * a + (1 - m) * b, rtol=1e-5, atol=1e-7)


def test_the_moco_queue_holds_the_last_keys():
    """Momentum 0: the step's keys are the online network's projections of both views
    before its update, normalized, written at rows 0..15; the other rows stay."""
    model = _compile(_model("moco", batch_norm=False, momentum=0.0), "eager")
    views = _views(8)
    queue = model.contrastive_loss.state
    initial = to_numpy(queue.keys).copy()
    network = model.embedder
    want = np.concatenate([to_numpy(network.projector(network.backbone(v))) for v in views])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    model.train_on_batch(x=views)
    assert int(to_numpy(queue.position)) == 16
    np.testing.assert_allclose(to_numpy(queue.keys)[:16], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(queue.keys)[16:], initial[16:])


def test_keras_file_round_trip_and_a_resumed_run_equals_a_straight_one(tmp_path):
    """MoCo: the target network, the queue and the optimizer's slots are saved."""
    views = _views(24)
    keras.utils.set_random_seed(5)  # the same initial heads for both runs
    straight = _compile(_model("moco", momentum=0.9), "eager", keras.optimizers.Adam(0.01))
    straight.fit(x=views, batch_size=8, epochs=2, shuffle=False, verbose=0)

    keras.utils.set_random_seed(5)
    first = _compile(_model("moco", momentum=0.9), "eager", keras.optimizers.Adam(0.01))
    first.fit(x=views, batch_size=8, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "ssl.keras")
    first.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ContrastiveModel) and loaded.algorithm == "moco"
    for a, b in zip(_values(first.weights), _values(loaded.weights), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(to_numpy(loaded.predict(views[0], verbose=0)),
                               to_numpy(first.predict(views[0], verbose=0)), rtol=1e-6)
    loaded.compile(optimizer=loaded.optimizer, run_eagerly=True)
    loaded.fit(x=views, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(_values(straight.weights), _values(loaded.weights), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_round_trips_a_keras_file(tmp_path, algorithm):
    model = _model(algorithm, augmenter=keras.layers.GaussianNoise(0.1, seed=1))
    path = str(tmp_path / f"{algorithm}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (type(loaded), loaded.algorithm, loaded.momentum) == (
        ContrastiveModel, algorithm, model.momentum)
    assert type(loaded.contrastive_loss) is type(model.contrastive_loss)
    assert len(loaded.weights) == len(model.weights)
    for a, b in zip(_values(model.weights), _values(loaded.weights), strict=True):
        np.testing.assert_array_equal(a, b)


def test_batches_of_views_in_every_form():
    """``fit(x=(v1, v2))``, ``(v1, v2)`` pairs and ``{"view1", "view2"}`` dicts agree."""
    v1, v2 = _views(8)
    results = []
    for data in ({"x": (v1, v2)}, {"x": v1, "y": v2},
                 {"x": {"view1": v1, "view2": v2}}):
        model = _compile(_model("simclr", batch_norm=False), "eager")
        model.fit(**data, batch_size=8, epochs=1, shuffle=False, verbose=0)
        results.append(_values(model.weights))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"algorithm": "dino"}, "algorithm"),
    ({"algorithm": "simsiam", "predictor": None}, "predictor"),
    ({"algorithm": "byol", "momentum": 1.5}, "momentum"),
    ({"algorithm": "moco", "momentum": -0.1}, "momentum"),
    ({"algorithm": "simclr", "momentum": 0.9}, "momentum"),
    ({"algorithm": "simsiam", "predictor": "p3"}, "predictor"),
    ({"algorithm": "simclr", "chunk_size": 0}, "chunk_size"),
])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    kwargs = dict(kwargs)
    projector = keras.Sequential([keras.layers.Dense(4)])
    if kwargs.get("predictor") == "p3":
        kwargs["predictor"] = keras.Sequential([keras.layers.Dense(3)])  # not the projector's 4
    else:
        kwargs.setdefault("predictor", build_predictor(4, 3))
    with pytest.raises(ValueError, match=match):
        ContrastiveModel(_backbone(), projector, **kwargs)


def test_bad_batches_are_value_errors():
    v1, v2 = _views(8)
    with pytest.raises(ValueError, match="same number of rows"):
        _compile(_model("simclr"), "eager").train_on_batch(x=(v1, v2[:7]))
    with pytest.raises(ValueError, match="two views"):
        _compile(_model("simclr"), "eager").fit(x=v1, batch_size=8, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="without `loss=`"):
        _model("simclr").compile(optimizer="sgd", loss="mse")


@pytest.mark.parametrize("mode", MODES)
def test_monitors_watch_the_projections(tmp_path, mode):
    """``monitors=``: Keras metrics of the ``[2N, P]`` projections, in the logs; compiled
    metrics are refused (no labels)."""
    model = _compile(_model("simclr", monitors=[tfdml.metrics.PCF()]), mode)
    history = model.fit(x=_views(16), batch_size=8, epochs=2, verbose=0).history
    assert all(0 < v <= 1 for v in history["pcf"]), history
    # The epoch's value: the PCF of the projections of the last epoch's batches.
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "m.keras"))
    assert [type(m).__name__ for m in loaded.monitors] == ["PCF"]
    with pytest.raises(ValueError, match="monitors"):
        _model("simclr").compile(optimizer="sgd", metrics=["mae"])
    with pytest.raises(ValueError, match="monitors"):
        _model("simclr", monitors=["mae"])


def test_output_std_of_collapsed_and_spread_outputs():
    spread = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
    metric = tfdml.models.monitors.OutputStd()
    metric.update_state(None, spread)
    unit = spread / np.linalg.norm(spread, axis=1, keepdims=True)
    np.testing.assert_allclose(to_numpy(metric.result()), unit.std(axis=0).mean(), rtol=1e-5)
    metric.reset_state()
    metric.update_state(None, np.tile(spread[:1], (8, 1)))
    assert abs(float(to_numpy(metric.result()))) < 1e-6
    metric.update_state(None, np.full((4, 16), np.nan, "float32"))
    assert np.isnan(to_numpy(metric.result()))


class _Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(5)

    def call(self, x):
        return self.dense(x)


def test_a_backbone_without_a_known_input_is_a_value_error_and_wraps():
    projector = keras.Sequential([keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="keras.Input"):
        ContrastiveModel(_Subclassed(), projector, algorithm="simclr")
    wrapped = keras.Sequential([keras.Input((6,)), _Subclassed()])
    predictor = keras.Sequential([keras.layers.Dense(4)])
    model = _compile(ContrastiveModel(wrapped, projector, predictor, algorithm="byol"), "eager")
    history = model.fit(x=_views(16), batch_size=8, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
