"""An array partitioned across trainer ranks and read one-sidedly: the mechanism under the
feature store (feature rows) and the distributed sampler (CSR row pointers and neighbours).

Each partition's segment lives in exactly one ``Win.Allocate`` window segment, held by the rank
that exposes that partition. The window stays in one ``Lock_all(MODE_NOCHECK)`` epoch for the
whole run, so a read never needs the target rank to enter MPI (MPICH serves passive-target gets
on allocated memory without the target's help; on ``Win.Create`` memory it waits for it).

A read of (partition, index) pairs is served from this rank's own segment or a same-node
segment by a numpy take on the ``Shared_query`` view (MPI-4 allows it on allocated windows;
MPICH maps on-node segments into every process), and from any other rank by one ``Get`` per
owner with indexed datatypes on both sides, so rows land directly in their output positions,
then one ``Flush`` per owner.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

MPI_TYPES = {np.dtype(np.float32): "FLOAT", np.dtype(np.int64): "INT64_T"}


@dataclass
class ReadStats:
    rows_local: int = 0  # served from this rank's own segment
    rows_shared: int = 0  # served from a same-node peer through shared memory
    rows_remote: int = 0  # fetched with RMA Get
    bytes_remote: int = 0
    owners_touched: int = 0  # distinct owners read with RMA
    seconds_remote: float = 0.0  # wall time from the first Get to the last Flush

    def add(self, other: "ReadStats") -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class DistributedArray:
    """Rows of shape ``row_shape`` split into one segment per partition.

    ``segment_rows[p]`` is partition p's row count; ``exposer[p]`` the rank of ``comm`` holding it;
    ``fill(array)`` writes this rank's own segment (called only on exposing ranks).
    """

    def __init__(self, comm, segment_rows, exposer, my_part: int | None, dtype, row_shape=(), fill=None):
        from mpi4py import MPI

        self.comm, self.dtype, self.row_shape = comm, np.dtype(dtype), tuple(row_shape)
        self.segment_rows = np.asarray(segment_rows, dtype=np.int64)
        self.exposer = np.asarray(exposer, dtype=np.int64)
        row_items = int(np.prod(self.row_shape)) if self.row_shape else 1
        self.row_bytes = row_items * self.dtype.itemsize
        exposes = my_part is not None and self.exposer[my_part] == comm.rank
        rows = int(self.segment_rows[my_part]) if exposes else 0
        self.win = MPI.Win.Allocate(rows * self.row_bytes, disp_unit=self.dtype.itemsize, comm=comm)
        self.own = np.frombuffer(self.win.tomemory(), dtype=self.dtype, count=rows * row_items).reshape((rows, *self.row_shape))
        if exposes and fill is not None:
            fill(self.own)
        comm.Barrier()  # every segment is filled before anyone reads
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.views: dict[int, np.ndarray] = {}  # partitions this process can load directly
        for part, rank in enumerate(self.exposer):
            n = int(self.segment_rows[part])
            if rank == comm.rank:
                self.views[part] = self.own
                continue
            try:
                buf, _ = self.win.Shared_query(int(rank))
            except MPI.Exception:  # an MPI that does not share allocated windows: RMA serves it
                continue
            if n and len(buf) >= n * self.row_bytes:
                self.views[part] = np.frombuffer(buf, dtype=self.dtype, count=n * row_items).reshape((n, *self.row_shape))
        base = getattr(MPI, MPI_TYPES[self.dtype])
        self.row_type = base.Create_contiguous(row_items).Commit()

    def read(self, parts: np.ndarray, index: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, ReadStats]:
        """Rows ``index[i]`` of partition ``parts[i]`` for every i (any order, repeats allowed)."""
        n = index.shape[0]
        if out is None:
            out = np.empty((n, *self.row_shape), dtype=self.dtype)
        elif out.dtype != self.dtype or out.shape != (n, *self.row_shape) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape {(n, *self.row_shape)}")
        stats = ReadStats()
        if n == 0:
            return out, stats
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(self.exposer.size + 1))
        pending, datatypes, remote_start = [], [], 0.0
        for part in np.flatnonzero(np.diff(bounds)):
            positions = order[bounds[part]:bounds[part + 1]]  # increasing
            local = index[positions]
            view = self.views.get(int(part))
            if view is not None:
                first = int(positions[0])
                if int(positions[-1]) - first + 1 == positions.size:  # a contiguous run: no temporary
                    np.take(view, local, axis=0, out=out[first:first + positions.size])
                else:
                    out[positions] = view[local]
                if view is self.own:
                    stats.rows_local += positions.size
                else:
                    stats.rows_shared += positions.size
                continue
            rank = int(self.exposer[part])
            if not pending:
                remote_start = time.perf_counter()
            if local.max() > np.iinfo(np.int32).max:  # MPI datatype displacements are C ints
                raise OverflowError(f"row {int(local.max())} of partition {part} is beyond the 2^31 rows one RMA read can address")
            target = self.row_type.Create_indexed_block(1, local.astype(np.int32)).Commit()
            origin = self.row_type.Create_indexed_block(1, positions.astype(np.int32)).Commit()
            self.win.Get([out, 1, origin], rank, target=(0, 1, target))
            datatypes += [target, origin]
            pending.append(rank)
            stats.rows_remote += positions.size
            stats.bytes_remote += positions.size * self.row_bytes
        for rank in pending:
            self.win.Flush(rank)
        for dt in datatypes:
            dt.Free()
        if pending:
            stats.seconds_remote = time.perf_counter() - remote_start
        stats.owners_touched = len(pending)
        return out, stats

    def publish(self) -> None:
        """Collective over ``comm``: rows written into segments (own or same-node views) after
        construction become visible to every reader."""
        self.win.Sync()
        self.comm.Barrier()
        self.win.Sync()

    def close(self) -> None:
        """Collective over ``comm``: call on every rank once no rank reads any more."""
        if self.win is not None:
            self.comm.Barrier()
            self.win.Unlock_all()
            self.row_type.Free()
            self.own = None
            self.views.clear()
            self.win.Free()
            self.win = None
