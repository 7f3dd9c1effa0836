"""FastAPLoss, PNPLoss and SmoothAPLoss against NumPy references and pytorch-metric-learning 2.9.

The references (tests/references.py) loop over the anchors and their positives in float64.
FastAP matches pml 2.9 (and the authors' code). PNP and Smooth-AP follow their papers, whose
positives are the other samples of the anchor's class; pml 2.9 also counts the anchor itself
(and, for Smooth-AP, puts it in its own retrieval set and groups the rows by position). The
references with pml's readings give pml's numbers, which these tests check too.

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from their entries in tests/loss_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    reference_gradient,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import slow_beyond
from pml_data import BATCHES, DATA, recorded, uneven_batch

from tfdml.losses import (
    FastAPLoss,
    PNPLoss,
    SmoothAPLoss,
    fast_ap_loss,
    pnp_loss,
    smooth_ap_loss,
)

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]

LOSSES = {
    "fast_ap": (FastAPLoss, fast_ap_loss, ref.fast_ap_loss),
    "pnp": (PNPLoss, pnp_loss, ref.pnp_loss),
    "smooth_ap": (SmoothAPLoss, smooth_ap_loss, ref.smooth_ap_loss),
}

CONFIGS = [
    ("fast_ap", {}), ("fast_ap", {"num_bins": 4}), ("fast_ap", {"num_bins": 25}),
    *[("pnp", {"variant": v}) for v in ("O", "Ds", "Dq", "Iu", "Ib")],
    ("pnp", {"variant": "Dq", "alpha": 2.0}), ("pnp", {"variant": "Ib", "b": 3.0, "anneal": 0.05}),
    ("smooth_ap", {}), ("smooth_ap", {"temperature": 0.1}),
]
#: Under JAX only the default of each loss (each configuration compiles anew). On every
#: commit (TensorFlow) the default of each loss and each PNP variant; other values of the
#: same parameters in the slow tier.
CONFIG_PARAMS = slow_beyond([
    pytest.param(name, args, id=f"{name}-{'-'.join(f'{k}={v}' for k, v in args.items())}",
                 marks=pytest.mark.skipif(BACKEND == "jax" and bool(args),
                                          reason="JAX: the defaults only"))
    for name, args in CONFIGS], {"fast_ap-", "smooth_ap-", *(f"pnp-variant={v}" for v in
                                                             ("O", "Ds", "Dq", "Iu", "Ib"))})

PNP_CASES = {"pnp_O": {"variant": "O"}, "pnp_Ds": {"variant": "Ds"}, "pnp_Dq": {"variant": "Dq"},
             "pnp_Iu": {"variant": "Iu"}, "pnp_Ib": {"variant": "Ib"},
             "pnp_Dq_alpha2": {"variant": "Dq", "alpha": 2.0},
             "pnp_Ib_b3": {"variant": "Ib", "b": 3.0, "anneal": 0.05}}


def _value_and_grad(cls, args, labels, x, **kwargs):
    """Value and gradient of the loss; compiled under JAX (eager JAX compiles op by op)."""
    loss = cls(**args, dtype="float64", **kwargs)
    if BACKEND != "jax":
        return value_and_grad(lambda e: loss(labels, e), x)
    return to_numpy(value_and_grad_function(lambda e: loss(labels, e), jit_compile=True)(x))


def _run(fn, x):
    """``fn(x)`` as NumPy; compiled under JAX."""
    if BACKEND == "jax":
        import jax

        return to_numpy(jax.jit(fn)(x))
    return to_numpy(fn(x))


@pytest.mark.parametrize("name,args", CONFIG_PARAMS)
def test_values_and_gradients_match_the_reference(name, args):
    cls, _, reference = LOSSES[name]
    labels, x = uneven_batch()
    value, grad = _value_and_grad(cls, args, labels, x)

    def want(e):
        return reference(labels, e, **args)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_functional_form_equals_the_class(name):
    cls, function, _ = LOSSES[name]
    labels, x = uneven_batch(1)
    loss = cls(dtype="float64")
    np.testing.assert_allclose(_run(lambda e: function(labels, e), x),
                               _run(lambda e: loss(labels, e), x), rtol=1e-12)


# On every commit each batch and each number of bins once; the other pairs in the slow tier.
@pytest.mark.parametrize("batch,case,num_bins", slow_beyond(
    [pytest.param(b.values[0], case, num_bins, id=f"{b.values[0]}-{case}-{num_bins}",
                  marks=b.marks)
     for case, num_bins in [("fast_ap", 10), ("fast_ap_4", 4)] for b in BATCHES],
    {"uneven-fast_ap-10", "pk-fast_ap_4-4", "pairs-fast_ap-10"}))
def test_fast_ap_equals_pytorch_metric_learning(case, num_bins, batch):
    labels, x, (want_value, want_grad) = recorded(case, batch)
    value, grad = _value_and_grad(FastAPLoss, {"num_bins": num_bins}, labels, x)
    np.testing.assert_allclose(value, want_value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-7, atol=1e-10)


# On every commit each variant once and each batch, with the gradient check (uneven-pnp_O);
# the other pairs (the same reading of pml's) in the slow tier.
@pytest.mark.parametrize("batch,case", slow_beyond(
    [pytest.param(b.values[0], c, id=f"{b.values[0]}-{c}", marks=b.marks)
     for c in sorted(PNP_CASES) for b in BATCHES],
    {"uneven-pnp_O", "pk-pnp_Ds", "pairs-pnp_Dq", "uneven-pnp_Iu", "pk-pnp_Ib"}))
def test_pnp_differs_from_pytorch_metric_learning_by_the_anchor_as_its_own_positive(case, batch):
    """pml 2.9 adds each anchor with a positive to its own positives (a term f(R_aa), s_aa = 1,
    and |P_a| + 1 in the mean); the paper's positives are the other samples of the class. The
    reference with pml's reading gives pml's numbers."""
    args = PNP_CASES[case]
    labels, x, (want_value, want_grad) = recorded(case, batch)
    value, _ = _value_and_grad(PNPLoss, args, labels, x)
    np.testing.assert_allclose(value, ref.pnp_loss(labels, x, **args), rtol=1e-12)
    assert abs(float(value) - float(want_value)) > 0.05 * abs(float(want_value))

    def pml_reading(e):
        return ref.pnp_loss(labels, e, anchor_as_positive=True, **args)

    np.testing.assert_allclose(pml_reading(x), want_value, rtol=1e-9)
    if batch == "uneven" and case == "pnp_O":
        np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-6,
                                   atol=1e-8)


# The second temperature (slow tier) is the same reading of pml's.
@pytest.mark.parametrize("case,temperature", slow_beyond(
    [pytest.param("smooth_ap", 0.01, id="smooth_ap-0.01"),
     pytest.param("smooth_ap_t01", 0.1, id="smooth_ap_t01-0.1")], {"smooth_ap-0.01"}))
def test_smooth_ap_differs_from_pytorch_metric_learning_by_the_anchor_in_its_own_set(
        case, temperature):
    """On a batch pml 2.9 reads as meant (classes of equal size in class order, as many rows
    per class as classes), pml puts the anchor in its own retrieval set and among its
    positives; the paper ranks the other samples. The reference with pml's reading gives
    pml's numbers."""
    labels, x, (want_value, want_grad) = recorded(case, "square")
    value, _ = _value_and_grad(SmoothAPLoss, {"temperature": temperature}, labels, x)
    np.testing.assert_allclose(value, ref.smooth_ap_loss(labels, x, temperature), rtol=1e-12)
    assert abs(float(value) - float(want_value)) > 0.05

    def pml_reading(e):
        return ref.smooth_ap_loss(labels, e, temperature, anchor_in_set=True)

    np.testing.assert_allclose(pml_reading(x), want_value, rtol=1e-9)
    np.testing.assert_allclose(reference_gradient(pml_reading, x), want_grad, rtol=1e-6,
                               atol=1e-8)


@pytest.mark.parametrize("case,temperature", [("smooth_ap", 0.01), ("smooth_ap_t01", 0.1)])
@pytest.mark.parametrize("batch", ["pk", "pairs"])
def test_pytorch_metric_learning_smooth_ap_groups_rows_by_position(case, temperature, batch):
    """pml 2.9 takes rows ``[g C, (g + 1) C)`` (C = the number of classes) as one class
    whatever their labels: on 6 classes of 4 and 8 classes of 2 its value is the reference
    on those groups, not on the labels. (tfdml uses the labels: the tests above.)"""
    labels, x, (want_value, _) = recorded(case, batch)
    groups = np.arange(len(labels)) // len(np.unique(labels))
    np.testing.assert_allclose(
        ref.smooth_ap_loss(labels, x, temperature, anchor_in_set=True, groups=groups),
        want_value, rtol=1e-9)
    by_labels = ref.smooth_ap_loss(labels, x, temperature, anchor_in_set=True)
    assert abs(by_labels - float(want_value)) > 1e-4


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_blocks_give_the_same_values_and_gradients(name):
    cls = LOSSES[name][0]
    labels, x = uneven_batch(4)
    value, grad = _value_and_grad(cls, {}, labels, x)
    blocked, blocked_grad = _value_and_grad(cls, {}, labels, x, block_size=5)
    np.testing.assert_allclose(blocked, value, rtol=1e-12)
    np.testing.assert_allclose(blocked_grad, grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_reference_set_gives_the_anchors_own_terms(name):
    """Anchors 0-4 against the whole batch (``ref_offset=0``) have the terms they have in it."""
    cls, function, _ = LOSSES[name]
    labels, x = uneven_batch(5)
    loss = cls(dtype="float64")
    every = _run(lambda e: list(loss.per_anchor(labels, e)), x)
    some = _run(lambda e: list(loss.per_anchor(labels[:5], e[:5], ref_embeddings=e,
                                               ref_labels=labels, ref_offset=0)), x)
    np.testing.assert_allclose(np.array(some), np.array(every)[:, :5], rtol=1e-12)
    np.testing.assert_allclose(
        _run(lambda e: function(labels, e, ref_embeddings=e, ref_labels=labels, ref_offset=0),
             x),
        _run(lambda e: function(labels, e), x), rtol=1e-12)


@pytest.mark.filterwarnings("ignore:Loss .* no anchor of this batch")
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_degenerate_batches(name):
    cls = LOSSES[name][0]
    labels, x = uneven_batch(2)
    x[4] = x[3]  # a positive pair at distance 0
    x[6] = x[0]  # a negative pair at distance 0
    value, grad = _value_and_grad(cls, {}, labels, x)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    for labels in (np.zeros(6, np.int64), np.arange(6)):  # no negative / no positive
        value, grad = _value_and_grad(cls, {}, labels, x[:6])
        assert value == 0.0 and np.all(grad == 0.0)
    x[2, 3] = np.nan
    value, _ = _value_and_grad(cls, {}, uneven_batch()[0], x)
    assert np.isnan(value)


@pytest.mark.parametrize("make,match", [
    (lambda: FastAPLoss(num_bins=0), "num_bins"), (lambda: FastAPLoss(num_bins=2.5), "num_bins"),
    (lambda: FastAPLoss(num_bins=True), "num_bins"), (lambda: PNPLoss(variant="X"), "variant"),
    (lambda: PNPLoss(variant="o"), "variant"), (lambda: PNPLoss(b=0.0), "b"),
    (lambda: PNPLoss(alpha=-1.0), "alpha"), (lambda: PNPLoss(anneal=0.0), "anneal"),
    (lambda: PNPLoss(anneal=float("inf")), "anneal"),
    (lambda: SmoothAPLoss(temperature=0.0), "temperature"),
    (lambda: SmoothAPLoss(temperature="0.01"), "temperature"),
    (lambda: fast_ap_loss(np.zeros(2), np.zeros((2, 2)), num_bins=-1), "num_bins"),
    (lambda: pnp_loss(np.zeros(2), np.zeros((2, 2)), variant="Dx"), "variant")])
def test_bad_arguments_are_value_errors_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_square_batch_is_recorded_in_class_order():
    labels = DATA["square/labels"]
    assert np.array_equal(labels, np.repeat(np.arange(4), 4))
