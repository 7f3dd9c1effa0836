"""tfdml.callbacks.RecallAtK during short fits on scikit-learn's digits."""

from __future__ import annotations

import csv
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

import tfdml
from tfdml.callbacks import RecallAtK
from tfdml.metrics import recall_at_k

NAMES = ["val_recall@1", "val_recall@2", "val_recall@4"]
KS = (1, 2, 4)


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    y = data.target.astype("int32")
    train = y <= 5
    rng = np.random.default_rng(0)
    val = np.flatnonzero(~train)
    val = np.sort(rng.choice(val, size=200, replace=False))  # small: fast epochs
    return x[train], y[train], x[val], y[val]


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=tfdml.losses.TripletNCALoss())
    return model


def _fit(model, digits, callbacks, epochs=3):
    x, y, _, _ = digits
    return model.fit(x, y, batch_size=96, epochs=epochs, steps_per_epoch=4, callbacks=callbacks,
                     verbose=0)


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_values_reach_history_and_a_csv_logger_after_it(digits, tmp_path):
    _, _, x_val, y_val = digits
    path = os.path.join(tmp_path, "log.csv")
    model = _model()
    recall = RecallAtK((x_val, y_val), ks=KS, verbose=0)
    history = _fit(model, digits, [recall, keras.callbacks.CSVLogger(path)])
    for name in NAMES:
        assert len(history.history[name]) == 3
    rows = _read_csv(path)
    assert len(rows) == 3
    for name in NAMES:
        logged = [float(row[name]) for row in rows]
        assert logged == pytest.approx(history.history[name], abs=1e-12)
    # The last value is Recall@K of the trained model, computed independently.
    want = recall_at_k(model.predict(x_val, verbose=0), y_val, KS)
    assert [history.history[n][-1] for n in NAMES] == pytest.approx(list(want.values()))
    # Training changed the embedding, and the callback tracked it epoch by epoch.
    assert len(set(history.history["val_recall@1"])) > 1


def test_csv_logger_before_the_callback_misses_the_values(digits, tmp_path):
    # Keras calls on_epoch_end in list order with one shared logs dict: a CSVLogger placed
    # before RecallAtK has written its row already. History (added last by fit) still sees
    # them. This is the documented limitation: put RecallAtK first.
    _, _, x_val, y_val = digits
    path = os.path.join(tmp_path, "log.csv")
    history = _fit(_model(), digits,
                   [keras.callbacks.CSVLogger(path), RecallAtK((x_val, y_val), KS, verbose=0)],
                   epochs=2)
    assert len(history.history["val_recall@1"]) == 2
    rows = _read_csv(path)
    assert len(rows) == 2 and "val_recall@1" not in rows[0]


def test_early_stopping_and_checkpoint_monitor_recall(digits, tmp_path):
    _, _, x_val, y_val = digits
    path = os.path.join(tmp_path, "best.weights.h5")
    stop = keras.callbacks.EarlyStopping(monitor="val_recall@1", mode="max", patience=0,
                                         baseline=1.01)  # never reached
    checkpoint = keras.callbacks.ModelCheckpoint(path, monitor="val_recall@1", mode="max",
                                                 save_best_only=True, save_weights_only=True)
    history = _fit(_model(), digits, [RecallAtK((x_val, y_val), KS, verbose=0), checkpoint, stop],
                   epochs=4)
    # Keras stops at the second epoch at the earliest; without the value it would not stop.
    assert len(history.history["loss"]) == 2 and stop.stopped_epoch == 1
    assert os.path.isfile(path)  # saved only when val_recall@1 is in the logs
    assert checkpoint.best == pytest.approx(history.history["val_recall@1"][0])


def test_every_and_a_shuffled_dataset(digits, tmp_path):
    _, _, x_val, y_val = digits
    model = _model()
    # The dataset reshuffles at every iteration; x and y must stay paired.
    ds = tf.data.Dataset.from_tensor_slices((x_val, y_val)).shuffle(200, seed=1).batch(33)
    on_ds = RecallAtK(ds, ks=KS, every=2, verbose=0)
    path = os.path.join(tmp_path, "log.csv")
    history = _fit(model, digits, [on_ds, keras.callbacks.CSVLogger(path)], epochs=5)
    assert len(history.history["val_recall@1"]) == 3  # epochs 1, 2 and 4
    rows = _read_csv(path)
    logged = [row["val_recall@1"] for row in rows]
    assert logged[2] == logged[4] == "NA"
    assert [float(logged[i]) for i in (0, 1, 3)] == pytest.approx(history.history["val_recall@1"])
    want = recall_at_k(model.predict(x_val, verbose=0), y_val, KS)
    assert on_ds.evaluate() == pytest.approx(dict(zip(NAMES, want.values(), strict=True)))
    assert on_ds.evaluate()["val_recall@1"] == pytest.approx(want[1])


def test_functional_model_progress_bar_and_prefix(digits, capsys):
    _, _, x_val, y_val = digits
    inputs = keras.Input((64,))
    model = keras.Model(inputs, keras.layers.Dense(8)(keras.layers.Dense(32)(inputs)))
    model.compile(optimizer="adam", loss=tfdml.losses.TripletNCALoss())
    recall = RecallAtK((x_val, y_val), ks=(1,), batch_size=50, prefix="digits_", verbose=1)
    history = _fit(model, digits, [recall], epochs=1)
    out = capsys.readouterr().out
    assert "4/4" in out  # 200 samples / batch_size 50: the progress bar
    assert "digits_recall@1" in out
    assert list(recall.names()) == ["digits_recall@1"] and "digits_recall@1" in history.history


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every": 0}, "every=0"),
        ({"ks": (0,)}, "ks"),
        ({"batch_size": -1}, "batch_size=-1"),
        ({"metric": "dot"}, "metric='dot'"),
        ({"unmatched": "skip"}, "unmatched='skip'"),
        ({"verbose": 2}, "verbose=2"),
        ({"data": np.zeros((4, 64))}, "ndarray"),
        ({"data": (np.zeros((4, 64)), np.zeros(3))}, "len\\(y\\)=3"),
    ],
)
def test_validation_errors(kwargs, match):
    data = kwargs.pop("data", (np.zeros((4, 64)), np.zeros(4)))
    with pytest.raises(ValueError, match=match):
        RecallAtK(data, **kwargs)
