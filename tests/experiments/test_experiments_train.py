"""tfdml.experiments.train and data: the learning-rate schedule, the synthetic datasets and the
best-epoch checkpoint of ``run``."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

from tfdml import experiments
from tfdml.experiments.resume import best_checkpoint

NAN = float("nan")


def test_learning_rate_schedule_divides_after_milestones():
    schedule = experiments.learning_rate_schedule(0.005, (30, 20), 0.1)
    got = [schedule(e) for e in (0, 19, 20, 29, 30, 39)]
    np.testing.assert_allclose(got, [0.005, 0.005, 5e-4, 5e-4, 5e-5, 5e-5], rtol=1e-12)
    assert experiments.learning_rate_schedule(0.1)(100) == 0.1


@pytest.mark.parametrize("dataset", ["cub200", "inshop", "vehicleid"])
def test_synthetic_data_has_the_evaluation_protocol(dataset):
    data = experiments.synthetic_data(dataset, num_classes=12, per_class=6, image_size=16)
    assert data.train.images.shape == (36, 16, 16, 3) and data.train.images.dtype == np.uint8
    train_classes = set(data.train.labels)
    assert train_classes == set(range(6))
    assert set(data.evaluation) == set(experiments.EVAL_SPLITS[dataset])
    for split in data.evaluation.values():
        assert not train_classes & set(split.labels)  # zero-shot: unseen classes
    if dataset == "inshop":
        q, g = data.evaluation["query"], data.evaluation["gallery"]
        assert set(q.labels) == set(g.labels) == set(range(6, 12))
        assert len(q) + len(g) == 36
    if dataset == "vehicleid":
        sizes = [len(set(data.evaluation[s].labels)) for s in experiments.EVAL_SPLITS[dataset]]
        assert sizes == sorted(sizes) and sizes[-1] == 6
        assert len(set(experiments.synthetic_data("vehicleid").evaluation["test_small"].labels)) >= 5
    again = experiments.synthetic_data(dataset, num_classes=12, per_class=6, image_size=16)
    np.testing.assert_array_equal(again.train.images, data.train.images)


def _saved_epoch(checkpoint, values):
    """Fakes epochs with logs ``{monitor: value}``; returns the epoch whose weights were saved."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    checkpoint.set_model(model)
    checkpoint.on_train_begin()
    for epoch, value in enumerate(values):
        model.layers[0].kernel.assign(np.full((2, 1), epoch + 1.0, "float32"))
        checkpoint.on_epoch_begin(epoch)
        checkpoint.on_epoch_end(epoch, {checkpoint.monitor: value})
    if not os.path.exists(checkpoint.filepath):
        return None
    model.load_weights(checkpoint.filepath)
    return int(model.layers[0].kernel.numpy()[0, 0])


@pytest.mark.parametrize(
    ("values", "want"),
    [([NAN, 0.3, 0.5, 0.4], 3), ([0.3, NAN, 0.5, NAN], 3), ([NAN, NAN], None)],
)
def test_run_checkpoint_never_saves_a_nan_epoch(tmp_path, values, want):
    # The checkpoint of experiments.run starts from -inf: a NaN first epoch is not an
    # improvement (with Keras' default start, None, it would be kept and never beaten).
    path = str(tmp_path / "best.weights.h5")
    checkpoint = best_checkpoint(path, "val_recall@1")
    assert _saved_epoch(checkpoint, values) == want
    history = [{"epoch": i + 1, "val_recall@1": v} for i, v in enumerate(values)]
    assert experiments.best_epoch(history, "val_recall@1") == want  # the same epoch


def test_fit_multi_worker_refuses_a_model_in_chunks():
    import tensorflow as tf

    import tfdml

    embedder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model = tfdml.models.MetricModel(embedder, tfdml.losses.TripletNCALoss(), chunk_size=2)
    model.compile(optimizer="sgd")
    data = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, 4), "float32"), np.array([0, 0, 1, 1]))).batch(4)
    with pytest.raises(ValueError, match="chunk_size"):
        experiments.fit_multi_worker(model, tf.distribute.get_strategy(), data, epochs=1)
