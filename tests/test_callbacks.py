"""tfdml.callbacks.RecallAtK and TripletScatter during short fits on scikit-learn's digits.

The tests on NumPy data run under every backend; those on tf.data run under TensorFlow.
"""

from __future__ import annotations

import csv
import os

import keras
import numpy as np
import pytest
from harness import slow_beyond
from sklearn.datasets import load_digits

import tfdml
from tfdml.analysis.scatter import movement_statistics, rescore_triplets, triplet_scatter
from tfdml.callbacks import RecallAtK, TripletScatter
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


_MODELS = {}  # seed -> (model, the initial values of its and its optimizer's variables)


def _model(seed=0):
    """A Dense(16) embedding of the digits compiled with TripletNCALoss, at its initial weights
    and optimizer state. Built once per seed and reset at each call: its traced training and
    prediction steps (most of a short fit's time) serve every test."""
    if seed not in _MODELS:
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=tfdml.losses.TripletNCALoss())
        model.optimizer.build(model.trainable_variables)
        variables = model.variables + model.optimizer.variables
        _MODELS[seed] = model, [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    model, initial = _MODELS[seed]
    for v, value in zip(model.variables + model.optimizer.variables, initial, strict=True):
        v.assign(value)
    keras.utils.set_random_seed(seed)
    return model


def _fit(model, digits, callbacks, epochs=3):
    x, y, _, _ = digits
    return model.fit(x, y, batch_size=96, epochs=epochs, steps_per_epoch=4, callbacks=callbacks,
                     verbose=0)


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.multibackend
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
    import tensorflow as tf

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


@pytest.mark.parametrize(("fit_verbose", "bar", "values"), [(0, False, False), (1, True, True),
                                                           (2, False, True)])
def test_default_verbosity_follows_fit(digits, capsys, fit_verbose, bar, values):
    x, y, x_val, y_val = digits
    recall = RecallAtK((x_val, y_val), ks=(1,), batch_size=40)  # 200 samples: 5 batches
    _model().fit(x, y, batch_size=96, epochs=1, steps_per_epoch=4, callbacks=[recall],
                 verbose=fit_verbose)
    out = capsys.readouterr().out
    assert ("5/5" in out) == bar, out
    assert ("Epoch 1: val_recall@1" in out) == values, out
    recall.evaluate()  # outside fit, "auto" shows the progress bar
    assert "5/5" in capsys.readouterr().out


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
        ({"verbose": 3}, "verbose=3"),
        ({"data": np.zeros((4, 64))}, "ndarray"),
        ({"data": (np.zeros((4, 64)), np.zeros(3))}, "len\\(y\\)=3"),
    ],
)
def test_validation_errors(kwargs, match):
    data = kwargs.pop("data", (np.zeros((4, 64)), np.zeros(4)))
    with pytest.raises(ValueError, match=match):
        RecallAtK(data, **kwargs)


# -- TripletScatter -----------------------------------------------------------------------------

MOVES = ["triplet_move_up_right", "triplet_move_up_left", "triplet_move_down_left",
         "triplet_move_down_right", "triplet_move_still"]


@pytest.mark.multibackend
def test_triplet_scatter_writes_files_and_logs(digits, tmp_path):
    x, y, _, _ = digits
    x, y = x[:300], y[:300]
    model = _model()
    initial = model.predict(x, verbose=0)
    out = tmp_path / "scatter"
    callback = TripletScatter((x, y), output_dir=str(out), movement=True, batch_size=128)
    path = os.path.join(tmp_path, "log.csv")
    history = _fit(model, digits, [callback, keras.callbacks.CSVLogger(path)], epochs=2)
    names = sorted(os.listdir(out))
    assert names == ["triplet_scatter.png"] + [
        f"triplet_scatter_epoch{e:03d}.{ext}" for e in (0, 1, 2) for ext in ("npz", "png")]
    # Epoch 0 is the model before training.
    with np.load(out / "triplet_scatter_epoch000.npz") as saved:
        want = triplet_scatter(initial, y)
        np.testing.assert_allclose(saved["s_ap"], want.s_ap, atol=1e-6)
        np.testing.assert_array_equal(saved["negatives"], want.negatives)
        assert int(saved["epoch"]) == 0
    # The last one is the trained model's scatter, every sample used (no singleton class).
    final = model.predict(x, verbose=0)
    with np.load(out / "triplet_scatter_epoch002.npz") as saved:
        want = triplet_scatter(final, y)
        np.testing.assert_allclose(saved["s_ap"], want.s_ap, atol=1e-6)
        np.testing.assert_allclose(saved["s_an"], want.s_an, atol=1e-6)
        assert saved["used"].all() and len(saved["used"]) == 300
        for key in ("anchors", "positives", "negatives"):
            np.testing.assert_array_equal(saved[key], getattr(want, key))
    assert history.history["triplet_correct"][-1] == pytest.approx(want.correct.mean())
    # Movement of the epoch-1 triplets during epoch 2, measured on the same triplets.
    moved = movement_statistics(callback.scatters[1], rescore_triplets(final,
                                                                        callback.scatters[1]))
    assert [history.history[n][-1] for n in MOVES] == pytest.approx(list(moved[:5]), abs=0.01)
    assert sum(history.history[n][0] for n in MOVES) == pytest.approx(1.0)
    rows = _read_csv(path)
    assert len(rows) == 2 and all(n in rows[0] for n in MOVES + ["triplet_correct"])
    assert sorted(callback.scatters) == [0, 1, 2]


def test_triplet_scatter_epochs_files_and_dataset(digits, tmp_path):
    import tensorflow as tf

    x, y, _, _ = digits
    x, y = x[:200], y[:200]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(200, seed=1).batch(64)
    callback = TripletScatter(ds, every=(2, 3), output_dir=str(tmp_path), initial=False,
                              files=("npz", "grid"), name="run", positive="hard",
                              negative="semihard", region="positive", verbose=1)
    history = _fit(_model(), digits, [callback], epochs=3)
    assert sorted(os.listdir(tmp_path)) == ["run.png", "run_epoch002.npz", "run_epoch003.npz"]
    assert len(history.history["triplet_correct"]) == 2
    assert "triplet_move_up_right" not in history.history
    with np.load(tmp_path / "run_epoch003.npz") as saved:
        s_ap, s_an = saved["s_ap"], saved["s_an"]
        assert np.all(s_an <= s_ap) and len(s_ap) > 0  # semi-hard negatives only
    assert callback.path(3, "npz") == os.path.join(str(tmp_path), "run_epoch003.npz")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every": 0}, "every=0"),
        ({"every": (0, 2)}, "every"),
        ({"positive": "all"}, "positive='all'"),
        ({"negative": "nearest"}, "negative='nearest'"),
        ({"files": ("npz", "pdf")}, "files"),
        ({"region": "half"}, "region='half'"),
        ({"grid_columns": 0}, "grid_columns=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"name": ""}, "name"),
        ({"verbose": 3}, "verbose=3"),
        ({"data": np.zeros((4, 64))}, "ndarray"),
        ({"data": (np.zeros((4, 64)), np.zeros(3))}, "len\\(y\\)=3"),
    ],
)
def test_triplet_scatter_validation_errors(kwargs, match, tmp_path):
    data = kwargs.pop("data", (np.zeros((4, 64)), np.zeros(4)))
    with pytest.raises(ValueError, match=match):
        TripletScatter(data, output_dir=str(tmp_path), **kwargs)


# -- non-finite embeddings and endless data -----------------------------------------------------


def _nan_row(x):
    x = x.copy()
    x[3, 10] = np.nan
    return x


def _inf_row(x):
    x = x.copy()
    x[7, :] = np.inf
    return x


def _all_nan(x):
    return np.full_like(x, np.nan)


NONFINITE = {"nan_row": _nan_row, "inf_row": _inf_row, "all_nan": _all_nan}


def _nonfinite_warnings(record, name):
    return [w for w in record if f"{name}:" in str(w.message) and "not finite" in str(w.message)]


# One row on every commit: the rows are tested one by one (tfdml.search.nonfinite_rows), so a
# row of Inf and every row NaN take the same path (the slow tier).
@pytest.mark.parametrize("corruption", slow_beyond(sorted(NONFINITE), {"nan_row"}))
def test_recall_callback_logs_nan_for_nonfinite_embeddings(digits, tmp_path, corruption):
    # The validation inputs make some embeddings non-finite: recall_at_k would raise, the
    # callback writes nan for each of its names at each epoch and warns once; training goes
    # on, and a ModelCheckpoint starting from -inf never saves a nan epoch.
    _, _, x_val, y_val = digits
    x_val = NONFINITE[corruption](x_val)
    csv_path = os.path.join(tmp_path, "log.csv")
    best_path = os.path.join(tmp_path, "best.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(best_path, monitor="val_recall@1", mode="max",
                                                 save_best_only=True, save_weights_only=True,
                                                 initial_value_threshold=float("-inf"))
    recall = RecallAtK((x_val, y_val), ks=KS, verbose=0)
    with pytest.warns(UserWarning) as record:
        history = _fit(_model(), digits, [recall, keras.callbacks.CSVLogger(csv_path), checkpoint],
                       epochs=2)
    assert len(history.history["loss"]) == 2  # training was not stopped
    for name in NAMES:
        assert len(history.history[name]) == 2 and np.isnan(history.history[name]).all()
    warned = _nonfinite_warnings(record, "RecallAtK")
    assert len(warned) == 1 and "at epoch 1" in str(warned[0].message)
    assert "val_recall@1" in str(warned[0].message)
    rows = _read_csv(csv_path)
    assert [row["val_recall@1"] for row in rows] == ["nan", "nan"]
    assert not os.path.exists(best_path) and checkpoint.best == float("-inf")
    assert all(np.isnan(v) for v in recall.evaluate().values())


def test_checkpoint_never_keeps_a_nan_epoch(tmp_path):
    # Epochs faked with logs holding nan first and later. ModelCheckpoint(mode="max") saves
    # on a strict improvement: `nan > best` is false, so a nan after a finite best is never
    # saved. A nan as the *first* value is taken as the best when the checkpoint starts
    # from None (the Keras default), and then nothing exceeds it: hence the documented
    # initial_value_threshold=float("-inf").
    def saved_epoch(values, **kwargs):
        path = os.path.join(tmp_path, f"{len(os.listdir(tmp_path))}.weights.h5")
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        checkpoint = keras.callbacks.ModelCheckpoint(path, monitor="val_recall@1", mode="max",
                                                     save_best_only=True,
                                                     save_weights_only=True, **kwargs)
        checkpoint.set_model(model)
        checkpoint.on_train_begin()
        for epoch, value in enumerate(values):
            model.layers[0].kernel.assign(np.full((2, 1), epoch + 1.0, "float32"))
            checkpoint.on_epoch_begin(epoch)
            checkpoint.on_epoch_end(epoch, {"val_recall@1": value})
        if not os.path.exists(path):
            return None
        model.load_weights(path)
        return int(model.layers[0].kernel.numpy()[0, 0])  # the epoch (from 1) saved last

    nan = float("nan")
    threshold = {"initial_value_threshold": float("-inf")}
    assert saved_epoch([nan, 0.3, 0.5, nan], **threshold) == 3
    assert saved_epoch([0.3, nan, 0.5, nan, 0.4], **threshold) == 3
    assert saved_epoch([0.2, 0.6, nan], **threshold) == 2
    assert saved_epoch([nan, nan], **threshold) is None
    assert saved_epoch([0.2, 0.6, nan]) == 2  # nan after a finite best: never saved
    assert saved_epoch([nan, 0.3, 0.5]) == 1  # the Keras default keeps a first nan


# One row on every commit (every row NaN: test_triplet_scatter_resumes_after_a_nonfinite_epoch);
# the others in the slow tier.
@pytest.mark.parametrize("corruption", slow_beyond(sorted(NONFINITE), {"nan_row"}))
def test_triplet_scatter_skips_nonfinite_epochs(digits, tmp_path, corruption):
    x, y, _, _ = digits
    x, y = NONFINITE[corruption](x[:120]), y[:120]
    out = tmp_path / "scatter"
    callback = TripletScatter((x, y), output_dir=str(out), movement=True, verbose=1)
    with pytest.warns(UserWarning) as record:
        history = _fit(_model(), digits, [callback], epochs=2)
    assert len(history.history["loss"]) == 2
    for name in ["triplet_correct"] + MOVES:
        assert len(history.history[name]) == 2 and np.isnan(history.history[name]).all()
    warned = _nonfinite_warnings(record, "TripletScatter")
    assert len(warned) == 1 and "at epoch 0" in str(warned[0].message)
    assert callback.scatters == {} and not out.exists()  # no file, no panel


def test_triplet_scatter_resumes_after_a_nonfinite_epoch(digits, tmp_path):
    # Epochs 1 and 3 are finite, epoch 2 is not: epoch 2 is skipped, and the movement of
    # epoch 3 is measured from the triplets of epoch 1.
    x, y, _, _ = digits
    x, y = x[:120], y[:120]
    model = _model()
    callback = TripletScatter((x, y), output_dir=str(tmp_path), initial=False, movement=True,
                              files=("npz",))
    callback.set_model(model)
    assert callback.record(1)["triplet_correct"] >= 0.0
    first = callback.scatters[1]
    kernel = model.layers[0].kernel
    weights = kernel.numpy()
    kernel.assign(np.full_like(weights, np.nan))
    with pytest.warns(UserWarning, match="TripletScatter: at epoch 2 120 of the 120"):
        skipped = callback.record(2)
    assert list(skipped) == callback.names() and np.isnan(list(skipped.values())).all()
    assert sorted(os.listdir(tmp_path)) == ["triplet_scatter_epoch001.npz"]
    kernel.assign(weights * 1.5)
    after = callback.record(3)
    embeddings, _ = callback.embed()  # the same forward passes as the callback's
    moved = movement_statistics(first, rescore_triplets(embeddings, first))
    assert [after[n] for n in MOVES] == pytest.approx(list(moved[:5]))
    assert sorted(os.listdir(tmp_path)) == ["triplet_scatter_epoch001.npz",
                                            "triplet_scatter_epoch003.npz"]


def _xy():
    return np.zeros((8, 64), "float32"), np.repeat(np.arange(4), 2)


@pytest.mark.parametrize("cls", [RecallAtK, TripletScatter])
@pytest.mark.parametrize("endless", ["repeat", "pk_batches"])
def test_infinite_datasets_are_rejected(cls, endless, tmp_path):
    import tensorflow as tf

    x, y = _xy()
    if endless == "repeat":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
    else:
        ds = tfdml.data.pk_batches((x, y), 2, 2)  # endless by default
    kwargs = {"output_dir": str(tmp_path)} if cls is TripletScatter else {}
    with pytest.raises(ValueError, match="infinite.*repeat=False.*take") as info:
        cls(ds, **kwargs)
    assert "Received: data" in str(info.value)


@pytest.mark.parametrize("cls", [RecallAtK, TripletScatter])
def test_finite_datasets_are_accepted_and_unknown_cardinality_needs_steps(cls, tmp_path):
    import tensorflow as tf

    x, y = _xy()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    unknown = ds.filter(lambda a, b: True)
    assert int(unknown.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    one_epoch = tfdml.data.pk_batches((x, y), 2, 2, repeat=False)
    kwargs = {"output_dir": str(tmp_path)} if cls is TripletScatter else {}
    for data in (ds, ds.repeat().take(3), one_epoch):
        assert cls(data, **kwargs).data is data
    # Unknown cardinality may be endless (a generator): refused up front unless `steps` is
    # given, instead of hanging at the end of the first epoch.
    with pytest.raises(ValueError, match=r"unknown cardinality.*`steps`.*assert_cardinality"):
        cls(unknown, **kwargs)
    for data in (unknown, ds.repeat(), tfdml.data.pk_batches((x, y), 2, 2)):
        taken = cls(data, steps=2, **kwargs).data
        assert sum(1 for _ in taken) == 2
    sizes = [len(b[1]) for b in cls(ds, steps=1, **kwargs).data]
    assert sizes == [4]
