"""Labels and sample weights that cannot be right: an error that names them, or a NaN loss.

A catalogue, under every backend. Where the values can be read (eagerly, PyTorch's
``fit``, ``MetricModel.fit`` on arrays) the input raises a ValueError naming the argument;
inside a compiled step (XLA, ``jax.jit``), where nothing can raise, the loss is NaN so that
``keras.callbacks.TerminateOnNaN`` stops training, and its gradient is 0 (never NaN);
valid inputs keep their value and gradient.

* class ids outside ``[0, C)`` for the seven losses with class vectors, functional and
  class forms; a ``tf.function`` graph without XLA also fails an assertion;
* a proxy loss compiled into a plain ``keras.Model``: a ValueError naming ``MetricModel``;
* string labels, and (JAX without 64-bit mode) ids beyond int32 in ``MetricModel.fit``;
* negative, NaN sample weights.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from backends import BACKEND, CAN_COMPILE, compiled, to_numpy, traced, value_and_grad_tensors
from harness import small_embedding_model
from keras import ops

from tfdml.losses import (
    ArcFaceLoss,
    ProxyAnchorLoss,
    TripletMarginLoss,
    arcface_loss,
    cosface_loss,
    normalized_softmax_loss,
    proxy_anchor_loss,
    proxy_nca_loss,
    soft_triple_loss,
    subcenter_arcface_loss,
)
from tfdml.models import MetricModel

pytestmark = pytest.mark.multibackend

B, D, C, K = 8, 3, 4, 2
_RNG = np.random.default_rng(3)
X = _RNG.normal(size=(B, D)).astype(np.float32)
W2 = _RNG.normal(size=(C, D)).astype(np.float32)
W3 = _RNG.normal(size=(C, K, D)).astype(np.float32)
LABELS = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)
INPUTS = _RNG.normal(size=(2 * B, 6)).astype(np.float32)  # two batches for fit


def _tensors(*arrays):
    return [ops.convert_to_tensor(a) for a in arrays]


def _with_id(bad_id):
    labels = LABELS.copy()
    labels[3] = bad_id
    return labels


#: Out-of-range ids: C, far above, negative, and a whole batch above (6..9 with C = 4).
BAD_IDS = {"C": _with_id(C), "1000": _with_id(1000), "-1": _with_id(-1),
           "all_above": LABELS + 6}

#: The functional forms: ``fn(labels, x)`` with fixed class vectors.
FUNCTIONAL = {
    "normalized_softmax": lambda y, x: normalized_softmax_loss(y, x, W2),
    "cosface": lambda y, x: cosface_loss(y, x, W2),
    "arcface": lambda y, x: arcface_loss(y, x, W2),
    "subcenter_arcface": lambda y, x: subcenter_arcface_loss(y, x, W3),
    "soft_triple": lambda y, x: soft_triple_loss(y, x, W3),
    "proxy_nca": lambda y, x: proxy_nca_loss(y, x, W2),
    "proxy_anchor": lambda y, x: proxy_anchor_loss(y, x, W2),
}


def _class_losses():
    """ArcFace (per-sample terms) and Proxy Anchor (its own reduction), built."""
    losses = {"arcface/class": ArcFaceLoss(num_classes=C),
              "proxy_anchor/class": ProxyAnchorLoss(num_classes=C)}
    for loss in losses.values():
        loss.build_state(D)
        loss.class_vectors.assign(W2)
    return losses


def _fit(model, y, sample_weight=None, epochs=3):
    """Two batches per epoch; TerminateOnNaN stops at the first NaN loss."""
    return model.fit(INPUTS, y, sample_weight=sample_weight, batch_size=B, epochs=epochs,
                     shuffle=False, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])


def _metric_model(loss):
    model = MetricModel(small_embedding_model(embed_dim=D), loss)
    model.compile(optimizer=keras.optimizers.Adam(0.01), jit_compile=CAN_COMPILE)
    return model


def _assert_stopped_on_nan(history, model):
    losses = history.history["loss"]
    assert len(losses) == 1 and np.isnan(losses[0]), losses
    for v in model.trainable_variables:  # the NaN step's gradient is 0, not NaN
        assert np.all(np.isfinite(to_numpy(v))), v.name


# -- 1. class ids outside [0, C) ---------------------------------------------------------------


@pytest.mark.parametrize("name", list(FUNCTIONAL))
def test_class_ids_out_of_range_raise_eagerly(name):
    for labels in BAD_IDS.values():
        with pytest.raises(ValueError, match=r"Class ids \(y_true\).*Received ids"):
            FUNCTIONAL[name](labels, X)
    if name in ("arcface", "proxy_anchor"):
        loss = _class_losses()[f"{name}/class"]
        for labels in BAD_IDS.values():
            with pytest.raises(ValueError, match=r"Class ids \(y_true\)"):
                loss(labels, X)


@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_class_ids_out_of_range_give_nan_when_compiled():
    """One compiled program: every functional form and two class forms, value and gradient
    w.r.t. the embeddings. Valid ids: the eager values, finite gradients; out-of-range ids:
    NaN values and zero gradients. PyTorch runs it eagerly: a ValueError."""
    classes = _class_losses()
    fns = {**FUNCTIONAL, **classes}

    def everything(labels, x):
        return {name: value_and_grad_tensors(fn, labels, x, argnums=1)
                for name, fn in fns.items()}

    eager = to_numpy(everything(*_tensors(LABELS, X)))
    step = compiled(everything)
    got = to_numpy(step(*_tensors(LABELS, X)))
    for name, (value, grad) in got.items():
        np.testing.assert_allclose(value, eager[name][0], rtol=1e-5, err_msg=name)
        assert np.all(np.isfinite(grad)) and np.any(grad != 0), name
    for kind, labels in BAD_IDS.items():
        if not CAN_COMPILE:
            with pytest.raises(ValueError, match=r"Class ids \(y_true\)"):
                step(*_tensors(labels, X))
            continue
        bad = to_numpy(step(*_tensors(labels, X)))
        for name, (value, grad) in bad.items():
            assert np.isnan(value), (kind, name, value)
            np.testing.assert_array_equal(grad, 0.0, err_msg=f"{kind} {name}")
    if BACKEND == "tensorflow":  # a graph without XLA evaluates the assertion
        import tensorflow as tf

        graph = traced(lambda labels, x: {n: fn(labels, x) for n, fn in fns.items()})
        assert np.isfinite(to_numpy(graph(LABELS, X))["arcface"])
        with pytest.raises(tf.errors.InvalidArgumentError, match="Class ids"):
            graph(BAD_IDS["1000"], X)


def test_class_ids_out_of_range_in_fit():
    """ArcFace(num_classes=4) trained on ids 6..9: labels given as arrays are refused before
    the first step, naming them and num_classes; inside a dataset they reach the loss, and a
    NaN loss stops a compiled fit (TF XLA, jax.jit) while PyTorch's eager fit raises."""
    model = _metric_model(ArcFaceLoss(num_classes=C))
    y = np.concatenate([BAD_IDS["all_above"], LABELS])
    with pytest.raises(ValueError, match=r"`y` holds class ids from 0 to 9.*num_classes=4"):
        _fit(model, y)
    with pytest.raises(ValueError, match=r"validation_data\[1\]"):
        model.fit(INPUTS, np.tile(LABELS, 2), batch_size=B, epochs=1, verbose=0,
                  validation_data=(INPUTS, y))

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return INPUTS[i * B:(i + 1) * B], y[i * B:(i + 1) * B]

    if not CAN_COMPILE:
        with pytest.raises(ValueError, match=r"Class ids \(y_true\)"):
            model.fit(Batches(), epochs=3, verbose=0)
        return
    _assert_stopped_on_nan(model.fit(Batches(), epochs=3, verbose=0, shuffle=False,
                                     callbacks=[keras.callbacks.TerminateOnNaN()]), model)


# -- 2. a proxy loss in a plain model -----------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: ArcFaceLoss(num_classes=C),
                                  lambda: ProxyAnchorLoss(num_classes=C)],
                         ids=["arcface", "proxy_anchor"])
def test_proxy_loss_in_a_plain_model_names_metric_model(make):
    model = small_embedding_model(embed_dim=D)
    model.compile(optimizer="adam", loss=make(), jit_compile=False)
    for _ in range(2):  # and again: no silent second try
        with pytest.raises(ValueError, match="MetricModel"):
            model.fit(INPUTS, np.tile(LABELS, 2), batch_size=B, epochs=1, verbose=0)


# -- 3. labels Keras would convert first --------------------------------------------------------


def test_string_labels_name_the_labels():
    names = np.array(["cat", "dog"] * B)
    model = MetricModel(small_embedding_model(embed_dim=D), TripletMarginLoss())
    model.compile(optimizer="adam")
    hint = r"not strings.*np\.unique"
    with pytest.raises(ValueError, match=r"`y` must be integer class ids.*" + hint):
        model.fit(INPUTS, names, batch_size=B, verbose=0)
    with pytest.raises(ValueError, match=r"`y`.*" + hint):
        model.fit(INPUTS, list(names), batch_size=B, verbose=0)
    with pytest.raises(ValueError, match=r"`y`.*" + hint):
        model.evaluate(INPUTS, names, batch_size=B, verbose=0)
    with pytest.raises(ValueError, match=r"`validation_data\[1\]`.*" + hint):
        model.fit(INPUTS, np.tile(LABELS, 2), batch_size=B, verbose=0,
                  validation_data=(INPUTS, names))
    with pytest.raises(ValueError, match=r"`y_true`.*" + hint):
        TripletMarginLoss()(names[:B], X)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data string tensors")
def test_string_labels_in_a_dataset_name_y_true():
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((INPUTS, np.array(["cat", "dog"] * B))).batch(B)
    model = MetricModel(small_embedding_model(embed_dim=D), TripletMarginLoss())
    model.compile(optimizer="adam", jit_compile=False)
    with pytest.raises(ValueError, match=r"`y_true` must be integer class ids.*np\.unique"):
        model.fit(data, verbose=0, shuffle=False)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX without 64-bit mode only")
def test_jax_int64_ids_beyond_int32_raise_in_fit():
    import jax

    assert not jax.config.jax_enable_x64
    y = np.tile(np.array([0, 2**32], np.int64), B)  # one class under int32
    model = MetricModel(small_embedding_model(embed_dim=D), TripletMarginLoss())
    model.compile(optimizer="adam")
    with pytest.raises(ValueError, match=r"`y` holds class ids beyond int32.*jax_enable_x64"):
        model.fit(INPUTS, y, batch_size=B, verbose=0)
    with pytest.raises(ValueError, match=r"`y` holds class ids beyond int32"):
        model.evaluate(INPUTS, y, batch_size=B, verbose=0)
    with pytest.raises(ValueError, match=r"`y_true` holds class ids beyond int32"):
        TripletMarginLoss()(y[:B], X)


# -- 4. sample weights ----------------------------------------------------------------------------


def _weighted_losses():
    return {"triplet": TripletMarginLoss(), **_class_losses()}


def test_negative_sample_weight_raises_eagerly_and_nan_weight_gives_nan():
    for name, loss in _weighted_losses().items():
        for weight in (-1.0, np.array([1, 1, 1, -0.5, 1, 1, 1, 1], np.float32)):
            with pytest.raises(ValueError, match="`sample_weight` must be >= 0.*Received"):
                loss(LABELS, X, sample_weight=weight)
        nan = np.array([1, 1, np.nan, 1, 1, 1, 1, 1], np.float32)
        assert np.isnan(to_numpy(loss(LABELS, X, sample_weight=nan))), name
        assert np.isfinite(to_numpy(loss(LABELS, X, sample_weight=np.zeros(B, "float32"))))


@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_negative_or_nan_sample_weight_gives_nan_when_compiled():
    losses = _weighted_losses()

    def everything(labels, x, weight):
        return {name: value_and_grad_tensors(lambda e, loss=loss: loss(labels, e, weight), x)
                for name, loss in losses.items()}

    ones = np.linspace(0.5, 1.5, B).astype(np.float32)
    eager = to_numpy(everything(*_tensors(LABELS, X, ones)))
    step = compiled(everything)
    for name, (value, grad) in to_numpy(step(*_tensors(LABELS, X, ones))).items():
        np.testing.assert_allclose(value, eager[name][0], rtol=1e-5, err_msg=name)
        assert np.all(np.isfinite(grad)) and np.any(grad != 0), name
    negative = ones.copy()
    negative[2] = -1.0
    nan = ones.copy()
    nan[5] = np.nan
    for weight in (negative, nan) if CAN_COMPILE else (nan,):
        for name, (value, grad) in to_numpy(step(*_tensors(LABELS, X, weight))).items():
            assert np.isnan(value), (name, weight)
            if weight is negative:  # the step's gradient is 0, not NaN
                np.testing.assert_array_equal(grad, 0.0, err_msg=name)
    if not CAN_COMPILE:
        with pytest.raises(ValueError, match="`sample_weight`"):
            step(*_tensors(LABELS, X, negative))
    if BACKEND == "tensorflow":  # a graph without XLA: NaN as well
        graph = traced(lambda labels, x, w: losses["triplet"](labels, x, w))
        assert np.isnan(to_numpy(graph(LABELS, X, negative)))


def test_negative_sample_weight_in_fit():
    model = _metric_model(TripletMarginLoss())
    weight = -np.ones(2 * B, np.float32)
    if not CAN_COMPILE:
        with pytest.raises(ValueError, match="`sample_weight`"):
            _fit(model, np.tile(LABELS, 2), sample_weight=weight)
        return
    _assert_stopped_on_nan(_fit(model, np.tile(LABELS, 2), sample_weight=weight), model)

