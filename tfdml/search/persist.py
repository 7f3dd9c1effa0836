"""An :class:`~tfdml.search.Index` in one ``.npz`` file: written whole or not at all, read
back with every field checked.

Fields: ``metric``, ``chunk_sizes``, ``backend``, ``size``, ``vectors`` (where the
embeddings were kept), ``embeddings`` (unless ``vectors`` is ``"none"``), ``labels``
(``[N]`` int64 class ids, or ``[N, L]`` bool multi-hot) and ``ids`` when present, and for an approximate index ``approximate`` (the factory string),
``faiss_index`` (faiss's own serialization, as bytes), ``faiss_version``, ``parameters``
(JSON) and ``settings`` (``rerank``, ``train_size``, ``seed``; 0 for None). No pickled
object. Embeddings on disk are streamed into and out of the file block by block.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from tfdml._argument_checks import at_indices
from tfdml._files import atomic_path
from tfdml._labels import check_multi_hot
from tfdml.search import approximate as faiss_api
from tfdml.search.exact import METRICS, nonfinite_rows
from tfdml.search.store import VectorStore

#: Rows checked (and copied, for an index on disk) at a time when loading.
LOAD_BLOCK = 1 << 18


def save_index(index, path):
    """Writes ``index`` to ``path`` (see the module's fields)."""
    arrays = {
        "metric": np.array(index.metric),
        "chunk_sizes": np.array([index.chunk_size, index.gallery_chunk_size], np.int64),
        "backend": np.array(index.backend),
        "size": np.array(len(index), np.int64),
        "vectors": np.array(index.vectors or "none"),
    }
    if index.vectors == "memory":
        arrays["embeddings"] = index.embeddings
    if index.labels is not None:
        arrays["labels"] = index.labels
    if index.ids is not None:
        arrays["ids"] = index.ids
    if index.approximate is not None:
        arrays["approximate"] = np.array(index.approximate)
        arrays["parameters"] = np.array(json.dumps(index.parameters, sort_keys=True))
        arrays["settings"] = np.array([index.rerank or 0, index.train_size or 0, index.seed],
                                      np.int64)
        arrays["faiss_version"] = np.array(faiss_api.version())
        if index._structure is not None:
            arrays["faiss_index"] = faiss_api.serialize(index._structure)
    # Whole or not at all: a temporary file beside it, renamed over it once written. The
    # fields as np.savez writes them (one .npy member each, stored), the rows on disk
    # copied block by block.
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED,
                                                   allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
        if index.vectors == "disk":
            _write_rows(archive, index)


def _write_rows(archive, index):
    """The ``embeddings`` member of an index whose rows are on disk, block by block."""
    store = index._vectors
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
              "fortran_order": False, "shape": (len(store), store.dim or index.dim or 0)}
    with archive.open("embeddings.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, header)
        for _, rows in store.blocks(LOAD_BLOCK):
            member.write(np.ascontiguousarray(rows, np.float32).tobytes())


def _bad(path, name, why):
    return ValueError(f"{path}: field `{name}` {why}.")


def _read_small(data, path):
    """Every field but the embeddings, read into memory."""
    fields = {}
    for name in data.files:
        if name != "embeddings":
            try:
                fields[name] = data[name]
            except _READ_ERRORS as err:
                raise _unreadable(path, err) from err
    for name in ("metric", "chunk_sizes"):
        if name not in fields:
            raise _bad(path, name, "is missing")
    return fields


def _stream_embeddings(data, path, store):
    """Copies the ``embeddings`` member into ``store`` block by block; its shape."""
    with data.zip.open("embeddings.npy") as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
        if len(shape) != 2 or dtype != np.float32 or fortran:
            raise _bad(path, "embeddings", f"must be a 2-D float32 array in C order, not "
                                           f"{dtype} of shape {shape}")
        row_bytes = 4 * shape[1]
        done = 0
        while done < shape[0]:
            rows = min(LOAD_BLOCK, shape[0] - done)
            raw = member.read(rows * row_bytes)
            if len(raw) != rows * row_bytes:
                raise _bad(path, "embeddings", "is truncated")
            store.append(np.frombuffer(raw, np.float32).reshape(rows, shape[1]))
            done += rows
        if not shape[0] and shape[1]:
            store.dim = int(shape[1])
    return shape


def _check_rows(store, metric, path):
    """Finite rows, of unit norm (or zero) for ``"cosine"``, block by block."""
    for start, rows in store.blocks(LOAD_BLOCK):
        bad_rows = nonfinite_rows(rows)
        if len(bad_rows):
            raise _bad(path, "embeddings", f"holds NaN or Inf at {at_indices(bad_rows + start)}")
        if metric == "cosine" and len(rows):
            norms = np.linalg.norm(rows.astype(np.float64), axis=1)
            off = np.flatnonzero((np.abs(norms - 1.0) > 1e-3) & (norms > 0))
            if len(off):
                raise _bad(path, "embeddings", "must hold unit rows in a cosine index; rows "
                                               f"{(off[:5] + start).tolist()} have norms "
                                               f"{norms[off[:5]].tolist()}")


def _settings(fields, path):
    """``(approximate, parameters, rerank, train_size, seed)`` of an approximate index."""
    if "approximate" not in fields:
        return None, None, None, None, 0
    for name in ("parameters", "settings", "faiss_version"):
        if name not in fields:
            raise _bad(path, name, "is missing")
    written, running = str(fields["faiss_version"]), faiss_api.version()
    if written != running:
        raise _bad(path, "faiss_version", f"says the approximate structure was written by faiss "
                                          f"{written}; this is faiss {running}, whose format may "
                                          "differ. Build the index again with this version")
    try:
        parameters = json.loads(str(fields["parameters"]))
    except json.JSONDecodeError as err:
        raise _bad(path, "parameters", f"is not JSON ({err})") from None
    settings = fields["settings"]
    if settings.shape != (3,) or settings.dtype.kind not in "iu" or (settings[:2] < 0).any():
        raise _bad(path, "settings", f"must be three integers, not {settings!r}")
    rerank, train_size, seed = (int(v) for v in settings)
    return str(fields["approximate"]), parameters, rerank or None, train_size or None, seed


#: What reading a damaged or foreign file raises (turned into a ValueError naming the file).
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError)


def _unreadable(path, err):
    return ValueError(f"{path}: not a readable index file ({type(err).__name__}: {err})")


def load_index(cls, path, backend=None, vectors=None):
    """The :class:`Index` in ``path``; ``backend`` and ``vectors`` override the saved ones."""
    path = os.fspath(path)
    # The file is opened here, so that it is closed whatever np.load raises.
    try:
        file = open(path, "rb")  # closed by the `with file` below
    except FileNotFoundError:
        raise
    except OSError as err:
        raise _unreadable(path, err) from err
    with file:
        try:
            data = np.load(file, allow_pickle=False)
        except _READ_ERRORS as err:
            raise _unreadable(path, err) from err
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError(f"{path}: not a readable index file (a single array, not an "
                             ".npz archive of fields)")
        with data:
            return _build(cls, data, _read_small(data, path), path, backend, vectors)


def _build(cls, data, fields, path, backend, vectors):
    metric = str(fields["metric"])
    if metric not in METRICS:
        raise _bad(path, "metric", f"must be one of {METRICS}, not {metric!r}")
    sizes = fields["chunk_sizes"]
    if sizes.shape != (2,) or sizes.dtype.kind not in "iu" or (sizes < 1).any():
        raise _bad(path, "chunk_sizes", f"must be two positive integers, not {sizes!r}")
    saved_place = str(fields["vectors"]) if "vectors" in fields else "memory"
    has_rows = "embeddings" in data.files
    if saved_place != "none" and not has_rows:
        raise _bad(path, "embeddings", "is missing")
    approximate, parameters, rerank, train_size, seed = _settings(fields, path)
    if vectors is None:
        vectors = None if saved_place == "none" else saved_place
    if vectors is not None and not has_rows:
        raise ValueError(f"{path}: the index was saved without its embeddings "
                         f"(vectors=None); it cannot keep them in {vectors!r}.")
    if backend is None:
        backend = str(fields["backend"]) if "backend" in fields else "keras"
    index = cls(metric, int(sizes[0]), int(sizes[1]), backend, approximate=approximate,
                parameters=parameters, rerank=rerank if vectors is not None else None,
                vectors=vectors, train_size=train_size, seed=seed)
    try:
        n = _load_rows(index, data, fields, path, has_rows)
    except ValueError:
        raise
    except _READ_ERRORS as err:
        raise _unreadable(path, err) from err
    labels = _checked_labels(fields, n, path)
    if "ids" in fields and (fields["ids"].ndim != 1 or len(fields["ids"]) != n
                            or fields["ids"].dtype.kind not in "iuU"):
        raise _bad(path, "ids", f"must hold {n} integers or strings (one per row), not "
                                f"{fields['ids'].dtype} of shape {fields['ids'].shape}")
    index._size = n
    if n:
        index._labels = None if labels is None else [labels]
        index._ids = [fields["ids"]] if "ids" in fields else None
    if approximate is not None and "faiss_index" in fields:
        index._structure = _load_structure(fields["faiss_index"], index, n, path)
    elif approximate is not None and n:
        raise _bad(path, "faiss_index", "is missing")
    return index


def _checked_labels(fields, n, path):
    """The ``labels`` field (None without one): ``[n]`` integers as int64, or ``[n, L]``
    multi-hot rows (0 and 1, none empty) as bool; a ValueError naming the file otherwise."""
    if "labels" not in fields:
        return None
    labels = fields["labels"]
    if labels.ndim == 2 and len(labels) == n and labels.shape[1] >= 2:
        try:
            return check_multi_hot(labels, "labels")
        except ValueError as err:
            raise _bad(path, "labels", str(err)) from None
    if labels.ndim != 1 or len(labels) != n or labels.dtype.kind not in "iu":
        raise _bad(path, "labels", f"must hold {n} integers (one per row) or {n} multi-hot "
                                   f"rows, not {labels.dtype} of shape {labels.shape}")
    return labels.astype(np.int64)


def _load_rows(index, data, fields, path, has_rows):
    """Loads the stored embeddings (if any) into the index's store; the number of items."""
    store = index._vectors
    if has_rows:
        target = store if store is not None else VectorStore("memory")
        if store is None or store.place == "disk":
            shape = _stream_embeddings(data, path, target)
        else:
            try:
                rows = data["embeddings"]
            except _READ_ERRORS as err:
                raise _unreadable(path, err) from err
            if rows.ndim != 2 or rows.dtype.kind != "f":
                raise _bad(path, "embeddings", f"must be a 2-D float array, not {rows.dtype} "
                                               f"of shape {rows.shape}")
            if len(rows):
                with np.errstate(over="ignore"):
                    target.append(rows.astype(np.float32))
            target.dim = int(rows.shape[1]) if rows.shape[1] else None
            shape = rows.shape
        _check_rows(target, index.metric, path)
        if store is None:
            target.close()
        index.dim = int(shape[1]) if shape[1] else None
        if index.metric != "cosine" and store is not None:
            index._max_abs = store.max_abs()
        return int(shape[0])
    if "size" not in fields or fields["size"].shape != () or fields["size"] < 0:
        raise _bad(path, "size", "is missing or not a count")
    return int(fields["size"])


def _load_structure(data, index, n, path):
    """The deserialized faiss structure, checked against the rest of the file."""
    if data.ndim != 1 or data.dtype != np.uint8:
        raise _bad(path, "faiss_index", f"must be bytes (uint8), not {data.dtype} of shape "
                                        f"{data.shape}")
    try:
        structure = faiss_api.deserialize(data)
    except RuntimeError as err:
        raise _bad(path, "faiss_index", "is not a faiss index faiss can read "
                                        f"({faiss_api.reason(err)[:-1]})") from None
    if structure.metric_type != faiss_api.faiss_metric(index.metric):
        raise _bad(path, "faiss_index", f"measures with faiss metric {structure.metric_type}, "
                                        f"not that of the index's metric {index.metric!r}")
    if structure.ntotal != n:
        raise _bad(path, "faiss_index", f"holds {structure.ntotal} items; the file has {n}")
    if index.dim is not None and structure.d != index.dim:
        raise _bad(path, "faiss_index", f"has dimension {structure.d}; the embeddings have "
                                        f"{index.dim}")
    index.dim = int(structure.d)
    if index._parameters:
        try:
            faiss_api.set_parameters(structure, index._parameters)
        except ValueError as err:
            raise _bad(path, "parameters", str(err)) from None
    return structure
