"""tfdml.losses.state.LossState: variables made once at build, wrapped losses' states as
children, and loading only what fits (the models that own states: test_metric_model)."""

from __future__ import annotations

import numpy as np
import pytest
from keras import ops

from tfdml.losses.state import LossState

pytestmark = pytest.mark.multibackend


class _Bank(LossState):
    """A state with an ``[embedding_dim]`` variable, made by ``make_variables``."""

    def __init__(self, **kwargs):
        super().__init__(needs_embedding_dim=True, **kwargs)
        self.calls = 0

    def make_variables(self, embedding_dim):
        self.calls += 1
        self.bank = self.add_weight(shape=(embedding_dim,), initializer="zeros",
                                    trainable=False, name="bank")


def test_build_makes_the_variables_once_and_builds_the_children():
    child = _Bank(name="child")
    parent = LossState(children=[child, None], name="parent")
    assert parent.needs_embedding_dim and parent.wrapped_states == [child]
    parent.build((None, 5))
    assert parent.built and child.built and child.calls == 1 and child.embedding_dim == 5
    assert tuple(child.bank.shape) == (5,)
    assert any(v is child.bank for v in parent.variables)
    x = ops.ones((2, 5))
    np.testing.assert_array_equal(np.asarray(ops.convert_to_numpy(parent(x))),
                                  np.ones((2, 5)))  # not part of any computation


def test_an_unknown_embedding_size_is_a_value_error_naming_the_loss():
    with pytest.raises(ValueError, match="'needs_dim'.*embedding size"):
        _Bank(name="needs_dim").build(None)


def test_loading_checks_the_loss_class_and_the_shapes():
    saved = _Bank(name="s")
    saved.loss_class_name = "CrossBatchMemory"
    saved.build((None, 4))
    store = {}
    saved.save_own_variables(store)
    other = _Bank(name="s")
    other.loss_class_name = "ProxyAnchorLoss"
    other.build((None, 4))
    with pytest.raises(ValueError, match="state of CrossBatchMemory"):
        other.load_own_variables(store)
    wider = _Bank(name="s")
    wider.loss_class_name = "CrossBatchMemory"
    wider.build((None, 6))
    with pytest.raises(ValueError, match="embedding size 4 in the file, 6 here"):
        wider.load_own_variables(store)
    same = _Bank(name="s")
    same.loss_class_name = "CrossBatchMemory"
    same.build((None, 4))
    saved.bank.assign(np.arange(4, dtype="float32"))
    store = {}
    saved.save_own_variables(store)
    same.load_own_variables(store)
    np.testing.assert_array_equal(np.asarray(ops.convert_to_numpy(same.bank)), np.arange(4))
    assert same.load_problem is None
