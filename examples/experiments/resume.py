"""Resumable runs: the state saved after every epoch (:class:`ResumeState`), the best
epoch's weights, both written whole or not at all, and the settings a run resumes with."""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings

import keras
import numpy as np

from experiments.report import atomic_write_json, write_csv
from tfdml._files import atomic_path

__all__ = ["ResumeState"]


def _save_weights(model, path):
    """``model.save_weights(path)``, written whole or not at all (a temporary file beside
    ``path``, flushed and renamed over it): a kill during the save leaves the old file."""
    with atomic_path(path) as tmp:
        model.save_weights(tmp)


class _BestWeights(keras.callbacks.Callback):
    """The weights of the epoch with the largest ``monitor`` so far, never a NaN epoch.

    What ``ModelCheckpoint(filepath, monitor, mode="max", save_best_only=True,
    save_weights_only=True, initial_value_threshold=float("-inf"))`` keeps, but
    written whole or not at all: a kill during a save leaves the previous best
    file (``ModelCheckpoint`` writes in place, and a kill then leaves a truncated
    file that fails to load). It saves on a strict improvement only, so among
    equal values the earliest epoch is kept; starting from ``-inf`` a NaN is
    never an improvement (Keras' default start, ``None``, would take a first NaN
    as the best, which nothing then exceeds).

    Attributes:
        filepath: the ``.weights.h5`` file.
        monitor: the log name maximized.
        best: the best value so far (``-inf`` before the first save).
    """

    def __init__(self, filepath, monitor):
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.best = float("-inf")

    def on_epoch_end(self, epoch, logs=None):
        current = (logs or {}).get(self.monitor)
        if current is None:
            warnings.warn(f"The best weights are saved by {self.monitor!r}, which the logs of "
                          f"epoch {epoch + 1} do not hold; skipping.", stacklevel=2)
            return
        current = float(np.asarray(current))
        if current > self.best:  # False for NaN
            _save_weights(self.model, self.filepath)
            self.best = current  # once saved: after a failed save the file holds the old best


def best_checkpoint(path, monitor):
    """The callback keeping the best weights by ``monitor`` (maximized), never a NaN epoch,
    written whole or not at all (:class:`_BestWeights`)."""
    return _BestWeights(path, monitor)


class ResumeState(keras.callbacks.Callback):
    """Saves everything needed to continue training after every epoch; restores it.

    After each finished epoch it writes a checkpoint folder ``ckpt-<epoch>`` in
    ``directory`` with the model weights (``model.weights.h5``, which Keras
    writes with the optimizer's variables, step count and momenta, and the
    state of the loss a :class:`tfdml.models.MetricModel` owns, such as a learned
    margin β or a random miner's seed), then
    commits it by replacing ``state.json`` (finished epochs, the logs of each
    epoch, the best monitored value so far) atomically, then deletes the older
    folder. A kill at any moment leaves a consistent last finished epoch.
    ``history_csv`` (if given) is rewritten from the same record, so it never
    holds an epoch twice.

    :meth:`restore` (before ``fit``) loads them and returns the epoch to pass
    as ``initial_epoch`` to ``fit`` and to the P x K sampler, so the resumed
    run draws the batches the uninterrupted run would have drawn. An epoch
    that was interrupted part-way is run again from its start; no finished
    epoch is lost or repeated. The seed of a random miner is restored with the
    weights when a ``MetricModel`` owns it (as :func:`run` arranges); the random
    state of dropout is not.

    Args:
        directory: where to keep the state.
        config: a JSON-able dict of the run's settings; resuming with other
            settings raises a ValueError.
        checkpoint: a ``keras.callbacks.ModelCheckpoint`` whose ``best``
            value is saved and restored.
        history_csv: path of a CSV file of the epoch logs.
    """

    def __init__(self, directory, config=None, checkpoint=None, history_csv=None):
        super().__init__()
        self.directory = directory
        self.config = config
        self.checkpoint = checkpoint
        self.history_csv = history_csv
        self.history = []
        os.makedirs(directory, exist_ok=True)

    @property
    def _state_path(self):
        return os.path.join(self.directory, "state.json")

    def load_state(self):
        """``state.json`` as a dict, or None when there is no saved epoch."""
        if not os.path.exists(self._state_path):
            return None
        with open(self._state_path) as f:
            return json.load(f)

    def restore(self, model) -> int:
        """Loads the saved state into ``model`` (compiled); returns the finished epochs."""
        state = self.load_state()
        if state is None:
            return 0
        if self.config is not None and state.get("config") not in (None, self.config):
            changed = sorted(k for k in set(self.config) | set(state["config"])
                             if self.config.get(k) != state["config"].get(k))
            raise ValueError(
                f"{self.directory} holds a run with other settings ({', '.join(changed)}). "
                "Use another --output-dir, or delete it to start again."
            )
        folder = os.path.join(self.directory, state["checkpoint"])
        opt = model.optimizer
        if not opt.built:  # so that the weights file's optimizer part has somewhere to go
            opt.build(model.trainable_variables)
        model.load_weights(os.path.join(folder, "model.weights.h5"))  # optimizer included
        self.history = list(state["history"])
        if self.checkpoint is not None and state.get("best") is not None:
            self.checkpoint.best = state["best"]
        return int(state["epoch"])

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(v) for k, v in (logs or {}).items()
                if isinstance(v, (int, float, np.floating, np.integer))
                or (hasattr(v, "shape") and not v.shape)}
        self.history.append({"epoch": epoch + 1, **logs})
        name = f"ckpt-{epoch + 1}"
        folder = os.path.join(self.directory, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        _save_weights(self.model, os.path.join(folder, "model.weights.h5"))
        best = None if self.checkpoint is None else self.checkpoint.best
        if best is not None and not np.isfinite(best):
            best = None
        atomic_write_json(self._state_path, {"epoch": epoch + 1, "checkpoint": name,
                                             "history": self.history, "best": best,
                                             "config": self.config})
        for other in os.listdir(self.directory):
            if other.startswith("ckpt-") and other != name:
                shutil.rmtree(os.path.join(self.directory, other), ignore_errors=True)
        if self.history_csv:
            write_csv(self.history_csv, self.history)


def resume_config(args, name):
    """The settings a run is resumed with (``config.json``): the flags and the method's name."""
    # Not part of what a run computes: a run may resume with other values of these.
    skip = {"verbose", "output_dir", "export", "epochs", "eval_batch_size", "strategy",
            "logical_cpus"}
    config = {k: v for k, v in vars(args).items() if k not in skip and not k.startswith("_")}
    config["name"] = name
    return json.loads(json.dumps(config, default=str))


def handle_sigterm():
    """SIGTERM ends the run like Ctrl-C (the last finished epoch is saved already)."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass
