"""NPairsLoss against a NumPy reference and pytorch-metric-learning 2.9.

The contract tests (config, .keras round trip, compiled = eager, degenerate and non-finite
batches, mixed precision) come from its entry in tests/loss_cases.py.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import references as ref
from backends import reference_gradient, to_numpy, value_and_grad
from pml_data import BATCHES, DATA, recorded, uneven_batch

from tfdml.losses import NPairsLoss, n_pairs_loss
from tfdml.losses.n_pairs import n_pairs_choice

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("float64")]


@pytest.mark.parametrize("normalize", [True, False])
def test_values_and_gradients_match_the_reference(normalize):
    labels, x = uneven_batch()
    loss = NPairsLoss(normalize=normalize, dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)

    def want(e):
        return ref.n_pairs_loss(labels, e, normalize=normalize)

    np.testing.assert_allclose(value, want(x), rtol=1e-12)
    np.testing.assert_allclose(grad, reference_gradient(want, x), rtol=1e-7, atol=1e-9)
    assert np.abs(grad).max() > 1e-3


def test_functional_form_equals_the_class():
    assert list(inspect.signature(n_pairs_loss).parameters)[:2] == ["y_true", "y_pred"]
    labels, x = uneven_batch(1)
    np.testing.assert_allclose(to_numpy(n_pairs_loss(labels, x)),
                               to_numpy(NPairsLoss(dtype="float64")(labels, x)), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(n_pairs_loss(labels, x, normalize=False)),
                               ref.n_pairs_loss(labels, x, normalize=False), rtol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_equals_pytorch_metric_learning(batch):
    labels, x, (want_value, want_grad) = recorded("n_pairs", batch)
    loss = NPairsLoss(dtype="float64")
    value, grad = value_and_grad(lambda e: loss(labels, e), x)
    np.testing.assert_allclose(value, want_value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-7, atol=1e-10)
    # Only the anchors and positives of the chosen pairs get a gradient.
    used = {i for pair in ref.n_pairs_pairs(labels) for i in pair}
    unused = [i for i in range(len(labels)) if i not in used]
    assert np.all(want_grad[unused] == 0.0) and np.all(grad[unused] == 0.0)


def test_the_chosen_pairs_are_each_class_first_and_second_sample():
    """The pairs pml's ``convert_to_pos_pairs_with_unique_labels`` chose (recorded, labels
    in no order; pml lists them by label)."""
    labels = DATA["n_pairs/choice/labels"]
    pml_pairs = sorted(zip(DATA["n_pairs/choice/a"].tolist(), DATA["n_pairs/choice/p"].tolist(),
                           strict=True))
    anchor, positive, columns = (to_numpy(t) for t in n_pairs_choice(labels))
    # Class 4: rows 0, 2; class 2: rows 1, 4; class 0: rows 8, 9; 9, 7 and 5 alone.
    assert pml_pairs == [(0, 2), (1, 4), (8, 9)] == ref.n_pairs_pairs(labels)
    np.testing.assert_array_equal(np.flatnonzero(anchor), [a for a, _ in pml_pairs])
    np.testing.assert_array_equal(np.flatnonzero(columns), [p for _, p in pml_pairs])
    assert [tuple(np.flatnonzero(positive[a]).tolist()) for a, _ in pml_pairs] == [
        (p,) for _, p in pml_pairs]
    # Every row knows its class's positive, anchor or not (none for a singleton class).
    assert np.flatnonzero(positive[7]).tolist() == [2] and not positive[3].any()
    assert np.flatnonzero(positive[10]).tolist() == [4]


def test_other_samples_of_a_class_change_nothing():
    labels, x = uneven_batch(2)
    first_two = [i for i in range(len(labels))
                 if np.sum(labels[:i] == labels[i]) < 2 and np.sum(labels == labels[i]) >= 2]
    value = to_numpy(NPairsLoss(dtype="float64")(labels, x))
    np.testing.assert_allclose(
        value, to_numpy(NPairsLoss(dtype="float64")(labels[first_two], x[first_two])),
        rtol=1e-12)


def test_a_reference_set_holding_the_anchors_is_the_batch():
    labels, x = uneven_batch(3)
    whole = to_numpy(n_pairs_loss(labels, x))
    np.testing.assert_allclose(
        to_numpy(n_pairs_loss(labels, x, ref_embeddings=x, ref_labels=labels, ref_offset=0)),
        whole, rtol=1e-12)
    # The anchors as rows 4.. of a larger reference set: pairs chosen over that set.
    extra_labels = np.array([0, 3, 3, 7], np.int64)
    ref_x = np.concatenate([np.random.default_rng(4).normal(size=(4, x.shape[1])), x])
    ref_labels = np.concatenate([extra_labels, labels])
    got = to_numpy(n_pairs_loss(labels, x, ref_embeddings=ref_x, ref_labels=ref_labels,
                                ref_offset=4))
    want = _pairs_of_rows(ref_labels, ref_x, range(4, 4 + len(labels)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert abs(want - whole) > 1e-3
    with pytest.raises(ValueError, match="ref_offset"):
        n_pairs_loss(labels, x, ref_embeddings=ref_x, ref_labels=ref_labels)


def _pairs_of_rows(labels, x, rows):
    """The reference's per-pair losses over the whole set, averaged over the pairs whose anchor
    is in ``rows``."""
    u = ref.l2_normalize(x)
    pairs = ref.n_pairs_pairs(labels)
    logits = u[[a for a, _ in pairs]] @ u[[p for _, p in pairs]].T
    top = logits.max(axis=1)
    per_pair = top + np.log(np.exp(logits - top[:, None]).sum(axis=1)) - np.diag(logits)
    keep = [i for i, (a, _) in enumerate(pairs) if a in set(rows)]
    return float(np.mean(per_pair[keep]))


def test_degenerate_batches():
    labels, x = uneven_batch(5)
    one_class = np.zeros(5, np.int64)
    value, grad = value_and_grad(lambda e: NPairsLoss(dtype="float64")(one_class, e), x[:5])
    assert value == 0.0 and np.all(grad == 0.0)  # one pair, no negative: log(1)
    singles = np.arange(5, dtype=np.int64)
    with pytest.warns(UserWarning, match="no anchor"):
        value, grad = value_and_grad(lambda e: NPairsLoss(dtype="float64")(singles, e), x[:5])
    assert value == 0.0 and np.all(grad == 0.0)
    dup = x.copy()
    dup[1] = dup[0]
    value, grad = value_and_grad(lambda e: NPairsLoss(dtype="float64")(labels, e), dup)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    bad = x.copy()
    bad[7, 0] = np.nan
    assert np.isnan(to_numpy(n_pairs_loss(labels, bad)))
    assert np.isnan(to_numpy(NPairsLoss(normalize=False)(labels, np.where(np.isnan(bad), np.inf,
                                                                          bad))))


def test_takes_no_block_size_and_keeps_its_config():
    with pytest.raises(TypeError):
        NPairsLoss(block_size=4)
    loss = NPairsLoss(normalize=False, name="np")
    config = loss.get_config()
    assert config["normalize"] is False and "block_size" not in config
    again = NPairsLoss.from_config(config)
    assert again.get_config() == config
