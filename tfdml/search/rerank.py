"""A pairwise re-ranker: a small Keras model that re-orders the top of each retrieval list.

A first search ranks the gallery by one similarity of the embeddings. A re-ranker looks
at each (query, candidate) pair among the first ``top_n`` of a list and scores how likely
the two are of one class, from features of the pair; the ``top_n`` are then put in the
order of those scores. It is trained on *mined* pairs: each training item with the
items a first search puts among its ``top_n`` nearest (itself excluded), labelled same
class or not: the pairs it will be asked about, hard ones included. Train it on classes
of their own and measure its gain on held-out ones (``benchmarks/rerank_gain.py``).

The model maps both embeddings with one learned linear map ``W`` (the identity at
first), takes features that are symmetric in the pair, ``Wq * Wg``, ``|Wq - Wg|`` and the
first search's score, and ends in ``Dense`` layers with ReLU and one logit: it can learn
which directions of the embeddings tell the classes apart and which mislead the first
similarity.
open-metric-learning's post-processing re-ranks pairs of images with a transformer
(its STIR paper); this one sees only the embeddings, so it can learn a better
similarity of them, not what the embedder missed.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfdml._argument_checks import check_int
from tfdml.search.exact import check_finite
from tfdml.search.index import Index
from tfdml.search.results import RetrievalResults

__all__ = ["PairReranker"]

#: Pairs scored per call of the model in :meth:`PairReranker.score` (bounds the features
#: held at once: ``[SCORE_CHUNK, 2 D + 1]`` float32).
SCORE_CHUNK = 65536


def _pair_features(queries, candidates, scores):
    """``[n, 2 D + 1]`` model inputs of pairs: ``q``, ``g`` and the first search's score."""
    return ops.concatenate([queries, candidates, ops.expand_dims(scores, -1)], axis=-1)


class PairReranker:
    """Re-orders the first ``top_n`` items of each list by a learned pair score.

    Args:
        top_n: how many items at the top of each list are re-ordered (the
            rest stay where they are); also the neighbours mined per training
            item. Defaults to `10`.
        hidden: the sizes of the hidden ``Dense`` layers. Defaults to
            `(128, 64)`.
        seed: seed of the weights and of the one shuffle of the training
            pairs (the global random state is not touched). Defaults to `0`.

    Examples:

    >>> reranker = tfdml.search.PairReranker(top_n=10)
    >>> reranker.fit(train_embeddings, train_labels, epochs=5)
    >>> results = index.retrieve(query_embeddings, 10, query_labels=query_labels)
    >>> better = reranker.rerank(results, query_embeddings, index.embeddings)
    >>> results.map_at_k(10), better.map_at_k(10)
    """

    def __init__(self, top_n: int = 10, hidden=(128, 64), seed: int = 0):
        self.top_n = check_int("top_n", top_n)
        self.hidden = tuple(check_int("hidden", h) for h in hidden)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise ValueError(f"`seed` must be an integer. Received: seed={seed!r}")
        self.seed = int(seed)
        self.model = None
        self.metric = None
        self.dim = None

    def _build(self, dim):
        inputs = keras.Input((2 * dim + 1,))
        # One linear map of both embeddings (the identity at first), then symmetric
        # features of the mapped pair: what a learned similarity of them can use.
        project = keras.layers.Dense(dim, use_bias=False, name="projection",
                                     kernel_initializer=keras.initializers.Identity())
        q, g = project(inputs[:, :dim]), project(inputs[:, dim : 2 * dim])
        x = ops.concatenate([q * g, ops.abs(q - g), inputs[:, 2 * dim :]], axis=-1)
        for number, units in enumerate(self.hidden, 1):
            x = keras.layers.Dense(units, activation="relu", kernel_initializer=(
                keras.initializers.GlorotUniform(seed=self.seed + number)))(x)
        logit = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(
            seed=self.seed))(x)
        model = keras.Model(inputs, logit, name="pair_reranker")
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
        return model

    def fit(self, embeddings, labels, epochs: int = 10, batch_size: int = 256,
            metric: str = "cosine", verbose=0):
        """Trains on the mined pairs of ``embeddings``: each item with its ``top_n``
        nearest others, labelled 1 for the same class and 0 otherwise.

        Args:
            embeddings: ``[N, D]`` training embeddings (of training classes).
            labels: ``[N]`` their classes.
            epochs: passes over the pairs. Defaults to `10`.
            batch_size: pairs per step. Defaults to `256`.
            metric: the first search's metric. Defaults to `"cosine"`.
            verbose: Keras' ``fit`` verbosity. Defaults to `0`.

        Returns:
            The Keras ``History``.

        Raises:
            ValueError: for non-finite embeddings, no labels, fewer than
                ``top_n + 1`` items, pairs of one kind only (all same-class or
                none), or a bad ``epochs`` or ``batch_size``.
        """
        if labels is None:
            raise ValueError("`labels` must give the class of each embedding: the mined "
                             "pairs are labelled by them. Received: labels=None")
        epochs = check_int("epochs", epochs)
        batch_size = check_int("batch_size", batch_size)
        x = np.asarray(embeddings, np.float32)
        check_finite(x, "embeddings")
        if len(x) <= self.top_n:
            raise ValueError(f"`embeddings` must hold more than top_n={self.top_n} items to "
                             f"mine pairs from. Received: {len(x)}")
        index = Index(metric, query_buckets=False)
        index.add(x, labels=labels)
        found = index.retrieve(x, self.top_n, query_labels=labels, exclude_self=True)
        rows = np.repeat(np.arange(len(x)), self.top_n)
        cols = found.indices.reshape(-1)
        target = found.correct.reshape(-1).astype(np.float32)
        if target.min() == target.max():
            raise ValueError("The mined pairs are all of one kind (all same-class or none): "
                             "there is nothing to learn. Give embeddings of several classes "
                             "with several items each.")
        self.metric, self.dim = index.metric, int(x.shape[1])
        stored = index.embeddings
        features = ops.convert_to_numpy(_pair_features(
            stored[rows], stored[cols], found.scores.reshape(-1)))
        self.model = self._build(self.dim)
        # Shuffled once with the re-ranker's seed (the global random state is left alone).
        order = np.random.default_rng(self.seed).permutation(len(target))
        return self.model.fit(features[order], target[order], epochs=epochs,
                              batch_size=batch_size, shuffle=False, verbose=verbose)

    def score(self, queries, candidates, scores):
        """The logits of pairs (``[n, D]`` each, prepared as the index stores them, and
        the first search's ``[n]`` scores); larger is more likely the same class.

        Raises:
            ValueError: before :meth:`fit`, or for arrays of other shapes.
        """
        self._check_fitted()
        q = np.asarray(queries, np.float32)
        g = np.asarray(candidates, np.float32)
        s = np.asarray(scores, np.float32)
        n = len(q) if q.ndim else -1
        for name, value, shape in (("queries", q, (n, self.dim)),
                                   ("candidates", g, (n, self.dim)), ("scores", s, (n,))):
            if value.shape != shape:
                raise ValueError(f"`{name}` must have the shape {shape} (one row of "
                                 f"{self.dim} values per pair, as the re-ranker was fitted "
                                 f"on). Received: {name}.shape={value.shape}")
        out = np.empty(n, np.float32)
        for start in range(0, n, SCORE_CHUNK):
            part = slice(start, start + SCORE_CHUNK)
            features = _pair_features(q[part], g[part], s[part])
            out[part] = np.asarray(ops.convert_to_numpy(self.model(features)))[:, 0]
        return out

    def _check_fitted(self):
        if self.model is None:
            raise ValueError("The re-ranker is not trained: call `fit` first.")

    def rerank(self, results: RetrievalResults, query_embeddings,
               gallery_embeddings) -> RetrievalResults:
        """``results`` with the items among the first ``top_n`` slots of each list in the
        order of their pair scores (ties: the earlier position first); the slots
        beyond, and empty slots, stay in place. Scores stay those of the first search.

        Args:
            results: from :meth:`tfdml.search.Index.retrieve`, with the metric the
                re-ranker was fitted with.
            query_embeddings: ``[Q, D]`` the queries' embeddings.
            gallery_embeddings: ``[G, D]`` the gallery as the index stores it
                (``index.embeddings``, a memory map included; for ``"cosine"`` the
                rows are normalized here, as the queries).

        Raises:
            ValueError: before :meth:`fit`, for another metric, non-finite
                embeddings (the queries, or the gallery rows in the lists), or
                shapes that do not fit the results or the fitted size.
        """
        self._check_fitted()
        if results.metric != self.metric:
            raise ValueError(f"The re-ranker was fitted on {self.metric!r} scores: `results` "
                             f"must come from a {self.metric!r} search. Received: "
                             f"results.metric={results.metric!r}")
        q = self._rows(query_embeddings, "query_embeddings")
        if len(q) != len(results):
            raise ValueError(f"`query_embeddings` must have one row per query ({len(results)}). "
                             f"Received: {len(q)}")
        n = min(self.top_n, results.k)
        top = results.indices[:, :n]
        valid = top >= 0
        rows = np.repeat(np.arange(len(q)), n)[valid.reshape(-1)]
        cols = top[valid]
        logits = np.full(top.shape, -np.inf, np.float32)
        if len(cols):
            gallery = self._rows(gallery_embeddings, "gallery_embeddings", check=False)
            if int(cols.max()) >= len(gallery):
                raise ValueError(f"`gallery_embeddings` must hold every position in the lists "
                                 f"(up to {int(cols.max())}). Received: {len(gallery)} rows")
            candidates = _take(gallery, cols)
            check_finite(candidates, "gallery_embeddings")
            if self.metric == "cosine":
                candidates = _unit(candidates)
            logits[valid] = np.nan_to_num(self.score(
                q[rows], candidates, results.scores[:, :n][valid]), nan=-np.inf)
        # Items first (by logit, ties by position), then the empty slots; the items go to
        # the item slots in position order, and each empty slot keeps its place.
        order = np.lexsort((-logits, ~valid), axis=1)
        slots = np.argsort(~valid, axis=1, kind="stable")
        full = np.tile(np.arange(results.k), (len(q), 1))
        top_order = np.empty_like(order)
        np.put_along_axis(top_order, slots, order, 1)
        full[:, :n] = top_order
        return results.reorder(full)

    def _rows(self, values, name, check=True):
        """``values`` as ``[n, D]`` float32 rows of the fitted size (an array or memory
        map as it is), finite and unit for ``"cosine"`` with ``check``."""
        if not isinstance(values, np.ndarray):
            values = np.asarray(ops.convert_to_numpy(values) if ops.is_tensor(values)
                                else values)
        if values.ndim != 2 or values.shape[1] != self.dim:
            raise ValueError(f"`{name}` must be [n, {self.dim}] embeddings (the size the "
                             f"re-ranker was fitted on). Received: {name}.shape={values.shape}")
        if not check:
            return values
        values = np.asarray(values, np.float32)
        check_finite(values, name)
        return _unit(values) if self.metric == "cosine" else values


def _unit(rows):
    """``rows`` divided by their norms (zero rows stay zero)."""
    norm = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norm, np.finfo(np.float32).tiny)


def _take(rows, positions):
    """``rows[positions]`` for an array or a memory map, read in position order."""
    order = np.argsort(positions, kind="stable")
    out = np.empty((len(positions), rows.shape[1]), np.float32)
    out[order] = np.asarray(rows[positions[order]], np.float32)
    return out
