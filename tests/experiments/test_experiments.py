"""tfdml.experiments: flags, synthetic data, schedule, evaluation, resume state, reports."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest

from tfdml import experiments, metrics


def test_parser_takes_script_defaults_and_rejects_unknown_ones():
    parser = experiments.make_parser("x", dataset="cars196", learning_rate=0.01,
                                     lr_milestones=(20, 30))
    args = parser.parse_args([])
    assert (args.dataset, args.learning_rate, args.lr_milestones) == ("cars196", 0.01, [20, 30])
    args = parser.parse_args(["-P", "8", "-K", "4", "--lr", "0.1", "--smoke"])
    assert (args.classes_per_batch, args.samples_per_class, args.learning_rate) == (8, 4, 0.1)
    with pytest.raises(ValueError, match="lr_milestone"):
        experiments.make_parser("x", lr_milestone=(1,))
    with pytest.raises(SystemExit):
        parser.parse_args(["--epochs", "0"])


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


class _MeanColour(keras.Model):
    """A fixed embedding: the mean colour of each image and its square."""

    def call(self, x, training=False):
        m = keras.ops.mean(x, axis=(1, 2))
        return keras.ops.concatenate([m, m**2], axis=-1)


def _identity(image):
    return keras.ops.cast(image, "float32") / 255.0


@pytest.mark.parametrize("dataset", ["cub200", "inshop", "vehicleid"])
def test_evaluate_matches_the_metrics_on_the_same_embeddings(dataset):
    data = experiments.synthetic_data(dataset, num_classes=12, per_class=6, image_size=8)
    model = _MeanColour()

    def embed(split):
        x = split.images.astype(np.float32) / 255.0
        return np.asarray(model(x)), split.labels

    result = experiments.evaluate(model, data, _identity, batch_size=7, final=True)
    if dataset == "vehicleid":
        assert result.monitor == "val_small_top1"
        emb, labels = embed(data.evaluation["test_medium"])
        want = metrics.vehicleid_match_rate(emb, labels, ks=(1, 5))
        assert result.values["val_medium_top1"] == pytest.approx(want[1])
        assert result.values["val_medium_top5"] == pytest.approx(want[5])
        return
    assert result.monitor == "val_recall@1"
    if dataset == "inshop":
        q, ql = embed(data.evaluation["query"])
        g, gl = embed(data.evaluation["gallery"])
        want = metrics.recall_at_k(q, ql, (1, 10), gallery_embeddings=g, gallery_labels=gl)
        assert "val_recall@20" not in result.values  # K above the gallery size (18) left out
    else:
        emb, labels = embed(data.evaluation["test"])
        want = metrics.recall_at_k(emb, labels, (1, 2, 4, 8, 16, 32))
        assert result.values["val_nmi"] == pytest.approx(metrics.nmi(emb, labels))
        assert result.values["val_f1"] == pytest.approx(metrics.f1_clustering(emb, labels))
    for k, v in want.items():
        assert result.values[f"val_recall@{k}"] == pytest.approx(v)
    assert 0 < result.values["val_recall@1"] < 1  # neither trivial nor empty


class _Diverged(keras.Model):
    """A model whose embeddings hold a NaN (one row) and an Inf."""

    def call(self, x, training=False):
        m = keras.ops.mean(x, axis=(1, 2))
        bad = keras.ops.where(keras.ops.arange(keras.ops.shape(m)[0])[:, None] == 1,
                              float("nan"), m)
        return keras.ops.concatenate([bad, m * float("inf")], axis=-1)


@pytest.mark.parametrize("dataset", ["cub200", "inshop", "vehicleid"])
def test_evaluate_logs_nan_for_a_diverged_model(dataset, capsys):
    data = experiments.synthetic_data(dataset, num_classes=12, per_class=6, image_size=8)
    result = experiments.evaluate(_Diverged(), data, _identity, batch_size=7, final=True)
    assert result.values and all(np.isnan(v) for v in result.values.values())
    assert result.monitor in result.values
    assert "non-finite embeddings" in capsys.readouterr().out


def _compiled_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def test_resume_state_restores_weights_optimizer_history_and_best(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    model = _compiled_model()
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.weights.h5"),
                                                 monitor="loss", mode="max",
                                                 save_weights_only=True, save_best_only=True)
    state = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 1},
                                    checkpoint=checkpoint, history_csv=str(tmp_path / "h.csv"))
    model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[checkpoint, state])
    saved = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert saved["epoch"] == 2 and [h["epoch"] for h in saved["history"]] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "backup").iterdir()) == ["ckpt-2", "state.json"]
    assert (tmp_path / "h.csv").read_text().splitlines()[0].startswith("epoch,")
    arrays = experiments.saved_arrays(tmp_path / "backup" / "ckpt-2" / "model.weights.h5")
    kernel = np.asarray(model.weights[0])
    assert any(a.shape == kernel.shape and np.array_equal(a, kernel) for a in arrays.values())

    fresh = _compiled_model(seed=5)
    fresh_checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "b.weights.h5"),
                                                       monitor="loss", mode="max")
    restored = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 1},
                                       checkpoint=fresh_checkpoint)
    assert restored.restore(fresh) == 2
    for a, b in zip(model.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(model.optimizer.variables, fresh.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # momenta, step count
    assert int(np.asarray(fresh.optimizer.iterations)) == 8
    assert fresh_checkpoint.best == pytest.approx(checkpoint.best)
    assert [h["epoch"] for h in restored.history] == [1, 2]

    other = experiments.ResumeState(str(tmp_path / "backup"), config={"a": 2})
    with pytest.raises(ValueError, match="other settings.*a"):
        other.restore(_compiled_model())
    assert experiments.ResumeState(str(tmp_path / "empty")).restore(_compiled_model()) == 0


def test_markdown_table():
    text = experiments.markdown_table([{"a": 1.23456, "b": "x"}, {"a": 2, "c": None}], digits=2)
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1.23 | x |  |",
                                 "| 2 |  |  |"]



NAN = float("nan")


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([NAN, 0.3, 0.5, 0.4], 3),  # NaN first
        ([0.3, NAN, 0.5, NAN], 3),  # NaN between and after
        ([0.5, 0.2, NAN], 1),
        ([0.4, 0.6, 0.6, NAN], 2),  # the first of equal values, the one ModelCheckpoint keeps
        ([NAN, NAN], None),
        ([], None),
    ],
)
def test_best_epoch_ignores_nan(values, want):
    history = [{"epoch": i + 1, "loss": 1.0, "val_recall@1": v} for i, v in enumerate(values)]
    history.append({"epoch": len(values) + 1, "loss": 0.5})  # not evaluated
    assert experiments.best_epoch(history, "val_recall@1") == want


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
    checkpoint = experiments._best_checkpoint(path, "val_recall@1")
    assert _saved_epoch(checkpoint, values) == want
    history = [{"epoch": i + 1, "val_recall@1": v} for i, v in enumerate(values)]
    assert experiments.best_epoch(history, "val_recall@1") == want  # the same epoch
