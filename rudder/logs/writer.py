"""Per-rank HDF5 run logs that survive a killed job.

Each rank appends rows to its own file, ``RUN/rank-NNNNN.h5``. Rows are buffered in memory and
written at least every ``flush_seconds``: the file is opened, the rows appended, and the file
closed again. Between flushes the file on disk is always a complete, closed HDF5 file, so a job
killed with SIGKILL loses at most the last few seconds of rows and never the file. (An HDF5 file
held open is only consistent after a clean close; SWMR would avoid reopening but marks the file
"open for write" until ``h5clear``.) The writer does not take HDF5's file lock: someone reading a
live log (``h5py.File(path, "r", locking=False)``) must never make a flush, and so training, fail.

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

import json
import os
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
        self.written = dict.fromkeys([*self.tables, *self.ragged], 0)  # rows on disk
        if resume_rows is not None:
            self._reopen(attrs, resume_rows)
            return
        with h5py.File(path, "w", locking=False) as f:
            f.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "running", "error": "",
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished": ""})
            f.attrs.update(attrs)
            for name, dt in self.tables.items():
                f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt, chunks=(max(1, (64 << 10) // dt.itemsize),))
            for name, dt in self.ragged.items():
                f.create_dataset(f"{name}/values", shape=(0,), maxshape=(None,), dtype=dt, chunks=(1 << 16,),
                                 compression="gzip", compression_opts=4, shuffle=True)
                f.create_dataset(f"{name}/offsets", data=np.zeros(1, dtype=np.int64), maxshape=(None,), chunks=(4096,))

    def _reopen(self, attrs: dict, rows: dict[str, int]) -> None:
        with h5py.File(self.path, "a", locking=False) as f:
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
        """Append buffered rows (and set ``attrs``), leaving a closed, complete file."""
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
        with h5py.File(self.path, "a", locking=False) as f:
            for name, rows in taken_rows.items():
                if rows:
                    _extend(f[name], np.array(rows, dtype=self.tables[name]))
                    self.written[name] += len(rows)
            for name, pieces in taken_pieces.items():
                if pieces:
                    sizes = np.array([p.size for p in pieces], dtype=np.int64)
                    _extend(f[f"{name}/values"], np.concatenate(pieces))
                    _extend(f[f"{name}/offsets"], self.ragged_end[name] + np.cumsum(sizes))
                    self.ragged_end[name] += int(sizes.sum())
                    self.written[name] += len(pieces)
            f.attrs.update(attrs)
        self.last_flush = time.monotonic()

    def close(self, status: str, error: str = "") -> None:
        self.flush(status=status, error=error, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _extend(dataset, rows: np.ndarray) -> None:
    n = dataset.shape[0]
    dataset.resize((n + rows.shape[0],))
    dataset[n:] = rows
