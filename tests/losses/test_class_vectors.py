"""The losses with class vectors (tfdml.losses.class_vectors) against tests/references.py.

The ten losses with learned class vectors (proxies, class weights, sub-centres,
SoftTriple centres): normalized softmax, CosFace, ArcFace, sub-centre ArcFace, SoftTriple,
P2SGrad, large-margin softmax, SphereFace, Proxy-NCA and Proxy Anchor. Values and gradients (w.r.t. the embeddings and the class
vectors) are compared with the float64 loops of tests/references.py, the gradients with
central differences of the reference (Richardson-extrapolated, about 1e-11 relative), in
float64 to 1e-9 and in float32 to about 1e-5. The inputs are exactly representable in
float32, so both dtypes share one reference.

The tests specific to one family are in tests/losses/test_proxies.py and
tests/losses/test_classification.py, on the data and cases defined here. Every test also runs
under JAX and PyTorch. Under JAX the losses run under ``jax.jit``
(eager JAX compiles every op once per shape).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

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
    ArcFaceLoss,
    CosFaceLoss,
    LargeMarginSoftmaxLoss,
    NormalizedSoftmaxLoss,
    P2SGradLoss,
    ProxyAnchorLoss,
    ProxyNCALoss,
    SoftTripleLoss,
    SphereFaceLoss,
    SubCenterArcFaceLoss,
    arcface_loss,
    cosface_loss,
    large_margin_softmax_loss,
    normalized_softmax_loss,
    p2s_grad_loss,
    proxy_anchor_loss,
    proxy_nca_loss,
    soft_triple_loss,
    sphereface_loss,
    subcenter_arcface_loss,
)

pytestmark = pytest.mark.multibackend

F64_RTOL = 1e-9
F32_RTOL = 1e-5


# -- the batch: B=9, D=5, C=7 (classes 4 and 6 absent), k=2 ---------------------------------------

B, D, C, K = 9, 5, 7, 2
LABELS = np.array([0, 2, 2, 5, 1, 2, 0, 5, 3], np.int32)  # counts 2, 1, 3, 1, 0, 2, 0


def _float32_exact(a):
    """float64 values that float32 represents exactly: one reference for both dtypes."""
    return np.asarray(a, np.float32).astype(np.float64)


def _make_inputs():
    rng = np.random.default_rng(7)
    w2 = rng.normal(size=(C, D))
    w3 = w2[:, None, :] + 0.25 * rng.normal(size=(C, K, D))  # sub-centres around w2
    x = rng.normal(size=(B, D))
    # Sample 4 (class 1) points away from its class: theta_y > pi - m, ArcFace's other branch.
    x[4] = -w2[1] + 0.05 * rng.normal(size=D)
    return _float32_exact(x), _float32_exact(w2), _float32_exact(w3)


X, W2, W3 = _make_inputs()


@dataclass(frozen=True, eq=False)
class Case:
    """One loss: its functional and class forms, its reference and hyperparameters.

    ``kwargs`` go to both forms and to the reference; ``class_kwargs`` to the class only;
    ``vectors_name`` is the functional form's name for the class vectors.
    """

    id: str
    functional: Callable
    cls: type
    reference: Callable
    rank: int
    vectors_name: str
    kwargs: dict = field(default_factory=dict)
    class_kwargs: dict = field(default_factory=dict)
    per_sample: bool = True  # Proxy Anchor is a sum over proxies

    @property
    def weights(self):
        return W2 if self.rank == 2 else W3

    def make(self, **kwargs):
        loss = self.cls(num_classes=C, **self.kwargs, **self.class_kwargs, **kwargs)
        loss.build_state(D)
        return loss

    def ref_value(self, labels, x, w, **kwargs):
        out = self.reference(labels, x, w, **self.kwargs, **kwargs)
        return out[0] if self.per_sample else out

    def ref_per_sample(self, labels, x, w):
        return self.reference(labels, x, w, **self.kwargs)[1]

    def __call__(self, labels, x, w):
        return self.functional(labels, x, w, **self.kwargs)


CASES = [
    Case("normalized_softmax", normalized_softmax_loss, NormalizedSoftmaxLoss,
         ref.normalized_softmax_loss, 2, "weights", dict(temperature=0.1)),
    Case("cosface", cosface_loss, CosFaceLoss, ref.cosface_loss, 2, "weights"),
    Case("arcface", arcface_loss, ArcFaceLoss, ref.arcface_loss, 2, "weights"),
    Case("subcenter_arcface", subcenter_arcface_loss, SubCenterArcFaceLoss,
         ref.subcenter_arcface_loss, 3, "weights", dict(margin=0.4, scale=30.0),
         dict(sub_centers=K)),
    Case("soft_triple", soft_triple_loss, SoftTripleLoss, ref.soft_triple_loss, 3, "centers",
         class_kwargs=dict(centers_per_class=K)),
    Case("proxy_nca", proxy_nca_loss, ProxyNCALoss, ref.proxy_nca_loss, 2, "proxies",
         dict(scale=3.0)),
    Case("proxy_anchor", proxy_anchor_loss, ProxyAnchorLoss, ref.proxy_anchor_loss, 2,
         "proxies", per_sample=False),
    Case("p2s_grad", p2s_grad_loss, P2SGradLoss, ref.p2s_grad_loss, 2, "weights"),
    Case("large_margin_softmax", large_margin_softmax_loss, LargeMarginSoftmaxLoss,
         ref.large_margin_softmax_loss, 2, "weights", dict(margin=3, scale=0.5)),
    Case("sphereface", sphereface_loss, SphereFaceLoss, ref.sphereface_loss, 2, "weights"),
]
BY_ID = {case.id: case for case in CASES}
IDS = [case.id for case in CASES]
PER_SAMPLE_IDS = [case.id for case in CASES if case.per_sample]


@functools.cache
def reference_value_and_grads(case_id):
    """``(value, d value / d X, d value / d W)`` of the case's reference at ``X``, ``W``."""
    case = BY_ID[case_id]
    w = case.weights
    value = case.ref_value(LABELS, X, w)
    grad_x = reference_gradient(lambda e: case.ref_value(LABELS, e, w), X)
    grad_w = reference_gradient(lambda v: case.ref_value(LABELS, X, v), w)
    return value, grad_x, grad_w


def value_and_grads(fn, *args, argnums=(1, 2)):
    """``fn(*args)`` and its gradients as NumPy: eager, or ``jax.jit`` under JAX."""
    if BACKEND == "jax":
        return to_numpy(value_and_grad_function(fn, argnums=argnums, jit_compile=True)(*args))
    return value_and_grad(fn, *args, argnums=argnums)


def _class_form(loss):
    """``loss(y, e)``, under ``jax.jit`` under JAX (traced anew: it reads the weights' value)."""
    return compiled(lambda y, e: loss(y, e)) if BACKEND == "jax" else loss


# -- 1. values and gradients against the reference ----------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_float64_matches_reference(case_id, float64):
    case = BY_ID[case_id]
    value, (grad_x, grad_w) = value_and_grads(case, LABELS, X, case.weights)
    assert value.dtype == grad_x.dtype == grad_w.dtype == np.float64
    want, want_x, want_w = reference_value_and_grads(case_id)
    np.testing.assert_allclose(value, want, rtol=F64_RTOL)
    assert_close_grad(grad_x, want_x, F64_RTOL)
    assert_close_grad(grad_w, want_w, F64_RTOL)
    assert np.abs(grad_x).max() > 1e-3 and np.abs(grad_w).max() > 1e-3


@pytest.mark.parametrize("case_id", IDS)
def test_float32_matches_reference(case_id):
    case = BY_ID[case_id]
    w32 = case.weights.astype(np.float32)
    value, (grad_x, grad_w) = value_and_grads(case, LABELS, X.astype(np.float32), w32)
    assert value.dtype == grad_x.dtype == np.float32
    want, want_x, want_w = reference_value_and_grads(case_id)
    np.testing.assert_allclose(value, want, rtol=F32_RTOL)
    assert_close_grad(grad_x, want_x, F32_RTOL)
    assert_close_grad(grad_w, want_w, F32_RTOL)


@pytest.mark.parametrize("case_id", PER_SAMPLE_IDS)
@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_reduction_none_is_the_reference_per_sample(case_id):
    case = BY_ID[case_id]
    loss = case.make(reduction="none")
    loss.class_vectors.assign(case.weights.astype(np.float32))
    got = to_numpy(_class_form(loss)(LABELS, X.astype(np.float32)))
    assert got.shape == (B,)
    np.testing.assert_allclose(got, case.ref_per_sample(LABELS, X, case.weights),
                               rtol=F32_RTOL)


# -- 2. the gradient against central differences of tfdml itself ---------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_float64_gradient_check(case_id, float64):
    """The gradient w.r.t. the embeddings and the class vectors (packed into one vector:
    one check, one compilation under JAX) against central differences of tfdml itself."""
    case = BY_ID[case_id]
    # A smaller problem (4 classes, D=3): each entry costs two evaluations.
    labels = np.array([0, 2, 2, 1, 0], np.int32)
    x, w = X[:5, :3], case.weights[:4, ..., :3]

    def fn(packed):
        return case(labels, ops.reshape(packed[:x.size], x.shape),
                    ops.reshape(packed[x.size:], w.shape))

    theoretical, numerical = gradient_check(fn, np.concatenate([x.ravel(), w.ravel()]),
                                            delta=1e-6)
    assert np.abs(theoretical[:x.size]).max() > 1e-3
    assert np.abs(theoretical[x.size:]).max() > 1e-3
    assert_close_grad(theoretical, numerical, 1e-6)


# -- 3. the class form is the functional form --------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_class_form_equals_functional_form(case_id):
    case = BY_ID[case_id]
    w32 = case.weights.astype(np.float32)
    x32 = X.astype(np.float32)
    loss = case.make()
    assert tuple(loss.class_vectors.shape) == w32.shape
    loss.class_vectors.assign(w32)
    assert len(loss.trainable_variables) == 1
    got_value, got_grad = value_and_grads(lambda y, e: loss(y, e), LABELS, x32, argnums=1)
    want_value, want_grad = value_and_grads(case, LABELS, x32, w32, argnums=1)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-6)
    assert_close_grad(got_grad, want_grad, 1e-6)


# -- 4. degenerate batches ---------------------------------------------------------------------


def _degenerate_batches(weights):
    """``{kind: (labels, x)}``, all ``[6, D]`` (one compiled program under JAX)."""
    x = X[:6].copy()
    vectors = weights if weights.ndim == 2 else weights[:, 0]
    duplicates = np.stack([x[0], x[0], x[0], vectors[3], -vectors[5], vectors[3]])
    zeros = x.copy()
    zeros[[1, 4]] = 0.0
    return {
        "one_class": (np.full(6, 2, np.int32), x),
        "singletons": (np.array([6, 0, 3, 1, 5, 2], np.int32), x),
        # Rows repeated, and rows equal to (minus) a class vector: cos_y = 1, cos_y = -1.
        "duplicates": (np.array([0, 0, 1, 3, 5, 3], np.int32), duplicates),
        "zero_vectors": (np.array([0, 2, 2, 1, 0, 1], np.int32), zeros),
        "all_zero": (np.array([0, 2, 2, 1, 0, 1], np.int32), np.zeros_like(x)),
    }


@pytest.mark.parametrize("case_id", IDS)
def test_degenerate_batches_are_finite_and_defined(case_id):
    """One class only, every class once, duplicate rows, zero rows: all valid inputs.

    These losses compare samples with class vectors, not with each other, so all are
    defined: the value is the reference's (finite), the gradients are finite. (Proxy
    Anchor averages its positive part over the classes present: one for a one-class
    batch.) A zero embedding has cosine 0 with every class vector, so the normalized
    softmax loss of an all-zero batch is log C, and the class vectors get no gradient.
    """
    case = BY_ID[case_id]
    w32 = case.weights.astype(np.float32)
    step = (value_and_grad_function(case, argnums=(1, 2), jit_compile=True)
            if BACKEND == "jax" else None)
    for kind, (labels, x) in _degenerate_batches(case.weights).items():
        x32 = x.astype(np.float32)
        if step is None:
            value, (grad_x, grad_w) = value_and_grad(case, labels, x32, w32, argnums=(1, 2))
        else:
            value, (grad_x, grad_w) = to_numpy(step(labels, x32, w32))
        assert np.isfinite(value) and np.all(np.isfinite(grad_x)), kind
        assert np.all(np.isfinite(grad_w)), kind
        np.testing.assert_allclose(value, case.ref_value(labels, x, case.weights),
                                   rtol=F32_RTOL, atol=1e-5, err_msg=kind)
        if kind == "all_zero" and case_id == "normalized_softmax":
            np.testing.assert_allclose(value, math.log(C), rtol=1e-6)
        if kind == "all_zero":  # no embedding direction to move: no gradient for weights
            np.testing.assert_array_equal(grad_w, 0.0)


# -- 5. NaN and Inf --------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
def test_nan_or_inf_gives_nan(case_id):
    case = BY_ID[case_id]
    fn = compiled(lambda y, e, w: case(y, e, w)) if BACKEND == "jax" else case
    x32, w32 = X.astype(np.float32), case.weights.astype(np.float32)
    assert np.isfinite(to_numpy(fn(LABELS, x32, w32)))
    for bad in (np.nan, np.inf, -np.inf):
        x_bad = x32.copy()
        x_bad[3, 1] = bad
        assert np.isnan(to_numpy(fn(LABELS, x_bad, w32))), f"{bad} in y_pred"
        w_bad = w32.copy()
        w_bad.reshape(-1, D)[-1, 2] = bad  # a vector of an absent class
        assert np.isnan(to_numpy(fn(LABELS, x32, w_bad))), f"{bad} in the weights"
    loss = case.make()
    loss.class_vectors.assign(w32)
    x_bad = x32.copy()
    x_bad[0, 0] = np.nan
    assert np.isnan(to_numpy(_class_form(loss)(LABELS, x_bad)))
    loss.class_vectors.assign(w_bad)
    assert np.isnan(to_numpy(_class_form(loss)(LABELS, x32)))


# -- 6. invalid arguments ----------------------------------------------------------------------

BAD_HYPERPARAMETERS = [
    ("normalized_softmax", dict(temperature=-0.1), "temperature"),
    ("normalized_softmax", dict(temperature=0.0), "temperature"),
    ("cosface", dict(scale=-1.0), "scale"),
    ("cosface", dict(margin=-0.1), "margin"),
    ("arcface", dict(scale=0.0), "scale"),
    ("arcface", dict(margin=-0.1), "margin"),
    ("arcface", dict(margin=2.0), "margin"),  # radians, below pi/2
    ("subcenter_arcface", dict(scale=-64.0), "scale"),
    ("soft_triple", dict(la=-1.0), "la"),
    ("soft_triple", dict(gamma=0.0), "gamma"),
    ("soft_triple", dict(margin=-0.01), "margin"),
    ("proxy_nca", dict(scale=-1.0), "scale"),
    ("proxy_nca", dict(scale=float("nan")), "scale"),
    ("proxy_anchor", dict(alpha=-32.0), "alpha"),
    ("proxy_anchor", dict(margin=-0.1), "margin"),
    # Capped as the margin-softmax scales: alpha=1e10 gave NaN under jax.jit.
    ("proxy_anchor", dict(alpha=1e10), "alpha=10000000000.0"),
    ("proxy_nca", dict(scale=1e7), "scale=10000000.0"),
]


@pytest.mark.parametrize("case_id,kwargs,match", BAD_HYPERPARAMETERS)
def test_invalid_hyperparameters(case_id, kwargs, match):
    case = BY_ID[case_id]
    with pytest.raises(ValueError, match=match):
        case.functional(LABELS, X, case.weights, **{**case.kwargs, **kwargs})
    with pytest.raises(ValueError, match=match):
        case.cls(num_classes=C, **{**case.kwargs, **case.class_kwargs, **kwargs})


@pytest.mark.parametrize("case_id", IDS)
def test_invalid_weights_and_labels(case_id):
    case = BY_ID[case_id]
    name = case.vectors_name
    w = case.weights
    wrong_rank = w[:, 0] if case.rank == 3 else w[:, None, :]
    with pytest.raises(ValueError, match=f"`{name}` must have shape"):
        case.functional(LABELS, X, wrong_rank, **case.kwargs)
    with pytest.raises(ValueError, match=f"`{name}`.*embedding size"):
        case.functional(LABELS, X, w[..., :-1], **case.kwargs)
    for bad_id in (C, -1):
        labels = LABELS.copy()
        labels[2] = bad_id
        with pytest.raises(ValueError, match=f"Class ids.*`{name}`"):
            case.functional(labels, X, w, **case.kwargs)
    loss = case.make()
    with pytest.raises(ValueError, match="Class ids"):
        loss(np.full(B, C, np.int32), X.astype(np.float32))
    with pytest.raises(ValueError, match="num_classes"):
        case.cls(num_classes=0, **case.kwargs, **case.class_kwargs)


# -- 7. config and sample weights --------------------------------------------------------------


@pytest.mark.parametrize("case_id", IDS)
def test_config_roundtrip(case_id):
    case = BY_ID[case_id]
    loss = case.cls(num_classes=C, embedding_dim=D, **case.kwargs, **case.class_kwargs,
                    initializer=keras.initializers.RandomNormal(stddev=0.01))
    clone = assert_config_roundtrip(loss)
    for key, value in case.kwargs.items():
        assert getattr(clone, key) == value
    assert clone.num_classes == C and clone.embedding_dim == D


def _with_sample_weight(loss):
    """``f(y, e, sample_weight) -> float`` (one ``jax.jit`` program under JAX)."""
    def call(y, e, w):
        return loss(y, e, sample_weight=w)

    fn = compiled(call) if BACKEND == "jax" else call
    return lambda y, e, w: float(to_numpy(fn(y, e, w)))


# -- 8. compiled ----------------------------------------------------------------------------


#: The losses compiled together in one XLA program (one compilation, whose time grows with
#: the losses in it): on every commit one of each kind of class vector (one weight vector per
#: class; several centers per class; proxies, with one value for the whole batch), all of
#: them in the slow tier. The class form of every loss is compiled on every commit as well,
#: against its float64 record (tests/losses/test_recorded_losses.py). Eager JAX is slow:
#: cosface only there.
COMPILED_IDS = ({"some": ["arcface", "soft_triple", "proxy_anchor"], "every": IDS}
                if BACKEND != "jax" else {"some": ["cosface"]})


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
@pytest.mark.filterwarnings("ignore:Loss .* has learned variables")
@pytest.mark.parametrize("group", slow_beyond(sorted(COMPILED_IDS), {"some"}))
def test_compiled_equals_eager(group):
    """Values and gradients of the losses (functional and class form) under XLA, in one
    compiled program (one compilation): the eager ones; a NaN embedding gives NaN there too."""
    compiled_ids = COMPILED_IDS[group]
    x32 = X.astype(np.float32)
    weights = {case_id: BY_ID[case_id].weights.astype(np.float32) for case_id in compiled_ids}
    losses = {}
    for case_id in compiled_ids:
        losses[case_id] = BY_ID[case_id].make()
        losses[case_id].class_vectors.assign(weights[case_id])

    def everything(labels, x, weights):
        out = {}
        for case_id in compiled_ids:
            out[case_id] = value_and_grad_tensors(BY_ID[case_id], labels, x, weights[case_id],
                                                  argnums=(1, 2))
            out[case_id + "/class"] = losses[case_id](labels, x)
        return out

    eager = to_numpy(everything(*(ops.convert_to_tensor(a) for a in (LABELS, x32)),
                                {k: ops.convert_to_tensor(w) for k, w in weights.items()}))
    step = compiled(everything)
    got = to_numpy(step(LABELS, x32, weights))
    for case_id in compiled_ids:
        value, (grad_x, grad_w) = got[case_id]
        want_value, (want_x, want_w) = eager[case_id]
        np.testing.assert_allclose(value, want_value, rtol=1e-5, err_msg=case_id)
        assert_close_grad(grad_x, want_x, 1e-5)
        assert_close_grad(grad_w, want_w, 1e-5)
        np.testing.assert_allclose(got[case_id + "/class"], want_value, rtol=1e-5,
                                   err_msg=case_id)
    broken = to_numpy(step(LABELS, np.full_like(x32, np.nan), weights))
    for case_id in compiled_ids:
        assert np.isnan(broken[case_id][0]) and np.isnan(broken[case_id + "/class"]), case_id


def test_labels_may_be_a_column():
    """``y_true`` of shape ``[B, 1]`` (Keras' usual) is the same as ``[B]``."""
    case = BY_ID["cosface"]
    x32, w32 = X.astype(np.float32), W2.astype(np.float32)
    fn = compiled(lambda y, e, w: case(y, e, w)) if BACKEND == "jax" else case
    np.testing.assert_allclose(to_numpy(fn(LABELS[:, None], x32, w32)),
                               to_numpy(fn(LABELS, x32, w32)), rtol=1e-6)
