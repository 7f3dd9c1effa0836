"""Where an :class:`~tfdml.search.Index` keeps its float32 embeddings: in memory, or on disk.

An exact index searches these rows; an approximate one re-ranks its candidates and tunes
its parameters against them. ``"memory"`` keeps the added blocks as NumPy arrays.
``"disk"`` appends them to an unnamed temporary file (``tempfile.TemporaryFile``: the
system removes it when the index is closed or collected, or the process ends, killed or
not), so a gallery larger than the memory can be searched. Scans read the file a block at
a time into their own buffers; gathers of scattered rows (re-ranking) read them through a
read-only memory map without read-ahead, whose pages are dropped from the process after
each gather. The operating system keeps in its page cache what fits; the process's
resident memory stays that of the blocks in use.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref

import numpy as np

#: Rows gathered from the file before its mapped pages are dropped again (``"disk"``).
GATHER_ROWS = 4096

#: The places an index keeps its embeddings in (``None``: nowhere; approximate indexes only).
PLACES = ("memory", "disk")


class VectorStore:
    """A growing ``[N, dim]`` float32 array, in memory or in a temporary file."""

    def __init__(self, place: str = "memory", directory=None):
        if place not in PLACES:
            raise ValueError(f"`vectors` must be one of {PLACES} or None. Received: "
                             f"vectors={place!r}")
        self.place = place
        self.dim = None
        self._blocks = []  # "memory": the added blocks
        self._file = tempfile.TemporaryFile(dir=directory) if place == "disk" else None
        # The file is closed (and so removed) when the store is, or when it is collected.
        self._close_file = weakref.finalize(self, self._file.close) if self._file else None
        self._size = 0
        self._view = None  # the concatenation (memory) or the memory map (disk), cached
        self._map = None  # the mmap under the view (disk)

    def __len__(self):
        return self._size

    def append(self, rows: np.ndarray):
        """Appends ``[n, dim]`` float32 rows."""
        rows = np.array(rows, np.float32)  # a copy: the caller's array may change later
        if self.dim is None:
            self.dim = int(rows.shape[1])
        if self._file is None:
            self._blocks.append(rows)
        else:
            self._file.seek(self._size * 4 * self.dim)
            self._file.write(rows.tobytes())
            self._file.flush()
        self._size += len(rows)
        self._view = self._map = None  # mapped again at the new size when read

    def array(self) -> np.ndarray:
        """All the rows: one array in memory, or a read-only map of the file."""
        if self._view is None:
            dim = self.dim or 0
            if not self._size:
                self._view = np.zeros((0, dim), np.float32)
            elif self._file is None:
                if len(self._blocks) > 1:
                    self._blocks = [np.concatenate(self._blocks)]
                self._view = self._blocks[0]
            else:
                self._map = mmap.mmap(self._file.fileno(), self._size * 4 * dim,
                                      access=mmap.ACCESS_READ)
                if hasattr(mmap, "MADV_RANDOM"):  # a row at a time: no read-ahead
                    self._map.madvise(mmap.MADV_RANDOM)
                self._view = np.frombuffer(self._map, np.float32).reshape(self._size, dim)
        return self._view

    def _release(self):
        """Drops the mapped pages of the file from the process (they stay in the system's
        page cache): what :meth:`rows` read does not stay in the resident memory."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def source(self):
        """What a search reads block by block: the array (memory), or a :class:`FileRows`
        that reads each block from the file into its own buffer (disk), so that a scan of
        the rows holds one block, not the pages of a memory map of all of them."""
        if self._file is None:
            return self.array()
        return FileRows(self._file.fileno(), self._size, self.dim or 0)

    def rows(self, positions) -> np.ndarray:
        """The rows at ``positions`` (any shape of int64 positions; ``[..., dim]`` out)."""
        positions = np.asarray(positions, np.int64)
        flat = positions.reshape(-1)
        order = np.argsort(flat, kind="stable")  # in file order: fewer pages touched
        out = np.empty((len(flat), self.dim or 0), np.float32)
        view, ordered = self.array(), flat[order]
        for start in range(0, len(ordered), GATHER_ROWS):  # a few pages mapped at a time
            part = slice(start, start + GATHER_ROWS)
            out[order[part]] = view[ordered[part]]
            self._release()
        return out.reshape(positions.shape + (self.dim or 0,))

    def blocks(self, size: int):
        """Yields ``(start, rows)``: the stored rows, ``size`` at a time."""
        view = self.source()
        for start in range(0, self._size, size):
            yield start, np.asarray(view[start : start + size])

    def max_abs(self) -> float:
        """The largest absolute entry (0 when empty), read block by block."""
        return max((float(np.abs(b).max(initial=0.0)) for _, b in self.blocks(1 << 18)),
                   default=0.0)

    def close(self):
        """Frees the rows (and removes the file)."""
        self._view = self._map = None
        self._blocks = []
        if self._close_file is not None:
            self._close_file()


class FileRows:
    """``[N, dim]`` float32 rows of a file, read slice by slice (``rows[a:b]``) with
    ``os.pread`` into a new array each time."""

    def __init__(self, fd: int, size: int, dim: int):
        self._fd, self.shape, self.dtype = fd, (size, dim), np.dtype(np.float32)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, rows):
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("FileRows reads contiguous slices (rows[a:b]) only.")
        start, stop, _ = rows.indices(self.shape[0])
        count = max(stop - start, 0)
        width = 4 * self.shape[1]
        raw = os.pread(self._fd, count * width, start * width) if count else b""
        return np.frombuffer(raw, np.float32).reshape(count, self.shape[1]).copy()
