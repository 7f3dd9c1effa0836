"""Silent no-learning made visible: tfdml.metrics.ActiveAnchors, the eager warning of the
losses and tfdml.callbacks.ActiveAnchorsWarning."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import references as ref
import tensorflow as tf
from harness import slow_beyond, small_embedding_model

import tfdml
from tfdml.callbacks import ActiveAnchorsWarning
from tfdml.losses import MarginLoss, MultiSimilarityLoss, TripletNCALoss
from tfdml.metrics import ActiveAnchors
from tfdml.miners import TripletMiner

pytestmark = pytest.mark.filterwarnings("ignore:Loss .* has learned variables")

RNG = np.random.default_rng(5)
X = RNG.normal(size=(12, 6)).astype(np.float32)


def _reference_fraction(labels):
    labels = np.asarray(labels)
    pos, neg = ref.label_masks(labels)
    return float(np.mean(np.asarray(pos).any(axis=1) & np.asarray(neg).any(axis=1)))


FRACTION_LABELS = [
    [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],  # two anchors have a triplet
    [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],  # all do
    list(range(12)),  # none does
    [4] * 12,  # one class: no negative
]
FRACTION_LOSSES = {"TripletNCALoss": TripletNCALoss, "MultiSimilarityLoss": MultiSimilarityLoss,
                   "margin_easy_hard": lambda: MarginLoss(miner=TripletMiner("easy", "hard"))}


# On every commit each loss and each batch once; the other pairs in the slow tier.
@pytest.mark.parametrize("make,labels", slow_beyond(
    [pytest.param(make, labels, id=f"{name}-labels{i}")
     for i, labels in enumerate(FRACTION_LABELS) for name, make in FRACTION_LOSSES.items()],
    {"TripletNCALoss-labels0", "MultiSimilarityLoss-labels1", "margin_easy_hard-labels2",
     "TripletNCALoss-labels3"}))
def test_metric_is_the_fraction_of_anchors_with_a_triplet(labels, make):
    metric = ActiveAnchors(make())
    metric.update_state(np.array(labels), X)
    want = _reference_fraction(labels)
    assert float(metric.result()) == pytest.approx(want)


def test_metric_accumulates_over_batches_and_resets():
    metric = ActiveAnchors(TripletNCALoss())
    metric.update_state(np.arange(12), X)  # 0 of 12
    metric.update_state(np.repeat(np.arange(4), 3), X)  # 12 of 12
    assert float(metric.result()) == pytest.approx(0.5)
    metric.reset_state()
    metric.update_state(np.arange(12), X)
    assert float(metric.result()) == 0.0


def test_metric_config_roundtrip_and_errors():
    metric = ActiveAnchors(MultiSimilarityLoss(alpha=3.0), name="ms_active")
    again = ActiveAnchors.from_config(metric.get_config())
    assert again.name == "ms_active"
    assert again._probe.alpha == 3.0
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert isinstance(restored, ActiveAnchors)
    with pytest.raises(ValueError, match="loss"):
        ActiveAnchors(keras.losses.MeanSquaredError())


def test_metric_mines_with_its_own_copy():
    """A random miner's draws in the loss do not depend on whether the metric is used."""
    loss = TripletNCALoss(miner=TripletMiner("random", "random", seed=3))
    metric = ActiveAnchors(loss)
    assert metric._probe is not loss and metric._probe.miner is not loss.miner
    labels = np.repeat(np.arange(4), 3)
    alone = TripletNCALoss(miner=TripletMiner("random", "random", seed=3))
    first = [float(alone(labels, X)) for _ in range(3)]
    second = []
    for _ in range(3):
        metric.update_state(labels, X)
        second.append(float(loss(labels, X)))
    assert first == second


def test_loss_warns_once_eagerly_on_a_batch_without_triplets():
    loss = TripletNCALoss()
    with pytest.warns(UserWarning, match="no anchor of this batch"):
        assert float(loss(np.arange(12), X)) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(np.arange(12), X)  # once per loss
        TripletNCALoss()(np.repeat(np.arange(4), 3), X)  # batches with triplets are quiet


def _fit(labels, callbacks, jit_compile=False):
    loss = TripletNCALoss()
    model = small_embedding_model(input_dim=6, embed_dim=4)
    model.compile(optimizer="sgd", loss=loss, metrics=[ActiveAnchors(loss)],
                  jit_compile=jit_compile)
    ds = tf.data.Dataset.from_tensor_slices((X, np.asarray(labels, np.int32))).batch(6)
    return model.fit(ds, epochs=2, verbose=0, callbacks=callbacks, shuffle=False)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fit_logs_and_warns_on_batches_without_positives(jit_compile):
    """Shuffled batches over many classes: no two samples of a class, nothing learned."""
    with pytest.warns(UserWarning, match="active_anchors = 0 after 1 training batch"):
        history = _fit(np.arange(12), [ActiveAnchorsWarning()], jit_compile)
    assert history.history["active_anchors"] == [0.0, 0.0]
    assert history.history["loss"] == [0.0, 0.0]


def test_fit_on_pk_batches_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        history = _fit(np.repeat(np.arange(4), 3), [ActiveAnchorsWarning()])
    assert history.history["active_anchors"] == [1.0, 1.0]


def test_callback_warns_when_the_metric_is_missing():
    loss = TripletNCALoss()
    model = small_embedding_model(input_dim=6, embed_dim=4)
    model.compile(optimizer="sgd", loss=loss)
    ds = tf.data.Dataset.from_tensor_slices((X, np.repeat(np.arange(4), 3))).batch(6)
    with pytest.warns(UserWarning, match="ActiveAnchors"):
        model.fit(ds, epochs=1, verbose=0, callbacks=[ActiveAnchorsWarning()], shuffle=False)


@pytest.mark.parametrize("kwargs", [dict(monitor=""), dict(threshold=1.0),
                                    dict(threshold=-0.1), dict(threshold="0")])
def test_callback_arguments(kwargs):
    with pytest.raises(ValueError):
        ActiveAnchorsWarning(**kwargs)


def test_public_names():
    assert tfdml.metrics.ActiveAnchors is ActiveAnchors
    assert tfdml.callbacks.ActiveAnchorsWarning is ActiveAnchorsWarning


def test_cross_batch_memory_counts_the_wrapped_loss_on_the_batch():
    labels = np.array([0, 0, 1, 2])  # anchors 0 and 1 have a positive and a negative
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    metric = ActiveAnchors(tfdml.losses.CrossBatchMemory(tfdml.losses.SupConLoss(),
                                                         memory_size=8))
    metric.update_state(labels, x)
    assert float(metric.result()) == pytest.approx(0.5)


def test_class_vector_losses_are_refused():
    with pytest.raises(ValueError, match="every anchor is active"):
        ActiveAnchors(tfdml.losses.ArcFaceLoss(3))


@pytest.mark.parametrize("shuffle", [False, True])
def test_metric_model_fit_warns_on_array_batches_without_positives(shuffle):
    """Compiled steps cannot warn from the loss: MetricModel.fit looks at the array labels."""
    model = tfdml.models.MetricModel(small_embedding_model(input_dim=6, embed_dim=4),
                                     TripletNCALoss())
    model.compile(optimizer="sgd")
    with pytest.warns(UserWarning, match=r"2 of the 2 batches of 6 .* no two samples of a class"):
        model.fit(X, np.arange(12), batch_size=6, epochs=1, verbose=0, shuffle=shuffle)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # P x K order, unshuffled: every batch has positives
        model.fit(X, np.repeat(np.arange(4), 3), batch_size=6, epochs=1, verbose=0,
                  shuffle=False)
    proxies = tfdml.models.MetricModel(small_embedding_model(input_dim=6, embed_dim=4),
                                       tfdml.losses.ProxyNCALoss(num_classes=12))
    proxies.compile(optimizer="sgd")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # class vectors: every sample learns
        proxies.fit(X, np.arange(12), batch_size=6, epochs=1, verbose=0, shuffle=shuffle)
