"""examples/experiments/train.py and data.py: the learning-rate schedule, the synthetic datasets, the
best-epoch checkpoint of ``run`` and the baselines of a run."""

from __future__ import annotations

import os

import experiments
import keras
import numpy as np
import pytest
from experiments.resume import best_checkpoint

from tfdml import metrics

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


#: The reduced-scale digits runs of the example READMEs: the tiny CNN on the 8 x 8 images.
DIGITS = ("--dataset digits --backbone tiny --weights none --image-size 8 --resize-size 8 "
          "--transform none --embedding-dim 16").split()


class _InitialEvaluation(keras.callbacks.Callback):
    """Evaluates the model of a run before its first training step."""

    def __init__(self, data, eval_fn, into):
        super().__init__()
        self.data, self.eval_fn, self.into = data, eval_fn, into

    def on_train_begin(self, logs=None):
        self.into.update(experiments.evaluate(self.model, self.data, self.eval_fn,
                                              final=True).values)


def test_baselines_are_the_raw_pixels_and_the_network_a_run_starts_from(tmp_path):
    import tfdml

    args = experiments.make_parser("digits").parse_args(
        [*DIGITS, "--seed", "1", "-P", "6", "-K", "4", "--epochs", "1", "--steps-per-epoch", "1",
         "--no-export", "--verbose", "0", "--output-dir", str(tmp_path)])
    initial = {}
    experiments.run(args, tfdml.losses.TripletMarginLoss(), name="triplet",
                    callbacks=lambda model, data, eval_fn, out: [
                        _InitialEvaluation(data, eval_fn, initial)])

    rows = experiments.baselines(args, [1, 0])
    assert list(rows) == ["raw pixels", "untrained (seed 1)", "untrained (seed 0)"]
    assert args.seed == 1  # the caller's flags are left alone
    # Seed 1: the weights the run above started from, evaluated as its best epoch is.
    assert set(rows["untrained (seed 1)"]) == set(initial) >= {"val_nmi", "val_f1"}
    assert rows["untrained (seed 1)"] == pytest.approx(initial)
    assert rows["untrained (seed 0)"] != pytest.approx(rows["untrained (seed 1)"])
    again = experiments.baselines(args, [0])  # the same numbers for a seed, call after call
    assert again == {k: rows[k] for k in ("raw pixels", "untrained (seed 0)")}
    # The raw pixels: cosine on the flattened test images, whatever the seed.
    test = tfdml.datasets.load("digits", "test")
    pixels = test.images.reshape(len(test.labels), -1).astype(np.float32)
    want = metrics.recall_at_k(pixels, test.labels, (1,))[1]
    assert rows["raw pixels"]["val_recall@1"] == pytest.approx(want)


@pytest.mark.parametrize("seeds", [[], [-1], [0, 0], [0.5]])
def test_baselines_refuse_bad_seeds(seeds):
    args = experiments.make_parser("digits").parse_args(DIGITS)
    with pytest.raises(ValueError, match="seeds"):
        experiments.baselines(args, seeds)
