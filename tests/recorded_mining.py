"""A miner wrapper that records what it mined, and checks of the record against references.

Shared by the parity tests of the pair losses (margin, multi-similarity, contrastive,
trimmed): the loss runs with a :class:`RecordingMiner`, and the reference loss is then
evaluated on exactly the pairs or triplets the miner chose (random miners included).
"""

from __future__ import annotations

import numpy as np
import references as ref

from tfdml.miners import Miner, Pairs


class RecordingMiner(Miner):
    """Delegates to another miner and keeps the scores it saw and what it returned."""

    def __init__(self, inner):
        self.inner = inner
        self.scores = None
        self.mined = None

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        self.scores = np.asarray(scores)
        self.mined = self.inner.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset,
                                     embeddings=embeddings, ref_embeddings=ref_embeddings)
        return self.mined


def checked_mined(recorder, labels, ref_labels=None, ref_offset=0):
    """The recorded mining result as ``("pairs", pos, neg)`` or ``("triplets", set)``,
    after checking it against the reference miner."""
    inner, mined, scores = recorder.inner, recorder.mined, recorder.scores
    ref_labels = labels if ref_labels is None else ref_labels
    if isinstance(mined, Pairs):
        pos, neg = mined.positive.numpy(), mined.negative.numpy()
        want = ref.multi_similarity_pairs(scores, labels, ref_labels, ref_offset,
                                          inner.epsilon, inner.positive)
        np.testing.assert_array_equal(pos, want[0])
        np.testing.assert_array_equal(neg, want[1])
        return "pairs", pos, neg
    arrays = [None if t is None else t.numpy() for t in mined]
    got = ref.triplet_set(*arrays)
    negative = "random" if inner.negative == "distance_weighted" else inner.negative
    chooser = ref.chooser_from(*arrays, disjoint=inner.disjoint)
    want = ref.mine_triplets(scores, labels, ref_labels, ref_offset, inner.positive, negative,
                             disjoint=inner.disjoint, chooser=chooser)
    assert got == want
    return "triplets", got


def checked_pairs(recorder, labels, ref_labels=None, ref_offset=0):
    """The recorded pairs (or the pairs of the recorded triplets) as ``(pos, neg, triplets)``,
    checked against the reference; ``triplets`` is None for a pair miner."""
    mined = checked_mined(recorder, labels, ref_labels, ref_offset)
    if mined[0] == "pairs":
        return mined[1], mined[2], None
    return (*ref.pairs_from_triplets(mined[1], *recorder.scores.shape), mined[1])


def as_f32(x):
    """``x`` rounded to float32, and the same values in float64 (for the reference)."""
    x32 = np.asarray(x, np.float32)
    return x32, x32.astype(np.float64)


def reference_set_arguments(ref_set):
    """``(kwargs, ref_kwargs, ref_labels, ref_offset)`` for a loss call with ``ref_set``.

    ``ref_set`` is ``(embeddings, labels, offset)`` or None; ``kwargs`` go to the
    tfdml functional loss (float32 tensors), ``ref_kwargs`` to the NumPy reference
    (the same values in float64).
    """
    if ref_set is None:
        return {}, {}, None, 0
    import tensorflow as tf

    r32, r64 = as_f32(ref_set[0])
    ref_labels, ref_offset = ref_set[1], ref_set[2]
    kwargs = dict(ref_embeddings=tf.constant(r32), ref_labels=tf.constant(ref_labels),
                  ref_offset=ref_offset)
    return kwargs, dict(ref_embeddings=r64), ref_labels, ref_offset
