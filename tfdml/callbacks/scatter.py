"""The triplet scatter diagram of a data set recorded during training: :class:`TripletScatter`."""

from __future__ import annotations

import os

import numpy as np

from tfdml._argument_checks import check_choice, check_int
from tfdml._pyplot import import_pyplot
from tfdml.analysis import scatter as _scatter
from tfdml.callbacks._embedding import EmbeddingCallback, check_data

__all__ = ["TripletScatter"]

_FILES = ("npz", "png", "grid")


def _check_every(every):
    """An int >= 1, or a non-empty collection of epoch numbers >= 1 (returned as a frozenset)."""
    if isinstance(every, (int, np.integer)) and not isinstance(every, bool):
        return check_int("every", every)
    try:
        epochs = frozenset(every)
    except TypeError:
        epochs = None
    if not epochs or any(
        not isinstance(e, (int, np.integer)) or isinstance(e, bool) or e < 1 for e in epochs
    ):
        raise ValueError(
            "`every` must be an integer >= 1 or a collection of epoch numbers >= 1. "
            f"Received: every={every!r}"
        )
    return frozenset(int(e) for e in epochs)


class TripletScatter(EmbeddingCallback):
    """Records the triplet scatter diagram of a data set during training (Figure 6).

    At the chosen epochs the model being trained embeds the whole of ``data``
    and :func:`tfdml.analysis.triplet_scatter` finds, for every sample, its
    triplet (``positive``, ``negative`` mining over the whole set, itself
    excluded). Epoch ``k`` is the state after ``k`` epochs of training; with
    ``initial=True`` epoch 0, the model before training ("epoch 0 =
    initialization" in the paper), is recorded when training begins.

    Files written to ``output_dir`` (``files`` chooses among them):

    * ``"npz"``: ``{name}_epoch{k:03d}.npz`` with the arrays ``s_ap``, ``s_an``
      (one value per anchor that has a triplet), ``used`` (``[N]`` bool),
      ``anchors``, ``positives``, ``negatives`` (indices into ``data``) and
      ``epoch``;
    * ``"png"``: ``{name}_epoch{k:03d}.png``, the diagram of that epoch;
    * ``"grid"``: ``{name}.png``, the recorded epochs side by side (wrapped
      after ``grid_columns``), rewritten after every recorded epoch.

    Each file is written whole or not at all (a temporary file renamed over
    it), so a run killed during a write leaves the previous version.

    The share of correct triplets (``S_ap > S_an``) goes into the logs as
    ``{prefix}correct``. With ``movement=True`` the triplets of the previous
    record are measured again (same indices,
    :func:`tfdml.analysis.rescore_triplets`) and the shares of
    :func:`tfdml.analysis.movement_statistics` go into the logs as
    ``{prefix}move_up_right``, ``{prefix}move_up_left``,
    ``{prefix}move_down_left``, ``{prefix}move_down_right`` and
    ``{prefix}move_still``. This is the movement over the epochs since the
    previous record, not over one optimizer step as in Section 6.1 (taking an
    extra step inside ``fit`` would change the training); for that use
    :func:`tfdml.analysis.triplet_movement`. With ``movement=True`` the
    triplets are also mined when training begins, so the first epoch has
    values. Put this callback before ``CSVLogger`` or ``EarlyStopping`` in
    ``callbacks=[...]`` for them to see the values (see
    :class:`tfdml.callbacks.RecallAtK`).

    **Non-finite embeddings.** An epoch whose embeddings hold a NaN or an Inf
    (e.g. the training diverged) is not recorded: no file is written, it is
    not added to ``scatters`` or the grid, and ``nan`` goes into the logs
    for each of :meth:`names` (so the ``CSVLogger`` columns stay the same).
    The callback warns the first time and does not stop the training. The
    movement of the next recorded epoch is measured from the last recorded
    one.

    Args:
        data: the data set: a tuple ``(x, y)`` of arrays (``y`` integer class
            ids), or a ``tf.data.Dataset`` or ``keras.utils.PyDataset`` of ``(x, y)``
            batches (iterated once
            per record). A dataset without labels, an infinite one or one of
            unknown cardinality raises a ``ValueError`` (see
            :class:`tfdml.callbacks.RecallAtK`) unless ``steps`` is given.
        every: an int: record after the first epoch and every ``every``-th
            (epochs ``1, every, 2 * every, ...``); or a collection of epoch
            numbers, e.g. ``(5, 10, 15, 40)``. Defaults to `1`.
        output_dir: folder for the files (created if needed). Defaults to
            `"triplet_scatter"`.
        positive: ``"easy"``, ``"hard"`` or ``"random"``. Defaults to `"easy"`.
        negative: ``"hard"``, ``"semihard"``, ``"easy"`` or ``"random"``.
            Defaults to `"hard"` (with ``"easy"``: EPHN, as in Figure 6).
        initial: also record epoch 0 when training begins. Defaults to `True`.
        movement: log movement statistics (see above). Defaults to `False`.
        files: which files to write, a subset of ``("npz", "png", "grid")``.
            ``"png"`` and ``"grid"`` need matplotlib. Defaults to
            `("npz", "png", "grid")`.
        name: file name stem. Defaults to `"triplet_scatter"`.
        region: ``"full"`` or ``"positive"``, see
            :func:`tfdml.analysis.plot_triplet_scatter`. Defaults to `"full"`.
        grid_columns: panels per row of the grid. Defaults to `5`.
        batch_size: batch size for embedding arrays (a dataset keeps its own
            batches). Defaults to `256`.
        chunk_size: anchors per chunk of the mining. Defaults to `1024`.
        prefix: prefix of the log names. Defaults to `"triplet_"`.
        seed: seed of random strategies. Defaults to `None`.
        verbose: 1 shows a progress bar while embedding and prints a line
            per record, 0 is silent. Defaults to `0`.
        steps: for a dataset, the number of its batches embedded at each
            record (see :class:`tfdml.callbacks.RecallAtK`). Defaults to
            `None` (the whole dataset).

    Attributes:
        scatters: ``{epoch: TripletScatterResult}`` of the recorded epochs
            (kept for the grid; with ``"grid"`` not in ``files`` only the
            last one is kept).

    Raises:
        ValueError: bad arguments (see above), including an infinite dataset.
        ImportError: ``"png"`` or ``"grid"`` without matplotlib installed.

    Examples:

    >>> scatter = tfdml.callbacks.TripletScatter(
    ...     (x_train, y_train), every=(5, 10, 15, 40), output_dir="scatter")
    >>> model.fit(train_ds, epochs=40, callbacks=[scatter])
    >>> # scatter/triplet_scatter.png: epochs 0, 5, 10, 15 and 40 side by side
    """

    def __init__(
        self,
        data,
        every=1,
        output_dir: str = "triplet_scatter",
        positive: str = "easy",
        negative: str = "hard",
        initial: bool = True,
        movement: bool = False,
        files=("npz", "png", "grid"),
        name: str = "triplet_scatter",
        region: str = "full",
        grid_columns: int = 5,
        batch_size: int = 256,
        chunk_size: int = 1024,
        prefix: str = "triplet_",
        seed: int | None = None,
        verbose: int = 0,
        steps=None,
    ):
        super().__init__()
        self.data = check_data(data, steps)
        self.steps = steps
        self.every = _check_every(every)
        _scatter.check_strategies(positive, negative)
        if isinstance(files, str):
            files = (files,)
        try:
            files = tuple(files)
        except TypeError:
            files = None
        if files is None or any(f not in _FILES for f in files):
            raise ValueError(
                f"`files` must be a subset of {_FILES}. Received: files={files!r}"
            )
        check_choice("region", region, _scatter.REGIONS)
        for arg, value in (("output_dir", output_dir), ("name", name), ("prefix", prefix)):
            if not isinstance(value, (str, os.PathLike)) or (arg == "name" and not value):
                raise ValueError(f"`{arg}` must be a non-empty string. Received: {arg}={value!r}")
        check_choice("verbose", verbose, (0, 1))
        self.grid_columns = check_int("grid_columns", grid_columns)
        self.batch_size = check_int("batch_size", batch_size)
        self.chunk_size = check_int("chunk_size", chunk_size)
        if "png" in files or "grid" in files:
            import_pyplot()  # fail now, not after the first epoch
        self.output_dir = os.fspath(output_dir)
        self.positive = positive
        self.negative = negative
        self.initial = bool(initial)
        self.movement = bool(movement)
        self.files = files
        self.name = name
        self.region = region
        self.prefix = prefix
        self.seed = seed
        self.verbose = verbose
        self.scatters = {}
        self._writer = _scatter.ScatterFiles(self.output_dir, name, files, positive, negative,
                                            region=region, grid_columns=self.grid_columns)
        self._reference = None  # triplets of the previous record, for movement
        self._began = False
        self._warned_nonfinite = False

    def names(self):
        """The log names this callback writes."""
        names = [f"{self.prefix}correct"]
        if self.movement:
            names += [f"{self.prefix}move_{d}" for d in _scatter.DIRECTIONS]
        return names

    def path(self, epoch=None, ext="png"):
        """Path of the file of ``epoch`` (``None``: the grid)."""
        return self._writer.path(epoch, ext)

    def _triplet_scatter(self, embeddings, labels):
        return _scatter.triplet_scatter(embeddings, labels, self.positive, self.negative,
                                        chunk_size=self.chunk_size, seed=self.seed)

    def _due(self, epoch):
        if isinstance(self.every, frozenset):
            return epoch in self.every
        return epoch == 1 or epoch % self.every == 0

    def record(self, epoch):
        """Embeds ``data``, writes the files of ``epoch`` and returns its log values.

        When an embedding holds a NaN or an Inf nothing is recorded and every
        value is ``nan`` (with a warning the first time).
        """
        embeddings, labels = self.embed()
        if self._nonfinite(embeddings, epoch, "that epoch is not recorded (its log values "
                           "are nan)"):
            if self.verbose:
                print(f"Triplet scatter, epoch {epoch}: not recorded (non-finite embeddings)")
            return {name: float("nan") for name in self.names()}
        points = self._triplet_scatter(embeddings, labels)
        values = _scatter.scatter_values(points, embeddings,
                                         self._reference if self.movement else None)
        values = {f"{self.prefix}{key}": value for key, value in values.items()}
        self._reference = points
        if "grid" not in self.files:
            self.scatters.clear()
        self.scatters[epoch] = points
        self._writer.write(epoch, self.scatters)
        if self.verbose:
            text = " - ".join(f"{k}: {v:.4f}" for k, v in values.items())
            print(f"Triplet scatter, epoch {epoch}: {text}")
        return values

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._began or self.scatters or self._reference is not None:
            return  # a later fit() continues the record
        self._began = True
        if self.initial:
            self.record(0)
        elif self.movement:
            embeddings, labels = self.embed()
            if self._nonfinite(embeddings, 0, "the triplets for the movement are mined at "
                               "the first recorded epoch instead"):
                return
            self._reference = self._triplet_scatter(embeddings, labels)

    def on_epoch_end(self, epoch, logs=None):
        epoch = epoch + 1
        if not self._due(epoch):
            return
        values = self.record(epoch)
        if logs is not None:
            logs.update(values)
