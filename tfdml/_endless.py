"""Endless datasets given to ``fit``: the ``steps_per_epoch`` they need (:func:`check_steps`)
and the ``shuffle`` Keras ignores for them (:func:`fit_shuffle`).

Both are public as ``tfdml.data.check_steps`` and ``tfdml.data.fit_shuffle`` (for a plain
``keras.Model``); :class:`tfdml.models.MetricModel` calls them in ``fit``.
"""

from __future__ import annotations

import sys

import keras

__all__ = ["check_steps", "fit_shuffle"]


def _endless(data):
    """Whether `data` is a dataset Keras would iterate forever: a `keras.utils.PyDataset`
    whose `num_batches` is None, or a ``tf.data.Dataset`` of infinite cardinality."""
    if isinstance(data, keras.utils.PyDataset):
        return data.num_batches is None
    tf = sys.modules.get("tensorflow")  # a tf.data.Dataset means TensorFlow is imported
    if tf is not None and isinstance(data, tf.data.Dataset):
        return int(data.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    return False


def check_steps(data, steps, name="steps_per_epoch"):
    """`steps`, or a ValueError naming `name` if `data` is endless and `steps` is None.

    Keras iterates an endless dataset (a `PKDataset` with `repeat=True`, any
    `keras.utils.PyDataset` whose `num_batches` is None, `pk_batches(repeat=True)` or
    another ``tf.data.Dataset`` of infinite cardinality) without end when `model.fit` gets
    no `steps_per_epoch`: the first epoch never ends. `PKDataset` cannot see the argument
    it is iterated with, so the check is made where `fit` is called: `MetricModel.fit`
    makes it; with a plain `keras.Model`, call it yourself. Use `name="validation_steps"`
    for `validation_data`, and `name="steps"` for `evaluate` and `predict`.

    Args:
        data: what `fit` (or `evaluate`, `predict`) is given.
        steps: the `steps_per_epoch` (or `validation_steps`, `steps`) given with it, or
            `None`.
        name: the argument's name, for the message. Defaults to `"steps_per_epoch"`.

    Returns:
        `steps`, unchanged.

    Raises:
        ValueError: if `data` is endless and `steps` is None.

    Examples:

    >>> stream = tfdml.data.PKDataset((x, y), 4, 3, seed=0)  # repeat=True: endless
    >>> tfdml.data.check_steps(stream, None)
    Traceback (most recent call last):
    ValueError: `steps_per_epoch` must be given for an endless dataset: ...
    >>> model.fit(stream, epochs=2, steps_per_epoch=tfdml.data.check_steps(stream, 20),
    ...           shuffle=tfdml.data.fit_shuffle(stream))
    """
    if steps is None and _endless(data):
        raise ValueError(
            f"`{name}` must be given for an endless dataset: without it Keras never ends the "
            f"first epoch. Received: {name}=None with {type(data).__name__} "
            f"{data!r:.200} (pass {name}=..., e.g. PKSampler(labels, P, K).steps_per_epoch "
            "for one visit of every class, or build the dataset with repeat=False)"
        )
    return steps


def fit_shuffle(data, shuffle=True):
    """The `shuffle` to give `model.fit`: `False` for an endless `keras.utils.PyDataset`,
    else `shuffle`.

    `model.fit` defaults to `shuffle=True`, and Keras warns "`shuffle=True` was passed, but
    will be ignored since the data `x` was provided as an infinite PyDataset" at every
    `fit` on an endless `PyDataset` (a `PKDataset` with `repeat=True`): it cannot shuffle
    an endless stream. Nothing on the dataset's side changes that (Keras reads only
    `num_batches`); `shuffle=False` is what Keras does anyway, without the warning.
    `MetricModel.fit` passes it; with a plain `keras.Model`, pass `shuffle=False`
    yourself. A finite `PyDataset`'s `shuffle` is kept (Keras shuffles its batch order).

    Args:
        data: what `fit` is given.
        shuffle: the `shuffle` given to `fit`. Defaults to `True` (`fit`'s default).

    Returns:
        `False` for an endless `PyDataset`, else `shuffle`.
    """
    if isinstance(data, keras.utils.PyDataset) and data.num_batches is None:
        return False
    return shuffle
