"""The approximate structures of an :class:`~tfdml.search.Index`: faiss indexes by factory string.

faiss (``pip install faiss-cpu``, the ``faiss`` extra) builds any structure its
``index_factory`` describes (``"HNSW32"``, ``"IVF4096,Flat"``, ``"IVF4096,PQ32"``,
``"OPQ32,IVF65536_HNSW32,PQ32"``...) for the index's metric: inner products for
``"cosine"`` (on L2-normalized rows) and ``"dot"``, squared Euclidean distances for
``"l2"``. This module holds what tfdml needs of it: building, training, adding, searching
with the parameters the structure takes (``nprobe``, ``efSearch``) and putting the
candidates in the index's order (re-ranked by exact scores, ties by position), the
exact flat index of ``backend="faiss"``, the grid :meth:`~tfdml.search.Index.tune`
walks, and serialization to bytes.
"""

from __future__ import annotations

import numpy as np

FAISS_INSTALL = ("An approximate index (Index(approximate=...)) and Index(backend=\"faiss\") "
                 "need the faiss package: `pip install faiss-cpu` (or faiss-gpu; in a clone of "
                 "tfdml, `pip install \".[faiss]\"`). The default exact index needs nothing else.")

#: Rows handed to faiss at a time when adding (bounds the temporary copies of a
#: transform such as OPQ or PCA).
ADD_BLOCK = 65536

#: The values ``nprobe`` and ``efSearch`` take in :func:`grid`: powers of two.
_EF_MAX = 4096


def import_faiss():
    """The faiss module; an ImportError naming the command that installs it otherwise."""
    try:
        import faiss
    except ImportError as err:
        raise ImportError(FAISS_INSTALL) from err
    return faiss


def faiss_metric(metric: str):
    """faiss's metric type for an index metric."""
    faiss = import_faiss()
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def build(description: str, dim: int, metric: str, parameters: dict | None = None):
    """A new faiss index from a factory string, with the search ``parameters`` given
    (:func:`set_parameters`); a ValueError naming ``approximate`` and quoting faiss' reason
    when faiss refuses it, or naming ``parameters`` for one the structure does not take."""
    faiss = import_faiss()
    if not isinstance(description, str) or not description.strip():
        raise ValueError("`approximate` must be a faiss index factory string such as "
                         f"\"HNSW32\" or \"IVF1024,Flat\". Received: approximate={description!r}")
    try:
        structure = faiss.index_factory(int(dim), description, faiss_metric(metric))
    except RuntimeError as err:
        raise ValueError(f"`approximate`: faiss cannot build {description!r} for {dim}-"
                         f"dimensional embeddings: {reason(err)} Received: "
                         f"approximate={description!r}") from None
    if parameters:
        set_parameters(structure, parameters)
    return structure


def reason(err) -> str:
    """faiss's own words in one of its errors (after its source location), ending in a
    period."""
    text = " ".join(str(err).split())
    if "Error: " in text:
        text = text.rsplit("Error: ", 1)[1]
    return text if text.endswith(".") else text + "."


def _ivf(structure):
    faiss = import_faiss()
    try:
        return faiss.extract_index_ivf(structure)
    except RuntimeError:
        return None


def _hnsw(structure):
    """The HNSW index inside ``structure`` (under a pre-transform or a refinement), or None."""
    faiss = import_faiss()
    index = faiss.downcast_index(structure)
    while True:
        if isinstance(index, faiss.IndexHNSW):
            return index
        inner = getattr(index, "index", None) or getattr(index, "base_index", None)
        if inner is None:
            return None
        index = faiss.downcast_index(inner)


def parameter_names(structure) -> tuple:
    """The search parameters that trade speed for recall in ``structure``."""
    ivf = _ivf(structure)
    if ivf is not None:
        names = ("nprobe",)
        if _hnsw(ivf.quantizer) is not None:
            names += ("quantizer_efSearch",)
        return names
    return ("efSearch",) if _hnsw(structure) is not None else ()


def set_parameters(structure, parameters: dict):
    """Sets search parameters (``{"nprobe": 16}``...) with faiss's ``ParameterSpace``; a
    ValueError naming ``parameters`` for one the structure does not take."""
    faiss = import_faiss()
    known = parameter_names(structure)
    space = faiss.ParameterSpace()
    for name, value in parameters.items():
        if name not in known or isinstance(value, bool) or not isinstance(
                value, (int, np.integer)) or value < 1:
            raise ValueError(f"`parameters`: this structure takes {known or 'no parameters'} "
                             f"(positive integers). Received: {name}={value!r}")
        space.set_index_parameter(structure, name, int(value))


def grid(structure, k: int) -> list:
    """The parameter settings :meth:`Index.tune` tries, cheapest first.

    IVF: ``nprobe`` = 1, 2, 4, ... up to the number of lists (with an HNSW
    quantizer its ``efSearch`` follows as ``max(64, 2 * nprobe)``); HNSW:
    ``efSearch`` = ``k``, then the powers of two above it, up to 4096. Each step
    searches more of the structure, so the first setting that reaches a recall is
    the fastest that does.
    """
    ivf = _ivf(structure)
    if ivf is not None:
        settings, nprobe = [], 1
        while True:
            nprobe = min(nprobe, ivf.nlist)
            setting = {"nprobe": nprobe}
            if _hnsw(ivf.quantizer) is not None:
                setting["quantizer_efSearch"] = max(64, 2 * nprobe)
            settings.append(setting)
            if nprobe == ivf.nlist:
                return settings
            nprobe *= 2
    if _hnsw(structure) is not None:
        values = [k] + [1 << p for p in range(4, 13) if (1 << p) > k]
        return [{"efSearch": v} for v in values if v <= max(_EF_MAX, k)]
    return []


def current_parameters(structure) -> dict:
    """The structure's present values of :func:`parameter_names`."""
    values = {}
    ivf = _ivf(structure)
    if ivf is not None:
        values["nprobe"] = int(ivf.nprobe)
        hnsw = _hnsw(ivf.quantizer)
        if hnsw is not None:
            values["quantizer_efSearch"] = int(hnsw.hnsw.efSearch)
    else:
        hnsw = _hnsw(structure)
        if hnsw is not None:
            values["efSearch"] = int(hnsw.hnsw.efSearch)
    return values


def nlist(structure) -> int:
    """The number of inverted lists (0 for a structure without)."""
    ivf = _ivf(structure)
    return 0 if ivf is None else int(ivf.nlist)


def add(structure, rows: np.ndarray):
    """Adds float32 rows, :data:`ADD_BLOCK` at a time."""
    for start in range(0, len(rows), ADD_BLOCK):
        structure.add(np.ascontiguousarray(rows[start : start + ADD_BLOCK], np.float32))


def ties_or_disorder(scores, metric) -> bool:
    """Whether consecutive scores of a row are equal (or out of order): ties to put in index
    order."""
    if metric == "l2":
        return bool((scores[:, 1:] <= scores[:, :-1]).any())
    return bool((scores[:, 1:] >= scores[:, :-1]).any())


def exact_scores(rows, queries, metric):
    """The float32 scores of each query ``[n, D]`` with its candidates' rows ``[n, f, D]``:
    similarities, or Euclidean distances for ``"l2"``."""
    if metric == "l2":
        scores = np.sqrt(np.square(rows - queries[:, None, :]).sum(axis=2))
    else:
        scores = np.einsum("nfd,nd->nf", rows, queries)
    return scores.astype(np.float32)


def candidates(structure, queries, k, fetch, metric, rows=None):
    """The ``k`` nearest of the structure's ``fetch`` candidates for each query, in order.

    The candidates are re-ranked by their exact scores when ``rows`` is given (a
    function of positions returning the stored rows); equal scores, and the positions
    faiss leaves at ``-1`` (no item, put last with the worst score), go in index order.

    Args:
        structure: a trained faiss index.
        queries: ``[n, D]`` float32 rows, C-contiguous, prepared as the index stores them.
        k: the neighbours to keep, at most ``fetch``.
        fetch: the candidates to ask the structure for.
        metric: ``"cosine"``, ``"dot"`` or ``"l2"``.
        rows: the stored rows at positions, to re-rank by. Defaults to `None`.

    Returns:
        ``(scores, positions)``: ``[n, k]`` float32 and int64.
    """
    found_scores, found = structure.search(queries, fetch)
    if rows is not None:
        found_scores = exact_scores(rows(np.maximum(found, 0)), queries, metric)
    elif metric == "l2":
        found_scores = np.sqrt(np.maximum(found_scores, 0.0))
    some_missing = found.min() < 0
    if rows is not None or some_missing or (fetch > 1 and ties_or_disorder(found_scores,
                                                                           metric)):
        # Re-ranked, or equal scores (or missing items) to put in index order.
        missing = found < 0
        key = found_scores if metric == "l2" else -found_scores  # smaller is nearer
        key = np.where(missing, np.inf, key)
        order = np.lexsort((np.where(missing, np.iinfo(np.int64).max, found), key),
                           axis=-1)[:, :k]
        found = np.take_along_axis(found, order, axis=1)
        found_scores = np.take_along_axis(found_scores, order, axis=1)
    found = found[:, :k].astype(np.int64, copy=False)
    found_scores = found_scores[:, :k].astype(np.float32, copy=False)
    if some_missing:
        found_scores = found_scores.copy()
        found_scores[found < 0] = np.inf if metric == "l2" else -np.inf
    return found_scores, found


def build_flat(metric, dim, blocks):
    """An exact faiss index (``IndexFlatL2`` for ``"l2"``, ``IndexFlatIP`` else) holding the
    rows of ``blocks`` (an iterable of ``(start, rows)``)."""
    faiss = import_faiss()
    structure = (faiss.IndexFlatL2 if metric == "l2" else faiss.IndexFlatIP)(dim)
    for _, rows in blocks:
        structure.add(rows)
    return structure


def flat_search(structure, queries, k, metric):
    """The ``k`` nearest items of an exact faiss index (:func:`build_flat`), equal scores in
    index order: more candidates are fetched until the ties at the ``k``-th place are
    complete. Returns ``(scores, positions)``, ``[Q, k]`` float32 (distances for ``"l2"``)
    and int64."""
    size = int(structure.ntotal)
    fetch = min(size, k + 8)
    while True:
        scores, indices = structure.search(queries, fetch)
        key = scores if metric == "l2" else -scores  # smaller is nearer
        order = np.lexsort((indices, key), axis=-1)
        key = np.take_along_axis(key, order, axis=1)
        # Ties at the k-th place may continue past the fetched candidates: fetch more.
        if fetch == size or not np.any(key[:, k - 1] == key[:, fetch - 1]):
            break
        fetch = min(size, 2 * fetch)
    order = order[:, :k]
    scores = np.take_along_axis(scores, order, axis=1).astype(np.float32)
    if metric == "l2":
        scores = np.sqrt(np.maximum(scores, 0.0))
    return scores, np.take_along_axis(indices, order, axis=1).astype(np.int64)


def serialize(structure) -> np.ndarray:
    """faiss's own serialization, as a uint8 array."""
    return import_faiss().serialize_index(structure)


def deserialize(data: np.ndarray):
    return import_faiss().deserialize_index(np.ascontiguousarray(data, np.uint8))


def version() -> str:
    return str(import_faiss().__version__)
