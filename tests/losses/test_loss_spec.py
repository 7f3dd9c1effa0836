"""The loss contract (tfdml/losses/base.py): a loss class, its config and its functional form.

The loss checked here is the example of docs/extending.md ("Adding a loss"), run from the
page itself: a ``PairLoss`` written with ``tfdml.losses.extend`` alone, its arguments checked
in ``__init__``, and its functional form built by ``functional_form``; NumPy computes its
reference value. The library's own losses are covered by the contract suite
(tests/losses/test_loss_base.py), the recorded values (tests/losses/test_recorded_losses.py)
and the checks of their declarations (tests/losses/test_loss_declarations.py).
"""

from __future__ import annotations

import inspect
import pathlib

import keras
import numpy as np
import pytest
from backends import to_numpy, value_and_grad

from tfdml import losses
from tfdml.losses._docstrings import SHARED
from tfdml.miners import TripletMiner

pytestmark = pytest.mark.multibackend

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _guide_example():
    """The names the first Python block of the guide's "Adding a loss" defines."""
    text = GUIDE.read_text()
    section = text[text.index("## Adding a loss"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    namespace = {"__name__": "guide_example"}
    exec(compile(code, str(GUIDE), "exec"), namespace)  # noqa: S102 (the guide's own code)
    return namespace


_EXAMPLE = _guide_example()
BinomialDevianceLoss = _EXAMPLE["BinomialDevianceLoss"]
binomial_deviance_loss = _EXAMPLE["binomial_deviance_loss"]


LABELS = np.array([0, 0, 1, 1, 1, 2, 3], "int32")  # class 3 alone: no positive


def _embeddings():
    return np.random.default_rng(3).normal(size=(len(LABELS), 4)).astype("float32")


def _reference(labels, x, alpha=2.0, beta=0.5, negative_cost=1.0):
    """The mean over every pair (i, j), i != j, of its binomial deviance."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = u @ u.T
    values = []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j:
                continue
            sign = -1.0 if labels[i] == labels[j] else negative_cost
            values.append(np.logaddexp(0.0, sign * alpha * (s[i, j] - beta)))
    return np.mean(values)


def test_the_class_takes_its_own_arguments_then_the_shared_ones_by_keyword():
    parameters = inspect.signature(BinomialDevianceLoss).parameters
    assert list(parameters) == ["alpha", "beta", "negative_cost", "miner", *SHARED]
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in SHARED)
    loss = BinomialDevianceLoss(3.0, 0.4, 2.0, None, normalize=False, average="halves",
                                reduction="sum", name="mine", block_size=4)
    assert (loss.alpha, loss.beta, loss.negative_cost, loss.normalize, loss.average,
            loss.reduction, loss.name, loss.block_size) == (3.0, 0.4, 2.0, False, "halves",
                                                            "sum", "mine", 4)
    assert type(loss.miner).__name__ == "AllPairsMiner"
    assert loss.arguments == {"alpha": 3.0, "beta": 0.4, "negative_cost": 2.0,
                              "miner": loss.miner}
    with pytest.raises(TypeError, match="unexpected keyword"):
        BinomialDevianceLoss(alpah=0.3)
    with pytest.raises(TypeError, match="positional"):
        BinomialDevianceLoss(2.0, 0.5, 1.0, None, False)
    with pytest.raises(ValueError, match="`alpha` must be"):
        BinomialDevianceLoss(alpha=0)
    with pytest.raises(ValueError, match="`beta` must be"):
        BinomialDevianceLoss(beta=float("inf"))
    with pytest.raises(ValueError, match="`average` must be one of"):
        BinomialDevianceLoss(average="pairs")


def test_the_docstrings_get_the_shared_arguments_with_this_loss_defaults():
    doc = BinomialDevianceLoss.__doc__
    args = doc[doc.index("Args:"):doc.index("Reference:")]
    for name in ("alpha", "beta", "negative_cost", "miner", *SHARED):
        assert f"        {name}: " in args
    words = " ".join(args.split())
    assert 'name of the loss. Defaults to `"binomial_deviance_loss"`.' in words
    assert '(:mod:`tfdml.losses.terms`). Defaults to `"terms"`.' in words
    fn_doc = binomial_deviance_loss.__doc__
    assert "ref_embeddings" in fn_doc and "{" not in fn_doc
    assert "alpha, beta, negative_cost, miner, normalize, average: as in" in " ".join(
        fn_doc.split())


def test_functional_form_signature_and_value_equal_the_class_and_numpy():
    parameters = inspect.signature(binomial_deviance_loss).parameters
    assert list(parameters) == ["y_true", "y_pred", "alpha", "beta", "negative_cost", "miner",
                                "normalize", "ref_embeddings", "ref_labels", "ref_offset",
                                "average"]
    assert parameters["alpha"].default == 2.0 and parameters["average"].default == "terms"
    assert binomial_deviance_loss.__name__ == "binomial_deviance_loss"
    x = _embeddings()
    want = _reference(LABELS, x, alpha=3.0)
    np.testing.assert_allclose(to_numpy(binomial_deviance_loss(LABELS, x, 3.0)), want,
                               rtol=1e-5)
    np.testing.assert_allclose(to_numpy(BinomialDevianceLoss(3.0)(LABELS, x)), want, rtol=1e-5)
    value, grad = value_and_grad(lambda e: binomial_deviance_loss(LABELS, e, alpha=3.0), x)
    value_c, grad_c = value_and_grad(lambda e: BinomialDevianceLoss(alpha=3.0)(LABELS, e), x)
    np.testing.assert_array_equal(value, value_c)
    np.testing.assert_array_equal(grad, grad_c)
    with pytest.raises(ValueError, match="`alpha` must be"):
        binomial_deviance_loss(LABELS, x, -0.5)
    with pytest.raises(TypeError):
        binomial_deviance_loss(LABELS, x, 2.0, 0.5, 1.0, None, True)  # the tail is by keyword


def test_config_round_trip_and_blocks():
    loss = BinomialDevianceLoss(2.5, miner=TripletMiner("easy", "semihard"), block_size=3,
                                name="h")
    config = loss.get_config()
    assert config["alpha"] == 2.5 and config["block_size"] == 3
    assert config["miner"]["class_name"] == "TripletMiner"
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(again) is BinomialDevianceLoss and again.get_config() == config
    x = _embeddings()
    dense = BinomialDevianceLoss(2.5, miner=TripletMiner("easy", "semihard"))
    np.testing.assert_allclose(to_numpy(again(LABELS, x)), to_numpy(dense(LABELS, x)),
                               rtol=1e-6)


def test_nan_in_gives_nan_out_and_no_pair_gives_zero():
    x = _embeddings()
    x[2, 1] = np.nan
    assert np.isnan(to_numpy(BinomialDevianceLoss()(LABELS, x)))
    assert np.isnan(to_numpy(binomial_deviance_loss(LABELS, x)))
    hard = BinomialDevianceLoss(miner=TripletMiner("hard", "hard"))
    alone = np.arange(4, dtype="int32")
    with pytest.warns(UserWarning, match="no anchor of this batch"):
        assert to_numpy(hard(alone, _embeddings()[:4])) == 0.0


def test_a_whole_loss_check_sits_in_the_init():
    with pytest.raises(ValueError, match="PNLoss cannot run in blocks"):
        losses.PNLoss(miner=TripletMiner("all", "semihard"), block_size=4)
    assert losses.PNLoss(miner=TripletMiner("hard", "semihard"), block_size=4).block_size == 4


def test_the_state_is_made_with_the_loss_and_follows_its_miner():
    """``make_state`` runs once, at the end of ``__init__``: reading ``state`` makes nothing."""
    assert BinomialDevianceLoss().state is None  # a deterministic miner: no state
    loss = BinomialDevianceLoss(miner=TripletMiner("random", "random", seed=1))
    state = loss.state
    assert state is loss.state and state.seed_generators == [loss.miner.seed_generator]
    assert not state.built and state.loss_class_name == "BinomialDevianceLoss"
    # A miner set while no model owns the loss: its seed becomes the state's.
    loss.miner = TripletMiner("random", "hard", seed=2)
    assert loss.state.seed_generators == [loss.miner.seed_generator]
    loss.miner = TripletMiner("easy", "hard")
    assert loss.state is None
