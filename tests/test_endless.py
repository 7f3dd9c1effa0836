"""tfdml._endless, public as tfdml.data.check_steps and tfdml.data.fit_shuffle: an endless
dataset given to ``fit`` needs ``steps_per_epoch``, and Keras' ``shuffle`` warning is kept
off it."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from backends import BACKEND

import tfdml

tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data path")
LABELS = np.array([0, 0, 1, 1])


def _model(shape):
    model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(4)])
    model.compile("sgd", tfdml.losses.TripletNCALoss(order=2))
    return model


# -- an endless dataset in fit needs steps_per_epoch ----------------------------------------


@pytest.mark.multibackend
def test_check_steps_refuses_an_endless_dataset_without_steps():
    x = np.zeros((4, 2, 2, 1), np.float32)
    endless = tfdml.data.PKDataset((x, LABELS), 2, 2, seed=0)
    finite = tfdml.data.PKDataset((x, LABELS), 2, 2, seed=0, repeat=False)
    with pytest.raises(ValueError, match=r"`steps_per_epoch`.*steps_per_epoch=None"):
        tfdml.data.check_steps(endless, None)
    with pytest.raises(ValueError, match=r"`validation_steps`.*validation_steps=None"):
        tfdml.data.check_steps(endless, None, "validation_steps")
    assert tfdml.data.check_steps(endless, 3) == 3
    assert tfdml.data.check_steps(finite, None) is None
    assert tfdml.data.check_steps((x, LABELS), None) is None
    assert tfdml.data.check_steps(tfdml.data.EvalDataset((x, LABELS), 2), None) is None


@tensorflow_only
def test_check_steps_refuses_an_endless_tf_dataset():
    import tensorflow as tf

    x = np.zeros((4, 2, 2, 1), np.float32)
    with pytest.raises(ValueError, match="`steps_per_epoch`"):
        tfdml.data.check_steps(tfdml.data.pk_batches((x, LABELS), 2, 2, seed=0), None)
    finite = tfdml.data.pk_batches((x, LABELS), 2, 2, seed=0, repeat=False)
    assert tfdml.data.check_steps(finite, None) is None
    unknown = tf.data.Dataset.range(3).filter(lambda i: i > 0)  # may end: not refused
    assert tfdml.data.check_steps(unknown, None) is None


# -- Keras' shuffle warning on an endless PyDataset -------------------------------------------


@pytest.mark.multibackend
def test_fit_shuffle_keeps_keras_from_warning():
    x = np.random.default_rng(0).random((4, 2, 2, 1)).astype(np.float32)
    endless = tfdml.data.PKDataset((x, LABELS), 2, 2, seed=0)
    finite = tfdml.data.PKDataset((x, LABELS), 2, 2, seed=0, repeat=False)
    assert tfdml.data.fit_shuffle(endless) is False
    assert tfdml.data.fit_shuffle(finite) is True and tfdml.data.fit_shuffle(finite, False) is False
    assert tfdml.data.fit_shuffle((x, LABELS)) is True
    model = _model((2, 2, 1))
    with pytest.warns(UserWarning, match="shuffle=True"):  # the warning fit_shuffle avoids
        model.fit(endless, epochs=1, steps_per_epoch=1, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(endless, epochs=1, steps_per_epoch=1, verbose=0,
                  shuffle=tfdml.data.fit_shuffle(endless))
    assert not [w for w in caught if "shuffle" in str(w.message)]
