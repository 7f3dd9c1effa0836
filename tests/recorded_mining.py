"""A miner wrapper that records what it mined, and checks of the record against references.

Shared by the parity tests of the pair losses (margin, multi-similarity, contrastive,
trimmed, triplet): the loss runs with a :class:`RecordingMiner`, and the reference loss is
then evaluated on exactly the pairs or triplets the miner chose (random miners included).
Backend-generic (keras.ops and tests/support/backends.py).
"""

from __future__ import annotations

import numpy as np
import references as ref
from backends import BACKEND, to_numpy, value_and_grad
from keras import ops

from tfdml._shims import is_traced
from tfdml.miners import Miner, Pairs


class RecordingMiner(Miner):
    """Delegates to another miner and keeps (as NumPy) the scores it saw and what it returned.

    Nothing is recorded where the scores are traced (JAX's ``value_and_grad``): see
    :func:`run_recorded`.
    """

    def __init__(self, inner):
        self.inner = inner
        self.scores = None
        self.mined = None

    def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
             ref_embeddings=None):
        mined = self.inner.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset,
                                embeddings=embeddings, ref_embeddings=ref_embeddings)
        if not is_traced(scores):
            self.scores = to_numpy(ops.stop_gradient(scores))
            self.mined = type(mined)(*(None if t is None else to_numpy(t) for t in mined))
        return mined


def run_recorded(fn, miner, x32, grad=True):
    """``(value, grad, recorder)`` of ``fn(recorder, x)`` at the float32 embeddings ``x32``.

    ``fn`` builds and calls the loss with the given miner. ``value`` (float32) and
    ``grad`` (None without ``grad``) are NumPy arrays; ``recorder`` holds what the miner
    saw and chose. With ``miner=None`` the loss gets ``miner=None`` and ``recorder`` is
    None. Under JAX the loss runs under ``jax.jit`` (see
    :func:`_jax_value_grad_and_mining`); the other tests cover eager JAX.
    """
    if BACKEND == "jax":
        return _jax_value_grad_and_mining(fn, miner, x32, grad)
    recorder = None if miner is None else RecordingMiner(miner)
    if not grad:
        return to_numpy(fn(recorder, ops.convert_to_tensor(x32))), None, recorder
    value, gradient = value_and_grad(lambda e: fn(recorder, e), x32)
    return value, gradient, recorder


def _jax_value_grad_and_mining(fn, miner, x32, grad):
    """:func:`run_recorded` under JAX: ``jax.jit(jax.value_and_grad(...))`` (without
    ``grad``: ``jax.jit``), the miner's scores and output returned as auxiliary outputs.

    Eager JAX compiles every op, forward and backward, for each new shape: several times
    slower than compiling the whole function once. Random miners draw inside a
    ``keras.StatelessScope`` (their seed state is read, not advanced), so the draws are
    those of a fresh miner.
    """
    import jax
    import keras

    kind = {}

    class Capture(Miner):
        def mine(self, scores, labels, ref_labels=None, ref_offset=0, embeddings=None,
                 ref_embeddings=None):
            mined = miner.mine(scores, labels, ref_labels=ref_labels, ref_offset=ref_offset,
                               embeddings=embeddings, ref_embeddings=ref_embeddings)
            kind["type"] = type(mined)
            kind["outputs"] = (ops.stop_gradient(scores), tuple(mined))
            return mined

    def traced(e):
        with keras.StatelessScope():
            value = fn(None if miner is None else Capture(), e)
        return value, kind.get("outputs")

    x = ops.convert_to_tensor(x32)
    if grad:
        (value, outputs), gradient = jax.jit(jax.value_and_grad(traced, has_aux=True))(x)
    else:
        (value, outputs), gradient = jax.jit(traced)(x), None
    recorder = None
    if miner is not None:
        recorder = RecordingMiner(miner)
        recorder.scores = to_numpy(outputs[0])
        recorder.mined = kind["type"](*(None if t is None else to_numpy(t)
                                        for t in outputs[1]))
    return to_numpy(value), to_numpy(gradient), recorder  # to_numpy(None) is None


def checked_mined(recorder, labels, ref_labels=None, ref_offset=0):
    """The recorded mining result as ``("pairs", pos, neg)`` or ``("triplets", set)``,
    after checking it against the reference miner."""
    inner, mined, scores = recorder.inner, recorder.mined, recorder.scores
    ref_labels = labels if ref_labels is None else ref_labels
    if isinstance(mined, Pairs):
        pos, neg = mined.positive, mined.negative
        want = ref.multi_similarity_pairs(scores, labels, ref_labels, ref_offset,
                                          inner.epsilon, inner.positive)
        np.testing.assert_array_equal(pos, want[0])
        np.testing.assert_array_equal(neg, want[1])
        return "pairs", pos, neg
    arrays = list(mined)
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
    tfdml functional loss (float32 backend tensors), ``ref_kwargs`` to the NumPy reference
    (the same values in float64).
    """
    if ref_set is None:
        return {}, {}, None, 0
    r32, r64 = as_f32(ref_set[0])
    ref_labels, ref_offset = ref_set[1], ref_set[2]
    kwargs = dict(ref_embeddings=ops.convert_to_tensor(r32),
                  ref_labels=ops.convert_to_tensor(ref_labels), ref_offset=ref_offset)
    return kwargs, dict(ref_embeddings=r64), ref_labels, ref_offset
