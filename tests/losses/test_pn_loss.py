"""PNLoss / pn_loss against the NumPy reference of tests/references.py.

The tests marked ``multibackend`` also run under JAX and PyTorch (a subset: eager JAX
compiles every op for each new shape).

The reference mines with ``references.mine_triplets`` and takes, for each triplet,
``max(d_ap - min(d_an, d_pn) + margin, 0)`` (or its softplus) in float64. Values agree to
1e-9 in float64 and 1e-5 in float32; gradients to central differences of the reference
(random inputs: no ties, so the mined triplets and the smaller of the two negative
distances stay the same around the point).
"""

from __future__ import annotations

import numpy as np
import pytest
import references as ref
from backends import (
    BACKEND,
    CAN_COMPILE,
    central_differences,
    compiled,
    to_numpy,
    value_and_grad,
    value_and_grad_function,
)
from harness import assert_config_roundtrip

from tfdml.losses import PNLoss, pn_loss
from tfdml.miners import AllPairsMiner, TripletMiner

MB = pytest.mark.multibackend

# B = 12, D = 7; classes of 4, 3, 2, 2 and 1 samples.
LABELS, X = ref.make_batch([4, 3, 2, 2, 1], 7, seed=3)

# Every strategy with the defaults, every other configuration with the default miner; the
# multibackend ones also run under JAX and PyTorch.
DEFAULT = ("hard", "semihard")
CASES = [
    pytest.param({}, DEFAULT, id="defaults-hard_semihard"),
    pytest.param({}, ("easy", "hard"), id="defaults-easy_hard"),
    pytest.param({}, ("hard", "easy"), id="defaults-hard_easy"),
    pytest.param({}, ("all", "semihard"), id="defaults-all_semihard"),
    pytest.param({}, ("easy", "all"), id="defaults-easy_all"),
    pytest.param({}, ("all", "all"), id="defaults-all_all", marks=MB),
    pytest.param(dict(margin=0.1), DEFAULT, id="hinge"),
    pytest.param(dict(margin=0.3, distance="squared_l2"), DEFAULT, id="squared_l2"),
    pytest.param(dict(margin=0.5, distance="l2", normalize=False), DEFAULT, id="l2_raw"),
    pytest.param(dict(distance="l2", normalize=False), ("all", "semihard"), id="soft_l2_raw"),
]


def _scale(config):
    return 1.0 if config.get("normalize", True) else 0.4


def _reference(labels, x, config, strategy, average="anchors"):
    positive, negative = strategy
    kwargs = {k: v for k, v in config.items() if k != "distance"}
    return ref.pn_loss(labels, x, distance_kind=config.get("distance", "cosine"),
                       positive=positive, negative=negative, average=average, **kwargs)


def _loss(config, strategy):
    return lambda y, e: pn_loss(y, e, miner=TripletMiner(*strategy), **config)


@pytest.mark.parametrize("config,strategy", CASES)
def test_values_and_gradients_match_the_reference(config, strategy, float64):
    x = _scale(config) * X
    want, terms = _reference(LABELS, x, config, strategy)
    assert 0 < len(terms) < len(LABELS)
    value, grad = value_and_grad(_loss(config, strategy), LABELS, x, argnums=1)
    np.testing.assert_allclose(value, want, rtol=1e-9)
    want_grad = central_differences(lambda e: _reference(LABELS, e, config, strategy)[0], x)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    assert np.abs(grad).max() > 1e-3
    x32 = x.astype(np.float32)
    value32, grad32 = value_and_grad(_loss(config, strategy), LABELS, x32, argnums=1)
    assert value32.dtype == grad32.dtype == np.float32
    np.testing.assert_allclose(value32, want, rtol=1e-5)
    np.testing.assert_allclose(grad32, want_grad, rtol=1e-3, atol=1e-5)


def test_the_smaller_negative_distance_matters():
    """A negative closer to the positive than to the anchor: PN takes ``d(p, n)``, a plain
    margin triplet loss ``d(a, n)``."""
    labels = np.array([0, 0, 1], np.int32)
    x = np.array([[0.0, 0.0], [1.0, 0.0], [1.5, 0.0]])
    config = dict(margin=1.0, distance="l2", normalize=False)
    value = float(to_numpy(pn_loss(labels, x, miner=TripletMiner("hard", "hard"), **config)))
    # anchor 0: d_ap = 1, d_an = 1.5, d_pn = 0.5 -> 1 - 0.5 + 1; anchor 1: d_ap = 1,
    # d_an = 0.5, d_pn = 1.5 -> 1 - 0.5 + 1. Anchor 2 has no positive.
    np.testing.assert_allclose(value, 1.5, rtol=1e-6)


def test_reduction_none_and_averages():
    x = X.astype(np.float32)
    strategy = ("all", "semihard")
    _, terms = _reference(LABELS, X, {}, strategy)
    per_anchor = to_numpy(PNLoss(miner=TripletMiner(*strategy), reduction="none")(LABELS, x))
    assert per_anchor.shape == (len(LABELS),)
    want = np.zeros(len(LABELS))
    for a, values in ref.anchor_values(terms, "anchors").items():
        want[a] = values
    np.testing.assert_allclose(per_anchor, want, rtol=1e-5, atol=1e-6)
    for average in ("batch", "terms", "nonzero"):
        got = to_numpy(pn_loss(LABELS, x, miner=TripletMiner(*strategy), average=average))
        np.testing.assert_allclose(got, _reference(LABELS, X, {}, strategy, average)[0],
                                   rtol=1e-5, err_msg=average)


@pytest.mark.parametrize("strategy", [pytest.param(("hard", "semihard"), marks=MB),
                                      ("all", "all")])
def test_reference_set_is_the_concatenation(strategy, float64):
    """``ref_embeddings = [batch; extra]`` with ``ref_offset=0``: the positive-negative
    distances come from the reference set's own ``[R, R]`` matrix."""
    extra_labels, extra = ref.make_batch([2, 2, 1], 7, seed=4)
    extra_labels = extra_labels + np.int32(2)  # classes 2, 3, 4: shared with the batch
    labels = np.concatenate([LABELS, extra_labels])
    x = np.concatenate([X, extra])
    b = len(LABELS)
    miner = TripletMiner(*strategy)
    got = to_numpy(pn_loss(LABELS, X, miner=miner, ref_embeddings=x, ref_labels=labels,
                           ref_offset=0))
    _, terms = _reference(labels, x, {}, strategy)
    want = ref.average_terms({a: t for a, t in terms.items() if a < b}, "anchors", b)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_degenerate_batches():
    """A batch of singletons or of one class has no triplet: 0 with zero gradients. Two
    identical samples: finite."""
    x = X[:6].astype(np.float32)
    for labels in (np.arange(6, dtype=np.int32), np.zeros(6, np.int32)):
        for loss in (PNLoss(), PNLoss(margin=0.2, miner=TripletMiner("all", "all"))):
            value, grad = value_and_grad(lambda y, e, f=loss: f(y, e), labels, x, argnums=1)
            assert value == 0.0
            np.testing.assert_array_equal(grad, 0.0)
    duplicates = np.repeat(x[:3], 2, axis=0)
    labels = np.array([0, 0, 1, 1, 2, 2], np.int32)
    for distance in ("cosine", "l2", "squared_l2"):
        value, grad = value_and_grad(lambda y, e, d=distance: pn_loss(y, e, distance=d), labels,
                                     duplicates, argnums=1)
        assert np.isfinite(value) and np.all(np.isfinite(grad)), distance


@MB
def test_nan_or_inf_gives_nan():
    x = X.astype(np.float32)
    loss = PNLoss()
    fns = [loss, lambda y, e: pn_loss(y, e, margin=0.2)]
    if BACKEND == "jax":
        fns = [compiled(fn) for fn in fns]
    for bad in (np.nan, np.inf, -np.inf):
        x_bad = x.copy()
        x_bad[11, 0] = bad  # the singleton: never mined
        for fn in fns:
            assert np.isnan(to_numpy(fn(LABELS, x_bad))), bad


@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
@MB
def test_compiled_equals_eager():
    x = X.astype(np.float32)
    for strategy in (("hard", "semihard"), ("all", "all")):
        fn = _loss({}, strategy)
        eager = value_and_grad(fn, LABELS, x, argnums=1)
        got = to_numpy(value_and_grad_function(fn, argnums=1, jit_compile=True)(LABELS, x))
        np.testing.assert_allclose(got[0], eager[0], rtol=1e-5)
        np.testing.assert_allclose(got[1], eager[1], rtol=1e-4, atol=1e-6)


def test_defaults_and_config_roundtrip():
    loss = PNLoss()
    assert (loss.margin, loss.distance, loss.normalize) == (None, "cosine", True)
    assert (loss.miner.positive, loss.miner.negative) == ("hard", "semihard")
    clone = assert_config_roundtrip(PNLoss(0.3, distance="l2", miner=None, reduction="sum"))
    assert (clone.margin, clone.distance, clone.reduction) == (0.3, "l2", "sum")
    assert isinstance(clone.miner, AllPairsMiner)
    assert assert_config_roundtrip(PNLoss()).margin is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(margin=-1.0), "margin"),
    (dict(margin="soft"), "margin"),
    (dict(distance="manhattan"), "distance"),
    (dict(miner="hard"), "miner"),
    (dict(average="pairs"), "average"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PNLoss(**kwargs)
    with pytest.raises(ValueError, match=match):
        pn_loss(LABELS, X, **kwargs)
