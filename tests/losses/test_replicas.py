"""tfdml.losses.replicas without replicas in sync: the loss on the replica's own batch, the
setting checked. (Under a MirroredStrategy of 2 and 4 CPU devices, where the losses gather
the global batch: tests/test_distribute.py, in a child process.)"""

from __future__ import annotations

import numpy as np
import pytest
from backends import to_numpy

from tfdml.losses import replicas

pytestmark = pytest.mark.multibackend


def test_one_replica_scales_nothing_and_gathers_nothing():
    assert replicas.num_replicas() == 1
    assert replicas.context(None) is None and replicas.context(True) is None
    assert replicas.context(False) is None
    np.testing.assert_allclose(to_numpy(replicas.scale(np.float32(3.0))), 3.0)


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum", "none"])
def test_call_over_replicas_is_the_loss_on_the_batch(reduction):
    seen = []

    def loss_value(labels, y_pred, sample_weight):
        seen.append((labels, y_pred, sample_weight))
        return y_pred * 2.0

    y_pred, labels = np.float32(1.5), np.array([0, 1])
    got = replicas.call_over_replicas(loss_value, None, labels, y_pred, None, reduction)
    assert len(seen) == 1 and seen[0][0] is labels and seen[0][1] is y_pred
    np.testing.assert_allclose(to_numpy(got), 3.0)


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_cross_replica_must_be_none_true_or_false(bad):
    with pytest.raises(ValueError, match="cross_replica"):
        replicas.context(bad)
