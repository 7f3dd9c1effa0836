"""The index: a gallery of embeddings, labels and ids to search (exact or approximate)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfdml._argument_checks import check_int, is_number
from tfdml.search import adding, results, tuning
from tfdml.search import approximate as faiss_api
from tfdml.search.approximate import ADD_BLOCK
from tfdml.search.calibration import SELF_MATCH_SHARE, copies
from tfdml.search.exact import check_metric, neighbours, score_scale
from tfdml.search.results import Lookup, RetrievalResults, gather, without_self
from tfdml.search.store import PLACES, VectorStore
from tfdml.search.tuning import Tuning

#: The search backends of an :class:`Index`.
BACKENDS = ("keras", "faiss")


def _accepts(scores, threshold, metric):
    """Whether each score reaches ``threshold``: ``<=`` for ``"l2"`` distances, ``>=`` else."""
    return scores <= threshold if metric == "l2" else scores >= threshold


#: Where an :class:`Index` keeps its embeddings: :data:`~tfdml.search.store.PLACES` or None.
VECTORS = (*PLACES, None)


class Index:
    """A nearest-neighbour index over embeddings, with optional labels and ids: exact, or
    approximate with a faiss structure.

    Add embeddings (as often as needed), then search: every query is compared
    with every stored embedding, in chunks, so answers are exact and memory is
    bounded by ``chunk_size x (gallery_chunk_size + k)`` scores. Ties go to the
    item added first.

    **Approximate.** With ``approximate`` (a faiss ``index_factory`` string such
    as ``"HNSW32"``, ``"IVF4096,Flat"`` or ``"OPQ32,IVF65536_HNSW32,PQ32"``)
    faiss searches a structure instead: trained on the first add when it needs
    training (or by :meth:`train`), searched with ``parameters`` that
    :meth:`tune` can choose for a target recall of the exact neighbours, its
    candidates optionally re-ranked by their exact scores (``rerank``).

    **Backends.** ``"keras"`` (default) is :func:`neighbours`, in ``keras.ops``
    on the Keras backend's device. ``"faiss"`` searches an exact faiss index
    (``IndexFlatIP`` for ``"cosine"`` and ``"dot"``, ``IndexFlatL2`` for
    ``"l2"``) when ``faiss-cpu`` (or ``faiss-gpu``) is installed, and puts
    equal scores in index order too (faiss does not), fetching more
    candidates until the ties at the ``k``-th place are complete: the same
    answers as the default backend (up to float32 rounding of the scores).
    A search whose ``"l2"`` or ``"dot"`` scores could overflow float32
    (:func:`score_scale`) runs on the default backend.

    **Query buckets.** Under JAX, which compiles each operation again for each
    new input shape, the queries (and added embeddings) are prepared and
    searched in chunks padded with zero rows to one of a few sizes
    (:func:`query_bucket`), each size compiled once as one program, so that
    batches of varying sizes do not compile again; the padding rows never
    reach an answer.

    Args:
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``. Defaults to `"cosine"`.
        chunk_size: queries per matrix product. Defaults to `1024`.
        gallery_chunk_size: stored items per matrix product. Defaults to
            `65536`.
        backend: ``"keras"`` or ``"faiss"``. Defaults to `"keras"`.
        query_buckets: pad each chunk of queries to :func:`query_bucket`
            rows; ``None`` pads under the JAX backend only (TensorFlow and
            PyTorch do not compile these operations). Not saved by
            :meth:`save`. Defaults to `None`.
        approximate: a faiss index factory string, or None for the exact
            index. Implies ``backend="faiss"``. Defaults to `None`.
        parameters: the structure's search parameters (``{"nprobe": 16}``,
            ``{"efSearch": 64}``). Defaults to `None` (faiss's).
        rerank: re-order this many candidates of the structure by their exact
            scores from the stored embeddings. Defaults to `None`.
        vectors: where the float32 embeddings are kept: ``"memory"``,
            ``"disk"`` (a temporary file, read through a memory map) or None
            (nowhere: only the structure's codes; approximate only). Defaults
            to `"memory"`.
        train_size: rows the structure is trained on. Defaults to `None` (64
            per inverted list, at least 65,536).
        seed: seed of the random training sample. Defaults to `0`.

    Examples:

    >>> index = tfdml.search.Index()
    >>> index.add(model.predict(gallery_images), labels=gallery_labels, ids=file_names)
    >>> lookup = index.lookup(model.predict(query_images), k=5)
    >>> lookup.labels[:, 0]      # the nearest item's label for each query
    >>> index.save("gallery.npz")
    >>> index = tfdml.search.Index.load("gallery.npz")
    >>> ann = tfdml.search.Index("cosine", approximate="IVF4096,PQ32", rerank=100,
    ...                          vectors="disk")
    >>> ann.add(batches_of_embeddings_and_labels())
    >>> ann.tune(held_out_embeddings, k=10, target_recall=0.95).parameters
    {'nprobe': 16}
    """

    def __init__(self, metric: str = "cosine", chunk_size: int = 1024,
                 gallery_chunk_size: int = 65536, backend: str = "keras",
                 query_buckets: bool | None = None, approximate: str | None = None,
                 parameters: dict | None = None, rerank: int | None = None,
                 vectors: str | None = "memory", train_size: int | None = None, seed: int = 0):
        if backend not in BACKENDS:
            raise ValueError(f"`backend` must be one of {BACKENDS}. Received: backend={backend!r}")
        if query_buckets is None:
            query_buckets = keras.backend.backend() == "jax"
        if not isinstance(query_buckets, (bool, np.bool_)):
            raise ValueError("`query_buckets` must be True, False or None. "
                             f"Received: query_buckets={query_buckets!r}")
        self.query_buckets = bool(query_buckets)
        self.metric = check_metric(metric)
        self.chunk_size = check_int("chunk_size", chunk_size)
        self.gallery_chunk_size = check_int("gallery_chunk_size", gallery_chunk_size)
        if approximate is not None:
            if not isinstance(approximate, str) or not approximate.strip():
                raise ValueError("`approximate` must be a faiss index factory string such as "
                                 f"\"HNSW32\" or \"IVF1024,Flat\". Received: "
                                 f"approximate={approximate!r}")
            backend = "faiss"
        self.backend = backend
        if backend == "faiss":
            faiss_api.import_faiss()
        if vectors not in VECTORS:
            raise ValueError(f"`vectors` must be one of {VECTORS}. Received: vectors={vectors!r}")
        if vectors is None and approximate is None:
            raise ValueError("An exact index searches its stored embeddings: `vectors` must be "
                             "\"memory\" or \"disk\" unless `approximate` is given. Received: "
                             "vectors=None")
        if rerank is not None:
            check_int("rerank", rerank)
            if approximate is None or vectors is None:
                raise ValueError("`rerank` re-orders an approximate index's candidates by their "
                                 "exact scores: it needs `approximate` and stored `vectors`. "
                                 f"Received: rerank={rerank}, approximate={approximate!r}, "
                                 f"vectors={vectors!r}")
        if train_size is not None:
            check_int("train_size", train_size)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise ValueError(f"`seed` must be an integer. Received: seed={seed!r}")
        self.approximate = approximate
        self.rerank = rerank
        self.train_size = train_size
        self.seed = int(seed)
        self._parameters = dict(parameters or {})
        self._vectors = None if vectors is None else VectorStore(vectors)
        self._structure = None  # faiss: the approximate structure, or the exact flat index
        self._pending = []  # rows waiting for the approximate structure to be trained
        self._size = 0
        self._labels = None  # list of blocks (int64 [n], or bool [n, L] multi-hot), or None
        self._ids = None  # list of blocks, or None
        self._gallery = None  # the stored rows as one backend tensor (exact, in memory)
        self._max_abs = 0.0  # the largest |entry| stored, for score_scale
        self.dim = None

    @property
    def vectors(self) -> str | None:
        """Where the embeddings are kept: ``"memory"``, ``"disk"`` or None (nowhere)."""
        return None if self._vectors is None else self._vectors.place

    @property
    def parameters(self) -> dict:
        """The approximate structure's search parameters (``{"nprobe": 16}``...)."""
        if self._structure is not None and self.approximate is not None:
            return faiss_api.current_parameters(self._structure)
        return dict(self._parameters)

    @property
    def is_trained(self) -> bool:
        """Whether the approximate structure is ready to hold items (an exact index is)."""
        if self.approximate is None:
            return True
        return self._structure is not None and bool(self._structure.is_trained)

    def __len__(self):
        return self._size

    def __repr__(self):
        kind = "" if self.approximate is None else f", approximate={self.approximate!r}"
        return (f"Index(metric={self.metric!r}, backend={self.backend!r}{kind}, "
                f"size={len(self)}, dim={self.dim}, "
                f"labels={self._labels is not None}, ids={self._ids is not None})")

    def _prepare(self, embeddings, name):
        """``[N, D]`` float32 NumPy rows, checked, L2-normalized for ``"cosine"``
        (:func:`~tfdml.search.adding.prepare`, on the host)."""
        return adding.prepare(embeddings, name, self.metric, self.dim,
                              self.approximate is not None, self.query_buckets, self.chunk_size)

    def add(self, embeddings, labels=None, ids=None, verbose=0):
        """Appends embeddings ``[N, D]``, with their labels and ids ``[N]``.

        Labels (``[N]`` integer class ids, or ``[N, L]`` multi-hot label sets of
        0 and 1, the same form and ``L`` for every add) and ids (any integers or
        strings, e.g. file names) are optional, but once the index has them
        every ``add`` must give them, and the other way round.

        ``embeddings`` may also be an iterable of batches (a generator, a
        ``tf.data`` dataset): each an array of embeddings, a tuple
        ``(embeddings, labels)`` or ``(embeddings, labels, ids)``, or a dict with
        those keys; only one batch (and, for an untrained approximate structure,
        its training sample) is held at a time. The batches before one that is
        refused stay added (the error says how many rows).

        An approximate structure that needs training (IVF, PQ) is trained on the
        first add, on ``train_size`` rows: a random sample of an array, or the
        first rows of the batches (shuffle them, or call :meth:`train` first).

        With ``verbose=1`` a progress bar counts the rows added (of batches, or of
        an array of more than 65,536 rows).

        Raises:
            ValueError: for a row with a NaN or an Inf, another embedding size,
                lengths that differ, labels/ids given for some adds only, or too
                few rows to train the approximate structure on.
        """
        if adding.is_batches(embeddings):
            if labels is not None or ids is not None:
                raise ValueError("With batches, give the labels and ids inside each batch "
                                 "(a tuple or a dict), not as `labels=` / `ids=`.")
            return self._add_batches(embeddings, adding.progress(verbose, None))
        if isinstance(embeddings, np.ndarray) and embeddings.ndim == 2 and (
                len(embeddings) > ADD_BLOCK):
            self._add_large(embeddings, labels, ids,
                            adding.progress(verbose, len(embeddings)))
            return None
        self._add_rows(*self._checked(embeddings, labels, ids))
        self._train_pending()
        return None

    def _add_batches(self, batches, progress):
        before, number = len(self), 0
        for batch in batches:
            try:
                self._add_rows(*self._checked(*adding.unpack(batch)))
            except ValueError as err:
                raise ValueError(f"Batch {number}: {err} ({len(self) - before} rows of the "
                                 "earlier batches were added.)") from None
            number += 1
            if progress is not None:
                progress.update(len(self) - before)
        self._train_pending()
        if progress is not None:
            progress.update(len(self) - before, finalize=True)

    def _checked(self, embeddings, labels, ids):
        """``(rows, labels, ids)``: validated, labels as int64."""
        x = self._prepare(embeddings, "embeddings")
        return (x, *self._checked_labels(int(x.shape[0]), labels, ids))

    def _checked_labels(self, n, labels, ids):
        """``(labels, ids)`` for ``n`` rows: validated, labels as int64 (bool ``[n, L]``
        multi-hot), of one form, given to every add or to none."""
        labels = results.added_labels(labels, n, self._labels[0] if self._labels else None)
        _, ids = adding.check_labels_ids(n, None, ids)
        for name, given, stored in (("labels", labels, self._labels), ("ids", ids, self._ids)):
            if len(self) and (given is None) != (stored is None):
                state = "has" if stored is not None else "has no"
                raise ValueError(f"The index {state} {name}: give `{name}` to every add or "
                                 "to none.")
        return labels, ids

    def _add_large(self, x, labels, ids, progress):
        """Adds a large NumPy array block by block (:data:`ADD_BLOCK` rows prepared at a
        time, not a copy of all of it), after checking all of it: all or nothing. An
        untrained structure is trained first on a random ``train_size`` of its rows."""
        labels, ids = self._checked_labels(len(x), labels, ids)
        if self.dim is not None and x.shape[1] != self.dim:
            self._prepare(x[:1], "embeddings")  # the error naming the number of columns
        adding.check_blocks(x, "embeddings", self.metric, self.approximate is not None,
                            ADD_BLOCK)
        if self.approximate is not None and not self.is_trained:
            fresh = self._structure is None
            if fresh:
                self._structure = faiss_api.build(self.approximate, x.shape[1], self.metric,
                                                  self._parameters)
            pick = adding.sample(len(x), self._train_rows(), self.seed)
            try:
                self._fit(self._prepare(x[pick], "embeddings"), "embeddings")
            except ValueError:
                if fresh:
                    self._structure = None
                raise
        for start in range(0, len(x), ADD_BLOCK):
            block = slice(start, start + ADD_BLOCK)
            self._add_rows(self._prepare(x[block], "embeddings"),
                           None if labels is None else labels[block],
                           None if ids is None else ids[block])
            if progress is not None:
                progress.update(min(start + ADD_BLOCK, len(x)))

    def _add_rows(self, x, labels, ids):
        if not len(x) and self.dim is not None:
            return
        if self.approximate is not None and self._structure is None:
            # Built (and its parameters checked) before anything changes: a string faiss
            # refuses leaves the index as it was.
            self._structure = faiss_api.build(self.approximate, int(x.shape[-1]), self.metric,
                                              self._parameters)
        if labels is not None:
            self._labels = self._labels or []
            self._labels.append(labels)
        if ids is not None:
            self._ids = self._ids or []
            self._ids.append(ids)
        self.dim = int(x.shape[-1])
        self._size += len(x)
        self._gallery = None
        if self._vectors is not None:
            self._vectors.append(x)
        if self.metric != "cosine" and x.size:
            self._max_abs = max(self._max_abs, float(np.abs(x).max()))
        if self.approximate is None:
            self._structure = None  # the exact faiss index is rebuilt on the next search
            return
        if self._structure.is_trained:
            faiss_api.add(self._structure, x)
            return
        self._pending.append(x)
        if sum(len(p) for p in self._pending) >= self._train_rows():
            self._train_pending()

    def _train_rows(self) -> int:
        """Rows to train the approximate structure on: ``train_size``, or 64 per inverted
        list (at least 65,536)."""
        if self.train_size is not None:
            return self.train_size
        return max(64 * faiss_api.nlist(self._structure), 65536)

    def _train_pending(self):
        """Trains the structure on the waiting rows (a random ``train_size`` of them) and
        adds them; an empty index again when faiss cannot train on them."""
        if not self._pending:
            return
        rows = np.concatenate(self._pending)
        self._pending = []
        try:
            self._fit(rows, "embeddings")
        except ValueError:
            self._reset()
            raise
        faiss_api.add(self._structure, rows)

    def _fit(self, rows, name):
        """Trains the structure on (a random ``train_size`` of) ``rows``."""
        adding.fit(self._structure, rows, self._train_rows(), self.seed, self.approximate,
                   name)

    def _reset(self):
        """Back to an empty index (same configuration)."""
        place = self.vectors
        if self._vectors is not None:
            self._vectors.close()
            self._vectors = VectorStore(place)
        self._structure, self._pending, self._size = None, [], 0
        self._labels = self._ids = self._gallery = None
        self._max_abs = 0.0

    def train(self, sample):
        """Trains the approximate structure on ``sample`` (``[N, D]`` embeddings) before
        anything is added. It is not added to the index.

        Raises:
            ValueError: for an exact index (nothing to train), an index that already
                holds items, or a sample faiss cannot train on (too few rows).
        """
        if self.approximate is None:
            raise ValueError("An exact index has nothing to train: `train` is for an "
                             "approximate one (Index(approximate=...)).")
        if len(self):
            raise ValueError(f"The index already holds {len(self)} items: train it before "
                             "the first add.")
        x = self._prepare(sample, "sample")
        if not len(x):
            raise ValueError("`sample` is empty. Received: sample.shape=(0, ...)")
        self._structure = faiss_api.build(self.approximate, int(x.shape[1]), self.metric,
                                          self._parameters)
        self.dim = int(x.shape[1])
        self._fit(x, "sample")  # on failure an untrained structure: the next add trains it

    @property
    def embeddings(self) -> np.ndarray:
        """The stored ``[N, D]`` float32 embeddings (L2-normalized for ``"cosine"``);
        a read-only memory map with ``vectors="disk"``.

        Raises:
            ValueError: for an index created with ``vectors=None``.
        """
        if self._vectors is None:
            raise ValueError("This index keeps no embeddings (vectors=None): only its "
                             "approximate structure's codes.")
        return self._vectors.array()

    def rows(self, positions) -> np.ndarray:
        """The stored embeddings at ``positions`` (int positions of any shape; ``[..., D]``
        float32 out), gathered without a copy of the whole index.

        Raises:
            ValueError: for an index created with ``vectors=None``.
        """
        if self._vectors is None:
            raise ValueError("This index keeps no embeddings (vectors=None): only its "
                             "approximate structure's codes.")
        return self._vectors.rows(positions)

    @property
    def labels(self) -> np.ndarray | None:
        """The stored labels, ``[N]`` int64 or ``[N, L]`` bool multi-hot, or None."""
        if self._labels is not None and len(self._labels) > 1:
            self._labels = [np.concatenate(self._labels)]
        return None if self._labels is None else self._labels[0]

    @property
    def ids(self) -> np.ndarray | None:
        """The stored ``[N]`` ids, or None."""
        if self._ids is not None and len(self._ids) > 1:
            self._ids = [np.concatenate(self._ids)]
        return None if self._ids is None else self._ids[0]

    def _check_search(self, k):
        if not self.is_trained:
            raise ValueError("The index's approximate structure is not trained: `add` "
                             "embeddings (the first add trains it) or call `train` before "
                             "searching.")
        if not len(self):
            raise ValueError("The index is empty: `add` embeddings before searching.")
        k = check_int("k", k)
        if k > len(self):
            raise ValueError(f"`k` must be at most the size of the index ({len(self)}). "
                             f"Received: k={k}")
        return k

    def search(self, queries, k: int = 1):
        """The ``k`` nearest stored items of each query.

        Exact, unless the index is approximate: then the structure's candidates
        (``rerank`` of them, re-ordered by their exact scores, when ``rerank`` is
        set), equal scores in index order among them. An approximate structure
        may find fewer than ``k`` items for a query (an IVF index whose probed
        lists hold fewer): the missing slots hold the position ``-1`` and the
        worst score (``-inf`` for similarities, ``inf`` for distances).

        Args:
            queries: ``[Q, D]`` embeddings.
            k: neighbours per query, at most ``len(index)``. Defaults to `1`.

        Returns:
            ``(scores, indices)``: ``[Q, k]`` float32 scores (similarities for
            ``"cosine"`` and ``"dot"``, Euclidean distances for ``"l2"``) and
            int64 positions in the index, nearest first, ties by position.

        Raises:
            ValueError: for an empty or untrained index, a bad ``k``, or a query
                row with a NaN or an Inf.
        """
        k = self._check_search(k)
        q = self._prepare(queries, "queries")  # on the host: chunks go to the device
        if len(q) == 0:  # no query: no neighbour
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        if self.approximate is not None:
            return self._approximate_search(q, k)
        max_abs = max(self._max_abs, float(np.abs(q).max(initial=0.0)))
        # faiss scores in float32 as given: rows that need scaling take the keras path.
        if self.backend == "faiss" and score_scale(max_abs, self.dim, self.metric) == 1.0:
            return self._faiss_search(q, k)
        if self._gallery is None:
            self._gallery = self._stored()
        return self._exact(q, k, self._gallery, max_abs)

    def _stored(self):
        """The stored rows to search: a tensor in memory, or the disk's rows read block by
        block."""
        stored = self._vectors.source()
        return stored if self.vectors == "disk" else ops.convert_to_tensor(stored)

    def _exact(self, q, k, stored, max_abs):
        """The exact ``(scores, indices)`` of prepared queries in ``stored``
        (:func:`~tfdml.search.neighbours`)."""
        scores = np.zeros((len(q), k), np.float32)
        indices = np.zeros((len(q), k), np.int64)
        for start, s, idx in neighbours(q, stored, k, self.metric, False, self.chunk_size,
                                        self.gallery_chunk_size, max_abs, self.query_buckets):
            scores[start:start + len(idx)] = s
            indices[start:start + len(idx)] = idx
        return scores, indices

    def _approximate_search(self, queries, k):
        """The structure's candidates, re-ranked by exact scores with ``rerank``."""
        fetch = min(len(self), max(k, self.rerank or 0))
        rows = self._vectors.rows if self.rerank else None
        if len(queries) <= self.chunk_size:  # one chunk (a single query): no copies
            return faiss_api.candidates(self._structure, np.ascontiguousarray(queries), k,
                                        fetch, self.metric, rows)
        scores = np.zeros((len(queries), k), np.float32)
        indices = np.zeros((len(queries), k), np.int64)
        for start in range(0, len(queries), self.chunk_size):
            chunk = slice(start, start + self.chunk_size)
            scores[chunk], indices[chunk] = faiss_api.candidates(
                self._structure, np.ascontiguousarray(queries[chunk]), k, fetch, self.metric,
                rows)
        return scores, indices

    def _faiss_search(self, queries, k):
        """faiss's exact search, re-sorted so that equal scores come in index order."""
        if self._structure is None:
            self._structure = faiss_api.build_flat(
                self.metric, self.dim, self._vectors.blocks(self.gallery_chunk_size))
        return faiss_api.flat_search(self._structure, queries, k, self.metric)

    def exact_search(self, queries, k: int = 1):
        """:meth:`search` over the stored embeddings, exactly, even in an approximate index.

        Raises:
            ValueError: as :meth:`search`, and for an index that keeps no embeddings.
        """
        if self.approximate is None:
            return self.search(queries, k)
        k = self._check_search(k)
        if self._vectors is None:
            raise ValueError("An exact search needs the stored embeddings; this index keeps "
                             "none (vectors=None).")
        q = self._prepare(queries, "queries")
        return self._exact(q, k, self._stored(), max(self._max_abs,
                                                     float(np.abs(q).max(initial=0.0))))

    def tune(self, queries, k: int = 10, target_recall: float = 0.95) -> Tuning:
        """Sets the fastest search parameters whose recall@k reaches ``target_recall``.

        The exact ``k`` nearest neighbours of ``queries`` are computed from the
        stored embeddings; then the settings of :func:`~tfdml.search.approximate.grid`
        (``nprobe`` = 1, 2, 4, ... for IVF, ``efSearch`` = k, 16, 32, ... for
        HNSW) are tried, cheapest first, each measured by its recall@k of the
        exact neighbours (:func:`neighbour_recall`). The first that reaches the
        target is the fastest that does (each step searches more); it is set on
        the index. When none does, the one with the best recall is set, with
        ``reached=False``. Tune on held-out queries, not on items of the index:
        a query in the index finds itself, and the recall would not hold for
        new queries.

        Args:
            queries: ``[Q, D]`` embeddings that are not in the index.
            k: the neighbours the recall counts. Defaults to `10`.
            target_recall: in ``(0, 1]``. Defaults to `0.95`.

        Returns:
            A :class:`Tuning`.

        Raises:
            ValueError: for an exact index, an index without stored embeddings
                (``vectors=None``), a target outside ``(0, 1]``, a bad ``k``, no
                query, or queries of which at least 10 % are copies of an item of
                the index.
        """
        tuning.check_target_recall(target_recall)
        if self.approximate is None:
            raise ValueError("An exact index has nothing to tune: `tune` sets an approximate "
                             "index's search parameters (Index(approximate=...)).")
        if self._vectors is None:
            raise ValueError("`tune` compares with the exact neighbours, computed from the "
                             "stored embeddings; this index keeps none (vectors=None).")
        _, truth = self.exact_search(queries, k)
        if not len(truth):
            raise ValueError("`tune` needs at least one query. Received: 0 queries")
        same = int(copies(self, queries, truth[:, 0]).sum())
        if same >= SELF_MATCH_SHARE * len(truth):
            raise ValueError(
                f"`queries`: {same} of the {len(truth)} tuning queries are copies of an item "
                "of the index (they find themselves at the best score), so their recall would "
                "not hold for new queries. Tune on held-out queries.")
        chosen = tuning.walk(self._structure, self._approximate_search,
                             self._prepare(queries, "queries"), truth, target_recall)
        self._parameters = dict(chosen.parameters)
        return chosen

    def lookup(self, queries, k: int = 1) -> Lookup:
        """:meth:`search` with the neighbours' labels and ids (see :class:`Lookup`;
        a missing neighbour, position ``-1``, has the label ``-1`` and the id ``-1``
        or ``""``)."""
        scores, indices = self.search(queries, k)
        return Lookup(scores, indices, gather(self.labels, indices), gather(self.ids, indices))

    def retrieve(self, queries, k: int = 10, query_labels=None, query_ids=None,
                 exclude_self: bool = False, min_jaccard=None) -> RetrievalResults:
        """Each query's ``k`` nearest items as :class:`RetrievalResults` (scores,
        positions, labels, ids, and with ``query_labels`` which are correct).

        Args:
            queries: ``[Q, D]`` embeddings.
            k: neighbours per query. Defaults to `10`.
            query_labels: ``[Q]`` labels of the queries (``[Q, L]`` multi-hot for
                an index of multi-hot labels), to mark the correct neighbours
                (the index must have labels). Defaults to `None`.
            query_ids: ``[Q]`` ids of the queries. Defaults to `None`.
            exclude_self: the queries are the index's own items, in order:
                query ``i`` is not its own neighbour. Defaults to `False`.
            min_jaccard: multi-hot labels: a neighbour is correct when the Jaccard
                similarity of its label set and the query's reaches this value in
                ``(0, 1]``. Defaults to `None` (when they share a label).

        Raises:
            ValueError: as :meth:`search`; for ``query_labels`` without labels in
                the index or of another form, lengths that differ, or
                ``exclude_self`` with another number of queries than items.
        """
        k = check_int("k", k)
        extra = int(bool(exclude_self))
        if extra and int(np.shape(queries)[0]) != len(self):
            raise ValueError(f"`exclude_self` needs the index's own {len(self)} items as the "
                             f"queries. Received: {np.shape(queries)[0]} queries")
        if extra and len(self) and k >= len(self):
            raise ValueError(f"`k` must be at most the size of the index minus one "
                             f"({len(self) - 1}) with `exclude_self`: a query is not its own "
                             f"neighbour. Received: k={k}")
        scores, indices = self.search(queries, k + extra)
        if extra:
            scores, indices = without_self(scores, indices, k)
        relevant = None
        if query_labels is not None:
            query_labels, relevant = results.query_relevance(
                self.labels, query_labels, len(indices), extra, min_jaccard)
        if query_ids is not None:
            query_ids = np.asarray(query_ids)
            if query_ids.shape != (len(indices),):
                raise ValueError(f"`query_ids` must have one entry per query ({len(indices)}). "
                                 f"Received: shape {query_ids.shape}")
        return RetrievalResults(self.metric, scores, indices, gather(self.labels, indices),
                                gather(self.ids, indices), query_labels, query_ids, relevant,
                                None if query_labels is None else min_jaccard)

    def match(self, queries, threshold, unknown=-1):
        """The label of each query's nearest item when it is near enough, else ``unknown``.

        Near enough: a similarity ``>= threshold`` (``"cosine"``, ``"dot"``) or a
        distance ``<= threshold`` (``"l2"``); :func:`calibrate` picks a threshold
        for a target precision.

        Args:
            queries: ``[Q, D]`` embeddings.
            threshold: the score a match must reach.
            unknown: the label of a query without a match. Defaults to `-1`
                (with multi-hot labels, the empty set: a row of False).

        Returns:
            ``[Q]`` int64 labels, or ``[Q, L]`` bool label sets for an index of
            multi-hot labels.

        Raises:
            ValueError: when the index has no labels, or for a ``threshold``
                that is not a finite number.
        """
        if not is_number(threshold) or not np.isfinite(threshold):
            raise ValueError(f"`threshold` must be a finite number. Received: threshold={threshold!r}")
        if self._labels is None:
            raise ValueError("`match` needs labels: `add` the embeddings with `labels=`.")
        found = self.lookup(queries, 1)
        near = _accepts(found.scores[:, 0], threshold, self.metric) & (found.indices[:, 0] >= 0)
        return results.matched_labels(found.labels[:, 0], near, unknown)

    def save(self, path):
        """Writes the index to one ``.npz`` file (no pickled objects), whole or not at all;
        an approximate structure is stored in faiss's own serialization inside it."""
        from tfdml.search.persist import save_index

        save_index(self, path)

    @classmethod
    def load(cls, path, backend=None, vectors=None) -> Index:
        """An index saved with :meth:`save` (with its backend and where it keeps its
        embeddings, unless ``backend`` or ``vectors`` is given).

        Raises:
            ValueError: naming the file and the field, for a file that is not a
                complete index: unreadable or truncated, a missing field, or a
                field that does not hold what :meth:`save` writes (2-D finite
                float32 embeddings, unit rows for ``"cosine"``, one integer
                label or multi-hot row and one id per row), an approximate structure written by
                another faiss version, or one whose metric, size or dimension
                disagree with the rest of the file.
        """
        from tfdml.search.persist import load_index

        return load_index(cls, path, backend, vectors)
