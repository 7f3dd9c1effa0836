"""tfdml.models.MetricModel: the model that owns a loss's state, under every backend.

Learned class vectors (proxies) are trained by ``fit`` (compiled where the backend
compiles), saved in ``.keras`` and weights files with the optimizer's slots, and training
resumes from a checkpoint exactly as if it had not stopped. ArcFace and CosFace with
scale 64 stay finite under the mixed-precision policies.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, to_numpy, value_and_grad
from harness import pk_arrays, run_under_policy, slow_beyond, small_embedding_model

import tfdml
from tfdml.losses import (
    ArcFaceLoss,
    CosFaceLoss,
    MarginLoss,
    ProxyAnchorLoss,
    SoftTripleLoss,
    SupConLoss,
    arcface_loss,
    cosface_loss,
)
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

NUM_CLASSES = 8  # pk_arrays(num_classes=4, num_batches=2): ids 0..7


def _data(num_batches=2, seed=0):
    return pk_arrays(num_classes=4, per_class=3, num_batches=num_batches, seed=seed)


# What the files and callbacks keep, what fit accepts and what evaluate reports is the same
# under every mode: those tests run eagerly on every commit, compiled in the slow tier
# (test_fit_trains_the_proxies_with_the_network, test_unbuilt_subclassed_embedder_with_embedding_dim
# and the mixed-precision tests train compiled on every commit).
ONE_MODE = slow_beyond(["eager", "compiled"] if CAN_COMPILE else ["eager"], {"eager"})


def _model(loss, seed=0, mode="compiled"):
    model = MetricModel(small_embedding_model(seed=seed), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.05), run_eagerly=mode == "eager",
                  jit_compile=CAN_COMPILE and mode == "compiled")
    return model


def _fit(model, data, epochs=1, initial_epoch=0):
    model.fit(data.x, data.y, batch_size=data.batch_size, epochs=epochs,
              initial_epoch=initial_epoch, shuffle=False, verbose=0)


def _numpy(variables):
    return [np.array(to_numpy(v)) for v in variables]


def test_fit_trains_the_proxies_with_the_network():
    loss = ProxyAnchorLoss(NUM_CLASSES)
    model = _model(loss)
    assert len(model.trainable_variables) == 3  # kernel, bias, proxies
    proxies = loss.class_vectors
    assert tuple(proxies.shape) == (NUM_CLASSES, 4)
    assert any(v is proxies for v in model.trainable_variables)
    before = np.array(to_numpy(proxies))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _fit(model, _data())
    after = np.array(to_numpy(proxies))
    assert np.abs(after - before).max() > 1e-3
    # predict gives the embedding model's output.
    x = _data().x[:5]
    np.testing.assert_allclose(to_numpy(model.predict(x, verbose=0)),
                               to_numpy(model.embedder.predict(x, verbose=0)), rtol=1e-6)


@pytest.mark.parametrize("mode", ONE_MODE)
def test_keras_file_keeps_the_vectors_and_resume_continues_exactly(tmp_path, mode):
    """Two epochs straight equal one epoch, save, load, one more epoch: the optimizer's
    moments for the network and the centres come back with the file."""
    data = _data()

    def make_loss():
        return SoftTripleLoss(NUM_CLASSES, centers_per_class=2,
                              initializer=keras.initializers.RandomNormal(0.0, 0.5, seed=1))

    straight = _model(make_loss(), mode=mode)
    _fit(straight, data, epochs=2)

    first = _model(make_loss(), mode=mode)
    _fit(first, data, epochs=1)
    path = tmp_path / "run.keras"
    first.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no optimizer mismatch, no custom compile
        resumed = keras.models.load_model(path)
    assert isinstance(resumed, MetricModel)
    assert isinstance(resumed.metric_loss, SoftTripleLoss)
    np.testing.assert_allclose(to_numpy(resumed.metric_loss.class_vectors),
                               to_numpy(first.metric_loss.class_vectors), rtol=0)
    _fit(resumed, data, epochs=2, initial_epoch=1)
    for a, b in zip(_numpy(straight.trainable_variables), _numpy(resumed.trainable_variables),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ONE_MODE)
def test_backup_and_restore_resumes_an_interrupted_fit(tmp_path, mode):
    """keras.callbacks.BackupAndRestore: a run killed after its first epoch and started
    again ends where an uninterrupted run ends (proxies and optimizer included)."""
    data = _data()

    def make_model():
        return _model(ProxyAnchorLoss(NUM_CLASSES, initializer=keras.initializers.RandomNormal(
            0.0, 0.5, seed=2)), mode=mode)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("interrupted")

    def fit(model, callbacks):
        model.fit(data.x, data.y, batch_size=data.batch_size, epochs=2, shuffle=False,
                  verbose=0, callbacks=callbacks)

    straight = make_model()
    fit(straight, [])
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(make_model(), [keras.callbacks.BackupAndRestore(backup), Interrupt()])
    resumed, epochs = make_model(), []
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs.append(e))
    fit(resumed, [keras.callbacks.BackupAndRestore(backup), record])
    assert epochs == [1]  # only the second epoch ran: the first one came from the backup
    for a, b in zip(_numpy(straight.trainable_variables), _numpy(resumed.trainable_variables),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ONE_MODE)
def test_weights_file_round_trip_and_plain_embedder_checkpoints(tmp_path, mode):
    model = _model(ProxyAnchorLoss(NUM_CLASSES), mode=mode)
    _fit(model, _data())
    path = str(tmp_path / "all.weights.h5")
    model.save_weights(path)
    other = _model(ProxyAnchorLoss(NUM_CLASSES), seed=5, mode=mode)
    other.build_from_config({"input_shape": (None, 6)})
    other.optimizer.build(other.trainable_variables)  # so that its moments load too
    other.load_weights(path)
    np.testing.assert_allclose(to_numpy(other.metric_loss.class_vectors),
                               to_numpy(model.metric_loss.class_vectors), rtol=0)
    for a, b in zip(_numpy(other.optimizer.variables), _numpy(model.optimizer.variables),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=0)
    # Weights of a plain embedding model load into the wrapped one.
    plain = str(tmp_path / "plain.weights.h5")
    model.embedder.save_weights(plain)
    fresh = _model(ProxyAnchorLoss(NUM_CLASSES), seed=7, mode=mode)
    fresh.embedder.load_weights(plain)
    x = _data().x[:4]
    np.testing.assert_allclose(to_numpy(fresh(x)), to_numpy(model(x)), rtol=1e-6)


@pytest.mark.parametrize("mode", ONE_MODE)
def test_stateless_losses_train_through_it_too(mode):
    loss = SupConLoss()
    assert loss.state is None
    model = _model(loss, mode=mode)
    assert len(model.trainable_variables) == 2
    before = _numpy(model.trainable_variables)
    _fit(model, _data())
    assert any(np.abs(a - b).max() > 1e-4
               for a, b in zip(before, _numpy(model.trainable_variables), strict=True))


@pytest.mark.parametrize("mode", ONE_MODE)
def test_evaluate_reports_the_wrapped_loss(mode):
    loss = MarginLoss(miner=tfdml.miners.TripletMiner("easy", "hard"))
    model = _model(loss, mode=mode)
    data = _data(num_batches=1)
    value = model.evaluate(data.x, data.y, batch_size=data.batch_size, verbose=0)
    expected = to_numpy(loss(data.y, model(data.x)))
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_usage_errors():
    model = MetricModel(small_embedding_model(), ProxyAnchorLoss(NUM_CLASSES))
    with pytest.raises(ValueError, match="already belongs"):
        MetricModel(small_embedding_model(), model.metric_loss)
    with pytest.raises(ValueError, match="must be a tfdml loss"):
        MetricModel(small_embedding_model(), "mse")
    with pytest.raises(ValueError, match="embedding_dim"):
        MetricModel(small_embedding_model(), SupConLoss(), embedding_dim=0)
    model.compile(optimizer="sgd", loss="mse")
    data = _data(num_batches=1)
    with pytest.raises(ValueError, match="compile it without `loss=`"):
        _fit(model, data)
    # An embedding size that differs from the loss's own.
    with pytest.raises(ValueError, match="size 5"):
        MetricModel(small_embedding_model(), ProxyAnchorLoss(NUM_CLASSES, embedding_dim=5))


@pytest.mark.skipif(not CAN_COMPILE, reason="PyTorch builds the variables eagerly")
def test_class_vector_loss_in_a_bare_compiled_model_says_what_to_do():
    model = small_embedding_model()
    model.compile(optimizer="sgd", loss=ProxyAnchorLoss(NUM_CLASSES), jit_compile=True)
    data = _data(num_batches=1)
    with pytest.raises(ValueError, match=r"MetricModel\(model, loss\)"):
        _fit(model, data)


def test_unbuilt_subclassed_embedder_with_embedding_dim():
    class Embedder(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(x)

    model = MetricModel(Embedder(), CosFaceLoss(NUM_CLASSES), embedding_dim=4)
    model.compile(optimizer=keras.optimizers.Adam(0.05), jit_compile=CAN_COMPILE)
    _fit(model, _data())
    assert tuple(model.metric_loss.class_vectors.shape) == (NUM_CLASSES, 4)
    assert len(model.trainable_variables) == 3


# -- mixed precision: scale 64 never overflows float16 --------------------------------------------


MARGIN_SOFTMAX = {"arcface": lambda: ArcFaceLoss(NUM_CLASSES, scale=64.0),
                  "cosface": lambda: CosFaceLoss(NUM_CLASSES, scale=64.0)}


# Each loss and each policy on every commit (arcface under float16, cosface under bfloat16),
# the other two pairs in the slow tier; test_half_precision_embeddings_at_the_extreme_angles
# checks every pair's values on every commit.
@pytest.mark.parametrize("make, policy", slow_beyond(
    [pytest.param(make, policy, id=f"{name}-{policy}")
     for name, make in MARGIN_SOFTMAX.items() for policy in ("mixed_float16", "mixed_bfloat16")],
    {"arcface-mixed_float16", "cosface-mixed_bfloat16"}))
def test_margin_softmax_losses_train_without_nan_under_mixed_precision(make, policy):
    if BACKEND == "jax" and policy == "mixed_float16":
        pytest.skip("one policy under JAX (each compiles a training step)")
    with run_under_policy(policy):
        loss = make()
        model = _model(loss)
        data = _data()
        history = model.fit(data.x, data.y, batch_size=data.batch_size, epochs=3,
                            shuffle=False, verbose=0)
    values = history.history["loss"]
    assert np.all(np.isfinite(values)), values
    assert np.all(np.isfinite(to_numpy(loss.class_vectors)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fn", [arcface_loss, cosface_loss], ids=["arcface", "cosface"])
def test_half_precision_embeddings_at_the_extreme_angles(fn, dtype):
    """Embeddings equal to (and opposite to) their class weight: cosines of exactly +-1,
    where arccos has an infinite slope and exp(64) overflows float16."""
    w = np.eye(3, 5, dtype=np.float32) + 0.01
    x = np.concatenate([w, -w])
    labels = np.array([0, 1, 2, 0, 1, 2])

    def loss(e):
        value = fn(labels, keras.ops.cast(e, dtype), w, scale=64.0)
        assert keras.backend.standardize_dtype(value.dtype) == dtype
        return keras.ops.cast(value, "float32")

    value, grad = value_and_grad(loss, x)
    assert np.isfinite(value) and np.isfinite(grad).all()
    assert np.abs(grad).max() > 0


@pytest.mark.parametrize("mode", ONE_MODE)
def test_fit_refuses_an_endless_dataset_without_steps_and_does_not_warn_about_shuffle(mode):
    data = _data()
    stream = tfdml.data.PKDataset((data.x, data.y), 4, 3, seed=0)  # repeat=True: endless
    model = _model(SupConLoss(), mode=mode)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(stream, epochs=2, verbose=0)
    with pytest.raises(ValueError, match="validation_steps"):
        model.fit(data.x, data.y, epochs=1, verbose=0, validation_data=stream)
    with pytest.raises(ValueError, match="`steps`"):
        model.evaluate(stream, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # Keras' "shuffle=True ... ignored" too
        history = model.fit(stream, epochs=2, steps_per_epoch=2, verbose=0)
    assert len(history.history["loss"]) == 2
