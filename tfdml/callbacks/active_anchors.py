"""A warning when training runs on batches in which no anchor has anything to learn from:
:class:`ActiveAnchorsWarning`."""

from __future__ import annotations

import warnings

import keras
import numpy as np

from tfdml._argument_checks import is_number

__all__ = ["ActiveAnchorsWarning"]


class ActiveAnchorsWarning(keras.callbacks.Callback):
    """Warns once when training runs on batches in which no anchor has anything to learn from.

    Reads the fraction that :class:`tfdml.metrics.ActiveAnchors` writes into
    the logs (``monitor``). At the end of a training batch where the epoch's
    fraction so far is at most ``threshold`` (by default: no anchor of any
    batch of the epoch had a triplet or pair), it warns once, saying that the
    loss is 0 and nothing is learned and how to sample batches that have
    positives. If the logs never hold ``monitor``, it warns once that the
    metric is missing.

    Args:
        monitor: the log name of the :class:`tfdml.metrics.ActiveAnchors`
            metric. Defaults to `"active_anchors"`.
        threshold: warn when the fraction is at most this. Defaults to `0.0`.

    Examples:

    >>> loss = tfdml.losses.MultiSimilarityLoss()
    >>> model.compile(optimizer="adam", loss=loss,
    ...               metrics=[tfdml.metrics.ActiveAnchors(loss)])
    >>> model.fit(ds, callbacks=[tfdml.callbacks.ActiveAnchorsWarning()])
    """

    def __init__(self, monitor="active_anchors", threshold=0.0):
        super().__init__()
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"`monitor` must be a log name. Received: monitor={monitor!r}")
        if not is_number(threshold) or not 0.0 <= threshold < 1.0:
            raise ValueError(
                f"`threshold` must be a number in [0, 1). Received: threshold={threshold!r}"
            )
        self.monitor = monitor
        self.threshold = float(threshold)
        self.warned = False

    def on_train_begin(self, logs=None):
        self.warned = False

    def on_train_batch_end(self, batch, logs=None):
        if self.warned:
            return
        logs = logs or {}
        if self.monitor not in logs:
            self.warned = True
            warnings.warn(
                f"ActiveAnchorsWarning: the logs hold no {self.monitor!r}; add "
                "`tfdml.metrics.ActiveAnchors(loss)` to `model.compile(metrics=[...])`.",
                stacklevel=2,
            )
            return
        value = float(np.asarray(logs[self.monitor]))
        if value <= self.threshold:
            self.warned = True
            warnings.warn(
                f"{self.monitor} = {value:.3g} after {batch + 1} training batch(es): "
                + ("no anchor has" if value == 0 else "few anchors have")
                + " a positive and a negative (or a mined pair), so the loss is 0 for them "
                "and nothing is learned from them. Sample batches with several samples of "
                "each class, e.g. tfdml.data.pk_batches(source, classes_per_batch=P, "
                "samples_per_class=K >= 2).",
                stacklevel=2,
            )
