"""Recall@K of a validation set in the Keras logs during training: :class:`RecallAtK`."""

from __future__ import annotations

import numpy as np

from tfdml import metrics as _metrics
from tfdml._argument_checks import check_choice, check_int
from tfdml.callbacks._embedding import EmbeddingCallback, check_data
from tfdml.metrics._neighbours import check_index, prepare, report_index
from tfdml.metrics.retrieval import at_k, check_ks

__all__ = ["RecallAtK"]


class RecallAtK(EmbeddingCallback):
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
        self.ks = check_ks(ks, float("inf"))
        self.metric = metric
        self.prefix = prefix
        self.unmatched = unmatched
        self.verbose = verbose
        self.data = check_data(data, steps)
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
        self.index = None if index is None else check_index(index, metric)
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
        data = prepare(embeddings, labels, None, None, self.metric, self.chunk_size, 65536,
                       self.unmatched, groups=self.groups, index=self.index,
                       multi_label=True)  # [N, L] label sets: a shared label is a match
        values = at_k("recall", data, self.ks, self.chunk_size, 65536,
                                  self.unmatched)
        out = {f"{self.prefix}recall@{k}": values[k] for k in self.ks}
        if self.index is not None:
            out[f"{self.prefix}index_recall"] = report_index(data)
        return out
