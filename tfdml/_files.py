"""Files written whole or not at all.

A file that a long run rewrites (a checkpoint, a state or history file, an index)
and a later run reads must never be left half-written by a kill, a full disk or an
error part-way through the write. :func:`atomic_path` gives the writer a temporary
path in the same directory and renames the finished file over the target
(``os.replace``, atomic within a file system), so that a reader finds the old file
or the new one.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import shutil

__all__ = [
    "atomic_path", "remove_temporaries", "save_atomically", "save_figure", "write_json",
    "write_text",
]

# `.<stem>.tmp-<pid>-<hex><suffix>` (being written) and `.<stem>.old-...` (a replaced directory).
_TEMPORARY = re.compile(r"^\..+\.(tmp|old)-[0-9]+-[0-9a-f]{8}(\..*)?$")


def _split_suffix(name):
    """``("best", ".weights.h5")`` for ``"best.weights.h5"``: writers such as Keras check the
    full suffix, so the temporary name keeps it."""
    dot = name.find(".", 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot:])


def _fsync(path):
    """Flushes a file (or every file under a directory) to disk."""
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for name in files:
                _fsync(os.path.join(root, name))
        return
    with open(path, "r+b") as f:
        os.fsync(f.fileno())


def _fsync_directory(folder):
    """Flushes a directory entry (the rename) to disk; a no-op where directories cannot be
    opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path, directory=False):
    """A temporary path beside ``path`` to write to, renamed over ``path`` once written.

    The body of the ``with`` writes the new file (or, with ``directory=True``,
    the new directory) at the yielded path, which is in the same directory as
    ``path`` and ends with the same suffix (``.weights.h5``, ``.json``...).
    When the body returns, the new file is flushed to disk (``fsync``) and
    renamed over ``path``, then the directory entry is flushed. A reader, or a
    run killed at any moment, finds the old file or the new one, never a part
    of one. When the body raises, the temporary file is removed and ``path``
    is left as it was. A kill may leave a temporary file behind (a hidden
    ``.<name>.tmp-...`` beside ``path``); it is never read.

    A directory cannot be renamed over a non-empty one: the old directory is
    first renamed aside, then removed once the new one is in place, so that a
    kill between the two renames leaves no ``path`` (and the old one aside),
    never a part of either.

    Args:
        path: the file (or directory) to write.
        directory: ``path`` is a directory.

    Yields:
        The temporary path to write to (it does not exist yet).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    stem, suffix = _split_suffix(os.path.basename(path))
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = os.path.join(folder, f".{stem}.tmp-{tag}{suffix}")
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f"Nothing was written to {tmp} (for {path}).")
        _fsync(tmp)
        if directory and os.path.isdir(path):
            aside = os.path.join(folder, f".{stem}.old-{tag}{suffix}")
            os.replace(path, aside)
            os.replace(tmp, path)
            _remove(aside)
        else:
            os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    _fsync_directory(folder)


def write_text(path, text):
    """Writes ``text`` to ``path``, whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def write_json(path, obj, **kwargs):
    """Writes ``obj`` as JSON to ``path`` (``json.dump``'s ``kwargs``: ``indent=1`` by
    default), whole or not at all."""
    import json

    kwargs.setdefault("indent", 1)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, **kwargs)


def save_figure(figure, path, **kwargs):
    """Writes a matplotlib ``figure`` to ``path`` (the format from its extension, PNG without
    one; ``savefig``'s ``kwargs``, e.g. ``dpi``), whole or not at all."""
    file_format = os.path.splitext(os.fspath(path))[1][1:] or "png"
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        figure.savefig(f, format=file_format, **kwargs)


def _is_local(filepath) -> bool:
    return "://" not in os.fspath(filepath)


class _WeightsBuffer(io.BytesIO):
    """An in-memory ``.weights.h5`` file: Keras writes its HDF5 weights into a ``BytesIO``,
    and checks the suffix of the name (``str(filepath)``)."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def __str__(self):
        return self.name


def save_atomically(write, filepath, overwrite=True, zipped=None, weights_only=False, **kwargs):
    """Calls ``write(path, overwrite=..., **kwargs)`` (a Keras ``save`` or ``save_weights``)
    on a temporary path and renames the finished file (or directory) over ``filepath``.

    A ``.weights.h5`` file is built in memory first: Keras leaves its HDF5 file open when a
    write into it fails (a full disk), and h5py then crashes the process when it closes it;
    written from memory, a full disk is an ``OSError`` of the plain write. A remote path, or
    an existing file with ``overwrite=False`` (Keras asks), goes to ``write`` directly.
    """
    if not weights_only and zipped is not None:
        kwargs["zipped"] = zipped
    exists = os.path.lexists(filepath) if _is_local(filepath) else False
    if not _is_local(filepath) or (exists and not overwrite):
        return write(filepath, overwrite=overwrite, **kwargs)
    if weights_only and os.fspath(filepath).endswith(".weights.h5") and not kwargs:
        buffer = _WeightsBuffer(os.fspath(filepath))
        write(buffer, overwrite=True)
        with atomic_path(filepath) as tmp, open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
        return None
    with atomic_path(filepath, directory=zipped is False) as tmp:
        write(tmp, overwrite=True, **kwargs)
    return None


def remove_temporaries(folder):
    """Removes the temporary files that :func:`atomic_path` left in ``folder`` (not below it)
    when a process was killed part-way through a write; returns their names.

    Call it only when no other process writes to ``folder`` (e.g. when a run starts).
    """
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in sorted(os.listdir(folder)):
        if _TEMPORARY.match(name):
            _remove(os.path.join(folder, name))
            removed.append(name)
    return removed


class CorruptFileError(ValueError, OSError):
    """A saved file that is not complete: truncated (e.g. a save killed part-way) or corrupt.

    A ``ValueError`` and an ``OSError``: the error Keras or h5py raised for the
    file was an ``OSError`` or a ``zipfile.BadZipFile``, which said neither.
    """


def incomplete_file(path):
    """Why ``path`` is not a complete ``.keras`` (zip) or ``.h5`` (HDF5) file, or `None`.

    `None` as well for a missing file or another format (the reader's error says more).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if path.endswith(".keras"):
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, EOFError, OSError) as e:
            return f"not a readable .keras archive ({size} bytes: {e})"
        return None if bad is None else f"its member {bad!r} is corrupt"
    if path.endswith(".h5"):
        import h5py

        try:
            with h5py.File(path, "r"):
                pass
        except OSError as e:
            return f"not a readable HDF5 file ({size} bytes: {e})"
    return None


def raise_if_incomplete(path, error=None):
    """Raises :class:`CorruptFileError` naming ``path`` when it is truncated or corrupt
    (:func:`incomplete_file`), chained to ``error`` (the reader's own error)."""
    why = incomplete_file(path)
    if why is not None:
        raise CorruptFileError(f"{os.fspath(path)} is truncated or corrupt: {why}. It cannot be "
                               f"loaded; save it again. Received: filepath="
                               f"{os.fspath(path)!r}") from error
