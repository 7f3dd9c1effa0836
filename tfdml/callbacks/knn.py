"""k-NN classification accuracy of a validation set in the Keras logs: :class:`KNNAccuracy`."""

from __future__ import annotations

from tfdml import metrics as _metrics
from tfdml._argument_checks import check_choice, check_int
from tfdml.callbacks._embedding import EmbeddingCallback, check_data
from tfdml.metrics.knn import check_temperature

__all__ = ["KNNAccuracy"]


class KNNAccuracy(EmbeddingCallback):
    """Writes the k-NN accuracy of a validation set into the Keras logs at chosen epochs.

    At the end of the first epoch and of every ``every``-th epoch the model
    being trained (or ``embedding_model``) embeds a labelled gallery
    (``train_data``) and labelled queries (``validation_data``), and
    :func:`tfdml.metrics.knn_accuracy` gives the share of queries whose class
    the vote of their ``k`` nearest gallery items gets right: the usual
    evaluation of self-supervised embeddings (Wu et al. 2018; DINO's k-NN
    evaluation with ``k=20, temperature=0.07``). The value goes into the
    epoch's logs as ``name`` (``"knn_accuracy"``), where ``History``,
    ``CSVLogger``, ``EarlyStopping`` and ``ModelCheckpoint(monitor=
    "knn_accuracy", mode="max")`` see it.

    As for :class:`RecallAtK`: put this callback *before* the callbacks that
    read its value (Keras calls them in list order with one shared ``logs``);
    with ``every > 1`` the first epoch is evaluated too (epochs ``1, every,
    2 * every, ...``) and skipped epochs have no value. When an embedding of
    either set holds a NaN or an Inf (a diverged model) the value is ``nan``
    for that epoch, with a warning (once per callback), and the training goes on.

    The gallery is embedded whole at each evaluation: its embeddings (``G x D``
    floats) are held on the host with the queries'.

    Args:
        train_data: the labelled gallery: a tuple ``(x, y)`` of arrays (``y``
            integer class ids), or a ``tf.data.Dataset`` or
            ``keras.utils.PyDataset`` of ``(x, y)`` batches that ends (as the
            ``data`` of :class:`RecallAtK`). Often a subset of the training set,
            without augmentation.
        validation_data: the labelled queries, in the same forms.
        k: neighbours that vote. With arrays, a ``k`` above the gallery size
            raises here, before training. Defaults to `20`.
        every: evaluate at the end of the first epoch and of every
            ``every``-th epoch. Defaults to `1`.
        temperature: ``None`` for a plain majority vote, or ``T > 0`` for votes
            weighted by ``exp(similarity / T)`` (see
            :func:`tfdml.metrics.knn_accuracy`). Defaults to `None`.
        metric: ``"cosine"`` or ``"l2"``. Defaults to `"cosine"`.
        name: the log name. Defaults to `"knn_accuracy"`.
        batch_size: batch size for embedding arrays (a dataset keeps its own
            batches). Defaults to `256`.
        chunk_size: queries per matrix product in the neighbour search.
            Defaults to `1024`.
        embedding_model: the model that embeds both sets, e.g. the backbone of
            a model trained through a projection head (its weights are those
            being trained). Defaults to `None` (the model being trained: the
            embedding model of a :class:`tfdml.models.MetricModel`, the backbone
            of a ``tfdml.models.ContrastiveModel``, whose ``predict`` gives them).
        verbose: 1 shows a progress bar while embedding and prints the value,
            2 prints the value, 0 is silent; `"auto"` follows ``fit``'s
            ``verbose``. Defaults to `"auto"`.
        steps: for a dataset ``train_data``, the batches embedded at each
            evaluation. Defaults to `None` (all of them).
        validation_steps: the same for ``validation_data``. Defaults to `None`.

    Raises:
        ValueError: bad arguments, naming them: data without labels or that
            never ends (without steps), ``k`` not an integer >= 1 or (arrays)
            above the gallery size, ``temperature`` not positive.

    Examples:

    >>> knn = tfdml.callbacks.KNNAccuracy((x_train[:10000], y_train[:10000]),
    ...                                   (x_val, y_val), k=20, temperature=0.07)
    >>> model.fit(ds, epochs=100, callbacks=[
    ...     knn,  # first, so that the callbacks after it see knn_accuracy
    ...     keras.callbacks.ModelCheckpoint("best.keras", monitor="knn_accuracy",
    ...                                     mode="max", save_best_only=True),
    ... ])

    Reference:
        Wu, Xiong, Yu, Lin. Unsupervised feature learning via non-parametric
        instance discrimination. CVPR 2018.
    """

    def __init__(self, train_data, validation_data, k: int = 20, every: int = 1,
                 temperature=None, metric: str = "cosine", name: str = "knn_accuracy",
                 batch_size: int = 256, chunk_size: int = 1024, embedding_model=None,
                 verbose="auto", steps=None, validation_steps=None):
        super().__init__()
        self.k = check_int("k", k)
        self.every = check_int("every", every)
        self.batch_size = check_int("batch_size", batch_size)
        self.chunk_size = check_int("chunk_size", chunk_size)
        self.temperature = check_temperature(temperature)
        self.metric = _metrics.check_metric(metric)
        check_choice("verbose", verbose, ("auto", 0, 1, 2))
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string. Received: name={name!r}")
        self.name = name
        self.verbose = verbose
        self.train_data = check_data(train_data, steps)
        self.validation_data = check_data(validation_data, validation_steps)
        if isinstance(self.train_data, tuple) and self.k > len(self.train_data[1]):
            raise ValueError(
                f"`k` asks for {self.k} neighbours, but `train_data` (the gallery) has "
                f"{len(self.train_data[1])} samples. Use a smaller k or more data. "
                f"Received: k={k!r}")
        self.embedding_model = embedding_model
        self.data = None  # the set being embedded, for EmbeddingCallback.embed
        self._warned_nonfinite = False
        self._epoch = None  # the epoch being evaluated, for the warning

    def _predict(self, x):
        model = self.model if self.embedding_model is None else self.embedding_model
        strategy = getattr(self.model, "distribute_strategy", None)
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            # As EmbeddingCallback: predict_on_batch would hand the batch to every replica.
            return model(x, training=False)
        return model.predict_on_batch(x)

    def _embed(self, data):
        self.data = data
        try:
            return self.embed()
        finally:
            self.data = None

    def evaluate(self):
        """The k-NN accuracy now: ``{name: float}`` (``nan`` for non-finite embeddings)."""
        gallery, gallery_labels = self._embed(self.train_data)
        queries, labels = self._embed(self.validation_data)
        if (self._nonfinite(gallery, self._epoch, f"{self.name} is nan for that evaluation")
                or self._nonfinite(queries, self._epoch,
                                   f"{self.name} is nan for that evaluation")):
            return {self.name: float("nan")}
        value = _metrics.knn_accuracy(queries, labels, gallery, gallery_labels, k=self.k,
                                      metric=self.metric, temperature=self.temperature,
                                      chunk_size=self.chunk_size)
        return {self.name: value}
