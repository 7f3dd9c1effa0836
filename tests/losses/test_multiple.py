"""MultipleLosses: the weighted sum of its losses, their miners, their states under a
MetricModel (trained, saved, restored), serialization and bad arguments."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, compiled, to_numpy
from harness import assert_config_roundtrip

import tfdml
from tfdml import losses as L
from tfdml.miners import MultiSimilarityMiner, TripletMiner

pytestmark = pytest.mark.multibackend

LABELS = np.repeat(np.arange(4), 3)
X = np.random.default_rng(0).normal(size=(12, 8)).astype("float32")


def _parts():
    return [L.MultiSimilarityLoss(), L.TripletMarginLoss(miner=TripletMiner("hard", "hard"))]


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "none"])
def test_the_value_is_the_weighted_sum_eager_and_compiled(reduction):
    parts = [L.MultiSimilarityLoss(reduction=reduction),
             L.ContrastiveLoss(reduction=reduction)]
    loss = L.MultipleLosses(parts, weights=[0.7, -0.2])
    want = 0.7 * to_numpy(parts[0](LABELS, X)) - 0.2 * to_numpy(parts[1](LABELS, X))
    np.testing.assert_allclose(to_numpy(loss(LABELS, X)), want, rtol=1e-6, atol=1e-7)
    if BACKEND != "torch":
        got = compiled(lambda y, e: loss(y, e))(LABELS, X)
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5, atol=1e-6)
    broken = X.copy()
    broken[3, 1] = np.nan
    value = to_numpy(loss(LABELS, broken))
    assert np.isnan(value) if value.ndim == 0 else np.any(np.isnan(value))


def test_miners_given_become_the_losses_miners():
    miner = MultiSimilarityMiner(epsilon=0.05, positive="easy")
    parts = _parts()
    loss = L.MultipleLosses(parts, miners=[None, miner])
    assert isinstance(parts[0].miner, MultiSimilarityMiner) and parts[1].miner is miner
    want = to_numpy(L.MultiSimilarityLoss()(LABELS, X)) + to_numpy(
        L.TripletMarginLoss(miner=miner)(LABELS, X))
    np.testing.assert_allclose(to_numpy(loss(LABELS, X)), want, rtol=1e-6)


def test_config_round_trip():
    loss = L.MultipleLosses(_parts(), weights=[1.0, 0.25], name="both")
    clone = assert_config_roundtrip(loss)
    assert [type(p) for p in clone.losses] == [type(p) for p in loss.losses]
    assert clone.weights == [1.0, 0.25] and clone.name == "both"
    np.testing.assert_allclose(to_numpy(clone(LABELS, X)), to_numpy(loss(LABELS, X)), rtol=1e-6)


def _model(loss):
    embedder = keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, name="head")])
    model = tfdml.models.MetricModel(embedder, loss)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    return model


def test_a_metric_model_trains_saves_and_restores_the_losses_states(tmp_path):
    loss = L.MultipleLosses([L.MultiSimilarityLoss(), L.ArcFaceLoss(num_classes=4)],
                            weights=[1.0, 0.5])
    model = _model(loss)
    arcface = loss.losses[1]
    assert any(v is arcface.class_vectors for v in model.trainable_variables)
    before = np.array(to_numpy(arcface.class_vectors))
    model.fit(X, LABELS, batch_size=12, epochs=2, verbose=0)
    after = np.array(to_numpy(arcface.class_vectors))
    assert not np.allclose(before, after)
    path = str(tmp_path / "multiple.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    restored = loaded.metric_loss.losses[1].class_vectors
    np.testing.assert_allclose(to_numpy(restored), after, rtol=1e-6)


def test_wrapping_it_in_a_loss_that_needs_terms_says_what_to_do():
    with pytest.raises(NotImplementedError, match="Wrap each loss"):
        L.TrimmedLoss(L.MultipleLosses(_parts()))(LABELS, X)


@pytest.mark.parametrize("kwargs,match", [
    ({"losses": []}, "losses"), ({"losses": L.MultiSimilarityLoss()}, "losses"),
    ({"losses": [keras.losses.MeanSquaredError()]}, "loss"),
    ({"weights": [1.0]}, "weights"), ({"weights": [1.0, float("nan")]}, "weights"),
    ({"miners": [None]}, "miners"), ({"miners": ["hard", None]}, "miners"),
])
def test_bad_arguments_are_value_errors_naming_them(kwargs, match):
    kwargs = {"losses": _parts(), **kwargs}
    with pytest.raises(ValueError, match=match):
        L.MultipleLosses(**kwargs)


def test_a_miner_for_a_loss_without_one_is_refused():
    with pytest.raises(ValueError, match="miners"):
        L.MultipleLosses([L.ArcFaceLoss(num_classes=4)], miners=[MultiSimilarityMiner()])


def test_mixing_per_sample_and_scalar_reductions_is_refused():
    """A scalar added to ``[B]`` values would broadcast onto each of them: the sum of
    TripletMargin (scalar) and MultiSimilarity (``reduction="none"``) came out ``[12]``."""
    parts = [L.MultiSimilarityLoss(reduction="none"), L.TripletMarginLoss()]
    with pytest.raises(ValueError, match=r"`losses`.*reduction=\['none', 'sum_over_batch_size'\]"):
        L.MultipleLosses(parts)
    # Nested sums count as what they return.
    inner = L.MultipleLosses([L.MultiSimilarityLoss(reduction="none")])
    with pytest.raises(ValueError, match="`losses`"):
        L.MultipleLosses([inner, L.ContrastiveLoss(reduction="sum")])
    both = L.MultipleLosses([inner, L.ContrastiveLoss(reduction="none")])
    assert to_numpy(both(LABELS, X)).shape == (12,)
    # A reduction changed after the sum was built is caught when it is called.
    parts = [L.MultiSimilarityLoss(), L.ContrastiveLoss(reduction="sum")]
    loss = L.MultipleLosses(parts)
    assert to_numpy(loss(LABELS, X)).shape == ()
    parts[1].reduction = "none"
    with pytest.raises(ValueError, match="reduction"):
        loss(LABELS, X)


def test_weights_all_zero_are_refused():
    with pytest.raises(ValueError, match=r"`weights`.*weights=\[0.0, 0.0\]"):
        L.MultipleLosses(_parts(), weights=[0, 0.0])
    loss = L.MultipleLosses(_parts(), weights=[0.0, 1.0])
    np.testing.assert_allclose(to_numpy(loss(LABELS, X)), to_numpy(_parts()[1](LABELS, X)),
                               rtol=1e-6)
