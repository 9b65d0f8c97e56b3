"""Per-rank HDF5 run logs that survive a killed job.

Each rank appends rows to its own file, ``RUN/rank-NNNNN.h5``. Rows are buffered in memory and
written at least every ``flush_seconds``: the file is opened, the rows appended, and the file
closed again. (An HDF5 file held open is only consistent after a clean close; SWMR would avoid
reopening but marks the file "open for write" until ``h5clear``.)

A flush is not atomic by itself: HDF5 writes the raw chunks, then rewrites its metadata in place
at close, and a compressed chunk that grows moves, its old space free for reuse while the metadata
on disk still points there. A job killed inside a flush would leave a torn file: rows flushed long
before unreadable, or the file itself. So each flush keeps an undo journal, ``rank-NNNNN.h5.undo``:
before HDF5 overwrites or cuts off a byte of the file as it was, that byte's page is copied there;
deleting the journal commits the flush. A killed writer thus leaves the file as its last finished
flush left it plus, at most, one unfinished flush that its journal undoes:

- the next writer on the log (a resume: ``resume_rows``, the counts of any finished flush) undoes
  it on disk first, so a job killed with SIGKILL loses at most the rows buffered since the last
  finished flush, and ``written`` (what a checkpoint records) only counts finished flushes;
- readers open a log with ``open_log`` (``rudder.logs.reader`` does), which reads a log with a
  journal as the journal would restore it, without changing the file: a bare ``h5py.File`` may
  find such a log torn. That covers a killed writer; a reader racing a live writer's flush may
  still see a mix of two flushes (and fail, or read wrong rows), as it could before the journal;
- a flush that raises is undone at once, and its rows stay buffered for the next.

This holds for a killed process, not for a machine that loses its page cache (nothing is fsynced).
A new log is made under another name and renamed into place. The writer does not take HDF5's file
lock: someone reading a live log must never make a flush, and so training, fail.

Layout of a log::

    attrs        format, format_version, status (running|completed|interrupted|failed),
                 error, started, finished, plus the caller's run attributes (JSON strings:
                 config, versions, layout, ...)
    TABLE        one structured dataset per table (e.g. minibatches, epochs), chunked, growable
    RAGGED/values, RAGGED/offsets
                 variable-length rows (e.g. each minibatch's remote input IDs): row i is
                 values[offsets[i]:offsets[i+1]]; values are gzip-compressed
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import time

import h5py
import numpy as np

from rudder.logs.schema import FORMAT_NAME, FORMAT_VERSION, record


def log_path(run_dir: str, world_rank: int) -> str:
    return os.path.join(run_dir, f"rank-{world_rank:05d}.h5")


class RunLog:
    def __init__(self, path: str, attrs: dict, tables: dict[str, np.dtype], ragged: dict[str, np.dtype] | None = None,
                 flush_seconds: float = 2.0, resume_rows: dict[str, int] | None = None):
        """``resume_rows``: continue the existing log at ``path`` (a run resumed from a
        checkpoint), cut back to these row counts per table and ragged set first, so rows the
        interrupted run wrote after its checkpoint are neither kept twice nor lost."""
        self.path, self.flush_seconds = path, flush_seconds
        self.tables = {name: np.dtype(dt) for name, dt in tables.items()}
        self.ragged = {name: np.dtype(dt) for name, dt in (ragged or {}).items()}
        self.rows: dict[str, list] = {name: [] for name in self.tables}
        self.pieces: dict[str, list] = {name: [] for name in self.ragged}
        self.ragged_end = dict.fromkeys(self.ragged, 0)
        self.last_flush = time.monotonic()
        self.lock = threading.Lock()  # rows may come from the pipeline thread too (a policy's own table)
        # one flush at a time: a watchdog or abort may close the log from another thread
        self.flushing = threading.Lock()
        self.written = dict.fromkeys([*self.tables, *self.ragged], 0)  # rows of finished flushes
        if resume_rows is not None:
            self._reopen(attrs, resume_rows)
            return
        # made under another name and renamed: a job killed meanwhile leaves the old file or the new one
        with h5py.File(path + NEW, "w", locking=False) as f:
            f.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "running", "error": "",
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished": ""})
            f.attrs.update(attrs)
            for name, dt in self.tables.items():
                f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt, chunks=(max(1, (64 << 10) // dt.itemsize),))
            for name, dt in self.ragged.items():
                f.create_dataset(f"{name}/values", shape=(0,), maxshape=(None,), dtype=dt, chunks=(1 << 16,),
                                 compression="gzip", compression_opts=4, shuffle=True)
                f.create_dataset(f"{name}/offsets", data=np.zeros(1, dtype=np.int64), maxshape=(None,), chunks=(4096,))
        if os.path.exists(path + UNDO):  # an earlier run's, killed mid-flush: it must not undo this file
            os.unlink(path + UNDO)
        os.replace(path + NEW, path)

    def _reopen(self, attrs: dict, rows: dict[str, int]) -> None:
        with _Journaled(self.path) as journaled, h5py.File(journaled, "r+") as f:
            for name in self.tables:
                n = rows.get(name, 0)
                if name not in f:
                    f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=self.tables[name],
                                     chunks=(max(1, (64 << 10) // self.tables[name].itemsize),))
                f[name].resize((min(n, f[name].shape[0]),))
                self.written[name] = f[name].shape[0]
            for name in self.ragged:
                n = min(rows.get(name, 0), f[f"{name}/offsets"].shape[0] - 1)
                f[f"{name}/offsets"].resize((n + 1,))
                self.ragged_end[name] = int(f[f"{name}/offsets"][n])
                f[f"{name}/values"].resize((self.ragged_end[name],))
                self.written[name] = n
            resumed = json.loads(f.attrs.get("resumed", "[]"))
            f.attrs.update(attrs)
            f.attrs.update({"status": "running", "error": "", "finished": "",
                            "resumed": json.dumps(resumed + [{"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}])})

    def append(self, table: str, fields: dict) -> None:
        """One row of ``table``, by field name (``rudder.logs.schema.record``)."""
        row = record(self.tables[table], fields)
        with self.lock:
            self.rows[table].append(row)

    def append_ragged(self, name: str, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=self.ragged[name])
        with self.lock:
            self.pieces[name].append(values)

    def maybe_flush(self) -> None:
        if time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self, **attrs) -> None:
        """Append buffered rows (and set ``attrs``): all of them, or, if it raises, none."""
        if not self.flushing.acquire(timeout=30):
            raise TimeoutError(f"{self.path}: another flush has held the log for 30 s")
        try:
            self._flush(attrs)
        finally:
            self.flushing.release()

    def _flush(self, attrs: dict) -> None:
        with self.lock:  # take what is buffered; appends meanwhile go to fresh lists
            taken_rows, self.rows = self.rows, {name: [] for name in self.tables}
            taken_pieces, self.pieces = self.pieces, {name: [] for name in self.ragged}
        written, ragged_end = dict(self.written), dict(self.ragged_end)
        try:
            with _Journaled(self.path) as journaled, h5py.File(journaled, "r+") as f:
                for name, rows in taken_rows.items():
                    if rows:
                        _extend(f[name], np.array(rows, dtype=self.tables[name]))
                        written[name] += len(rows)
                for name, pieces in taken_pieces.items():
                    if pieces:
                        sizes = np.array([p.size for p in pieces], dtype=np.int64)
                        _extend(f[f"{name}/values"], np.concatenate(pieces))
                        _extend(f[f"{name}/offsets"], ragged_end[name] + np.cumsum(sizes))
                        ragged_end[name] += int(sizes.sum())
                        written[name] += len(pieces)
                f.attrs.update(attrs)
        except BaseException:
            # the file is as the last flush left it (undone now, or by the next flush): the rows go back
            # to the front of the buffers, for the next flush to write
            with self.lock:
                for name, rows in taken_rows.items():
                    self.rows[name][:0] = rows
                for name, pieces in taken_pieces.items():
                    self.pieces[name][:0] = pieces
            raise
        self.written, self.ragged_end = written, ragged_end  # what a checkpoint may now count on
        self.last_flush = time.monotonic()

    def close(self, status: str, error: str = "") -> None:
        self.flush(status=status, error=error, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _extend(dataset, rows: np.ndarray) -> None:
    n = dataset.shape[0]
    dataset.resize((n + rows.shape[0],))
    dataset[n:] = rows


# -- the undo journal ---------------------------------------------------------------------------
NEW, UNDO = ".new", ".undo"  # beside rank-NNNNN.h5: a log being created, a flush's undo journal
_MAGIC = b"rudder-undo\0"
_HEADER = struct.Struct("<12sQ")  # magic, the log's size before the flush
_ENTRY = struct.Struct("<QI")  # offset, length; then the bytes that were there
_PAGE = 4096


class _Journaled:
    """The log file as HDF5 writes it during one flush (h5py's file-object driver), journaling
    each page of the file as it was before its first change (the module's docstring). A journal
    left by a killed writer is undone first.

    An error inside a write (a full disk: the journal's writes need new space where the log's
    overwrites do not) is not raised into h5py's C code, which ignores an exception raised while
    it closes the file and leaves it pending, so that its next call into Python fails with a
    SystemError: the error is kept here, that write and every later one pretend to succeed
    without touching the file, and leaving the ``with`` undoes the flush and raises it."""

    def __init__(self, path: str):
        self.path = path
        self.error: BaseException | None = None

    def __enter__(self):
        undo(self.path)
        self.file = open(self.path, "r+b", buffering=0)
        self.size = os.fstat(self.file.fileno()).st_size
        self.saved: set[int] = set()  # pages already in the journal
        self.journal = open(self.path + UNDO, "wb", buffering=0)
        _write_all(self.journal, _HEADER.pack(_MAGIC, self.size))  # before any byte of the log changes
        return self

    def __exit__(self, kind, *_) -> None:
        self.file.close()
        self.journal.close()
        if kind is None and self.error is None:
            os.unlink(self.path + UNDO)  # the commit
            return
        undo(self.path)  # a failed flush (the writer lives on): back to the file as it was
        if kind is None:
            raise OSError(f"{self.path}: a write of the flush failed, the flush was undone: {self.error}") \
                from self.error

    def _guarded(self, call, arg, pretended: int) -> int:
        """``call(arg)``, a change of the file; ``pretended`` if it fails (the error kept for
        ``__exit__``) or an earlier one did."""
        if self.error is None:
            try:
                return call(arg)
            except Exception as e:
                self.error = e
        return pretended

    def _save(self, start: int, end: int) -> None:
        """Journal the pages of [start, end) that were part of the file and are not saved yet."""
        end = min(end, self.size)
        page = start // _PAGE
        while page * _PAGE < end:
            if page in self.saved:
                page += 1
                continue
            first = page
            while page * _PAGE < end and page not in self.saved:
                page += 1
            at = first * _PAGE
            old = os.pread(self.file.fileno(), min(page * _PAGE, self.size) - at, at)
            _write_all(self.journal, _ENTRY.pack(at, len(old)) + old)
            self.saved.update(range(first, page))  # saved once the entry is written whole

    # the file-object interface h5py's driver calls
    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def readinto(self, buffer) -> int:
        return self.file.readinto(buffer)

    def write(self, data) -> int:
        return self._guarded(self._write, data, memoryview(data).nbytes)

    def _write(self, data) -> int:
        at, n = self.file.tell(), memoryview(data).nbytes
        self._save(at, at + n)
        _write_all(self.file, data)
        return n

    def truncate(self, size: int) -> int:
        return self._guarded(self._truncate, size, size)

    def _truncate(self, size: int) -> int:
        self._save(size, self.size)
        return self.file.truncate(size)

    def flush(self) -> None:
        pass


def _write_all(file, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[file.write(view):]


def _journal(path: str) -> tuple[int, list[tuple[int, bytes]]] | None:
    """The undo journal of the log at ``path``: the log's size before the flush and the pages it
    overwrote, or None when there is nothing to undo (no journal, or one killed before its header,
    when the log was not touched yet). An entry cut off by the kill was not yet acted on."""
    try:
        with open(path + UNDO, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, size = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise OSError(f"{path + UNDO}: not an undo journal of a run log")
    pages, at = [], _HEADER.size
    while at + _ENTRY.size <= len(data):
        offset, n = _ENTRY.unpack_from(data, at)
        if at + _ENTRY.size + n > len(data):
            break
        pages.append((offset, data[at + _ENTRY.size:at + _ENTRY.size + n]))
        at += _ENTRY.size + n
    return size, pages


def undo(path: str) -> bool:
    """Undo the flush a killed writer left unfinished on the log at ``path``, restoring the file
    as the last finished flush left it; False if there was none. Only a writer may call this (the
    next one, on resume): a reader would undo a live writer's flush (``open_log`` reads the
    restored file without changing it)."""
    journal = _journal(path)
    if journal is not None:
        size, pages = journal
        with open(path, "r+b") as f:  # killed meanwhile: the journal is still there, and undone again
            for offset, old in pages:
                os.pwrite(f.fileno(), old, offset)
            f.truncate(size)
    if os.path.exists(path + UNDO):
        os.unlink(path + UNDO)
        return True
    return False


class _Undone:
    """A read-only view of a log as it was before an unfinished flush (its journal undone in memory)."""

    def __init__(self, path: str, size: int, pages: list[tuple[int, bytes]]):
        self.file, self.size, self.pos = open(path, "rb"), size, 0
        self.pages = {(offset + at) // _PAGE: old[at:at + _PAGE] for offset, old in pages for at in range(0, len(old), _PAGE)}

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        out = bytearray(max(0, self.size - self.pos) if n < 0 else n)
        return bytes(out[:self.readinto(out)])

    def readinto(self, buffer) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self.size - self.pos))
        got = os.preadv(self.file.fileno(), [out[:n]], self.pos) if n else 0
        out[got:n] = bytes(n - got)  # cut off by the flush: the journal holds what was there
        for page in range(self.pos // _PAGE, (self.pos + n + _PAGE - 1) // _PAGE):
            if page in self.pages:
                old, offset = self.pages[page], page * _PAGE
                lo, hi = max(offset, self.pos), min(offset + len(old), self.pos + n)
                out[lo - self.pos:hi - self.pos] = old[lo - offset:hi - offset]
        self.pos += n
        return n


@contextlib.contextmanager
def open_log(path: str):
    """The log at ``path`` (an ``h5py.File``) for reading, as its last finished flush left it: a
    log whose writer was killed mid-flush is read through its undo journal (without changing it),
    and without HDF5's file lock (a live log's writer must never fail for a reader)."""
    journal = _journal(path)
    if journal is None:
        with h5py.File(path, "r", locking=False) as f:
            yield f
        return
    view = _Undone(path, *journal)
    try:
        with h5py.File(view, "r") as f:
            yield f
    finally:
        view.file.close()
