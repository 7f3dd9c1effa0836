"""The loss contract (tfdml/losses/base.py): a loss class, its config and its functional form.

The loss written here is the example of docs/losses.md ("Writing a loss"): an explicit
``__init__`` that passes its own arguments on, a ``terms(inputs)`` method, and a functional
form that calls ``functional_loss``; NumPy computes its reference value. The library's own
losses are covered by the contract suite (tests/losses/test_loss_base.py), the recorded
values (tests/losses/test_recorded_losses.py) and the checks of their declarations below.
"""

from __future__ import annotations

import inspect
import re

import keras
import numpy as np
import pytest
from backends import to_numpy, value_and_grad
from keras import ops

from tfdml import losses
from tfdml import ops as dml
from tfdml._argument_checks import is_number
from tfdml._docs import fill_doc
from tfdml.losses._docstrings import REFERENCE_ARGS, SHARED, shared_args
from tfdml.losses.base import MetricLoss, functional_loss
from tfdml.losses.inputs import resolve_miner
from tfdml.losses.terms import triplet_terms
from tfdml.miners import TripletMiner, as_triplets, gather_triplet_scores

pytestmark = pytest.mark.multibackend


def _check(margin: float = 0.1, miner="default"):
    if not is_number(margin) or not margin >= 0:
        raise ValueError(f"`margin` must be a number >= 0. Received: margin={margin!r}")
    return {"margin": float(margin),
            "miner": resolve_miner(miner, lambda: TripletMiner("hard", "hard"))}


def _terms(inputs, margin, miner):
    labels, x, ref_labels, ref, ref_offset = inputs
    scores = dml.pairwise_similarity(x, ref)
    triplets = as_triplets(miner.mine(scores, labels, ref_labels, ref_offset, x, ref))
    s_ap, s_an = gather_triplet_scores(scores, triplets)
    return triplet_terms(ops.relu(s_an - s_ap + margin), triplets.mask)


@keras.saving.register_keras_serializable(package="tfdml_tests")
@fill_doc(SHARED_ARGS=shared_args("cosine_hinge_loss"))
class CosineHingeLoss(MetricLoss):
    """A hinge on cosine similarities.

    Args:
        margin: ``>= 0``. Defaults to `0.1`.
        miner: a miner; `"default"` for the hardest positive and negative.
        {SHARED_ARGS}

    Examples:

    >>> CosineHingeLoss(0.2)
    """

    def __init__(self, margin: float = 0.1, miner="default", normalize=True, average="anchors",
                 reduction="sum_over_batch_size", name="cosine_hinge_loss", dtype=None,
                 block_size=None):
        super().__init__(normalize=normalize, average=average, reduction=reduction, name=name,
                         dtype=dtype, block_size=block_size, **_check(margin, miner))

    def terms(self, inputs):
        return _terms(inputs, **self.arguments)


@fill_doc(REFERENCE_ARGS=REFERENCE_ARGS)
def cosine_hinge_loss(y_true, y_pred, margin: float = 0.1, miner="default", normalize=True,
                      ref_embeddings=None, ref_labels=None, ref_offset=None, average="anchors"):
    """Functional form of `CosineHingeLoss`.

    Args:
        y_true: ``[B]`` or ``[B, 1]`` integer class ids.
        y_pred: ``[B, D]`` embeddings.
        margin, miner, normalize, average: as in `CosineHingeLoss`.
        {REFERENCE_ARGS}

    Returns:
        A scalar of the dtype of ``y_pred``.
    """
    return functional_loss(CosineHingeLoss, _terms, y_true, y_pred, ref_embeddings, ref_labels,
                           ref_offset, normalize, average, **_check(margin, miner))


LABELS = np.array([0, 0, 1, 1, 1, 2, 3], "int32")  # class 3 alone: no positive


def _embeddings():
    return np.random.default_rng(3).normal(size=(len(LABELS), 4)).astype("float32")


def _reference(labels, x, margin):
    """Mean over anchors with a positive and a negative of the hardest triplet's hinge."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = u @ u.T
    values = []
    for a in range(len(labels)):
        pos = [j for j in range(len(labels)) if j != a and labels[j] == labels[a]]
        neg = [j for j in range(len(labels)) if labels[j] != labels[a]]
        if pos and neg:
            values.append(max(0.0, max(s[a, neg]) - min(s[a, pos]) + margin))
    return np.mean(values)


def test_the_class_takes_its_own_arguments_then_the_shared_ones():
    names = list(inspect.signature(CosineHingeLoss).parameters)
    assert names == ["margin", "miner", *SHARED]
    loss = CosineHingeLoss(0.3, None, False, "terms", "sum", "mine", None, 4)
    assert (loss.margin, loss.normalize, loss.average, loss.reduction, loss.name,
            loss.block_size) == (0.3, False, "terms", "sum", "mine", 4)
    assert type(loss.miner).__name__ == "AllPairsMiner"
    assert loss.arguments == {"margin": 0.3, "miner": loss.miner}
    with pytest.raises(TypeError, match="unexpected keyword"):
        CosineHingeLoss(margn=0.3)
    with pytest.raises(ValueError, match="`margin` must be a number >= 0"):
        CosineHingeLoss(margin=-1)
    with pytest.raises(ValueError, match="`average` must be one of"):
        CosineHingeLoss(average="pairs")


def test_the_docstring_gets_the_shared_arguments_with_this_loss_defaults():
    doc = CosineHingeLoss.__doc__
    args = doc[doc.index("Args:"):doc.index("Examples:")]
    for name in ("margin", *SHARED):
        assert f"        {name}: " in args
    words = " ".join(args.split())
    assert 'name of the loss. Defaults to `"cosine_hinge_loss"`.' in words
    assert '(:mod:`tfdml.losses.terms`). Defaults to `"anchors"`.' in words
    assert "ref_embeddings" in cosine_hinge_loss.__doc__
    assert "{" not in cosine_hinge_loss.__doc__


def test_functional_form_signature_and_value_equal_the_class_and_numpy():
    params = list(inspect.signature(cosine_hinge_loss).parameters)
    assert params == ["y_true", "y_pred", "margin", "miner", "normalize", "ref_embeddings",
                      "ref_labels", "ref_offset", "average"]
    x = _embeddings()
    want = _reference(LABELS, x, 0.2)
    np.testing.assert_allclose(to_numpy(cosine_hinge_loss(LABELS, x, 0.2)), want, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(CosineHingeLoss(0.2)(LABELS, x)), want, rtol=1e-5)
    value, grad = value_and_grad(lambda e: cosine_hinge_loss(LABELS, e, margin=0.2), x)
    value_c, grad_c = value_and_grad(lambda e: CosineHingeLoss(margin=0.2)(LABELS, e), x)
    np.testing.assert_array_equal(value, value_c)
    np.testing.assert_array_equal(grad, grad_c)
    with pytest.raises(ValueError, match="`margin` must be a number >= 0"):
        cosine_hinge_loss(LABELS, x, -0.5)
    with pytest.raises(ValueError, match="CosineHingeLoss cannot take `average='halves'`"):
        cosine_hinge_loss(LABELS, x, average="halves")


def test_config_round_trip_and_blocks():
    loss = CosineHingeLoss(0.25, TripletMiner("easy", "semihard"), block_size=3, name="h")
    config = loss.get_config()
    assert config["margin"] == 0.25 and config["block_size"] == 3
    assert config["miner"]["class_name"] == "TripletMiner"
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(again) is CosineHingeLoss and again.get_config() == config
    x = _embeddings()
    dense = CosineHingeLoss(0.25, TripletMiner("easy", "semihard"))
    np.testing.assert_allclose(to_numpy(again(LABELS, x)), to_numpy(dense(LABELS, x)),
                               rtol=1e-6)


def test_nan_in_gives_nan_out_and_no_triplet_gives_zero():
    x = _embeddings()
    x[2, 1] = np.nan
    assert np.isnan(to_numpy(CosineHingeLoss()(LABELS, x)))
    assert np.isnan(to_numpy(cosine_hinge_loss(LABELS, x)))
    alone = np.arange(4, dtype="int32")
    with pytest.warns(UserWarning, match="no anchor of this batch"):
        assert to_numpy(CosineHingeLoss()(alone, _embeddings()[:4])) == 0.0


def test_a_whole_loss_check_sits_in_the_init():
    with pytest.raises(ValueError, match="PNLoss cannot run in blocks"):
        losses.PNLoss(miner=TripletMiner("all", "semihard"), block_size=4)
    assert losses.PNLoss(miner=TripletMiner("hard", "semihard"), block_size=4).block_size == 4


def test_the_state_is_made_with_the_loss_and_follows_its_miner():
    """``make_state`` runs once, at the end of ``__init__``: reading ``state`` makes nothing."""
    assert CosineHingeLoss().state is None  # a deterministic miner: no state
    loss = CosineHingeLoss(miner=TripletMiner("random", "random", seed=1))
    state = loss.state
    assert state is loss.state and state.seed_generators == [loss.miner.seed_generator]
    assert not state.built and state.loss_class_name == "CosineHingeLoss"
    # A miner set while no model owns the loss: its seed becomes the state's.
    loss.miner = TripletMiner("random", "hard", seed=2)
    assert loss.state.seed_generators == [loss.miner.seed_generator]
    loss.miner = TripletMiner("easy", "hard")
    assert loss.state is None


# -- every public loss is declared this way ----------------------------------------------------

#: A docstring line that is a placeholder of :func:`tfdml._docs.fill_doc` left unfilled.
PLACEHOLDER = re.compile(r"^\s*\{[A-Z_]+\}\s*$", re.M)


def _public(kind):
    return [(name, obj) for name, obj in ((n, getattr(losses, n)) for n in losses.__all__)
            if (inspect.isclass(obj) and issubclass(obj, keras.losses.Loss)) == (kind == "class")
            and (kind == "class" or inspect.isfunction(obj))]


@pytest.mark.parametrize("name,cls", _public("class"), ids=[n for n, _ in _public("class")])
def test_every_loss_class_has_a_written_init(name, cls):
    """What type checkers and ``help()`` read: a real ``__init__`` in the source, with named
    arguments (no generated ``__signature__``)."""
    init = cls.__init__
    assert "__signature__" not in vars(init), name
    assert init.__qualname__.split(".")[0] in {c.__name__ for c in cls.__mro__}
    assert re.match(r"def __init__\(\s*self", inspect.getsource(init).lstrip()), name
    kinds = {p.kind for p in inspect.signature(init).parameters.values()}
    assert inspect.Parameter.VAR_POSITIONAL not in kinds, name
    assert not PLACEHOLDER.search(cls.__doc__ or ""), f"{name}: an unfilled placeholder"


@pytest.mark.parametrize("name,fn", _public("function"), ids=[n for n, _ in _public("function")])
def test_every_functional_form_is_a_written_function(name, fn):
    assert "__signature__" not in vars(fn), name
    assert inspect.getsource(fn).lstrip().startswith(("def ", "@")), name
    assert fn.__doc__ and not PLACEHOLDER.search(fn.__doc__), name
