"""Keras callbacks that evaluate embeddings during training."""

from __future__ import annotations

import os
import sys
import warnings

import keras
import numpy as np

from tfdml import metrics as _metrics
from tfdml import ops as dml
from tfdml import search as _search
from tfdml._checks import check_choice, check_int
from tfdml.analysis import scatter as _scatter
from tfdml.metrics import retrieval as _retrieval

__all__ = ["ActiveAnchorsWarning", "RecallAtK", "TripletScatter"]


def _is_tf_dataset(data):
    """Whether ``data`` is a ``tf.data.Dataset``, without importing TensorFlow.

    A dataset exists only once TensorFlow is imported, so TensorFlow is looked up
    in ``sys.modules``: NumPy inputs under JAX or PyTorch never import it.
    """
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


class _PyBatches:
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


def _check_data(data, steps=None):
    """``data`` as ``(x, y)`` with NumPy labels, or a tf.data.Dataset of ``(x, y)`` batches that
    ends (``steps`` of its batches, when given).

    A dataset must have labels (elements of two or more parts) and a known, finite
    cardinality, or ``steps``: embedding one that never ends, at the end of an epoch, would
    hang with growing memory.
    """
    if steps is not None:
        steps = check_int("steps", steps)
    if _is_tf_dataset(data):
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
    if isinstance(data, keras.utils.PyDataset):
        return _PyBatches(data, steps)
    if steps is not None:
        raise ValueError(
            "`steps` is for a dataset; arrays (x, y) are embedded whole. "
            f"Received: steps={steps!r} with data of type {type(data).__name__}"
        )
    if isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = data
        if y is None:
            raise ValueError(
                "`data` must be (x, y) with the labels y: the embeddings are evaluated by "
                "class. Received: y=None"
            )
        dml.cast_labels(y, "y")  # integer class ids of shape [N] or [N, 1]
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
    raise ValueError(
        "`data` must be a tuple (x, y) of arrays, or a tf.data.Dataset or keras.utils.PyDataset "
        "of (x, y) batches. "
        f"Received: data of type {type(data).__name__}"
    )


class _EmbeddingCallback(keras.callbacks.Callback):
    """Embeds ``self.data`` with the model being trained (``batch_size``, ``verbose``)."""

    _fit_verbose = None  # fit's `verbose` while a fit runs

    def on_train_begin(self, logs=None):
        self._fit_verbose = (self.params or {}).get("verbose", 1)

    def on_train_end(self, logs=None):
        self._fit_verbose = None

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
        if isinstance(self.data, _PyBatches):
            yield from self.data
        elif _is_tf_dataset(self.data):
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
        if isinstance(self.data, _PyBatches):
            return len(self.data)
        if _is_tf_dataset(self.data):
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
            labels.append(np.asarray(y).reshape(-1))
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


class RecallAtK(_EmbeddingCallback):
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

    **Non-finite embeddings.** When an embedding of ``data`` holds a NaN or an
    Inf (e.g. the training diverged) Recall@K is undefined and
    :func:`tfdml.metrics.recall_at_k` raises; this callback does not stop the
    training: it writes ``nan`` for each of its log names for that epoch and
    warns (once per callback). ``ModelCheckpoint(mode="max")`` never saves a
    ``nan`` epoch as the best when it starts from
    ``initial_value_threshold=float("-inf")``; without it Keras takes the
    first monitored value as the best, even ``nan``, and then no later value
    compares greater. ``EarlyStopping`` has no such threshold: a ``nan`` at
    its first evaluation becomes its best value.

    Args:
        data: the validation set: a tuple ``(x, y)`` of arrays (``y`` integer
            class ids), or a ``tf.data.Dataset`` or ``keras.utils.PyDataset`` (e.g.
            ``tfdml.data.EvalDataset``) yielding ``(x, y)`` batches
            (extra elements such as sample weights are ignored). A dataset is
            iterated once per evaluation, so ``x`` and ``y`` stay paired even if
            it shuffles. Its size must be known: an infinite dataset (such as
            ``tfdml.data.pk_batches`` with its default ``repeat=True``) or one of
            unknown cardinality (a generator, ``filter``), which would hang the
            end of the epoch, raises a ``ValueError`` unless ``steps`` is given.
            A dataset without labels raises a ``ValueError``.
        ks: the values of K: integers >= 1. With arrays, a K larger than the
            number of other samples a query can see (``len(y) - 1``) raises a
            ``ValueError`` here, before training; with a dataset, whose size is
            known only once it is iterated, at the first evaluation
            (:func:`tfdml.metrics.recall_at_k`). Defaults to `(1, 2, 4, 8)`.
        every: evaluate at the end of the first epoch and of every
            ``every``-th epoch (epochs ``1, every, 2 * every, ...`` counting
            from 1). Defaults to `1`.
        batch_size: batch size for embedding arrays (a dataset keeps its own
            batches). Defaults to `256`.
        metric: ``"cosine"`` or ``"l2"`` (see :func:`tfdml.metrics.recall_at_k`).
            Defaults to `"cosine"`.
        prefix: prefix of the log names. Defaults to `"val_"`.
        unmatched: how queries with no other sample of their class count; see
            :func:`tfdml.metrics.recall_at_k`. Defaults to `"miss"`.
        chunk_size: queries per matrix product in the neighbour search.
            Defaults to `1024`.
        verbose: 1 shows a progress bar while embedding and prints the values,
            2 prints the values, 0 is silent; `"auto"` follows ``fit``'s
            ``verbose`` (1 outside ``fit``). Defaults to `"auto"`.
        steps: for a dataset, the number of its batches embedded at each
            evaluation (``data.take(steps)``, from the start of the dataset
            each time); needed for an infinite dataset or one of unknown
            cardinality. Not for arrays. Defaults to `None` (the whole
            dataset).
        groups: ``[N]`` integer group ids of the validation samples, in the
            order they are embedded; a sample of a query's group is left out
            of its ranking (see :func:`tfdml.metrics.recall_at_k`). Defaults to
            `None`.
        index: an approximate search instead of the exact one, as in
            :func:`tfdml.metrics.recall_at_k` (a faiss factory string or an
            empty ``tfdml.search.Index(approximate=...)``); the logs then also
            hold ``val_index_recall``, its recall of the exact neighbours on
            up to 1,000 sampled queries. Defaults to `None` (exact).

    Raises:
        ValueError: bad arguments, naming them: ``data`` without labels, with
            labels that are not integer class ids, or that never ends (without
            ``steps``); ``ks`` that are not integers >= 1, or (arrays) larger
            than ``len(y) - 1``.

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
    ...             "best.keras", monitor="val_recall@1", mode="max", save_best_only=True,
    ...             initial_value_threshold=float("-inf"),  # never a nan epoch
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
        verbose="auto",
        steps=None,
        groups=None,
        index=None,
    ):
        super().__init__()
        self.every = check_int("every", every)
        self.batch_size = check_int("batch_size", batch_size)
        self.chunk_size = check_int("chunk_size", chunk_size)
        metric = _metrics.check_metric(metric)
        check_choice("unmatched", unmatched, _metrics.UNMATCHED)
        check_choice("verbose", verbose, ("auto", 0, 1, 2))
        if not isinstance(prefix, str):
            raise ValueError(f"`prefix` must be a string. Received: prefix={prefix!r}")
        self.ks = _retrieval._check_ks(ks, float("inf"))
        self.metric = metric
        self.prefix = prefix
        self.unmatched = unmatched
        self.verbose = verbose
        self.data = _check_data(data, steps)
        self.steps = steps
        if isinstance(self.data, tuple):  # the size is known now: check ks before training
            others = len(self.data[1]) - 1
            if max(self.ks) > others:
                raise ValueError(
                    f"`ks` asks for {max(self.ks)} neighbours, but `data` has "
                    f"{len(self.data[1])} samples, so a query (itself excluded) has {others} "
                    f"others to rank. Use smaller K or more data. Received: ks={ks!r}"
                )
        self.groups = None if groups is None else np.asarray(groups)
        self.index = None if index is None else _retrieval._check_index(index, metric)
        self._warned_nonfinite = False
        self._epoch = None  # the epoch being evaluated by on_epoch_end, for the warning

    def names(self):
        """The log names this callback writes, e.g. ``["val_recall@1", ...]`` (and
        ``"val_index_recall"`` with an approximate ``index``)."""
        names = [f"{self.prefix}recall@{k}" for k in self.ks]
        return names + [f"{self.prefix}index_recall"] if self.index is not None else names

    def evaluate(self):
        """Recall@K of the validation set now: ``{"val_recall@1": float, ...}``.

        Every value is ``nan`` when an embedding holds a NaN or an Inf (with a
        warning the first time).
        """
        embeddings, labels = self.embed()
        if self._nonfinite(embeddings, self._epoch,
                           f"{', '.join(self.names())} are nan for that evaluation"):
            return {name: float("nan") for name in self.names()}
        data = _retrieval._prepare(embeddings, labels, None, None, self.metric,
                                   self.chunk_size, 65536, self.unmatched, groups=self.groups,
                                   index=self.index)
        values = _retrieval._at_k("recall", data, self.ks, self.chunk_size, 65536,
                                  self.unmatched)
        out = {f"{self.prefix}recall@{k}": values[k] for k in self.ks}
        if self.index is not None:
            out[f"{self.prefix}index_recall"] = _retrieval._report_index(data)
        return out

    def on_epoch_end(self, epoch, logs=None):
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


class TripletScatter(_EmbeddingCallback):
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
    record are measured again (same indices, :func:`rescore_triplets`) and the
    shares of :func:`tfdml.analysis.movement_statistics` go into the logs as
    ``{prefix}move_up_right``, ``{prefix}move_up_left``,
    ``{prefix}move_down_left``, ``{prefix}move_down_right`` and
    ``{prefix}move_still``. This is the movement over the epochs since the
    previous record, not over one optimizer step as in Section 6.1 (taking an
    extra step inside ``fit`` would change the training); for that use
    :func:`tfdml.analysis.triplet_movement`. With ``movement=True`` the
    triplets are also mined when training begins, so the first epoch has
    values. Put this callback before ``CSVLogger`` or ``EarlyStopping`` in
    ``callbacks=[...]`` for them to see the values (see
    :class:`RecallAtK`).

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
            unknown cardinality raises a ``ValueError`` (see :class:`RecallAtK`)
            unless ``steps`` is given.
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
            record (see :class:`RecallAtK`). Defaults to `None` (the whole
            dataset).

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
        self.data = _check_data(data, steps)
        self.steps = steps
        self.every = _check_every(every)
        _scatter._check_strategies(positive, negative)
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
            _scatter._import_pyplot()  # fail now, not after the first epoch
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
        reference = self._reference if self.movement else None
        points, values = _scatter.record_scatter(
            embeddings, labels, self.positive, self.negative, chunk_size=self.chunk_size,
            seed=self.seed, reference=reference)
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
            self._reference = _scatter.triplet_scatter(
                embeddings, labels, self.positive, self.negative, chunk_size=self.chunk_size,
                seed=self.seed)

    def on_epoch_end(self, epoch, logs=None):
        epoch = epoch + 1
        if not self._due(epoch):
            return
        values = self.record(epoch)
        if logs is not None:
            logs.update(values)


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
        if not dml.is_number(threshold) or not 0.0 <= threshold < 1.0:
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
