"""Global node-feature rows, served to every trainer through one-sided MPI.

Each partition's feature rows live in exactly one RMA window segment (``Win.Allocate``), held by
the trainer that exposes that partition: partition p's trainer in ``trainer`` mode, the lowest
trainer of the node in ``node`` mode (its node peers then expose nothing and read it through
shared memory). The window stays in one ``Lock_all(MODE_NOCHECK)`` epoch for the whole run, so
a read never needs the target rank to enter MPI (MPICH serves passive-target gets on
``Win.Allocate`` memory without the target's help; on ``Win.Create`` memory it waits for it).

A gather splits the requested global IDs by owning partition and serves each group from:
* this rank's own segment: a numpy take;
* a segment on the same node: a numpy take on the ``Shared_query`` view (MPI-4 allows it on
  allocated windows; MPICH maps on-node segments into every process);
* any other rank: one ``Get`` per owner with indexed datatypes on both sides (the rows land
  directly in their output positions), then one ``Flush`` per owner.
Every call returns its counters (rows and bytes by path, owners touched) for the per-minibatch log.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.partition_store import PartitionMeta, read_features

FLOAT_BYTES = 4


@dataclass
class FetchStats:
    rows_local: int = 0  # served from this rank's own segment
    rows_shared: int = 0  # served from a same-node peer through shared memory
    rows_remote: int = 0  # fetched with RMA Get
    bytes_remote: int = 0
    owners_touched: int = 0  # distinct remote (RMA) owners

    def add(self, other: "FetchStats") -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class FeatureStore:
    def __init__(self, layout, meta: PartitionMeta, data_dir: str):
        from mpi4py import MPI

        self._MPI = MPI
        comm = layout.trainers
        self.comm, self.meta, self.dim = comm, meta, meta.feat_dim
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        # Which trainer rank exposes each partition: everyone learns (partition, exposes?) pairs.
        exposes = layout.partition_mode == "trainer" or layout.node_trainers.rank == 0
        table = comm.allgather(layout.partition_id if exposes else -1)
        self.exposer = np.full(meta.num_parts, -1, dtype=np.int64)
        for rank, part in enumerate(table):
            if part >= 0:
                self.exposer[part] = rank
        self.part_id = layout.partition_id
        rows = meta.parts[self.part_id].num_owned if exposes else 0
        self.win = MPI.Win.Allocate(rows * self.dim * FLOAT_BYTES, disp_unit=FLOAT_BYTES, comm=comm)
        self.own = np.frombuffer(self.win.tomemory(), dtype=np.float32).reshape(rows, self.dim)
        if exposes:
            read_features(data_dir, self.part_id, meta, out=self.own)
        comm.Barrier()  # every segment is filled before anyone reads
        self.win.Lock_all(MPI.MODE_NOCHECK)
        # Views of segments that this process can load directly (itself and same-node peers).
        self.views: dict[int, np.ndarray] = {}
        for part, rank in enumerate(self.exposer):
            if rank == comm.rank:
                self.views[part] = self.own
                continue
            try:
                buf, _ = self.win.Shared_query(int(rank))
            except MPI.Exception:  # an MPI that does not share allocated windows: RMA serves it
                continue
            n = meta.parts[part].num_owned
            if len(buf) >= n * self.dim * FLOAT_BYTES and n:
                self.views[part] = np.frombuffer(buf, dtype=np.float32, count=n * self.dim).reshape(n, self.dim)
        self.row_type = MPI.FLOAT.Create_contiguous(self.dim).Commit()

    def gather(self, gids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, FetchStats]:
        """Feature rows of global IDs ``gids`` (any order, repeats allowed) into ``out``."""
        MPI = self._MPI
        gids = np.asarray(gids, dtype=np.int64)
        if out is None:
            out = np.empty((gids.size, self.dim), dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != (gids.size, self.dim) or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape ({gids.size}, {self.dim})")
        stats = FetchStats()
        if gids.size == 0:
            return out, stats
        parts = np.searchsorted(self.offsets, gids, side="right") - 1
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(self.meta.num_parts + 1))
        pending, datatypes = [], []
        for part in np.flatnonzero(np.diff(bounds)):
            positions = order[bounds[part]:bounds[part + 1]]
            local = gids[positions] - self.offsets[part]
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
            target = self.row_type.Create_indexed_block(1, local.astype(np.int32)).Commit()
            origin = self.row_type.Create_indexed_block(1, positions.astype(np.int32)).Commit()
            self.win.Get([out, 1, origin], rank, target=(0, 1, target))
            datatypes += [target, origin]
            pending.append(rank)
            stats.rows_remote += positions.size
            stats.bytes_remote += positions.size * self.dim * FLOAT_BYTES
        for rank in pending:
            self.win.Flush(rank)
        for dt in datatypes:
            dt.Free()
        stats.owners_touched = len(pending)
        return out, stats

    def close(self) -> None:
        if self.win is not None:
            self.win.Unlock_all()
            self.row_type.Free()
            self.own = None
            self.views.clear()
            self.win.Free()
            self.win = None
