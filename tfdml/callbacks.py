"""Keras callbacks that evaluate embeddings during training."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfdml import metrics as _metrics

__all__ = ["RecallAtK"]


class RecallAtK(keras.callbacks.Callback):
    """Writes Recall@K of a validation set into the Keras logs at the end of chosen epochs.

    At the end of the first epoch and of every ``every``-th epoch the model
    being trained embeds ``data`` and :func:`tfdml.metrics.recall_at_k` is
    computed with every validation embedding as a query against all the others (itself
    excluded). The values are added to the epoch's logs as
    ``{prefix}recall@{k}`` (``val_recall@1``, ``val_recall@2``, ...), so that
    ``History``, ``CSVLogger``, ``TensorBoard``, ``EarlyStopping`` and
    ``ModelCheckpoint(monitor="val_recall@1", mode="max")`` see them.

    **Order matters.** Keras calls the callbacks' ``on_epoch_end`` in list order
    with one shared ``logs`` dict, so a callback sees the values only if it
    comes *after* ``RecallAtK`` in ``callbacks=[...]``. The ``History`` that
    ``fit`` adds itself is always last and always sees them. Put ``RecallAtK``
    first: ``callbacks=[RecallAtK(...), CSVLogger(...), EarlyStopping(...)]``.
    A ``CSVLogger`` placed before it writes rows without these columns.

    With ``every > 1`` the first epoch is evaluated as well (epochs 1,
    ``every``, ``2 * every``, ...): ``CSVLogger`` fixes its columns at the first
    epoch, so the values must be in the logs then. Skipped epochs have no
    ``recall@k`` entries: ``CSVLogger`` writes ``NA`` for them,
    ``History.history`` lists the evaluated epochs only, and ``EarlyStopping``
    and ``ModelCheckpoint`` skip them (with a warning); count ``patience`` in
    evaluated epochs (one every ``every``).

    Args:
        data: the validation set: a tuple ``(x, y)`` of arrays (``y`` integer
            class ids) or a ``tf.data.Dataset`` yielding ``(x, y)`` batches
            (extra elements such as sample weights are ignored). A dataset is
            iterated once per evaluation, so ``x`` and ``y`` stay paired even if
            it shuffles.
        ks: the values of K. Defaults to `(1, 2, 4, 8)`.
        every: evaluate at the end of the first epoch and of every
            ``every``-th epoch (epochs ``1, every, 2 * every, ...`` counting
            from 1). Defaults to `1`.
        batch_size: batch size for embedding arrays (a dataset keeps its own
            batches). Defaults to `256`.
        metric: ``"cosine"`` or ``"euclidean"``. Defaults to `"cosine"`.
        prefix: prefix of the log names. Defaults to `"val_"`.
        unmatched: how queries with no other sample of their class count; see
            :func:`tfdml.metrics.recall_at_k`. Defaults to `"miss"`.
        chunk_size: queries per matrix product in the neighbour search.
            Defaults to `1024`.
        verbose: 1 shows a progress bar while embedding and prints the values,
            0 is silent. Defaults to `1`.

    Examples:

    >>> recall = tfdml.callbacks.RecallAtK((x_val, y_val), ks=(1, 2, 4, 8))
    >>> history = model.fit(
    ...     train_ds,
    ...     epochs=20,
    ...     callbacks=[
    ...         recall,  # first, so that the callbacks after it see val_recall@K
    ...         keras.callbacks.CSVLogger("log.csv"),
    ...         keras.callbacks.EarlyStopping("val_recall@1", mode="max", patience=3),
    ...         keras.callbacks.ModelCheckpoint(
    ...             "best.keras", monitor="val_recall@1", mode="max", save_best_only=True
    ...         ),
    ...     ],
    ... )
    >>> history.history["val_recall@1"]
    """

    def __init__(
        self,
        data,
        ks=(1, 2, 4, 8),
        every: int = 1,
        batch_size: int = 256,
        metric: str = "cosine",
        prefix: str = "val_",
        unmatched: str = "miss",
        chunk_size: int = 1024,
        verbose: int = 1,
    ):
        super().__init__()
        self.every = _metrics._check_positive_int("every", every)
        self.batch_size = _metrics._check_positive_int("batch_size", batch_size)
        self.chunk_size = _metrics._check_positive_int("chunk_size", chunk_size)
        _metrics._check_choice("metric", metric, _metrics.METRICS)
        _metrics._check_choice("unmatched", unmatched, _metrics.UNMATCHED)
        _metrics._check_choice("verbose", verbose, (0, 1))
        if not isinstance(prefix, str):
            raise ValueError(f"`prefix` must be a string. Received: prefix={prefix!r}")
        self.ks = _metrics._check_ks(ks, float("inf"))
        self.metric = metric
        self.prefix = prefix
        self.unmatched = unmatched
        self.verbose = verbose
        if isinstance(data, tf.data.Dataset):
            self.data = data
        elif isinstance(data, (tuple, list)) and len(data) == 2:
            x, y = data
            y = np.asarray(y)
            if len(x) != len(y):
                raise ValueError(
                    "`data` must be (x, y) with as many labels as inputs. "
                    f"Received: len(x)={len(x)}, len(y)={len(y)}"
                )
            self.data = (x, y)
        else:
            raise ValueError(
                "`data` must be a tuple (x, y) of arrays or a tf.data.Dataset of (x, y). "
                f"Received: data of type {type(data).__name__}"
            )

    def names(self):
        """The log names this callback writes, e.g. ``["val_recall@1", ...]``."""
        return [f"{self.prefix}recall@{k}" for k in self.ks]

    def _batches(self):
        if isinstance(self.data, tf.data.Dataset):
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
        if isinstance(self.data, tf.data.Dataset):
            n = int(self.data.cardinality())
            return n if n >= 0 else None
        return -(-len(self.data[1]) // self.batch_size)

    def embed(self):
        """Embeds the validation set with the current model; returns ``(embeddings, labels)``."""
        progbar = keras.utils.Progbar(self._num_batches(), verbose=self.verbose,
                                      unit_name="batch")
        embeddings, labels = [], []
        for step, (x, y) in enumerate(self._batches(), start=1):
            out = self.model.predict_on_batch(x)
            if isinstance(out, (list, tuple, dict)):
                raise ValueError(
                    "RecallAtK needs a model with a single embedding output. Received: "
                    f"an output of type {type(out).__name__}"
                )
            embeddings.append(np.asarray(out))
            labels.append(np.asarray(y).reshape(-1))
            progbar.update(step)
        if not embeddings:
            raise ValueError("`data` yielded no batch.")
        return np.concatenate(embeddings), np.concatenate(labels)

    def evaluate(self):
        """Recall@K of the validation set now: ``{"val_recall@1": float, ...}``."""
        embeddings, labels = self.embed()
        values = _metrics.recall_at_k(embeddings, labels, self.ks, metric=self.metric,
                                      chunk_size=self.chunk_size, unmatched=self.unmatched)
        return {name: values[k] for name, k in zip(self.names(), self.ks, strict=True)}

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0 and (epoch + 1) % self.every:
            return
        values = self.evaluate()
        if logs is not None:
            logs.update(values)
        if self.verbose:
            text = " - ".join(f"{name}: {value:.4f}" for name, value in values.items())
            print(f"Epoch {epoch + 1}: {text}")
