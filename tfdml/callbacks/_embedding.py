"""The plumbing the evaluation callbacks share: the checked validation data (arrays, a
``tf.data.Dataset`` or a ``keras.utils.PyDataset`` of ``(x, y)`` batches that ends) and
:class:`EmbeddingCallback`, which embeds it with the model being trained."""

from __future__ import annotations

import sys
import warnings

import keras
import numpy as np

from tfdml import ops as dml
from tfdml import search as _search
from tfdml._argument_checks import check_int
from tfdml._labels import is_multi_label

__all__ = ["EmbeddingCallback", "PyBatches", "check_data", "is_tf_dataset"]


def is_tf_dataset(data):
    """Whether ``data`` is a ``tf.data.Dataset``, without importing TensorFlow.

    A dataset exists only once TensorFlow is imported, so TensorFlow is looked up
    in ``sys.modules``: NumPy inputs under JAX or PyTorch never import it.
    """
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


class PyBatches:
    """The ``(x, y)`` batches of a ``keras.utils.PyDataset`` (e.g. ``tfdml.data.EvalDataset``):
    ``steps`` of them, or all of a finite one."""

    def __init__(self, data, steps):
        self.data = data
        self.size = data.num_batches if steps is None else steps
        if self.size is None:
            raise ValueError(
                "`data` is an endless keras.utils.PyDataset (num_batches is None), so "
                "embedding it would never end. Pass `steps` (the batches embedded at each "
                "evaluation) or a finite one, e.g. tfdml.data.EvalDataset(...). Received: "
                f"data={data!r}"
            )

    def __len__(self):
        return self.size

    def __iter__(self):
        for index in range(self.size):
            element = self.data[index]
            if not isinstance(element, (tuple, list)) or len(element) < 2:
                raise ValueError(
                    "`data` must give (x, y) batches: the labels y are needed to evaluate "
                    f"the embeddings. Received: a batch of type {type(element).__name__}"
                )
            yield element[0], element[1]


def _check_dataset(data, steps):
    """A ``tf.data.Dataset`` of ``(x, y)`` batches that ends: ``steps`` of its batches, or
    all of a dataset of known, finite cardinality."""
    import tensorflow as tf

    spec = data.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) < 2:
        raise ValueError(
            "`data` must be a tf.data.Dataset of (x, y) batches: the labels y are needed "
            "to evaluate the embeddings, and this dataset yields no labels. Received: data "
            f"with element_spec={spec!r}"
        )
    if steps is not None:
        return data.take(steps)
    cardinality = int(data.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "`data` is an infinite tf.data.Dataset, so embedding it would never end. "
            "Pass `steps` (the batches embedded at each evaluation), or a finite dataset: "
            "`tfdml.data.eval_batches(...)` (every example once), "
            "`tfdml.data.pk_batches(..., repeat=False)` (one epoch of P x K batches), "
            "or `dataset.take(steps)`. Received: data with "
            "cardinality tf.data.INFINITE_CARDINALITY"
        )
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        raise ValueError(
            "`data` is a tf.data.Dataset of unknown cardinality (from a generator, or "
            "after `filter`), which may never end: embedding it at the end of an epoch "
            "would then hang with growing memory. Pass `steps` (the batches embedded at "
            "each evaluation), or state its size: "
            "`dataset.apply(tf.data.experimental.assert_cardinality(num_batches))`. "
            "Received: data with cardinality tf.data.UNKNOWN_CARDINALITY"
        )
    return data


def _check_arrays(x, y):
    """``(x, y)`` with ``y`` as a NumPy array of integer class ids, one per input."""
    if y is None:
        raise ValueError(
            "`data` must be (x, y) with the labels y: the embeddings are evaluated by "
            "class. Received: y=None"
        )
    dml.cast_labels(y, "y")  # class ids of shape [N] or [N, 1], or [N, L] multi-hot sets
    y = np.asarray(y)
    try:
        size = len(x)
    except TypeError:
        raise ValueError(
            "`data` must be (x, y) with x an array (or arrays) of inputs. Received: x of "
            f"type {type(x).__name__}"
        ) from None
    if size != len(y):
        raise ValueError(
            "`data` must be (x, y) with as many labels as inputs. "
            f"Received: len(x)={size}, len(y)={len(y)}"
        )
    return (x, y)


def check_data(data, steps=None):
    """``data`` as ``(x, y)`` with NumPy labels, or a tf.data.Dataset of ``(x, y)`` batches that
    ends (``steps`` of its batches, when given), or a :class:`PyBatches`.

    A dataset must have labels (elements of two or more parts) and a known, finite
    cardinality, or ``steps``: embedding one that never ends, at the end of an epoch, would
    hang with growing memory.

    Args:
        data: a tuple ``(x, y)`` of arrays, or a ``tf.data.Dataset`` or
            ``keras.utils.PyDataset`` of ``(x, y)`` batches.
        steps: for a dataset, the batches embedded at each evaluation. Defaults to
            `None` (all of them).

    Returns:
        The data, ready for :meth:`EmbeddingCallback.embed`.

    Raises:
        ValueError: data without labels, with labels that are not integer class ids, a
            dataset that may never end (without ``steps``), or ``steps`` with arrays.
    """
    if steps is not None:
        steps = check_int("steps", steps)
    if is_tf_dataset(data):
        return _check_dataset(data, steps)
    if isinstance(data, keras.utils.PyDataset):
        return PyBatches(data, steps)
    if steps is not None:
        raise ValueError(
            "`steps` is for a dataset; arrays (x, y) are embedded whole. "
            f"Received: steps={steps!r} with data of type {type(data).__name__}"
        )
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _check_arrays(*data)
    raise ValueError(
        "`data` must be a tuple (x, y) of arrays, or a tf.data.Dataset or keras.utils.PyDataset "
        "of (x, y) batches. "
        f"Received: data of type {type(data).__name__}"
    )


class EmbeddingCallback(keras.callbacks.Callback):
    """Embeds ``self.data`` with the model being trained (``batch_size``, ``verbose``)."""

    _fit_verbose = None  # fit's `verbose` while a fit runs

    def on_train_begin(self, logs=None):
        self._fit_verbose = (self.params or {}).get("verbose", 1)

    def on_train_end(self, logs=None):
        self._fit_verbose = None

    def on_epoch_end(self, epoch, logs=None):
        """At the end of the first epoch and of every ``every``-th one: the values of
        ``self.evaluate()`` into ``logs``, and printed (``verbose``)."""
        if epoch > 0 and (epoch + 1) % self.every:
            return
        self._epoch = epoch + 1
        try:
            values = self.evaluate()
        finally:
            self._epoch = None
        if logs is not None:
            logs.update(values)
        if self._verbosity():
            text = " - ".join(f"{name}: {value:.4f}" for name, value in values.items())
            print(f"Epoch {epoch + 1}: {text}")

    def _verbosity(self):
        """0 (silent), 1 (progress bar and values) or 2 (values only).

        ``verbose="auto"`` follows ``fit``'s ``verbose`` (``self.params``, set by
        Keras): silent under ``fit(verbose=0)``, values only under ``verbose=2``;
        outside ``fit``, 1.
        """
        if self.verbose != "auto":
            return self.verbose
        if self._fit_verbose is None:
            return 1
        return 1 if self._fit_verbose == "auto" else int(self._fit_verbose)

    def _batches(self):
        if isinstance(self.data, PyBatches):
            yield from self.data
        elif is_tf_dataset(self.data):
            for element in self.data:
                if not isinstance(element, (tuple, list)) or len(element) < 2:
                    raise ValueError(
                        "`data` must yield (x, y) batches. Received an element of type "
                        f"{type(element).__name__}"
                    )
                yield element[0], element[1]
        else:
            x, y = self.data
            for start in range(0, len(y), self.batch_size):
                yield x[start : start + self.batch_size], y[start : start + self.batch_size]

    def _num_batches(self):
        if isinstance(self.data, PyBatches):
            return len(self.data)
        if is_tf_dataset(self.data):
            n = int(self.data.cardinality())
            return n if n >= 0 else None
        return -(-len(self.data[1]) // self.batch_size)

    def _predict(self, x):
        strategy = getattr(self.model, "distribute_strategy", None)
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            # Under a strategy with several replicas predict_on_batch hands the whole
            # batch to every replica (and returns it once per replica): call the model.
            return self.model(x, training=False)
        return self.model.predict_on_batch(x)

    def embed(self):
        """Embeds ``data`` with the current model; returns ``(embeddings, labels)``."""
        progbar = keras.utils.Progbar(self._num_batches(), verbose=int(self._verbosity() == 1),
                                      unit_name="batch")
        embeddings, labels = [], []
        for step, (x, y) in enumerate(self._batches(), start=1):
            out = self._predict(x)
            if isinstance(out, (list, tuple, dict)):
                raise ValueError(
                    f"{type(self).__name__} needs a model with a single embedding output. "
                    f"Received: an output of type {type(out).__name__}"
                )
            if not isinstance(out, np.ndarray):
                out = keras.ops.convert_to_numpy(out)
            embeddings.append(out)
            y = np.asarray(y)
            labels.append(y if is_multi_label(y) else y.reshape(-1))  # [n, L] label sets
            progbar.update(step)
        if not embeddings:
            raise ValueError("`data` yielded no batch.")
        return np.concatenate(embeddings), np.concatenate(labels)

    def _nonfinite(self, embeddings, epoch, consequence):
        """True if a row of ``embeddings`` holds a NaN or an Inf; warns the first time."""
        bad = _search.nonfinite_rows(embeddings)
        if not len(bad):
            return False
        if not self._warned_nonfinite:
            self._warned_nonfinite = True
            when = "" if epoch is None else f"at epoch {epoch} "
            warnings.warn(
                f"{type(self).__name__}: {when}{len(bad)} of the {len(embeddings)} "
                "embeddings of `data` are not finite (NaN or Inf; the model may have "
                f"diverged), so {consequence}. This warning is shown once; later epochs with "
                "non-finite embeddings are handled the same way.",
                stacklevel=3,
            )
        return True
