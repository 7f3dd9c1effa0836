"""The approximate structures of an :class:`~tfdml.search.Index`: faiss indexes by factory string.

faiss (``pip install faiss-cpu``, the ``faiss`` extra) builds any structure its
``index_factory`` describes (``"HNSW32"``, ``"IVF4096,Flat"``, ``"IVF4096,PQ32"``,
``"OPQ32,IVF65536_HNSW32,PQ32"``...) for the index's metric: inner products for
``"cosine"`` (on L2-normalized rows) and ``"dot"``, squared Euclidean distances for
``"l2"``. This module holds what tfdml needs of it: building, training, adding, searching
with the parameters the structure takes (``nprobe``, ``efSearch``), the grid
:meth:`~tfdml.search.Index.tune` walks, and serialization to bytes.
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


def build(description: str, dim: int, metric: str):
    """A new faiss index from a factory string; a ValueError naming ``approximate`` and
    quoting faiss' reason when faiss refuses it."""
    faiss = import_faiss()
    if not isinstance(description, str) or not description.strip():
        raise ValueError("`approximate` must be a faiss index factory string such as "
                         f"\"HNSW32\" or \"IVF1024,Flat\". Received: approximate={description!r}")
    try:
        return faiss.index_factory(int(dim), description, faiss_metric(metric))
    except RuntimeError as err:
        raise ValueError(f"`approximate`: faiss cannot build {description!r} for {dim}-"
                         f"dimensional embeddings: {reason(err)} Received: "
                         f"approximate={description!r}") from None


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


def serialize(structure) -> np.ndarray:
    """faiss's own serialization, as a uint8 array."""
    return import_faiss().serialize_index(structure)


def deserialize(data: np.ndarray):
    return import_faiss().deserialize_index(np.ascontiguousarray(data, np.uint8))


def version() -> str:
    return str(import_faiss().__version__)
