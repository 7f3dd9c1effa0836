"""examples/experiments/report.py: evaluation, the best epoch and the result tables."""

from __future__ import annotations

import experiments
import keras
import numpy as np
import pytest

from tfdml import metrics


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
