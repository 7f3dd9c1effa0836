"""TrimmedLoss / trim_mask (Shen & Sanghavi 2019) against the naive references of
tests/references.py: the kept anchors, the value (mean over kept anchors of the wrapped
loss's per-anchor values) and its gradient (finite differences with the pairs and the kept
anchors held fixed). The tests marked ``multibackend`` also run under JAX and PyTorch.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import references as ref
from backends import BACKEND, CAN_COMPILE, compiled, to_numpy
from harness import slow_beyond
from keras import ops
from recorded_mining import checked_pairs, run_recorded

from tfdml.losses import (
    ContrastiveLoss,
    MarginLoss,
    MultiSimilarityLoss,
    TrimmedLoss,
    TripletNCALoss,
)
from tfdml.losses.trimmed import trim_mask
from tfdml.miners import Miner, MultiSimilarityMiner, TripletMiner

VALUE_TOL = 1e-5
GRAD_ATOL = 2e-5
GRAD_RTOL = 1e-4
MB = pytest.mark.multibackend

# -- trim_mask -------------------------------------------------------------------------------------


def _trim_mask(losses, valid, trim):
    return to_numpy(trim_mask(ops.convert_to_tensor(np.asarray(losses, np.float32)),
                              ops.convert_to_tensor(np.asarray(valid, bool)), trim))


# The fractions between (slow tier) take the same path as 0.2 and 0.5; the rounding of
# floor(trim * n) has its own cases in test_trim_mask_hand_examples.
@pytest.mark.parametrize("trim", slow_beyond(
    [0.0, 0.1, pytest.param(0.2, marks=MB), 0.25, 0.3, 0.5, 0.7, 0.99],
    {"0.0", "0.2", "0.5", "0.99"}))
def test_trim_mask_matches_reference(trim):
    rng = np.random.default_rng(int(trim * 100))
    # Eager JAX compiles every op for each new shape: fewer sizes there.
    sizes = range(1, 13) if BACKEND == "tensorflow" else (1, 2, 7, 12)
    for size in sizes:
        for _ in range(4):
            # Integer losses: many ties, which must drop the later anchor first.
            losses = rng.integers(0, 4, size=size).astype(np.float32)
            valid = rng.random(size) < 0.8
            got = _trim_mask(losses, valid, trim)
            keep = ref.trim_keep(losses, valid, trim)
            assert set(np.nonzero(got)[0].tolist()) == keep, (losses, valid, trim)
            if valid.any():
                assert got.any()  # never drops every valid anchor


@MB
def test_trim_mask_hand_examples():
    # 5 valid anchors, trim 0.2: exactly one dropped, the highest loss.
    assert _trim_mask([0.5, 2.0, 0.1, 1.0, 0.7], [True] * 5, 0.2).tolist() == [
        True, False, True, True, True]
    # Tie for the highest loss: the later anchor goes.
    assert _trim_mask([3.0, 1.0, 3.0, 0.0, 2.0], [True] * 5, 0.2).tolist() == [
        True, True, False, True, True]
    # Invalid anchors are neither counted nor kept: 4 valid, floor(0.5 * 4) = 2 dropped.
    assert _trim_mask([9.0, 1.0, 5.0, 0.0, 2.0, 7.0], [False, True, True, True, True, False],
                      0.5).tolist() == [False, True, False, True, False, False]
    # floor(trim * n) read as decimals: 0.29 * 100 = 29 (not 28.999...), 0.57 * 100 = 57.
    for trim, drop in ((0.29, 29), (0.57, 57), (0.3, 30)):
        kept = _trim_mask(np.arange(100, dtype=np.float32), [True] * 100, trim)
        assert kept.sum() == 100 - drop and kept[: 100 - drop].all()


# -- TrimmedLoss against references ---------------------------------------------------------------


def _contrastive_case():
    def make(miner):
        return ContrastiveLoss(negative_margin=1.3, miner=miner, average="anchors")

    def reference(labels, e, mined):
        return ref.contrastive_loss(e, mined[0], mined[1], 0.0, 1.3)[1]

    return make, reference, lambda: MultiSimilarityMiner(0.2, "easy")


def _contrastive_all_pairs_case():
    def reference(labels, e, mined):
        pos, neg = ref.label_masks(labels)
        return ref.contrastive_loss(e, pos, neg, 0.2, 1.2)[1]

    return (lambda miner: ContrastiveLoss(0.2, 1.2, average="anchors")), reference, None


def _margin_case():
    def make(miner):
        return MarginLoss(beta=1.1, learn_beta=False, miner=miner, average="anchors")

    def reference(labels, e, mined):
        return ref.margin_triplet_input_loss(labels, e, mined[2], 0.2, 1.1)[1]

    return make, reference, lambda: TripletMiner("easy", "distance_weighted", seed=4)


def _ms_case():
    def make(miner):
        return MultiSimilarityLoss(miner=miner, average="anchors")

    def reference(labels, e, mined):
        return ref.multi_similarity_loss(e, mined[0], mined[1])[1]

    return make, reference, lambda: MultiSimilarityMiner(0.3, "hard")


CASES = {"contrastive_ms_easy": _contrastive_case, "contrastive_all": _contrastive_all_pairs_case,
         "margin_eps_dw": _margin_case, "multi_similarity": _ms_case}
BATCH = ref.make_batch([4, 4, 3, 3, 2], 6, seed=5)  # B=16, D=6


# On every commit each wrapped loss with a trim of 0.2 or 0.5 (trim 0 of each wrapped loss:
# test_trim_zero_equals_wrapped_loss); the other pairs in the slow tier.
@pytest.mark.parametrize("case,trim", slow_beyond(
    [pytest.param(c, t, id=f"{c}-{t}", marks=[MB] if (c, t) == ("margin_eps_dw", 0.2) else [])
     for c in sorted(CASES) for t in [0.0, 0.2, 0.5]],
    {"contrastive_all-0.2", "contrastive_ms_easy-0.5", "margin_eps_dw-0.2",
     "multi_similarity-0.5"}))
def test_trimmed_loss_matches_reference(case, trim):
    make, reference, make_miner = CASES[case]()
    labels, x = BATCH
    x32 = np.asarray(x, np.float32)
    x64 = x32.astype(np.float64)
    value, got_grad, recorder = run_recorded(
        lambda miner, e: TrimmedLoss(make(miner), trim=trim)(labels, e),
        None if make_miner is None else make_miner(), x32)
    mined = None if recorder is None else checked_pairs(recorder, labels)

    per_anchor = reference(labels, x64, mined)
    losses = [per_anchor.get(a, 0.0) for a in range(len(labels))]
    valid = [a in per_anchor for a in range(len(labels))]
    keep = ref.trim_keep(losses, valid, trim)
    assert len(keep) == sum(valid) - int(np.floor(trim * sum(valid) + 1e-9))
    want = ref.mean_of_anchors(per_anchor, keep)
    assert want > 0
    np.testing.assert_allclose(value, want, atol=VALUE_TOL)
    if trim > 0:  # trimming removed the largest losses: the value went down
        assert want < ref.mean_of_anchors(per_anchor) - 1e-4

    # Per anchor: the wrapped loss's value on kept anchors, 0 elsewhere.
    none = TrimmedLoss(make(None if recorder is None else _Replay(recorder.mined)), trim=trim,
                       reduction="none")(labels, x32)
    none = to_numpy(none)
    np.testing.assert_allclose(none, [per_anchor[a] if a in keep else 0.0
                                      for a in range(len(labels))], atol=VALUE_TOL)

    fd = ref.finite_difference_gradient(
        lambda e: ref.mean_of_anchors(reference(labels, e, mined), keep), x64)
    np.testing.assert_allclose(got_grad, fd, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    # The trimmed anchors' terms are really left out of the gradient.
    if trim > 0:
        full = ref.finite_difference_gradient(
            lambda e: ref.mean_of_anchors(reference(labels, e, mined)), x64)
        assert np.abs(full - fd).max() > 1e-3


class _Replay(Miner):
    """Returns a fixed, previously mined result (so a second loss sees the same pairs)."""

    def __init__(self, mined):
        self.mined = type(mined)(*(None if t is None else ops.convert_to_tensor(t)
                                   for t in mined))

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        return self.mined


@pytest.mark.parametrize("make_loss", [
    lambda: ContrastiveLoss(negative_margin=1.2),
    lambda: MultiSimilarityLoss(miner=MultiSimilarityMiner(0.1, "easy")),
    lambda: MarginLoss(learn_beta=False, miner=TripletMiner("easy", "semihard")),
    pytest.param(lambda: TripletNCALoss(order=2, miner=TripletMiner("all", "semihard")),
                 marks=MB),
], ids=["contrastive", "multi_similarity", "margin", "nca"])
def test_trim_zero_equals_wrapped_loss(make_loss):
    labels, x = BATCH
    x32 = np.asarray(x, np.float32)
    results = []
    for loss in (make_loss(), TrimmedLoss(make_loss(), trim=0.0)):
        value, grad, _ = run_recorded(lambda _, e, loss=loss: loss(labels, e), None, x32)
        results.append((value, grad))
    assert results[0][0] > 0
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-7)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6, atol=1e-9)


def test_trimmed_loss_honours_wrapped_normalize():
    """normalize=False on the wrapped loss is honoured (raw embeddings)."""
    labels, x = BATCH
    x32 = np.asarray(0.4 * x, np.float32)
    inner = ContrastiveLoss(0.0, 1.0, distance="squared_l2", normalize=False,
                            average="anchors")
    value = to_numpy(TrimmedLoss(inner, trim=0.25)(labels, x32))
    pos, neg = ref.label_masks(labels)
    _, per_anchor = ref.contrastive_loss(x32.astype(np.float64), pos, neg, 0.0, 1.0,
                                         "squared_l2", normalize=False)
    losses = [per_anchor[a] for a in range(len(labels))]
    keep = ref.trim_keep(losses, [True] * len(labels), 0.25)
    np.testing.assert_allclose(value, ref.mean_of_anchors(per_anchor, keep), atol=VALUE_TOL)


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("trim", [-0.1, 1.0, 1.5, "0.2", None, True, float("nan")])
def test_invalid_trim(trim):
    with pytest.raises(ValueError, match="trim"):
        TrimmedLoss(ContrastiveLoss(), trim=trim)


@pytest.mark.parametrize("loss", [keras.losses.MeanSquaredError(), "contrastive_loss", None,
                                  lambda y, p: 0.0])
def test_non_tfdml_loss_rejected(loss):
    with pytest.raises(ValueError, match="loss"):
        TrimmedLoss(loss)


@MB
def test_trimmed_loss_keeps_the_wrapped_loss_average():
    """Trimming the margin loss keeps its average over the non-zero pair terms (of the kept
    anchors), so trim=0 is the margin loss itself."""
    labels, x = BATCH
    x32 = np.asarray(x, np.float32)
    x64 = x32.astype(np.float64)
    inner = MarginLoss(margin=0.0, beta=1.3, learn_beta=False,
                       miner=TripletMiner("easy", "hard"))
    loss = TrimmedLoss(inner, trim=0.25)
    assert loss.average == inner.average == "nonzero"
    triplets = ref.mine_triplets(ref.margin_scores(x64, distance_kind="l2"), labels,
                                 positive="easy", negative="hard")
    terms = ref.margin_triplet_terms(labels, x64, triplets, 0.0, 1.3)
    means = [float(np.mean(terms[a])) if a in terms else 0.0 for a in range(len(labels))]
    keep = ref.trim_keep(means, [a in terms for a in range(len(labels))], 0.25)
    want = ref.average_terms({a: terms[a] for a in keep}, "nonzero", len(labels))
    np.testing.assert_allclose(to_numpy(loss(labels, x32)), want, atol=VALUE_TOL)
    assert abs(want - ref.average_terms({a: terms[a] for a in keep}, "anchors", 16)) > 1e-3


@MB
@pytest.mark.skipif(not CAN_COMPILE, reason="this backend does not compile")
def test_compiled_equals_eager():
    """Under XLA (tf.function(jit_compile=True) or jax.jit): the eager kept anchors and values."""
    labels, x = BATCH
    x32 = np.asarray(x, np.float32)
    losses = np.array([3.0, 1.0, 3.0, 0.0, 2.0, 5.0, 4.0, 1.0], np.float32)
    valid = np.array([True, True, True, True, True, False, True, True])
    for trim in (0.2, 0.5):
        fn = compiled(lambda v, m, trim=trim: trim_mask(v, m, trim))
        np.testing.assert_array_equal(to_numpy(fn(losses, valid)), _trim_mask(losses, valid, trim))
    loss = TrimmedLoss(ContrastiveLoss(negative_margin=1.3, average="anchors"), trim=0.25,
                       reduction="none")
    want = to_numpy(loss(labels, x32))
    assert np.sum(want > 0) == 12
    got = to_numpy(compiled(lambda y, e: loss(y, e))(labels, x32))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
