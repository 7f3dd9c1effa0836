"""MetricModel(chunk_size=...): gradient caching, under every backend.

A chunked step embeds the batch chunk by chunk without keeping activations, takes the
loss's gradient w.r.t. the embeddings, and back-propagates it chunk by chunk. It gives the
update of the unchunked step when the embedder treats rows independently (a ragged last
chunk included); random layers replay their draws, BatchNormalization normalizes per
chunk, and the loss (with its state) runs once per step.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, to_numpy, value_and_grad_function
from harness import pk_arrays, slow_beyond

from tfdml.losses import (
    CrossBatchMemory,
    MarginLoss,
    ProxyAnchorLoss,
    SupConLoss,
    TripletNCALoss,
)
from tfdml.miners import TripletMiner
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

CHUNK = 5  # batches of 12 rows: chunks of 5, 5 and 2
NUM_CLASSES = 8  # pk_arrays(num_classes=4, num_batches=2): ids 0..7

# How a step runs: eagerly, as a graph (TensorFlow without XLA) or compiled.
MODES = {"tensorflow": ["eager", "graph", "compiled"], "jax": ["eager", "compiled"],
         "torch": ["eager"]}[BACKEND]

# The checks of one mode are about what a chunked step computes (the loss's variables and
# state, the chunk sizes, regularization), the same code under every mode: eagerly on every
# commit, compiled in the slow tier. The compiled chunk loop runs on every commit in
# test_random_and_batch_norm_layers_replay_the_first_pass (a ragged last chunk) and
# test_blocks_with_chunks_compile_and_equal_the_dense_step (against the unchunked step).
ONE_MODE = ["eager", "compiled"] if CAN_COMPILE else ["eager"]


def _data(num_batches=2, seed=0):
    return pk_arrays(num_classes=4, per_class=3, num_batches=num_batches, seed=seed)


def _embedder(*middle, seed=0, regularizer=None):
    """``Input(6) -> Dense(8) -> middle... -> Dense(4)``, seeded."""
    init = keras.initializers.GlorotUniform

    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed),
                           kernel_regularizer=regularizer),
        *middle,
        keras.layers.Dense(4, kernel_initializer=init(seed + 1)),
    ])


def _compile(model, optimizer, mode):
    model.compile(optimizer=optimizer, run_eagerly=mode == "eager",
                  jit_compile=mode == "compiled")
    return model


def _fit(model, data, epochs=1):
    return model.fit(data.x, data.y, batch_size=data.batch_size, epochs=epochs, shuffle=False,
                     verbose=0)


def _numpy(variables):
    return [np.array(to_numpy(v)) for v in variables]


def _pair(make_embedder, make_loss, mode, optimizer, chunk_size=CHUNK):
    """The same model twice (same weights): without chunks and with ``chunk_size``."""
    models = []
    for chunks in (None, chunk_size):
        model = MetricModel(make_embedder(), make_loss(), chunk_size=chunks)
        models.append(_compile(model, keras.optimizers.get(optimizer), mode))
    return models


def _assert_same_variables(a, b, rtol=1e-5, atol=1e-6):
    assert len(a) == len(b)
    for x, y in zip(_numpy(a), _numpy(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


# -- the update of the unchunked step -----------------------------------------------------------


STEP_LOSSES = {
    "triplet_nca-sgd": (lambda: TripletNCALoss(order=2),
                        {"class_name": "SGD", "config": {"learning_rate": 0.5}}),
    "supcon-adam": (lambda: SupConLoss(), {"class_name": "Adam", "config": {"learning_rate": 0.01}}),
}


# Eagerly on every commit (SGD, and Adam: one update of its moments per step); as a graph and
# compiled in the slow tier. On every commit a compiled chunked step equals the unchunked one
# in test_blocks_with_chunks_compile_and_equal_the_dense_step, and the chunk loop, a ragged
# last chunk included, equals the step computed by hand as a graph and compiled in
# test_random_and_batch_norm_layers_replay_the_first_pass.
@pytest.mark.parametrize("make_loss, optimizer, mode", slow_beyond(
    [pytest.param(make, optimizer, mode, id=f"{name}-{mode}")
     for name, (make, optimizer) in STEP_LOSSES.items() for mode in MODES],
    {"triplet_nca-sgd-eager", "supcon-adam-eager"}))
def test_chunked_steps_equal_unchunked_steps(make_loss, optimizer, mode):
    plain, chunked = _pair(_embedder, make_loss, mode, optimizer)
    before = _numpy(plain.trainable_variables)
    data = _data()
    history_plain = _fit(plain, data)
    history_chunked = _fit(chunked, data)
    assert max(np.abs(a - b).max()
               for a, b in zip(before, _numpy(plain.trainable_variables), strict=True)) > 1e-3
    _assert_same_variables(chunked.trainable_variables, plain.trainable_variables)
    np.testing.assert_allclose(history_chunked.history["loss"], history_plain.history["loss"],
                               rtol=1e-5)


# A chunk larger than the batch takes the same path as one of the whole batch (the stock step):
# in the slow tier.
@pytest.mark.parametrize("mode", slow_beyond(ONE_MODE, {"eager"}))
@pytest.mark.parametrize("chunk_size", slow_beyond([4, 12, 16], {"4", "12"}))
def test_chunks_without_a_ragged_one(chunk_size, mode):
    """Chunks that divide the batch; one chunk of the whole batch (or larger)."""
    plain, chunked = _pair(_embedder, SupConLoss, mode, "sgd", chunk_size=chunk_size)
    data = _data()
    _fit(plain, data)
    _fit(chunked, data)
    _assert_same_variables(chunked.trainable_variables, plain.trainable_variables)


@pytest.mark.parametrize("mode", slow_beyond(ONE_MODE, {"eager"}))
@pytest.mark.parametrize("make_loss", [
    lambda: MarginLoss(miner=TripletMiner("easy", "hard")),  # beta is learned
    lambda: ProxyAnchorLoss(NUM_CLASSES, initializer=keras.initializers.RandomNormal(
        0.0, 0.5, seed=2))],
                         ids=["margin-beta", "proxy_anchor"])
def test_the_losss_variables_train_as_without_chunks(make_loss, mode):
    plain, chunked = _pair(_embedder, make_loss, mode, {"class_name": "Adam",
                                                        "config": {"learning_rate": 0.05}})
    learned = chunked.metric_loss.trainable_variables
    assert learned and all(any(v is w for w in chunked.trainable_variables) for v in learned)
    before = _numpy(learned)
    _fit(plain, _data())
    _fit(chunked, _data())
    assert max(np.abs(a - b).max() for a, b in zip(before, _numpy(learned), strict=True)) > 1e-3
    _assert_same_variables(learned, plain.metric_loss.trainable_variables)
    _assert_same_variables(chunked.trainable_variables, plain.trainable_variables)


@pytest.mark.parametrize("mode", slow_beyond(ONE_MODE, {"eager"}))
def test_weight_regularization_is_trained_once(mode):
    plain, chunked = _pair(lambda: _embedder(regularizer=keras.regularizers.L2(0.1)),
                           SupConLoss, mode, {"class_name": "SGD",
                                              "config": {"learning_rate": 0.5}})
    history_plain = _fit(plain, _data())
    history_chunked = _fit(chunked, _data())
    _assert_same_variables(chunked.trainable_variables, plain.trainable_variables)
    np.testing.assert_allclose(history_chunked.history["loss"], history_plain.history["loss"],
                               rtol=1e-5)


def test_losses_added_in_the_embedders_call_are_refused():
    embedder = keras.Sequential([keras.Input((6,)),
                                 keras.layers.Dense(4, activity_regularizer="l2")])
    model = MetricModel(embedder, SupConLoss(), chunk_size=CHUNK)
    model.compile(optimizer="sgd", run_eagerly=True)
    with pytest.raises(ValueError, match="adds losses during its call"):
        _fit(model, _data(num_batches=1))


# -- random layers and BatchNormalization: a chunk at a time --------------------------------------


def _reference_step(model, loss, x, y, learning_rate, mode):
    """One SGD step computed by hand, embedding ``x`` chunk by chunk (in order, the
    non-trainable state threaded through), all under one gradient: the weights and the
    embedder's non-trainable state after it."""
    embedder = model.embedder
    weights = [keras.ops.convert_to_tensor(w) for w in _numpy(embedder.trainable_variables)]
    state = [keras.ops.convert_to_tensor(v) for v in _numpy(embedder.non_trainable_variables)]
    starts = list(range(0, len(x), CHUNK))
    chunks = [keras.ops.convert_to_tensor(x[s:s + CHUNK]) for s in starts]

    def run(*weights):
        values, parts = list(state), []
        for chunk in chunks:
            out, values = embedder.stateless_call(list(weights), values, chunk, training=True)
            parts.append(out)
        return keras.ops.concatenate(parts, axis=0), values

    def objective(*weights):
        return loss(y, run(*weights)[0])

    step = value_and_grad_function(objective, argnums=tuple(range(len(weights))),
                                   jit_compile=mode == "compiled")
    _, grads = step(*weights)
    new_state = run(*weights)[1]
    updated = [w - learning_rate * g for w, g in zip(_numpy(weights), to_numpy(grads),
                                                       strict=True)]
    return updated, _numpy(new_state)


# On every commit each layer eagerly, Dropout compiled and BatchNormalization as a graph; the
# other two in the slow tier.
@pytest.mark.parametrize("middle, mode", slow_beyond(
    [pytest.param(middle, mode, id=f"{middle}-{mode}")
     for middle in ("dropout", "batch_norm") for mode in MODES],
    {f"{middle}-{mode}" for middle in ("dropout", "batch_norm") for mode in MODES}
    - {"batch_norm-compiled", "dropout-graph"}))
def test_random_and_batch_norm_layers_replay_the_first_pass(middle, mode):
    """The update equals the gradient of the loss on the embeddings of the chunks (same
    dropout masks, BatchNormalization's statistics per chunk), and the embedder's state
    (seed, moving statistics) advanced as by one pass over the chunks."""
    layer = (keras.layers.Dropout(0.5, seed=3) if middle == "dropout"
             else keras.layers.BatchNormalization(momentum=0.5))
    model = MetricModel(_embedder(layer), TripletNCALoss(order=2), chunk_size=CHUNK)
    _compile(model, keras.optimizers.SGD(0.5), mode)
    data = _data(num_batches=1)
    state_before = _numpy(model.embedder.non_trainable_variables)
    expected, expected_state = _reference_step(model, TripletNCALoss(order=2), data.x, data.y,
                                               0.5, mode)
    history = _fit(model, data)
    assert np.isfinite(history.history["loss"]).all()
    state = _numpy(model.embedder.non_trainable_variables)
    assert any(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max() > 0
               for a, b in zip(state_before, state, strict=True))  # the seed / statistics moved
    for got, want in zip(state, expected_state, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(_numpy(model.embedder.trainable_variables), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- the loss runs once per step -------------------------------------------------------------------


@pytest.mark.parametrize("mode", slow_beyond(ONE_MODE, {"eager"}))
@pytest.mark.parametrize("make_loss", [
    lambda: CrossBatchMemory(TripletNCALoss(), memory_size=24),
    lambda: TripletNCALoss(miner=TripletMiner("easy", "random", seed=1)),
], ids=["xbm", "random_miner"])
def test_the_losss_state_advances_once_per_step(make_loss, mode):
    plain, chunked = _pair(_embedder, make_loss, mode, "sgd")
    data = _data(num_batches=1)
    _fit(plain, data)
    _fit(chunked, data)
    state = chunked.loss_state
    if isinstance(chunked.metric_loss, CrossBatchMemory):
        assert int(to_numpy(state.filled)) == 12  # one batch, not two
        assert int(to_numpy(state.steps)) == 1
        np.testing.assert_allclose(to_numpy(state.embeddings)[:12],
                                   to_numpy(plain.loss_state.embeddings)[:12], rtol=1e-5,
                                   atol=1e-6)
    _assert_same_variables(state.non_trainable_variables,
                           plain.loss_state.non_trainable_variables)
    _assert_same_variables(chunked.trainable_variables, plain.trainable_variables)


# -- arguments and saving -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.0, 2.5, True, "8", [4]])
def test_bad_chunk_size(bad):
    with pytest.raises(ValueError, match=r"chunk_size.*Received: chunk_size="):
        MetricModel(_embedder(), SupConLoss(), chunk_size=bad)


# Eagerly on every commit; compiled as fit compiles by default in the slow tier.
@pytest.mark.parametrize("mode", slow_beyond(["eager", "default"], {"eager"}))
def test_config_and_keras_file_keep_the_chunk_size(tmp_path, mode):
    model = MetricModel(_embedder(), MarginLoss(miner=TripletMiner("easy", "hard")),
                        chunk_size=np.int64(7))
    assert model.chunk_size == 7 and isinstance(model.chunk_size, int)
    config = model.get_config()
    assert config["chunk_size"] == 7
    assert MetricModel.from_config(config).chunk_size == 7
    assert MetricModel(_embedder(), SupConLoss()).get_config()["chunk_size"] is None
    model.compile(optimizer="adam", run_eagerly=mode == "eager")
    data = _data(num_batches=1)
    _fit(model, data)
    # evaluate and predict run as without chunks.
    value = model.evaluate(data.x, data.y, batch_size=data.batch_size, verbose=0)
    np.testing.assert_allclose(value, to_numpy(model.metric_loss(data.y, model(data.x))),
                               rtol=1e-5)
    np.testing.assert_allclose(to_numpy(model.predict(data.x, verbose=0)),
                               to_numpy(model.embedder(data.x)), rtol=1e-5, atol=1e-6)
    path = tmp_path / "chunked.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, MetricModel) and loaded.chunk_size == 7
    _assert_same_variables(loaded.trainable_variables, model.trainable_variables, rtol=0, atol=0)


# -- the catalogue: blocks with chunks, mixed precision, embedders chunks cannot split -----------


@pytest.mark.parametrize("policy", ["float32", pytest.param("mixed_float16", marks=pytest.mark.slow)])
def test_blocks_with_chunks_compile_and_equal_the_dense_step(policy):
    """A loss in row blocks inside a chunked step (the docs' large-batch recipe), compiled
    where the backend compiles (XLA on TensorFlow: the blocks count the batch's rows, which
    the chunk loop's output used to hide), equals the step without either, under mixed
    precision too. (Under loss scaling a chunked step sums the network's gradient over
    chunks in float32, so it can escape an fp16 overflow that makes the unchunked step skip;
    this loss's gradients do not overflow.)"""
    data = _data()
    mode = "compiled" if CAN_COMPILE else "eager"
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        runs = []
        for block, chunk in ((None, None), (4, 3)):
            model = MetricModel(_embedder(), TripletNCALoss(block_size=block), chunk_size=chunk)
            _compile(model, keras.optimizers.SGD(0.1), mode)
            runs.append((_fit(model, data, epochs=2).history["loss"], model))
    finally:
        keras.config.set_dtype_policy(previous)
    (dense_losses, dense), (losses, chunked) = runs
    np.testing.assert_allclose(losses, dense_losses, rtol=2e-3 if policy != "float32" else 1e-5)
    _assert_same_variables(_numpy(chunked.trainable_variables), _numpy(dense.trainable_variables),
                           rtol=2e-3 if policy != "float32" else 1e-5, atol=1e-4)


def _two_views_embedder():
    first, second = keras.Input((6,)), keras.Input((6,))
    encoder = keras.layers.Dense(4)
    views = keras.layers.Concatenate(axis=0)([encoder(first), encoder(second)])  # [2N, D]
    return keras.Model([first, second], views)


# Chunks of one row in the slow tier: the same check refuses them.
@pytest.mark.parametrize("chunk_size", slow_beyond([1, 3], {"3"}))
def test_an_embedder_of_two_stacked_views_is_refused_with_chunks(chunk_size):
    from tfdml.losses import NTXentLoss, SelfSupervisedLoss

    x = np.random.default_rng(0).normal(size=(12, 6)).astype("float32")
    model = MetricModel(_two_views_embedder(), SelfSupervisedLoss(NTXentLoss()),
                        chunk_size=chunk_size)
    model.compile(optimizer="sgd", run_eagerly=not CAN_COMPILE)
    with pytest.raises(ValueError, match=r"one embedding row per input row.*chunk_size"):
        model.fit([x, x], np.zeros(12), batch_size=12, epochs=1, verbose=0)
    plain = MetricModel(_two_views_embedder(), SelfSupervisedLoss(NTXentLoss()))
    plain.compile(optimizer="sgd", run_eagerly=not CAN_COMPILE)
    assert np.isfinite(plain.fit([x, x], np.zeros(12), batch_size=12, verbose=0)
                       .history["loss"][0])


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_an_embedder_with_two_outputs_is_refused(chunk_size):
    inputs = keras.Input((6,))
    embedder = keras.Model(inputs, [keras.layers.Dense(4)(inputs), keras.layers.Dense(4)(inputs)])
    data = _data()
    model = MetricModel(embedder, SupConLoss(), chunk_size=chunk_size)
    model.compile(optimizer="sgd", run_eagerly=not CAN_COMPILE)
    with pytest.raises(ValueError, match="one tensor of embeddings"):
        _fit(model, data)
