"""Reusable contract checks for tfdml losses (and, where it applies, miners).

Every helper takes a loss *instance* or a zero-argument *factory* returning one
(``lambda: TripletNCALoss(order=2)``); factories are preferred so that each check
gets a fresh object (a seeded random miner then starts from the same state).

Checks:

* :func:`assert_config_roundtrip`: ``get_config``/``from_config`` and
  ``keras.saving.serialize_keras_object``/``deserialize_keras_object`` (via JSON).
* :func:`assert_keras_save_load`: ``model.save(".keras")`` + ``keras.models.load_model``.
* :func:`assert_jit_matches_eager`: value and gradient under ``jit_compile=True``
  (``tf.function`` / ``jax.jit``; skips under PyTorch, which has no compiled path here).
* :func:`assert_one_step_fit`: ``model.fit`` on P x K batches of int labels (a ``tf.data``
  pipeline under TensorFlow, NumPy arrays under the other backends).
* :func:`assert_finite_loss_and_grads`: value and gradient w.r.t. the embeddings finite.
* :func:`run_under_policy` / :func:`mixed_precision_loss`: Keras mixed precision.
* :func:`large_tensor_ops` / :func:`trace_loss_graph`: static-shape graph walk that
  finds ops whose outputs are too large (e.g. a ``B x B x B`` tensor). TensorFlow only.
* :func:`slow_beyond`: the parameters of a test that run on every commit, and the rest in the
  slow tier (``make test-slow``).
* hypothesis strategies: :func:`ordinary_batches`, :func:`degenerate_batches`,
  :func:`no_triplet_batches` and the single kinds they mix.

Everything but the graph inspection (:func:`walk_graph_ops`, :func:`large_tensor_ops`,
:func:`trace_loss_graph`, :func:`xla_large_shapes`) and :func:`pk_dataset` (``tf.data``)
runs under every Keras backend, through ``tests/support/backends.py``; TensorFlow is imported
only inside those TensorFlow-only helpers.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import keras
import numpy as np
import pytest
from backends import (
    BACKEND,
    CAN_COMPILE,
    compiled,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
    value_and_grad_tensors,
)
from hypothesis import example
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from keras import ops

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "Batch",
    "FitData",
    "LossCase",
    "LossProbe",
    "all_zero_batches",
    "assert_config_roundtrip",
    "assert_finite_loss_and_grads",
    "assert_jit_matches_eager",
    "assert_keras_save_load",
    "assert_one_step_fit",
    "assert_same_config",
    "builds_all_triplets",
    "degenerate_batches",
    "degenerate_examples",
    "duplicate_embedding_batches",
    "forward_backward",
    "has_triplet",
    "is_deterministic",
    "large_id_batches",
    "large_tensor_ops",
    "loss_and_grads",
    "make_loss",
    "mixed_batches",
    "mixed_precision_loss",
    "no_triplet_batches",
    "nonfinite_batches",
    "one_class_batches",
    "ordinary_batches",
    "pk_arrays",
    "pk_data",
    "pk_dataset",
    "pk_labels",
    "run_under_policy",
    "singleton_batches",
    "slow_beyond",
    "small_embedding_model",
    "trace_loss_graph",
    "walk_graph_ops",
    "with_examples",
    "with_reduction",
    "xla_large_shapes",
    "zero_vector_batches",
]

LossLike = keras.losses.Loss | Callable[[], keras.losses.Loss]


# -- loss cases ------------------------------------------------------------------------------


def slow_beyond(values, fast, ids=None) -> list:
    """``values`` as pytest parameters, those not named in ``fast`` marked ``slow``.

    The fast tier (every commit) keeps one configuration per code path of a check, the ones
    in ``fast``; the slow tier (``make test-slow``) runs the others. A value's name is its id
    in ``ids`` (a list, or a function of the value), else the ``id`` of a ``pytest.param``,
    else ``str(value)``. A name in ``fast`` that no value has is an error, so a renamed
    configuration cannot drop out of the fast tier unnoticed.
    """
    values = list(values)

    def name(i, value):
        if ids is not None:
            return ids(value) if callable(ids) else ids[i]
        if isinstance(value, type(pytest.param(None))):
            return value.id if value.id is not None else str(value.values[0])
        return str(value)

    names = [name(i, v) for i, v in enumerate(values)]
    unknown = set(fast) - set(names)
    if unknown:
        raise ValueError(f"fast-tier names not among the parameters: {sorted(unknown)}")
    params = []
    for label, value in zip(names, values, strict=True):
        marks = () if label in fast else (pytest.mark.slow,)
        if isinstance(value, type(pytest.param(None))):
            params.append(pytest.param(*value.values, id=value.id or label,
                                       marks=(*value.marks, *marks)))
        else:
            params.append(pytest.param(value, id=label, marks=marks))
    return params


def make_loss(loss: LossLike) -> keras.losses.Loss:
    """The loss itself, or a fresh one from a factory."""
    if isinstance(loss, keras.losses.Loss):
        return loss
    made = loss()
    if not isinstance(made, keras.losses.Loss):
        raise TypeError(f"Loss factory returned {made!r}, not a keras.losses.Loss")
    return made


def _miner_config(loss) -> dict:
    miner = getattr(loss, "miner", None)
    inner = getattr(loss, "loss", None)  # a wrapper such as TrimmedLoss
    if miner is None and isinstance(inner, keras.losses.Loss):
        return _miner_config(inner)
    if miner is None or not hasattr(miner, "get_config"):
        return {}
    return miner.get_config()


def is_deterministic(loss) -> bool:
    """False when the loss's miner draws random choices (two calls may differ)."""
    config = _miner_config(make_loss(loss))
    random = ("random", "distance_weighted")
    return config.get("positive") not in random and config.get("negative") not in random


def builds_all_triplets(loss) -> bool:
    """True when the loss's miner enumerates every (anchor, positive, negative): a B^3 tensor."""
    config = _miner_config(make_loss(loss))
    return config.get("positive") == "all" and config.get("negative") == "all"


@dataclass(frozen=True)
class LossCase:
    """One loss configuration of the contract tests.

    Attributes:
        id: pytest id.
        factory: zero-argument callable returning a fresh loss.
        deterministic: the loss gives the same value on every call; defaults to
            :func:`is_deterministic` of a fresh instance.
        cubic: the loss is allowed to (and does) build a ``B x B x B`` tensor;
            defaults to :func:`builds_all_triplets`.
        zero_without_triplet: an anchor without both a positive and a
            negative has loss 0 (false for pair losses over all pairs, where
            a negative pair alone already gives a loss).
    """

    id: str
    factory: Callable[[], keras.losses.Loss]
    deterministic: bool | None = None
    cubic: bool | None = None
    zero_without_triplet: bool = True

    def make(self) -> keras.losses.Loss:
        return make_loss(self.factory)

    @property
    def is_deterministic(self) -> bool:
        if self.deterministic is not None:
            return self.deterministic
        return is_deterministic(self.factory)

    @property
    def is_cubic(self) -> bool:
        if self.cubic is not None:
            return self.cubic
        return builds_all_triplets(self.factory)


# -- small batches -------------------------------------------------------------------------


def has_triplet(labels) -> bool:
    """Whether some anchor has both a positive (same class, not itself) and a negative."""
    labels = np.asarray(labels).reshape(-1)
    _, counts = np.unique(labels, return_counts=True)
    return bool(len(counts) >= 2 and counts.max() >= 2)


def pk_labels(num_classes: int, per_class: int, offset: int = 0) -> np.ndarray:
    """``[0]*K + [1]*K + ...`` (plus ``offset``): a P x K batch of int32 class ids."""
    return (np.repeat(np.arange(num_classes), per_class) + offset).astype(np.int32)


def _random_embeddings(batch, dim, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, dim)).astype(np.float32)


# -- running a loss ------------------------------------------------------------------------


def loss_and_grads(loss: LossLike, labels, embeddings, sample_weight=None):
    """Eager value and gradient w.r.t. ``embeddings`` as NumPy arrays.

    Labels and embeddings are passed as backend tensors.
    """
    loss = make_loss(loss)
    return value_and_grad(
        lambda y, x: loss(y, x, sample_weight=sample_weight), labels, embeddings, argnums=1
    )


def with_reduction(loss: LossLike, reduction):
    """A fresh copy of ``loss`` (same config; a seeded miner restarts) with another reduction."""
    loss = make_loss(loss)
    return type(loss).from_config({**loss.get_config(), "reduction": reduction})


class LossProbe:
    """A loss run over many hypothesis examples, for fuzzing.

    Calling it returns NumPy arrays: ``"value"`` and ``"grad"`` (w.r.t. the
    embeddings) for the loss's own reduction, ``"none"`` (the ``[B]``
    per-anchor values) and, for each extra reduction ``r``, ``r`` and
    ``"grad_" + r``.

    TensorFlow: traced once (graph mode, dynamic ``[None]``/``[None, None]``
    shapes), much faster than eager calls over many examples, and exercises unknown
    static shapes, as ``model.fit`` does. JAX: ``jax.jit``, compiled once per batch
    shape (eager JAX compiles every op for every new shape, which is slower still), so
    feed it few distinct shapes; eager for a loss with a random miner (its
    ``SeedGenerator`` state cannot be updated inside a bare ``jax.jit``). PyTorch: eager.
    """

    def __init__(self, loss: LossLike, extra_reductions=("sum",)):
        self.loss = make_loss(loss)
        self._per_anchor = with_reduction(self.loss, "none")
        self._extra = {r: with_reduction(self.loss, r) for r in extra_reductions}
        if BACKEND == "tensorflow":
            import tensorflow as tf

            self._fn = tf.function(
                self._run,
                input_signature=[
                    tf.TensorSpec([None], tf.int32),
                    tf.TensorSpec([None, None], tf.float32),
                ],
                autograph=False,  # as in backends.py: nothing to convert, faster tracing
            )
        elif BACKEND == "jax" and is_deterministic(self.loss):
            import jax

            self._fn = jax.jit(self._run)
        else:
            self._fn = self._run

    def _run(self, labels, embeddings):
        out = {}
        for name, loss in [("value", self.loss), *self._extra.items()]:
            value, grad = value_and_grad_tensors(
                lambda x, loss=loss: loss(labels, x), embeddings
            )
            out[name] = value
            out["grad" if name == "value" else f"grad_{name}"] = grad
        out["none"] = self._per_anchor(labels, embeddings)
        return out

    def __call__(self, labels, embeddings) -> dict:
        out = self._fn(
            ops.convert_to_tensor(np.asarray(labels, np.int32)),
            ops.convert_to_tensor(np.asarray(embeddings, np.float32)),
        )
        return to_numpy(out)


def assert_finite_loss_and_grads(loss: LossLike, labels, embeddings, sample_weight=None):
    """The loss value and its gradient w.r.t. the embeddings are finite (no NaN/Inf).

    Returns:
        ``(value, grad)`` as NumPy arrays, for further checks.
    """
    value, grad = loss_and_grads(loss, labels, embeddings, sample_weight)
    assert np.all(np.isfinite(value)), f"non-finite loss {value} for labels={labels!r}"
    assert np.all(np.isfinite(grad)), (
        f"non-finite gradient for labels={labels!r}, embeddings={embeddings!r}: {grad}"
    )
    return value, grad


def assert_compiled_values_equal_eager(losses, labels, embeddings, rtol=1e-5, atol=1e-6):
    """Each loss (or ``fn(y_true, y_pred)``) gives under XLA (``tf.function(jit_compile=True)``,
    ``jax.jit``) the values it gives eagerly, which are not all 0. Skips the calling test
    where nothing is compiled (PyTorch)."""
    if not CAN_COMPILE:
        pytest.skip(f"no compiled path to compare with under the {BACKEND} backend")
    for fn in losses:
        want = to_numpy(fn(labels, embeddings))
        assert np.any(want > 0), f"{fn!r}: all 0 eagerly"
        got = to_numpy(compiled(lambda y, e, fn=fn: fn(y, e))(labels, embeddings))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def assert_jit_matches_eager(
    loss: LossLike, labels, embeddings, sample_weight=None, rtol=1e-4, atol=1e-5
):
    """The compiled value and gradient (``tf.function(jit_compile=True)``, ``jax.jit``) are
    the eager ones.

    Only meaningful for deterministic losses (miners without random strategies).
    Skips the calling test under PyTorch, where nothing is compiled (see
    ``backends.CAN_COMPILE``).
    """
    if not CAN_COMPILE:
        pytest.skip(f"no compiled path to compare with under the {BACKEND} backend")
    loss = make_loss(loss)
    eager_value, eager_grad = loss_and_grads(loss, labels, embeddings, sample_weight)

    compiled = forward_backward(loss, jit_compile=True, sample_weight=sample_weight)
    jit_value, jit_grad = to_numpy(compiled(labels, embeddings))
    np.testing.assert_allclose(jit_value, eager_value, rtol=rtol, atol=atol)
    np.testing.assert_allclose(jit_grad, eager_grad, rtol=rtol, atol=10 * atol)
    # The same compiled program turns a NaN or an Inf embedding into a NaN loss.
    for bad in (np.nan, np.inf):
        broken = np.array(embeddings, copy=True)
        broken[len(broken) // 2, 0] = bad
        value, _ = to_numpy(compiled(labels, broken))
        assert np.isnan(value), f"compiled: {bad} in the embeddings gave {value}"
    return eager_value, eager_grad


# -- serialization -------------------------------------------------------------------------


def _normalize(config):
    """JSON round trip: tuples become lists, as they do in a saved .keras file."""
    return json.loads(json.dumps(config))


def assert_same_config(a, b):
    """Same class and same (JSON-normalized) config, nested objects included."""
    assert type(a) is type(b), f"{type(a).__name__} != {type(b).__name__}"
    assert _normalize(a.get_config()) == _normalize(b.get_config())


def assert_config_roundtrip(obj):
    """``get_config -> from_config`` and ``serialize -> JSON -> deserialize`` keep the config.

    Works for losses and miners. Returns the object rebuilt by ``from_config``.
    """
    config = obj.get_config()
    clone = type(obj).from_config(config)
    assert_same_config(obj, clone)
    # from_config must not keep references into the config dict it was given.
    assert clone.get_config() == obj.get_config()

    serialized = keras.saving.serialize_keras_object(obj)
    text = json.dumps(serialized)  # the saved form must be plain JSON
    restored = keras.saving.deserialize_keras_object(json.loads(text))
    assert_same_config(obj, restored)
    return clone


def small_embedding_model(input_dim: int = 6, embed_dim: int = 4, seed: int = 0, name=None):
    """``Input -> Dense(embed_dim)``: the smallest embedding model, seeded."""
    return keras.Sequential(
        [
            keras.Input((input_dim,)),
            keras.layers.Dense(
                embed_dim, kernel_initializer=keras.initializers.GlorotUniform(seed=seed)
            ),
        ],
        name=name,
    )


def _batch_for_model(input_dim=6, num_classes=3, per_class=3, seed=1):
    labels = pk_labels(num_classes, per_class)
    features = _random_embeddings(len(labels), input_dim, seed)
    return labels, features


def _build_state(loss, embedding_dim):
    state = getattr(loss, "state", None)
    if state is not None and not state.built:
        loss.build_state(embedding_dim)


def assert_keras_save_load(loss: LossLike, tmp_path, labels=None, features=None):
    """A model compiled with the loss survives ``.keras`` save/load with the same loss.

    Checks the loaded model's loss has the same class and config (nested miner
    included) and gives the same value on a batch. Returns the loaded model.
    """
    loss = make_loss(loss)
    if labels is None or features is None:
        labels, features = _batch_for_model()
    model = small_embedding_model(input_dim=features.shape[-1])
    model.compile(optimizer="sgd", loss=loss)
    embeddings = model(features)
    # A loss with learned variables is called outside a MetricModel here: its variables are
    # built first, as its error asks (a differentiated first call builds none on PyTorch).
    _build_state(loss, embeddings.shape[-1])
    expected = to_numpy(loss(labels, embeddings))

    path = tmp_path / f"{type(loss).__name__}.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_loss = loaded.loss
    _build_state(loaded_loss, embeddings.shape[-1])
    assert isinstance(loaded_loss, keras.losses.Loss), f"loaded loss is {loaded_loss!r}"
    assert_same_config(loss, loaded_loss)
    miner = getattr(loss, "miner", None)
    if miner is not None:
        assert_same_config(miner, loaded_loss.miner)
    value = to_numpy(loaded_loss(labels, loaded(features)))
    np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)
    return loaded


# -- training ------------------------------------------------------------------------------


class FitData(NamedTuple):
    """P x K batches as NumPy arrays for ``model.fit(x, y, batch_size=batch_size)``."""

    x: np.ndarray
    y: np.ndarray
    batch_size: int


def pk_arrays(
    num_classes: int = 4,
    per_class: int = 3,
    input_dim: int = 6,
    num_batches: int = 2,
    label_offset: int = 0,
    seed: int = 0,
) -> FitData:
    """``num_batches`` P x K batches of ``(features, int64 labels)`` as NumPy arrays.

    Each batch has ``num_classes`` classes with ``per_class`` samples each
    (batch ``b`` has the ids ``label_offset + b * num_classes + [0, num_classes)``);
    features are random (so every loss has something to learn).
    """
    rng = np.random.default_rng(seed)
    batch = num_classes * per_class
    labels = np.concatenate(
        [
            pk_labels(num_classes, per_class, label_offset + b * num_classes)
            for b in range(num_batches)
        ]
    ).astype(np.int64)
    features = rng.normal(size=(batch * num_batches, input_dim)).astype(np.float32)
    return FitData(features, labels, batch)


def pk_dataset(**kwargs) -> tf.data.Dataset:
    """A repeating ``tf.data`` pipeline of the batches of :func:`pk_arrays` with ``kwargs``
    (TensorFlow only)."""
    import tensorflow as tf

    data = pk_arrays(**kwargs)
    return tf.data.Dataset.from_tensor_slices((data.x, data.y)).batch(data.batch_size).repeat()


def pk_data(steps: int = 2, **kwargs):
    """:func:`pk_dataset` under TensorFlow, :func:`pk_arrays` of ``steps`` batches elsewhere.

    What :func:`assert_one_step_fit` trains on by default; ``kwargs`` go to either.
    """
    if BACKEND == "tensorflow":
        return pk_dataset(**kwargs)
    return pk_arrays(num_batches=steps, **kwargs)


def _weights(model):
    return [np.array(to_numpy(w.value)) for w in model.trainable_weights]


def assert_one_step_fit(
    loss: LossLike,
    jit_compile=True,
    steps: int = 2,
    epochs: int = 1,
    dataset: tf.data.Dataset | FitData | None = None,
    model: keras.Model | None = None,
    optimizer="sgd",
):
    """``model.fit`` for a few steps: loss finite, weights changed.

    ``dataset`` is a repeating ``tf.data`` pipeline (TensorFlow only; ``steps``
    batches per epoch) or a :class:`FitData` of NumPy arrays holding exactly
    ``steps`` batches (one epoch = one pass). Defaults to :func:`pk_data`.
    ``jit_compile`` only applies where the backend compiles (not PyTorch).
    Returns the ``History``.
    """
    loss = make_loss(loss)
    dataset = pk_data(steps) if dataset is None else dataset
    model = small_embedding_model() if model is None else model
    jit_compile = bool(jit_compile and CAN_COMPILE)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    assert model.jit_compile == jit_compile, "Keras turned jit_compile off for this model"
    before = _weights(model)
    if isinstance(dataset, FitData):
        assert len(dataset.y) == steps * dataset.batch_size, "FitData must hold `steps` batches"
        history = model.fit(
            dataset.x, dataset.y, batch_size=dataset.batch_size, epochs=epochs, shuffle=False,
            verbose=0,
        )
    else:
        history = model.fit(
            dataset, epochs=epochs, steps_per_epoch=steps, shuffle=False, verbose=0
        )
    losses = np.asarray(history.history["loss"], dtype=np.float64)
    assert losses.shape == (epochs,), history.history
    assert np.all(np.isfinite(losses)), f"non-finite training loss {losses}"
    after = _weights(model)
    assert all(np.all(np.isfinite(w)) for w in after), "non-finite weights after fit"
    changed = any(not np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    assert changed, f"weights did not change in {steps * epochs} steps (loss {losses})"
    return history


# -- mixed precision -----------------------------------------------------------------------


@contextlib.contextmanager
def run_under_policy(policy: str) -> Iterator[None]:
    """Sets the global Keras dtype policy for the ``with`` block, then restores it."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


_POLICY_OUTPUT = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def mixed_precision_loss(
    loss: LossLike,
    policy: str,
    labels=None,
    features=None,
    kernel=None,
    fit_steps: int = 0,
    jit_compile=None,
):
    """Runs a loss on the output of a small model built under a mixed-precision policy.

    The model is ``Input -> Dense`` (bias-free, with ``kernel`` if given) whose
    output dtype is bfloat16 (``"mixed_bfloat16"``) or float16
    (``"mixed_float16"``). Labels are passed as int64 tensors, as tf.data
    pipelines give them (int32 under JAX without ``jax_enable_x64``; use ids > 2048
    to catch labels cast to the loss dtype).
    Defaults: a 3 x 3 batch of ids 4095, 4096, 4097 (4096 and 4097 round to one
    number in both bfloat16 and float16) with random 6-d features. ``jit_compile``
    defaults to False, except under JAX (True, Keras' own default there: an eager JAX
    model compiles every op on first use, which is much slower); PyTorch never compiles.

    Returns:
        A dict with ``"direct"`` (``loss(labels, model(features))``),
        ``"evaluate"`` (``model.evaluate`` on one batch, the same path as
        training: a tf.data batch under TensorFlow, NumPy arrays elsewhere),
        ``"embeddings"`` (the model output, as float32 NumPy) and, when
        ``fit_steps``, ``"fit"`` (the training losses, checked finite).
    """
    if labels is None:
        labels = pk_labels(3, 3, offset=4095)
    if features is None:
        features = _random_embeddings(len(labels), 6, seed=2)
    labels = np.asarray(labels, dtype=np.int64)
    features = np.asarray(features, dtype=np.float32)
    with run_under_policy(policy):
        loss = make_loss(loss)
        dense = keras.layers.Dense(
            features.shape[-1] if kernel is None else np.shape(kernel)[-1],
            use_bias=False,
            kernel_initializer=(
                keras.initializers.GlorotUniform(seed=0)
                if kernel is None
                else keras.initializers.Constant(np.asarray(kernel, np.float32))
            ),
        )
        model = keras.Sequential([keras.Input((features.shape[-1],)), dense])
        if jit_compile is None:
            jit_compile = BACKEND == "jax"
        model.compile(optimizer="sgd", loss=loss, jit_compile=bool(jit_compile and CAN_COMPILE))
        outputs = model(features)
        expected_dtype = _POLICY_OUTPUT.get(policy)
        output_dtype = keras.backend.standardize_dtype(outputs.dtype)
        if expected_dtype is not None:
            assert output_dtype == expected_dtype, f"model output is {output_dtype}"
        result = {
            "embeddings": to_numpy(ops.cast(outputs, "float32")),
            "direct": float(to_numpy(loss(ops.convert_to_tensor(labels), outputs))),
        }
        if BACKEND == "tensorflow":
            import tensorflow as tf

            dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(len(labels))
            result["evaluate"] = float(model.evaluate(dataset, verbose=0))
            fit_data = {"x": dataset.repeat(), "steps_per_epoch": fit_steps}
        else:
            result["evaluate"] = float(
                model.evaluate(features, labels, batch_size=len(labels), verbose=0)
            )
            fit_data = {"x": np.tile(features, (max(fit_steps, 1), 1)),
                        "y": np.tile(labels, max(fit_steps, 1)), "batch_size": len(labels)}
        if fit_steps:
            history = model.fit(**fit_data, shuffle=False, verbose=0)
            fit_losses = np.asarray(history.history["loss"], np.float64)
            assert np.all(np.isfinite(fit_losses)), f"non-finite loss under {policy}: {fit_losses}"
            result["fit"] = fit_losses
    return result


# -- graph inspection ----------------------------------------------------------------------


def _function_names(op) -> list[str]:
    names = []
    for key, value in op.node_def.attr.items():
        del key
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def _lookup_function_graph(name, graphs):
    for graph in graphs:
        try:
            fn = graph._get_function(name)  # noqa: SLF001 - no public API for this
        except (AttributeError, KeyError, ValueError):
            fn = None
        if fn is not None and getattr(fn, "graph", None) is not None:
            return fn.graph
    return None


def walk_graph_ops(graph) -> Iterator[tf.Operation]:  # TensorFlow only
    """Yields every op of ``graph`` and, recursively, of the functions its ops call.

    Follows ``While``/``If``/``PartitionedCall`` bodies (any op attribute that
    names a function), so loops and nested functions are not blind spots.
    """
    seen = set()
    stack = [(graph, (graph,))]
    while stack:
        current, lineage = stack.pop()
        for op in current.get_operations():
            yield op
            for name in _function_names(op):
                if name in seen:
                    continue
                seen.add(name)
                body = _lookup_function_graph(name, (current, *lineage))
                if body is None:
                    raise AssertionError(f"cannot find the graph of function {name!r} of {op.name}")
                stack.append((body, (current, *lineage)))


def large_tensor_ops(graph, max_elements: int) -> list[tuple[str, str, tuple]]:
    """``(op type, op name, shape)`` of every op output with ``>= max_elements`` elements.

    Unknown dimensions count as unbounded, so a dynamic shape is reported too.
    """
    found = []
    for op in walk_graph_ops(graph):
        for out in op.outputs:
            shape = out.shape
            if shape.rank is None:
                continue
            if any(d is None for d in shape.as_list()):
                if shape.rank >= 3:
                    found.append((op.type, op.name, tuple(shape.as_list())))
                continue
            if shape.num_elements() >= max_elements:
                found.append((op.type, op.name, tuple(shape.as_list())))
    return found


def forward_backward(loss: LossLike, jit_compile: bool = False, sample_weight=None):
    """``step(labels, embeddings) -> (value, grad)``: ``loss`` and its gradient w.r.t. the
    embeddings, as backend tensors.

    TensorFlow: a ``tf.function`` (XLA with ``jit_compile=True``); JAX: ``jax.jit``
    with ``jit_compile=True``, eager otherwise; PyTorch: eager (see
    ``backends.value_and_grad_function``). The gradient is zeros, not None, when the
    value does not depend on the embeddings.
    """
    loss = make_loss(loss)
    return value_and_grad_function(
        lambda labels, embeddings: loss(labels, embeddings, sample_weight=sample_weight),
        argnums=1,
        jit_compile=jit_compile,
    )


def trace_loss_graph(loss: LossLike, batch: int = 48, dim: int = 8):
    """Graph of forward + backward of ``loss`` for static ``[batch]``, ``[batch, dim]`` inputs.

    TensorFlow only.
    """
    import tensorflow as tf

    concrete = forward_backward(loss).get_concrete_function(
        tf.TensorSpec([batch], tf.int32), tf.TensorSpec([batch, dim], tf.float32)
    )
    return concrete.graph


_HLO_SHAPE = re.compile(r"\b(?:pred|[subf]\d+|bf16)\[([\d,]+)\]")


def xla_large_shapes(loss: LossLike, max_elements: int, batch: int = 48, dim: int = 8):
    """Shapes with ``>= max_elements`` elements in the optimized XLA HLO of forward + backward.

    The TensorFlow graph is not the whole story under ``jit_compile=True``: XLA
    lowers some ops (a batched ``tf.searchsorted``, for one) to much larger
    intermediate tensors, so memory claims are checked on the compiled program.
    TensorFlow only.
    """
    import tensorflow as tf

    step = forward_backward(loss, jit_compile=True)
    labels = tf.constant(np.arange(batch) % max(batch // 4, 2), tf.int32)
    embeddings = tf.random.stateless_normal([batch, dim], seed=[1, 2])
    hlo = step.experimental_get_compiler_ir(labels, embeddings)(stage="optimized_hlo")
    found = set()
    for match in _HLO_SHAPE.finditer(hlo):
        dims = [int(d) for d in match.group(1).split(",") if d]
        if int(np.prod(dims)) >= max_elements:
            found.add(match.group(0))
    return sorted(found)


# -- hypothesis strategies -----------------------------------------------------------------

MAX_BATCH = 12
_DIMS = st.integers(min_value=2, max_value=6)
_ELEMENT = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False, width=32)


@dataclass(frozen=True)
class Batch:
    """A test batch: int32 labels ``[B]``, float32 embeddings ``[B, D]`` and how it was made."""

    labels: np.ndarray
    embeddings: np.ndarray
    kind: str

    @property
    def has_triplet(self) -> bool:
        return has_triplet(self.labels)

    def __repr__(self):  # hypothesis prints this on failure: keep it reproducible
        return (
            f"Batch(kind={self.kind!r}, labels=np.array({self.labels.tolist()}), "
            f"embeddings=np.array({self.embeddings.tolist()}, np.float32))"
        )


def _embeddings(batch, dim):
    return hnp.arrays(np.float32, (batch, dim), elements=_ELEMENT)


@st.composite
def _batch_from_labels(draw, labels_strategy, kind):
    labels = np.asarray(draw(labels_strategy), dtype=np.int32)
    dim = draw(_DIMS)
    return Batch(labels, draw(_embeddings(len(labels), dim)), kind)


def _class_ids(max_id=20):
    return st.integers(min_value=0, max_value=max_id)


def ordinary_batches(min_size: int = 2, max_size: int = MAX_BATCH, max_classes: int = 4):
    """Random labels from a few classes and random embeddings."""
    labels = st.lists(st.integers(0, max_classes - 1), min_size=min_size, max_size=max_size)
    return _batch_from_labels(labels, "ordinary")


def one_class_batches(max_size: int = MAX_BATCH):
    """Every sample in the same class (any id, large ones included): no negative at all."""

    @st.composite
    def build(draw):
        size = draw(st.integers(1, max_size))
        label = draw(st.one_of(_class_ids(), st.integers(2049, 2**31 - 1)))
        return [label] * size

    return _batch_from_labels(build(), "one_class")


def singleton_batches(max_size: int = MAX_BATCH):
    """Every class a singleton: no positive at all."""
    labels = st.lists(
        st.one_of(_class_ids(1000), st.integers(2049, 100_000)),
        min_size=1,
        max_size=max_size,
        unique=True,
    )
    return _batch_from_labels(labels, "singletons")


def large_id_batches(max_size: int = MAX_BATCH):
    """Class ids above 2048 (float16 and bfloat16 cannot tell neighbours apart), 256/257 too."""
    base = st.sampled_from([256, 2048, 4096, 65_536, 2**24, 2**31 - 8])

    @st.composite
    def build(draw):
        start = draw(base)
        offsets = draw(st.lists(st.integers(0, 3), min_size=2, max_size=max_size))
        return [start + o for o in offsets]

    return _batch_from_labels(build(), "large_ids")


def duplicate_embedding_batches(max_size: int = MAX_BATCH):
    """Rows repeated exactly (zero distances, tied similarities), random labels."""

    @st.composite
    def build(draw):
        size = draw(st.integers(2, max_size))
        dim = draw(_DIMS)
        distinct = draw(st.integers(1, min(3, size)))
        base = draw(_embeddings(distinct, dim))
        rows = draw(st.lists(st.integers(0, distinct - 1), min_size=size, max_size=size))
        labels = draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
        return Batch(np.asarray(labels, np.int32), base[rows], "duplicates")

    return build()


def zero_vector_batches(max_size: int = MAX_BATCH):
    """Some rows (or all rows) exactly zero."""

    @st.composite
    def build(draw):
        batch = draw(ordinary_batches(max_size=max_size))
        size = len(batch.labels)
        zero = np.asarray(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
        if draw(st.booleans()):
            zero[:] = True
        embeddings = np.where(zero[:, None], np.float32(0), batch.embeddings)
        return Batch(batch.labels, embeddings.astype(np.float32), "zero_vectors")

    return build()


def all_zero_batches(max_size: int = MAX_BATCH):
    """Every embedding the zero vector."""

    @st.composite
    def build(draw):
        batch = draw(ordinary_batches(max_size=max_size))
        return Batch(batch.labels, np.zeros_like(batch.embeddings), "all_zero")

    return build()


def mixed_batches(max_size: int = MAX_BATCH):
    """Several degeneracies at once: large ids, duplicates, zero and tiny rows, singletons."""

    @st.composite
    def build(draw):
        size = draw(st.integers(2, max_size))
        dim = draw(_DIMS)
        offset = draw(st.sampled_from([0, 255, 2047, 4095, 2**24 - 2]))
        labels = np.asarray(
            draw(st.lists(st.integers(0, 5), min_size=size, max_size=size)), np.int64
        ) + offset
        embeddings = draw(_embeddings(size, dim))
        kinds = draw(
            st.lists(
                st.sampled_from(["keep", "zero", "copy", "tiny", "huge"]),
                min_size=size,
                max_size=size,
            )
        )
        for i, what in enumerate(kinds):
            if what == "zero":
                embeddings[i] = 0.0
            elif what == "copy":
                embeddings[i] = embeddings[draw(st.integers(0, size - 1))]
            elif what == "tiny":
                embeddings[i] *= np.float32(1e-20)
            elif what == "huge":
                embeddings[i] *= np.float32(1e15)
        return Batch(labels.astype(np.int32), embeddings, "mixed")

    return build()


def no_triplet_batches(max_size: int = MAX_BATCH):
    """Batches in which no anchor has a triplet: one class only, or all singletons."""
    return st.one_of(one_class_batches(max_size), singleton_batches(max_size))


def nonfinite_batches(max_size: int = MAX_BATCH):
    """Ordinary or degenerate batches with NaN or +-Inf put into one entry, one row or all."""

    @st.composite
    def build(draw):
        batch = draw(st.one_of(ordinary_batches(min_size=1, max_size=max_size),
                               degenerate_batches(max_size)))
        x = batch.embeddings.copy()
        bad = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        where = draw(st.sampled_from(["entry", "row", "all"]))
        row = draw(st.integers(0, x.shape[0] - 1))
        if where == "entry":
            x[row, draw(st.integers(0, x.shape[1] - 1))] = bad
        elif where == "row":
            x[row] = bad
        else:
            x[:] = bad
        return Batch(batch.labels, x, f"{batch.kind}+{bad}@{where}")

    return build()


def degenerate_batches(max_size: int = MAX_BATCH):
    """Any of the degenerate kinds above, or an ordinary random batch."""
    return st.one_of(
        one_class_batches(max_size),
        singleton_batches(max_size),
        duplicate_embedding_batches(max_size),
        zero_vector_batches(max_size),
        all_zero_batches(max_size),
        large_id_batches(max_size),
        mixed_batches(max_size),
        ordinary_batches(max_size=max_size),
    )


def degenerate_examples() -> list[Batch]:
    """Hand-made degenerate batches, one per kind, for ``@example`` (guaranteed coverage:
    a few derandomized hypothesis examples do not reach every kind)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    pk = pk_labels(4, 2)
    zero_rows = x.copy()
    zero_rows[[0, 3]] = 0.0
    mixed = x.copy()
    mixed[0] = 0.0
    mixed[1] *= np.float32(1e-20)
    mixed[2] *= np.float32(1e15)
    mixed[5] = mixed[4]
    pairs = np.repeat(x[:4], 2, axis=0)  # every class: two identical rows
    return [
        Batch(np.full(6, 3, np.int32), x[:6], "one_class"),
        Batch(np.array([0, 256, 257, 2048, 2049, 4097], np.int32), x[:6], "singletons"),
        Batch(np.zeros(1, np.int32), x[:1], "single_sample"),
        Batch(np.array([5, 6], np.int32), x[:2], "two_singletons"),
        Batch(pk, np.repeat(x[:1], 8, axis=0), "all_rows_identical"),
        Batch(pk, pairs, "duplicate_positives"),
        Batch(pk, zero_rows, "zero_vectors"),
        Batch(pk, np.zeros_like(x), "all_zero"),
        Batch((pk.astype(np.int64) + 2**31 - 8).astype(np.int32), x, "large_ids"),
        Batch((pk + 2047).astype(np.int32), mixed, "mixed"),
    ]


def with_examples(examples, name="batch"):
    """Decorator: ``hypothesis.example(**{name: e})`` for every batch in ``examples``."""

    def decorate(fn):
        for batch in reversed(examples):
            fn = example(**{name: batch})(fn)
        return fn

    return decorate

