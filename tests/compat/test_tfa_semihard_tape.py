"""tfdml.compat.tfa.triplet_semihard_loss in eager mode: the tape does not record the selection.

A recorded op keeps its inputs until ``tape.gradient``; the semi-hard selection (sorts, counts,
masks over the ``[B, B]`` distances) must not be recorded, or eager mode needs far more memory
than a ``tf.function`` (benchmarks/tfa_memory.py). Nothing recorded may hold on to the distance
matrix: the loss keeps only its gradient w.r.t. the distances.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import references as ref
import tensorflow as tf

from tfdml.compat import tfa

LABELS = ref.make_labels([4, 3, 2, 2, 1], seed=8)  # B=12, with a singleton
X = np.random.default_rng(21).normal(size=(12, 5)) * 1.7


@pytest.mark.parametrize("squared", [False, True])
def test_tape_keeps_no_distance_intermediates(squared):
    kept = []

    def metric(embeddings):
        dist = tfa.pairwise_distance(embeddings, squared=squared)
        kept.append(weakref.ref(dist))
        return dist

    x = tf.constant(X, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = tfa.triplet_semihard_loss(LABELS, x, 0.5, metric)
    assert kept[0]() is None, "an op recorded on the tape still holds the distance matrix"
    grad = tape.gradient(value, x)

    @tf.function
    def compiled(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = tfa.triplet_semihard_loss(LABELS, x, 0.5, metric)
        return value, tape.gradient(value, x)

    want_value, want_grad = compiled(x)
    np.testing.assert_array_equal(value.numpy(), want_value.numpy())
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-6, atol=1e-7)
    assert np.any(grad.numpy() != 0.0)
