"""Collapse monitors as Keras metrics (tfdml.metrics.OutputStd, tfdml.metrics.PCF), the k-NN
accuracy (tfdml.metrics.knn_accuracy) and its callback (tfdml.callbacks.KNNAccuracy), against
NumPy references written here. Every test runs under TensorFlow, JAX and PyTorch."""

from __future__ import annotations

import math
import warnings

import keras
import numpy as np
import pytest
from backends import BACKEND, compiled, to_numpy

from tfdml.callbacks import KNNAccuracy
from tfdml.metrics import PCF, OutputStd, knn_accuracy, pcf
from tfdml.models.monitors import OutputStd as ModelsOutputStd

pytestmark = pytest.mark.multibackend

RNG = np.random.default_rng(11)


def _asymmetric(rows, dim, seed):
    """Rows of different scales per dimension and a non-zero mean: no symmetry to hide
    a wrong axis or a sample (instead of population) standard deviation."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) * rng.uniform(0.2, 3.0, size=dim)
            + rng.normal(size=dim)).astype(np.float32)


# -- NumPy references -----------------------------------------------------------------------------


def ref_output_std(x):
    """Mean over dimensions of the population std over rows of the L2-normalized rows."""
    x = np.asarray(x, np.float64)
    z = x / np.sqrt(np.maximum((x * x).sum(axis=1, keepdims=True), 1e-12))
    return float(z.std(axis=0, ddof=0).mean())


def ref_pcf(x, share):
    """n / D, n the fewest principal components (eigenvalues of the float64 covariance)
    whose explained variance reaches ``share``."""
    x = np.asarray(x, np.float64)
    centred = x - x.mean(axis=0)
    eig = np.sort(np.linalg.eigh(centred.T @ centred / len(x))[0])[::-1]
    eig = np.where(eig > x.shape[1] * 1e-6 * eig[0], eig, 0.0)
    explained = np.cumsum(eig) / eig.sum()
    n = next(i + 1 for i, value in enumerate(explained) if value >= share - 1e-12)
    return n / x.shape[1]


def ref_knn_accuracy(queries, labels, gallery, gallery_labels, k, metric="cosine",
                     temperature=None):
    """Brute force: rank the gallery per query (stable: ties to the lower index), vote."""
    q, g = np.asarray(queries, np.float64), np.asarray(gallery, np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)
    correct = 0
    for i in range(len(q)):
        if metric == "cosine":
            sims = [float(q[i] @ g[j]) for j in range(len(g))]
        else:
            sims = [-math.sqrt(float(((q[i] - g[j]) ** 2).sum())) for j in range(len(g))]
        order = sorted(range(len(g)), key=lambda j: -sims[j])[:k]
        votes = {}
        for j in order:
            weight = 1.0 if temperature is None else math.exp(sims[j] / temperature)
            votes[int(gallery_labels[j])] = votes.get(int(gallery_labels[j]), 0.0) + weight
        best = max(votes.values())
        predicted = min(c for c, v in votes.items() if v == best)
        correct += predicted == int(labels[i])
    return correct / len(q)


# -- OutputStd ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 5), (2, 16)])
def test_output_std_matches_the_reference(shape):
    x = _asymmetric(*shape, seed=shape[0])
    metric = OutputStd()
    metric.update_state(None, x)
    assert float(metric.result()) == pytest.approx(ref_output_std(x), rel=1e-5)


def test_output_std_is_zero_on_collapsed_rows_and_near_one_over_sqrt_d_when_healthy():
    metric = OutputStd()
    direction = RNG.normal(size=(1, 12))
    metric.update_state(None, np.repeat(direction, 9, axis=0) * RNG.uniform(0.5, 4, (9, 1)))
    assert float(metric.result()) == pytest.approx(0.0, abs=1e-6)  # one point on the sphere
    healthy = OutputStd()
    healthy.update_state(None, RNG.normal(size=(4000, 64)))
    assert float(healthy.result()) == pytest.approx(1 / math.sqrt(64), rel=0.02)


def test_output_std_weights_batches_by_their_rows_and_resets():
    batches = [_asymmetric(3, 6, 1), _asymmetric(10, 6, 2), _asymmetric(5, 6, 3)]
    metric = OutputStd()
    for batch in batches:
        metric.update_state(np.zeros(len(batch)), batch)  # the labels are ignored
    want = sum(len(b) * ref_output_std(b) for b in batches) / sum(len(b) for b in batches)
    assert float(metric.result()) == pytest.approx(want, rel=1e-5)
    metric.reset_state()
    metric.update_state(None, batches[0])
    assert float(metric.result()) == pytest.approx(ref_output_std(batches[0]), rel=1e-5)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_output_std_of_nonfinite_rows_is_nan(value):
    x = _asymmetric(8, 4, 5)
    x[3, 2] = value
    metric = OutputStd()
    metric.update_state(None, _asymmetric(8, 4, 6))  # a good batch first
    metric.update_state(None, x)
    assert math.isnan(float(metric.result()))


def test_output_std_is_the_one_contrastive_model_reports():
    # One class, one registered Keras name: tfdml.metrics re-exports tfdml.models' monitor.
    assert OutputStd is ModelsOutputStd
    assert keras.saving.get_registered_object("tfdml>OutputStd") is OutputStd


def test_output_std_update_compiles_and_the_config_round_trips():
    batches = [_asymmetric(6, 5, 7), _asymmetric(4, 5, 8)]
    metric = OutputStd(name="spread")
    update = compiled(lambda variables, y: metric.stateless_update_state(variables, None, y))
    variables = [v.value for v in metric.variables]
    for batch in batches:  # under jax.jit (JAX) or XLA (TensorFlow)
        variables = update(variables, keras.ops.convert_to_tensor(batch))
    want = sum(len(b) * ref_output_std(b) for b in batches) / 10
    assert float(to_numpy(metric.stateless_result(variables))) == pytest.approx(want, rel=1e-5)
    again = OutputStd.from_config(metric.get_config())
    assert again.name == "spread"
    assert isinstance(keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(metric)), OutputStd)


def test_metrics_in_a_compiled_evaluate():
    x = _asymmetric(40, 6, 9)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)])
    model.compile(loss="mse", metrics=[OutputStd(), PCF(0.6)])
    logs = model.evaluate(x, np.zeros((40, 5), np.float32), batch_size=16, verbose=0,
                          return_dict=True)
    out = model.predict(x, verbose=0)
    batches = [out[:16], out[16:32], out[32:]]
    want = sum(len(b) * ref_output_std(b) for b in batches) / 40
    assert logs["output_std"] == pytest.approx(want, rel=1e-4)
    assert logs["pcf"] == pytest.approx(pcf(out, 0.6))


# -- PCF ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [0.1, 0.5, 0.8, 0.95, 1.0])
def test_pcf_metric_over_batches_is_pcf_of_all_rows(share):
    x = (RNG.normal(size=(300, 10)) * np.geomspace(8, 0.5, 10) + 3.0).astype(np.float32)
    metric = PCF(share)
    for start, stop in ((0, 1), (1, 120), (120, 300)):
        metric.update_state(None, x[start:stop])
    value = float(metric.result())
    assert value == pytest.approx(pcf(x, share)) and value == pytest.approx(ref_pcf(x, share))


def test_pcf_metric_keeps_a_small_variance_far_from_the_origin():
    # Rows near (100, ..., 100): float32 sums of raw rows would lose this variance.
    x = (100.0 + RNG.normal(size=(500, 6)) * [1e-2, 1e-2, 1e-3, 1e-3, 1e-3, 1e-3])
    metric = PCF(0.5)
    metric.update_state(None, x[:250].astype(np.float32))
    metric.update_state(None, x[250:].astype(np.float32))
    assert float(metric.result()) == pytest.approx(pcf(x.astype(np.float32), 0.5))


def test_pcf_metric_is_nan_without_variance_or_with_nonfinite_rows():
    one = PCF()
    one.update_state(None, np.ones((1, 4), np.float32))
    assert math.isnan(float(one.result()))  # fewer than 2 rows
    same = PCF()
    same.update_state(None, np.tile([[0.3, -1.7, 2.1]], (5, 1)))
    same.update_state(None, np.tile([[0.3, -1.7, 2.1]], (4, 1)))
    assert math.isnan(float(same.result())) and math.isnan(pcf(np.tile([[0.3, -1.7, 2.1]],
                                                                      (9, 1))))
    assert math.isnan(float(PCF().result()))  # nothing seen
    bad = _asymmetric(6, 3, 4)
    bad[2, 1] = np.nan
    nan = PCF()
    nan.update_state(None, _asymmetric(6, 3, 5))
    nan.update_state(None, bad)
    assert math.isnan(float(nan.result()))
    nan.reset_state()
    nan.update_state(None, _asymmetric(50, 3, 5))
    assert float(nan.result()) == pytest.approx(pcf(_asymmetric(50, 3, 5)))


@pytest.mark.parametrize("share", [0, 1.5, -0.1, True, "half", None, float("nan")])
def test_pcf_metric_refuses_a_share_outside_0_1(share):
    with pytest.raises(ValueError, match="explained_variance"):
        PCF(share)


def test_pcf_metric_config_and_shape_checks():
    metric = PCF(0.75, name="pcf75")
    assert PCF.from_config(metric.get_config()).explained_variance == 0.75
    metric.update_state(None, np.eye(3, 4, dtype=np.float32))
    with pytest.raises(ValueError, match="size 4"):
        metric.update_state(None, np.eye(3, 5, dtype=np.float32))
    with pytest.raises(ValueError, match=r"\[B, D\]"):
        metric.update_state(None, np.zeros((2, 3, 4), np.float32))


# -- knn_accuracy ---------------------------------------------------------------------------------


def _tied_data(seed):
    """Small-integer rows with duplicated gallery rows: equal scores and equal votes."""
    rng = np.random.default_rng(seed)
    gallery = rng.integers(-2, 3, size=(25, 3)).astype(np.float32)
    gallery[~gallery.any(axis=1)] = 1.0  # no zero row (cosine)
    gallery = np.concatenate([gallery, gallery[:6]])
    queries = rng.integers(-2, 3, size=(15, 3)).astype(np.float32)
    queries[~queries.any(axis=1)] = 1.0
    return queries, rng.integers(0, 4, 15), gallery, rng.integers(0, 4, len(gallery))


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_knn_accuracy_majority_vote_matches_brute_force(metric, k):
    if BACKEND != "tensorflow" and k != 4:
        pytest.skip("one k off TensorFlow: each k compiles the search again under JAX")
    queries, labels, gallery, gallery_labels = _tied_data(k)
    got = knn_accuracy(queries, labels, gallery, gallery_labels, k=k, metric=metric)
    assert got == pytest.approx(ref_knn_accuracy(queries, labels, gallery, gallery_labels, k,
                                                 metric))
    again = knn_accuracy(queries, labels, gallery, gallery_labels, k=k, metric=metric,
                         chunk_size=4, gallery_chunk_size=7)
    assert again == got


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_knn_accuracy_weighted_vote_matches_brute_force(metric, temperature):
    if BACKEND != "tensorflow" and temperature != 0.07:
        pytest.skip("one temperature off TensorFlow (NumPy code past the search)")
    gallery = RNG.normal(size=(60, 5))
    gallery_labels = RNG.integers(0, 5, 60)
    queries = RNG.normal(size=(30, 5))
    labels = RNG.integers(0, 5, 30)
    got = knn_accuracy(queries, labels, gallery, gallery_labels, k=9, metric=metric,
                       temperature=temperature, chunk_size=8)
    want = ref_knn_accuracy(queries, labels, gallery, gallery_labels, 9, metric, temperature)
    assert got == pytest.approx(want)


def test_knn_vote_ties_go_to_the_smallest_label_and_weights_break_them():
    gallery = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]])
    query = np.array([[1.0, 0.05]])
    # k=2: one vote each for 7 (nearest) and 3: the tie goes to 3.
    assert knn_accuracy(query, [3], gallery, [7, 1, 3, 1], k=2) == 1.0
    assert knn_accuracy(query, [7], gallery, [7, 1, 3, 1], k=2) == 0.0
    # Weighted, the nearer neighbour's class wins.
    assert knn_accuracy(query, [7], gallery, [7, 1, 3, 1], k=2, temperature=0.1) == 1.0
    # k=4: two votes for 1 beat one each for 7 and 3.
    assert knn_accuracy(query, [1], gallery, [7, 1, 3, 1], k=4) == 1.0


def test_knn_accuracy_refuses_bad_arguments():
    queries, labels, gallery, gallery_labels = _tied_data(0)
    with pytest.raises(ValueError, match="`k` asks for 32 neighbours"):
        knn_accuracy(queries, labels, gallery, gallery_labels, k=32)
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match="`k`"):
            knn_accuracy(queries, labels, gallery, gallery_labels, k=k)
    for temperature in (0, -1.0, float("nan"), "warm"):
        with pytest.raises(ValueError, match="temperature"):
            knn_accuracy(queries, labels, gallery, gallery_labels, temperature=temperature)
    with pytest.raises(ValueError, match="gallery_embeddings"):
        knn_accuracy(queries, labels, None, None)
    with pytest.raises(ValueError, match="metric"):
        knn_accuracy(queries, labels, gallery, gallery_labels, k=3, metric="dot")
    bad = gallery.copy()
    bad[4, 0] = np.nan
    with pytest.raises(ValueError, match=r"gallery_embeddings.*\(NaN or Inf\)"):
        knn_accuracy(queries, labels, bad, gallery_labels, k=3)
    bad = queries.copy()
    bad[1] = np.inf
    with pytest.raises(ValueError, match=r"embeddings.*\(NaN or Inf\)"):
        knn_accuracy(bad, labels, gallery, gallery_labels, k=3)


# -- KNNAccuracy ----------------------------------------------------------------------------------


def _fit_data():
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(4, 8)) * 2
    y = np.repeat(np.arange(4), 24)
    x = (centres[y] + rng.normal(size=(96, 8))).astype(np.float32)
    return x[::2], y[::2], x[1::2], y[1::2]


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _targets(y):
    return np.eye(4, dtype=np.float32)[y]


def test_callback_logs_the_knn_accuracy_of_the_trained_model(capsys):
    x, y, x_val, y_val = _fit_data()
    model = _model()
    knn = KNNAccuracy((x, y), (x_val, y_val), k=5, temperature=0.1, batch_size=20, verbose=2)
    stop = keras.callbacks.EarlyStopping(monitor="knn_accuracy", mode="max", patience=5)
    history = model.fit(x, _targets(y), batch_size=16, epochs=2, callbacks=[knn, stop],
                        verbose=0)
    values = history.history["knn_accuracy"]
    assert len(values) == 2 and stop.best == max(values)
    want = knn_accuracy(model.predict(x_val, verbose=0), y_val, model.predict(x, verbose=0), y,
                        k=5, temperature=0.1)
    assert values[-1] == pytest.approx(want)
    assert f"Epoch 2: knn_accuracy: {values[-1]:.4f}" in capsys.readouterr().out


def test_callback_every_name_and_embedding_model():
    x, y, x_val, y_val = _fit_data()
    model = _model()
    backbone = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    knn = KNNAccuracy((x, y), (x_val, y_val), k=3, every=2, name="val_knn",
                      embedding_model=backbone, verbose=0)
    history = model.fit(x, _targets(y), batch_size=16, epochs=3, callbacks=[knn], verbose=0)
    assert len(history.history["val_knn"]) == 2  # epochs 1 and 2
    want = knn_accuracy(backbone.predict(x_val, verbose=0), y_val,
                        backbone.predict(x, verbose=0), y, k=3)
    assert history.history["val_knn"][-1] == pytest.approx(want)


def test_callback_nonfinite_embeddings_log_nan_and_bad_arguments_raise():
    x, y, x_val, y_val = _fit_data()
    broken = keras.Sequential([keras.Input((8,)),
                               keras.layers.Lambda(lambda t: t * float("nan"))])
    knn = KNNAccuracy((x, y), (x_val, y_val), k=3, embedding_model=broken, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = _model().fit(x, _targets(y), batch_size=16, epochs=1, callbacks=[knn],
                               verbose=0)
    assert math.isnan(history.history["knn_accuracy"][0])
    assert any("not finite" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="`k` asks for 49 neighbours"):
        KNNAccuracy((x, y), (x_val, y_val), k=49)
    with pytest.raises(ValueError, match="temperature"):
        KNNAccuracy((x, y), (x_val, y_val), temperature=0.0)
    with pytest.raises(ValueError, match="labels y"):
        KNNAccuracy((x, None), (x_val, y_val))
    with pytest.raises(ValueError, match="name"):
        KNNAccuracy((x, y), (x_val, y_val), name="")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data")
def test_callback_on_datasets():
    import tensorflow as tf

    x, y, x_val, y_val = _fit_data()
    model = _model()
    gallery = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(48, seed=1).batch(10)
    queries = tf.data.Dataset.from_tensor_slices((x_val, y_val)).repeat().batch(12)
    knn = KNNAccuracy(gallery, queries, k=4, verbose=0, validation_steps=4)
    history = model.fit(x, _targets(y), batch_size=16, epochs=1, callbacks=[knn], verbose=0)
    want = knn_accuracy(model.predict(x_val, verbose=0), y_val, model.predict(x, verbose=0), y,
                        k=4)
    assert history.history["knn_accuracy"][0] == pytest.approx(want)
