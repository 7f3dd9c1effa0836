"""SupCon, NT-Xent, the circle loss and the soft nearest neighbour loss against
tests/references.py.

Values and gradients are compared with the float64 loops of tests/references.py, the
gradients with central differences of the reference (Richardson-extrapolated, about 1e-11
relative), in float64 to 1e-9 and in float32 to about 1e-5. The circle loss's weights
``alpha_p``, ``alpha_n`` are constants in its gradient (Sun et al.'s code, as
pytorch-metric-learning): its reference gradient holds them fixed, and
``keras.losses.circle``, which differentiates through them, has the same values and other
gradients. The inputs are exactly representable in float32, so both dtypes share one
reference.

Every test also runs under JAX and PyTorch; under JAX on one configuration per loss, and
under ``jax.jit`` (eager JAX compiles every op once per shape).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    CAN_COMPILE,
    assert_close_grad,
    compiled,
    gradient_check,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
    value_and_grad_tensors,
)
from harness import assert_config_roundtrip, slow_beyond
from keras import ops

from tfdml.losses import (
    CircleLoss,
    NTXentLoss,
    SoftNearestNeighborLoss,
    SupConLoss,
    circle_loss,
    multiple_negatives_ranking_loss,
    ntxent_loss,
    soft_nearest_neighbor_loss,
    supcon_loss,
)
from tfdml.miners import AllPairsMiner

pytestmark = pytest.mark.multibackend

F64_RTOL = 1e-9
F32_RTOL = 1e-5


# -- the batch: B=10, D=6; classes of 4, 2, 2, 1 and 1 samples (non-contiguous ids) --------------

B, D = 10, 6
LABELS = np.array([4, 1, 4, 7, 1, 4, 9, 7, 4, 2], np.int32)  # 9 and 2: no positive


def _float32_exact(a):
    """float64 values that float32 represents exactly: one reference for both dtypes."""
    return np.asarray(a, np.float32).astype(np.float64)


X = _float32_exact(np.random.default_rng(11).normal(size=(B, D)))


@dataclass(frozen=True, eq=False)
class Case:
    """One loss: functional and class forms, reference, and two configurations.

    ``defaults`` are the loss's hyperparameters and ``average`` (spelled out, for the
    reference); ``variant`` overrides some of them (another temperature, average, and
    ``normalize=False``).
    """

    id: str
    functional: Callable
    cls: type
    reference_fn: Callable
    defaults: dict
    variant: dict

    def config(self, name):
        return {**self.defaults, **(self.variant if name == "variant" else {})}

    def reference(self, labels, x, config, alphas_at=None, **kwargs):
        """``(value, terms)`` of the reference. Circle: alphas held at ``alphas_at`` (default
        ``x``; with ``ref_embeddings`` at those)."""
        kwargs = {**config, **kwargs}
        if self.id == "circle":
            at = x if alphas_at is None else alphas_at
            kwargs["alphas"] = ref.circle_alphas(at, config["margin"], config["normalize"],
                                                 kwargs.get("ref_embeddings"))
        return self.reference_fn(labels, x, **kwargs)

    def make(self, config, **kwargs):
        return self.cls(**config, **kwargs)

    def __call__(self, labels, x, config, **kwargs):
        return self.functional(labels, x, **config, **kwargs)


CASES = [
    Case("supcon", supcon_loss, SupConLoss, ref.supcon_loss,
         dict(temperature=0.1, normalize=True, average="anchors"),
         dict(temperature=0.5, normalize=False, average="batch")),
    Case("ntxent", ntxent_loss, NTXentLoss, ref.ntxent_loss,
         dict(temperature=0.07, normalize=True, average="terms"),
         dict(temperature=0.3, normalize=False, average="anchors")),
    Case("circle", circle_loss, CircleLoss, ref.circle_loss,
         dict(margin=0.4, gamma=80.0, normalize=True, average="anchors"),
         dict(margin=0.25, gamma=32.0, normalize=False, average="batch")),
    # The variant's small temperature on unit vectors puts the logits at up to -80: the
    # exponentials of whole rows underflow in float32 without the log-sum-exp.
    Case("snn", soft_nearest_neighbor_loss, SoftNearestNeighborLoss,
         ref.soft_nearest_neighbor_loss,
         dict(temperature=1.0, distance="squared_l2", normalize=False, average="anchors"),
         dict(temperature=0.05, distance="l2", normalize=True, average="batch")),
]
BY_ID = {case.id: case for case in CASES}
IDS = list(BY_ID)
CONFIGS = ["default", pytest.param("variant", marks=pytest.mark.skipif(
    BACKEND == "jax", reason="JAX: one configuration (each compiles anew)"))]


def _inputs(config):
    """The embeddings for a configuration: scaled down without normalization."""
    return X if config["normalize"] else 0.5 * X


@functools.cache
def reference_value_and_grad(case_id, config_name):
    case = BY_ID[case_id]
    config = case.config(config_name)
    x = _inputs(config)
    value, terms = case.reference(LABELS, x, config)
    grad = reference_gradient(
        lambda e: case.reference(LABELS, e, config, alphas_at=x)[0], x)
    return value, terms, grad


def value_and_grads(fn, *args, argnums=1):
    """``fn(*args)`` and its gradient as NumPy: eager, or ``jax.jit`` under JAX."""
    if BACKEND == "jax":
        return to_numpy(value_and_grad_function(fn, argnums=argnums, jit_compile=True)(*args))
    return value_and_grad(fn, *args, argnums=argnums)


def _per_anchor(terms, average):
    """tfdml's ``reduction="none"`` values from the reference's terms (0: no terms)."""
    values = np.zeros(B)
    for a, value in ref.anchor_values(terms, average).items():
        values[a] = value
    return values


# -- 1. values and gradients against the reference ----------------------------------------------


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("case_id", IDS)
def test_float64_matches_reference(case_id, config_name, float64):
    case = BY_ID[case_id]
    config = case.config(config_name)
    value, grad = value_and_grads(lambda y, e: case(y, e, config), LABELS, _inputs(config))
    assert value.dtype == grad.dtype == np.float64
    want, terms, want_grad = reference_value_and_grad(case_id, config_name)
    assert 0 < len(terms) < B  # anchors 6 and 9 have no positive
    np.testing.assert_allclose(value, want, rtol=F64_RTOL)
    assert_close_grad(grad, want_grad, F64_RTOL)
    assert np.abs(grad).max() > 1e-3


# The variants in float32 (slow tier): their paths run in float64 on every commit
# (test_float64_matches_reference), the float32 rounding with the defaults.
@pytest.mark.parametrize("config_name", slow_beyond(CONFIGS, {"default"}))
@pytest.mark.parametrize("case_id", IDS)
def test_float32_matches_reference(case_id, config_name):
    case = BY_ID[case_id]
    config = case.config(config_name)
    x32 = _inputs(config).astype(np.float32)
    value, grad = value_and_grads(lambda y, e: case(y, e, config), LABELS, x32)
    assert value.dtype == grad.dtype == np.float32
    want, _, want_grad = reference_value_and_grad(case_id, config_name)
    np.testing.assert_allclose(value, want, rtol=F32_RTOL)
    assert_close_grad(grad, want_grad, F32_RTOL)


@pytest.mark.parametrize("case_id", IDS)
def test_reduction_none_is_the_reference_per_anchor(case_id):
    """``[B]``: each anchor's value (its mean, or for ``average="terms"`` its sum), 0 for
    anchors without terms."""
    case = BY_ID[case_id]
    config = case.config("default")
    loss = case.make(config, reduction="none")
    fn = compiled(lambda y, e: loss(y, e)) if BACKEND == "jax" else loss
    got = to_numpy(fn(LABELS, _inputs(config).astype(np.float32)))
    assert got.shape == (B,)
    _, terms, _ = reference_value_and_grad(case_id, "default")
    want = _per_anchor(terms, config["average"])
    np.testing.assert_allclose(got, want, rtol=F32_RTOL, atol=1e-6)
    assert got[6] == got[9] == 0.0


# -- 2. the gradient against central differences of tfdml itself ---------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_float64_gradient_check(case_id, float64):
    """SupCon and NT-Xent: the gradient is the derivative of the value. Circle: it is not
    (its weights are held constant); it is the derivative with the weights held."""
    case = BY_ID[case_id]
    config = case.config("default")
    labels, x = LABELS[:7], X[:7, :4]
    theoretical, numerical = gradient_check(lambda e: case(labels, e, config), x, delta=1e-6)
    assert np.abs(theoretical).max() > 1e-3
    if case_id != "circle":
        assert_close_grad(theoretical, numerical, 1e-6)
        return
    assert np.abs(theoretical - numerical).max() > 0.1 * np.abs(numerical).max()
    held = reference_gradient(lambda e: case.reference(labels, e, config, alphas_at=x)[0], x)
    assert_close_grad(theoretical, held, F64_RTOL)
    free = reference_gradient(lambda e: ref.circle_loss(labels, e, **config)[0], x)
    assert_close_grad(numerical, free, 1e-6)


# -- 3. the class form is the functional form --------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_class_form_equals_functional_form(case_id):
    case = BY_ID[case_id]
    config = case.config("default")
    x32 = X.astype(np.float32)
    loss = case.make(config)
    assert isinstance(loss.miner, AllPairsMiner) and loss.average == config["average"]
    got_value, got_grad = value_and_grads(lambda y, e: loss(y, e), LABELS, x32)
    want_value, want_grad = value_and_grads(lambda y, e: case(y, e, config), LABELS, x32)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    assert_close_grad(got_grad, want_grad, 1e-6)


# -- 4. degenerate batches ---------------------------------------------------------------------


def _degenerate_batches():
    """``{kind: (labels, x)}``, all ``[8, D]`` (one compiled program under JAX)."""
    x = X[:8].copy()
    pk = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)
    zeros = x.copy()
    zeros[[0, 3]] = 0.0
    return {
        "one_class": (np.full(8, 5, np.int32), x),
        "singletons": (np.arange(8, dtype=np.int32) * 3, x),
        "duplicate_positives": (pk, np.repeat(x[:4], 2, axis=0)),
        "all_identical": (pk, np.repeat(x[:1], 8, axis=0)),
        "zero_vectors": (pk, zeros),
        "all_zero": (pk, np.zeros_like(x)),
    }


@pytest.mark.parametrize("case_id", IDS)
def test_degenerate_batches(case_id):
    """Finite values and gradients, the reference's values. Without a positive pair
    (singletons) every loss is 0 with zero gradients; with one class only (no negative)
    too: SupCon and circle have no active anchor, and each NT-Xent pair and each soft
    nearest neighbour anchor is ``-log(e^s / e^s) = 0``. A zero embedding has similarity
    0 with every sample."""
    case = BY_ID[case_id]
    config = case.config("default")
    step = (value_and_grad_function(lambda y, e: case(y, e, config), argnums=1,
                                    jit_compile=True) if BACKEND == "jax" else None)
    for kind, (labels, x) in _degenerate_batches().items():
        x32 = x.astype(np.float32)
        if step is None:
            value, grad = value_and_grad(lambda y, e: case(y, e, config), labels, x32,
                                         argnums=1)
        else:
            value, grad = to_numpy(step(labels, x32))
        assert np.isfinite(value) and np.all(np.isfinite(grad)), kind
        want, _ = case.reference(labels, x, config)
        np.testing.assert_allclose(value, want, rtol=F32_RTOL, atol=1e-5, err_msg=kind)
        if kind in ("one_class", "singletons"):
            assert value == 0.0, kind
            np.testing.assert_array_equal(grad, 0.0, err_msg=kind)


@pytest.mark.parametrize("case_id", IDS)
def test_warns_when_no_anchor_is_active(case_id):
    loss = BY_ID[case_id].make(BY_ID[case_id].config("default"))
    with pytest.warns(UserWarning, match="no anchor"):
        value = loss(np.arange(4, dtype=np.int32), X[:4].astype(np.float32))
    assert to_numpy(value) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per loss
        loss(np.arange(4, dtype=np.int32), X[:4].astype(np.float32))


# -- 5. NaN and Inf --------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_nan_or_inf_gives_nan(case_id):
    case = BY_ID[case_id]
    config = case.config("default")

    def with_ref(y, e, r):
        return case(y, e, config, ref_embeddings=r, ref_labels=LABELS, ref_offset=0)

    loss = case.make(config)
    fns = [with_ref, lambda y, e, r: loss(y, e)]
    if BACKEND == "jax":
        fns = [compiled(fn) for fn in fns]
    x32 = X.astype(np.float32)
    for fn in fns:
        assert np.isfinite(to_numpy(fn(LABELS, x32, x32)))
    for bad in (np.nan, np.inf, -np.inf):
        x_bad = x32.copy()
        x_bad[6, 2] = bad  # an anchor without a positive: never mined
        for fn in fns:
            assert np.isnan(to_numpy(fn(LABELS, x_bad, x32))), f"{bad} in y_pred"
        assert np.isnan(to_numpy(fns[0](LABELS, x32, x_bad))), f"{bad} in ref_embeddings"


# -- 6. invalid arguments ----------------------------------------------------------------------

BAD_ARGUMENTS = [
    ("supcon", dict(temperature=-0.1), "temperature"),
    ("supcon", dict(temperature=0.0), "temperature"),
    ("ntxent", dict(temperature=-1.0), "temperature"),
    ("ntxent", dict(temperature=float("inf")), "temperature"),
    ("circle", dict(gamma=-80.0), "gamma"),
    ("circle", dict(gamma=0.0), "gamma"),
    ("circle", dict(margin=-0.4), "margin"),
    ("supcon", dict(average="pairs"), "average"),
    ("ntxent", dict(miner="hard"), "miner"),
    ("circle", dict(reduction="median"), "reduction"),
    ("snn", dict(temperature=0.0), "temperature"),
    ("snn", dict(distance="manhattan"), "distance"),
    ("snn", dict(average="pairs"), "average"),
]


@pytest.mark.parametrize("case_id,kwargs,match", BAD_ARGUMENTS)
def test_invalid_arguments(case_id, kwargs, match):
    case = BY_ID[case_id]
    with pytest.raises(ValueError, match=match):
        case.cls(**kwargs)
    if "reduction" not in kwargs:
        with pytest.raises(ValueError, match=match):
            case.functional(LABELS, X, **kwargs)


@pytest.mark.parametrize("case_id", IDS)
def test_invalid_reference_sets(case_id):
    fn = BY_ID[case_id].functional
    with pytest.raises(ValueError, match="ref_labels"):
        fn(LABELS, X, ref_labels=LABELS)
    with pytest.raises(ValueError, match="ref_embeddings"):
        fn(LABELS, X, ref_embeddings=X)
    with pytest.raises(ValueError, match="ref_offset"):
        fn(LABELS, X, ref_embeddings=X[:8], ref_labels=LABELS[:8], ref_offset=0)
    with pytest.raises(ValueError, match="ref_embeddings"):
        fn(LABELS, X, ref_embeddings=X[:, :4], ref_labels=LABELS, ref_offset=0)


# -- 7. config ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_config_roundtrip(case_id):
    case = BY_ID[case_id]
    config = case.config("variant")
    clone = assert_config_roundtrip(case.make(config, reduction="sum"))
    for key, value in config.items():
        assert getattr(clone, key) == value
    assert clone.reduction == "sum" and isinstance(clone.miner, AllPairsMiner)


# -- 8. compiled ----------------------------------------------------------------------------


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Values and gradients of the three losses (functional and class form, per anchor
    too) under XLA, in one compiled program: the eager ones; NaN embeddings give NaN."""
    x32 = X.astype(np.float32)
    losses = {case.id: case.make(case.config("default")) for case in CASES}
    per_anchor = {case.id: case.make(case.config("default"), reduction="none")
                  for case in CASES}

    def everything(labels, x):
        out = {}
        for case in CASES:
            out[case.id] = value_and_grad_tensors(
                lambda e, c=case: c(labels, e, c.config("default")), x)
            out[case.id + "/class"] = losses[case.id](labels, x)
            out[case.id + "/none"] = per_anchor[case.id](labels, x)
        return out

    eager = to_numpy(everything(ops.convert_to_tensor(LABELS), ops.convert_to_tensor(x32)))
    step = compiled(everything)
    got = to_numpy(step(LABELS, x32))
    for case in CASES:
        value, grad = got[case.id]
        np.testing.assert_allclose(value, eager[case.id][0], rtol=1e-5, err_msg=case.id)
        assert_close_grad(grad, eager[case.id][1], 1e-5)
        for key in (case.id + "/class", case.id + "/none"):
            np.testing.assert_allclose(got[key], eager[key], rtol=1e-5, atol=1e-6,
                                       err_msg=key)
    broken = to_numpy(step(LABELS, np.full_like(x32, np.nan)))
    for case in CASES:
        assert np.isnan(broken[case.id][0]) and np.isnan(broken[case.id + "/class"])


# -- 9. reference sets -------------------------------------------------------------------------

EXTRA_LABELS = np.array([7, 9, 3, 4], np.int32)  # gives anchor 6 (class 9) a positive
EXTRA = _float32_exact(np.random.default_rng(12).normal(size=(4, D)))
REF_B = 6  # anchors: the first 6 rows of the batch


@pytest.mark.parametrize("case_id", IDS)
def test_reference_set_is_the_concatenation(case_id, float64):
    """``ref_embeddings = [batch; extra]``, ``ref_offset=0``: the reference loss computed on
    the concatenation as one batch, with only the batch rows as anchors. The gradients
    w.r.t. ``y_pred`` and the batch rows of ``ref_embeddings`` add up to the derivative
    w.r.t. those rows of the concatenation."""
    case = BY_ID[case_id]
    config = case.config("default")
    labels, x = np.concatenate([LABELS[:REF_B], EXTRA_LABELS]), np.concatenate([X[:REF_B], EXTRA])
    batch_labels = labels[:REF_B]

    def fn(y, e, r):
        return case(y, e, config, ref_embeddings=r, ref_labels=labels, ref_offset=0)

    value, (grad_x, grad_ref) = value_and_grads(fn, batch_labels, x[:REF_B], x, argnums=(1, 2))

    def restricted(z):
        _, terms = case.reference(labels, z, config, alphas_at=x)
        anchors = {a: t for a, t in terms.items() if a < REF_B}
        return ref.average_terms(anchors, config["average"], REF_B)

    want_grad = reference_gradient(restricted, x)
    np.testing.assert_allclose(value, restricted(x), rtol=F64_RTOL)
    combined = grad_ref.copy()
    combined[:REF_B] += grad_x
    assert_close_grad(combined, want_grad, F64_RTOL)
    # Without ref_offset the anchors are outside the reference set: nothing is excluded.
    outside = to_numpy(case(batch_labels, x[:REF_B], config, ref_embeddings=EXTRA,
                            ref_labels=EXTRA_LABELS))
    want, _ = case.reference(batch_labels, x[:REF_B], config, ref_embeddings=EXTRA,
                             ref_labels=EXTRA_LABELS, ref_offset=None)
    np.testing.assert_allclose(outside, want, rtol=F64_RTOL)


# -- 10. against keras.losses.circle -----------------------------------------------------------


def test_circle_matches_keras_values_not_gradients(float64):
    """``keras.losses.circle`` on L2-normalized embeddings gives the per-anchor values of
    ``CircleLoss(reduction="none")`` for anchors with a positive and a negative (and 0 for
    the others), but differentiates through ``alpha_p`` and ``alpha_n``: its gradient is
    the derivative of the reference with the weights free, tfdml's with them held.
    Gradients are compared without tfdml's normalization (``normalize=False`` on unit
    inputs), so that the weights are the only difference."""
    unit = ref.l2_normalize(X)
    kwargs = dict(margin=0.4, gamma=80.0)

    def keras_circle(y, e):
        return keras.losses.circle(y, e, **kwargs)

    def tfdml_circle(y, e):
        return CircleLoss(**kwargs, normalize=False, reduction="none", dtype="float64")(y, e)

    keras_values = to_numpy(keras_circle(LABELS, unit))
    # Keras under PyTorch computes this in float32 (keras.ops.maximum(float64, 0.0) is
    # float32 there): compare at float32 precision.
    keras_rtol = 1e-12 if keras_values.dtype == np.float64 else 1e-5
    normalized = CircleLoss(**kwargs, reduction="none", dtype="float64")
    tfdml_values = to_numpy(normalized(LABELS, unit))
    _, terms = ref.circle_loss(LABELS, unit, **kwargs)
    active = sorted(terms)
    assert len(active) == 8
    np.testing.assert_allclose(tfdml_values[active], keras_values[active], rtol=keras_rtol)
    np.testing.assert_allclose(keras_values[[6, 9]], 0.0)
    np.testing.assert_allclose(tfdml_values, _per_anchor(terms, "anchors"), rtol=1e-12)
    # keras.losses.Circle's "sum_over_batch_size" leaves out the anchors of loss 0 (its
    # Keras mask): here the same mean over the active anchors as tfdml's default.
    np.testing.assert_allclose(
        to_numpy(keras.losses.Circle(**kwargs, dtype="float64")(LABELS, unit)),
        to_numpy(CircleLoss(**kwargs, dtype="float64")(LABELS, unit)), rtol=keras_rtol)

    # Gradients on a batch where every anchor has both (Keras' -inf rows would give NaN).
    labels = np.array([0, 0, 1, 1, 1, 2, 2, 0], np.int32)
    x = unit[:8]
    _, keras_grad = value_and_grads(keras_circle, labels, x)
    _, tfdml_grad = value_and_grads(tfdml_circle, labels, x)
    assert np.abs(keras_grad - tfdml_grad).max() > 0.1 * np.abs(tfdml_grad).max()

    def total(e, held):
        _, terms = ref.circle_loss(labels, e, **kwargs, normalize=False,
                                   alphas=ref.circle_alphas(x, 0.4, False) if held else None)
        return sum(t[0] for t in terms.values())

    assert_close_grad(tfdml_grad, reference_gradient(lambda e: total(e, True), x), 1e-8)
    assert_close_grad(keras_grad, reference_gradient(lambda e: total(e, False), x),
                      max(1e-8, 10 * keras_rtol))


# -- 11. multiple negatives ranking (query/key pairs) ------------------------------------------


def _mnr_reference(q, k, scale, normalize, add_one):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if normalize:
        q, k = ref.l2_normalize(q), ref.l2_normalize(k)
    s = scale * q @ k.T
    rows = [ref.logsumexp(list(s[i]) + ([0.0] if add_one else [])) - s[i, i]
            for i in range(len(s))]
    return float(np.mean(rows))


# Each of normalize and add_one on and off on every commit; both on in the slow tier.
@pytest.mark.parametrize("scale,normalize,add_one", slow_beyond([
    pytest.param(20.0, False, False, id="20.0-False-False", marks=pytest.mark.multibackend),
    pytest.param(20.0, False, True, id="20.0-False-True"),
    pytest.param(5.0, True, False, id="5.0-True-False"),
    pytest.param(50.0, True, True, id="50.0-True-True")],
    {"20.0-False-False", "20.0-False-True", "5.0-True-False"}))
def test_multiple_negatives_ranking_matches_reference(scale, normalize, add_one, float64):
    q, k = X[:8], _float32_exact(np.random.default_rng(13).normal(size=(8, D)))

    def fn(a, b):
        return multiple_negatives_ranking_loss(a, b, scale, normalize, add_one)

    value, (grad_q, grad_k) = value_and_grad(fn, q, k, argnums=(0, 1))
    np.testing.assert_allclose(value, _mnr_reference(q, k, scale, normalize, add_one),
                               rtol=F64_RTOL)
    want_q = reference_gradient(lambda e: _mnr_reference(e, k, scale, normalize, add_one), q)
    want_k = reference_gradient(lambda e: _mnr_reference(q, e, scale, normalize, add_one), k)
    assert_close_grad(grad_q, want_q, 1e-7)
    assert_close_grad(grad_k, want_k, 1e-7)
    value32 = to_numpy(fn(q.astype(np.float32), k.astype(np.float32)))
    assert value32.dtype == np.float32
    np.testing.assert_allclose(value32, value, rtol=F32_RTOL)


def test_multiple_negatives_ranking_nan_and_errors():
    q, k = X[:6].astype(np.float32), X[4:].astype(np.float32)
    for bad in (np.nan, np.inf):
        for which in (0, 1):
            args = [q.copy(), k.copy()]
            args[which][2, 1] = bad
            assert np.isnan(to_numpy(multiple_negatives_ranking_loss(*args)))
    # Far apart at a large scale: finite (log-sum-exp).
    assert np.isfinite(to_numpy(multiple_negatives_ranking_loss(100.0 * q, k, scale=50.0)))
    with pytest.raises(ValueError, match="scale"):
        multiple_negatives_ranking_loss(q, k, scale=0.0)
    with pytest.raises(ValueError, match="key_embeddings"):
        multiple_negatives_ranking_loss(q, k[:5])
    with pytest.raises(ValueError, match="query_embeddings"):
        multiple_negatives_ranking_loss(q[0], k)


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_multiple_negatives_ranking_compiled_equals_eager():
    q, k = X[:6].astype(np.float32), X[4:].astype(np.float32)
    eager = value_and_grad(multiple_negatives_ranking_loss, q, k, argnums=(0, 1))
    got = to_numpy(value_and_grad_function(multiple_negatives_ranking_loss, argnums=(0, 1),
                                           jit_compile=True)(q, k))
    np.testing.assert_allclose(got[0], eager[0], rtol=1e-6)
    for a, b in zip(got[1], eager[1], strict=True):
        assert_close_grad(a, b, 1e-5)
