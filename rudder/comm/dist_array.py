"""An array partitioned across trainer ranks and read one-sidedly: the mechanism under the
feature store (feature rows) and the distributed sampler (CSR row pointers and neighbours).

Each partition's segment lives in exactly one ``Win.Allocate`` window segment, held by the rank
that exposes that partition. The window stays in one ``Lock_all(MODE_NOCHECK)`` epoch for the
whole run, so a read never needs the target rank to enter MPI (MPICH serves passive-target gets
on allocated memory without the target's help; on ``Win.Create`` memory it waits for it).

A read of (partition, index) pairs is served from this rank's own segment or a same-node
segment by a numpy take on the ``Shared_query`` view (MPI-4 allows it on allocated windows;
MPICH maps on-node segments into every process), and from any other rank by RMA ``Rget``s,
complete when their requests are (no ``Flush``). Where the shared-memory rows take long
to copy the Gets are issued first and those rows copied while they are in flight, poking MPI's
progress between slices of the copy, since over OFI/TCP a Get moves only while both its ranks are
in MPI (docs/network.md, "Keeping the wire busy"). Two ways to issue the Gets:

- ``runs``: one Get per run of rows consecutive in both the owner's segment and the output, of
  a contiguous type. MPICH's UCX netmod serves these as true one-sided reads, whatever the owner
  is doing: 900 rows of 18.9 KB in about 10 ms while the owner computes. (Its OFI netmod, with
  the providers the mpich wheel brings, waits for the owner either way.)
- ``indexed``: one Get per owner, an indexed datatype on the owner's side, into consecutive rows
  (scattered into place after, where the output's positions are not consecutive): four MPI calls
  an owner (the type's build, commit and free, and the Get). Fewer calls, but MPICH
  serves a non-contiguous Get between nodes by active messages, which wait until the owner enters
  MPI: the same read took 300 ms, the owner's whole compute phase (measured with
  ``MPIR_CVAR_NUM_CLIQUES=2``; ``bench/feature_gather.py`` compares both).

Where a Get waits for its owner, the owner's progress thread (``rudder.comm.progress``,
``--rma-progress``) serves it while the owner computes (``bench/busy_owner.py``; docs/cluster.md).

By default (``auto``) rows of 4 KiB or more are read run by run straight into place, smaller
ones by one indexed Get per owner, since a Get call costs more than copying a few KB
(``RUNS_MIN_ROW_BYTES``). The sampler's adjacency entries (8 bytes) are read indexed: reading
each remote node's entries by one Get covering them cost RMAT-16 at 4 ranks 3.46 s an epoch
against 1.91 s indexed (and Facebook 3.60 against 3.42).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rudder.comm import gate, waiting

# A Get moves bytes and converts nothing, so rows of any dtype travel as the unsigned integer
# type of their item size (float16 and bfloat16 feature rows included, which MPI may not name).
MPI_TYPES = {1: "UINT8_T", 2: "UINT16_T", 4: "UINT32_T", 8: "UINT64_T"}
GETS = ("auto", "runs", "indexed")
# ``gets="auto"``: rows at least this big are read one Get per run (served without the owner),
# smaller ones by one indexed Get per owner. A Get call costs about 3.5 us in mpi4py, the time to
# copy a few KB, so for small rows the calls cost more than waiting for the owner: on RMAT-16 at
# 2 ranks (512-byte rows, about 3,000 remote rows per minibatch) an epoch took 2.55 s by runs and
# 1.71 s indexed; on Facebook (18.9 KB rows) runs won, 3.12 s against 3.67 s.
RUNS_MIN_ROW_BYTES = 4096
# Rows copied from shared memory between two pokes of MPI's progress while Gets are in flight
# (a poke costs about a microsecond; 256 KiB take about 50 us to copy).
PROGRESS_BYTES = 256 << 10
# A read copies its rows from shared memory before issuing its Gets when they are at most this
# many bytes (about 2 ms of copying: the wire idles that long at most), after them when more:
# Facebook's own rows, 60-80 MB a minibatch, took 100 ms to copy; RMAT-16's, 2-3 MB, ran 3%
# slower an epoch at 250 Mbit/s copied after the Gets than before them (docs/network.md).
COPY_FIRST_MAX_BYTES = 8 << 20


@dataclass
class ReadStats:
    rows_local: int = 0  # served from this rank's own segment
    rows_shared: int = 0  # served from a same-node peer through shared memory
    rows_remote: int = 0  # fetched with RMA Get
    bytes_remote: int = 0
    owners_touched: int = 0  # distinct owners read with RMA
    seconds_remote: float = 0.0  # wall time from the first Get to the last Flush

    def add(self, other: ReadStats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Flight:
    """A read's Gets in flight: what to wait for and what to do once they land."""
    start: float = 0.0  # perf_counter when the first was issued
    owners: int = 0  # owners read by RMA
    requests: list = field(default_factory=list)  # Rget requests to complete
    flush: list = field(default_factory=list)  # owner ranks read by plain Gets: flushed after the requests
    scatters: list = field(default_factory=list)  # (scratch rows, their positions in out)


def take_rows(source: np.ndarray, index: np.ndarray, out: np.ndarray, at: np.ndarray | None = None) -> None:
    """``out[at] = source[index]`` for row arrays (``at`` None: ``out[:index.size]``). Into a
    contiguous range of ``out`` torch's ``index_select`` copies at memory speed (numpy's ``take``
    of 18.9 KB rows ran 3x slower); elsewhere numpy's gather-then-scatter is as fast as anything
    (a temporary from torch's allocator costs a page fault per 4 KB, numpy's gets huge pages)."""
    if index.size == 0:
        return
    import torch  # here, not at the top: only trainers copy rows, and agent ranks must not pay torch's import

    first = 0 if at is None else int(at[0])
    if at is None or (int(at[-1]) - first + 1 == at.size and bool((np.diff(at) == 1).all())):
        torch.index_select(torch.from_numpy(source), 0, torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64)),
                           out=torch.from_numpy(out[first:first + index.size]))
    else:
        out[at] = source[index]


class DistributedArray:
    """Rows of shape ``row_shape`` split into one segment per partition.

    ``segment_rows[p]`` is partition p's row count; ``exposer[p]`` the rank of ``comm`` holding it;
    ``fill(array)`` writes this rank's own segment (called only on exposing ranks); ``gets``:
    ``runs``, ``indexed`` or ``auto`` (by row size; module docstring); ``nearby``: the ranks of
    ``comm`` that may share memory with this one (its node's; None: any); ``wait``: how a read waits
    for its Gets, ``spin`` (in ``Flush``; with the MPI lock on, ``rudder.comm.gate``, by back-to-back
    tests of ``Rget``s, the lock free between them) or ``yield`` (``rudder.comm.waiting``).
    """

    def __init__(self, comm, segment_rows, exposer, my_part: int | None, dtype, row_shape=(), fill=None,
                 gets: str = "auto", wait: str = "spin", nearby=None):
        from mpi4py import MPI

        if gets not in GETS:
            raise ValueError(f"gets must be one of {', '.join(GETS)}, not {gets!r}")
        self.comm, self.dtype, self.row_shape = comm, np.dtype(dtype), tuple(row_shape)
        self.segment_rows = np.asarray(segment_rows, dtype=np.int64)
        self.exposer = np.asarray(exposer, dtype=np.int64)
        row_items = int(np.prod(self.row_shape)) if self.row_shape else 1
        self.row_bytes = row_items * self.dtype.itemsize
        if gets == "auto":
            gets = "runs" if self.row_bytes >= RUNS_MIN_ROW_BYTES else "indexed"
        self.gets, self.wait = gets, wait
        exposes = my_part is not None and self.exposer[my_part] == comm.rank
        rows = int(self.segment_rows[my_part]) if exposes else 0
        # Collective calls through the MPI lock (rudder.comm.gate): an evaluation opens windows
        # while the pipeline thread reads
        self.win = gate.collective(comm, MPI.Win.Allocate, rows * self.row_bytes, self.dtype.itemsize, MPI.INFO_NULL, comm)
        with gate.held():  # attribute queries, but MPI calls beside the progress thread's
            memory = self.win.tomemory()
        self.own = np.frombuffer(memory, dtype=self.dtype, count=rows * row_items).reshape((rows, *self.row_shape))
        if exposes and fill is not None:
            fill(self.own)
        gate.collective(comm, comm.Barrier)  # every segment is filled before anyone reads
        with gate.held():
            self.win.Lock_all(MPI.MODE_NOCHECK)
        self.views: dict[int, np.ndarray] = {}  # partitions this process can load directly
        self.own_part = my_part if exposes and rows else None
        near = None if nearby is None else set(nearby)
        for part, rank in enumerate(self.exposer):
            n = int(self.segment_rows[part])
            if rank == comm.rank:
                self.views[part] = self.own
                continue
            if near is not None and rank not in near:  # another node's segment: read by RMA
                continue
            try:
                with gate.held():
                    buf, _ = self.win.Shared_query(int(rank))
            except MPI.Exception:  # an MPI that does not share allocated windows: RMA serves it
                continue
            if n and len(buf) >= n * self.row_bytes:
                self.views[part] = np.frombuffer(buf, dtype=self.dtype, count=n * row_items).reshape((n, *self.row_shape))
        base = getattr(MPI, MPI_TYPES[self.dtype.itemsize])
        with gate.held():
            self.row_type = base.Create_contiguous(row_items).Commit()
        self.row_items = row_items

    def read(self, parts: np.ndarray, index: np.ndarray, out: np.ndarray | None = None,
             at: np.ndarray | None = None, spare: bool = False,
             while_fetching: Callable[[], None] | None = None) -> tuple[np.ndarray, ReadStats]:
        """Rows ``index[i]`` of partition ``parts[i]`` for every i (any order, repeats allowed),
        into ``out[i]``, or into ``out[at[i]]`` when ``at`` is given (distinct rows of ``out``);
        ``spare``: the caller fills the other rows of ``out`` afterwards (they may be overwritten);
        ``while_fetching``: called once the rows from shared memory are in place and before waiting
        for the Gets (the caller's own copies into the other rows of ``out``, overlapping the wire)."""
        n = index.shape[0]
        if out is None:
            out = np.empty((n, *self.row_shape), dtype=self.dtype)
        elif out.dtype != self.dtype or out.shape[1:] != self.row_shape or not out.flags.c_contiguous \
                or (at is None and out.shape[0] != n):
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of {n if at is None else 'any number of'} "
                             f"rows of shape {self.row_shape}")
        stats = ReadStats()
        if n == 0:
            if while_fetching is not None:
                while_fetching()
            return out, stats
        order = np.argsort(parts, kind="stable")
        bounds = np.searchsorted(parts[order], np.arange(self.exposer.size + 1))
        present = np.flatnonzero(np.diff(bounds))
        nearby = [int(p) for p in present if int(p) in self.views]
        remote = [int(p) for p in present if int(p) not in self.views]
        # A long copy from shared memory goes after the Gets are issued, so that rows cross the
        # wire meanwhile (copying first left it idle that long: docs/network.md, "Keeping the wire
        # busy"); a short one goes first, where one contiguous copy may take every row.
        gets_first = bool(remote) and sum(int(bounds[p + 1] - bounds[p]) for p in nearby) * self.row_bytes \
            > COPY_FIRST_MAX_BYTES
        flying = self._issue_gets(remote, bounds, order, index, at, out, stats) if gets_first else None
        mine, filled = self.own_part, False
        owned = int(bounds[mine + 1] - bounds[mine]) if mine is not None else 0
        if flying is None and owned and (at is None or spare) and 2 * owned >= (n if at is None else out.shape[0]):
            # most rows are this rank's own: one contiguous copy of every row (the others get
            # row 0 for now) is cheaper than a scatter of the own ones (2-3x per row); the other
            # rows are overwritten below, or by the caller
            is_own = parts == mine
            if at is None:
                whole = np.where(is_own, index, 0)
            else:
                whole = np.zeros(out.shape[0], dtype=np.int64)
                whole[at[is_own]] = index[is_own]
            take_rows(self.own, whole, out)
            stats.rows_local += owned
            filled = True
        # with Gets in flight, in slices with MPI's progress poked between them: over OFI/TCP a
        # Get moves only while its origin and its target are in MPI
        step = max(1, PROGRESS_BYTES // self.row_bytes) if flying else n
        for part in nearby:
            if filled and part == mine:
                continue
            positions = order[bounds[part]:bounds[part + 1]]
            view = self.views[part]
            for first in range(0, positions.size, step):
                piece = positions[first:first + step]
                take_rows(view, index[piece], out, piece if at is None else at[piece])
                if flying:
                    self.progress()
            if view is self.own:
                stats.rows_local += positions.size
            else:
                stats.rows_shared += positions.size
        if flying is None:
            flying = self._issue_gets(remote, bounds, order, index, at, out, stats) if remote else Flight()
        if while_fetching is not None:
            while_fetching()
        if flying.requests:  # wait for the Gets by tests (the MPI lock released between them)
            waiting.wait_all(flying.requests, self.wait)
        if flying.flush:  # owners read by plain Gets, which no request completes
            with gate.held():
                for rank in flying.flush:
                    self.win.Flush(rank)
        for rows, positions in flying.scatters:  # indexed rows that landed in a scratch block: into place
            out[positions] = rows
        if flying.owners:
            stats.seconds_remote = time.perf_counter() - flying.start
        stats.owners_touched = flying.owners
        return out, stats

    def _issue_gets(self, remote: list, bounds, order, index, at, out, stats: ReadStats) -> Flight:
        """The Gets of every row of the partitions ``remote``: issued, not waited for. Each owner's
        Gets under one hold of the MPI lock (``rudder.comm.gate``; between owners a waiting thread
        may take it)."""
        flight = Flight(start=time.perf_counter())
        # an Rget's request is what a thread can test without blocking: every Get one with the
        # lock on, the last of each owner with ``yield``
        request = self.wait == "yield" or gate.ENABLED
        for part in remote:
            positions = order[bounds[part]:bounds[part + 1]]  # increasing
            local = index[positions]
            if at is not None:
                positions = at[positions]
            rank = int(self.exposer[part])
            with gate.held():
                if self.gets == "runs":
                    self._get_runs(out, positions, local, rank, request, flight)
                else:
                    self._get_indexed(out, positions, local, rank, part, flight)
            flight.owners += 1
            stats.rows_remote += positions.size
            stats.bytes_remote += positions.size * self.row_bytes
        return flight

    def progress(self) -> None:
        """Let MPI progress what is in flight (others' Gets of this rank's rows included) without
        waiting for anything; any thread may call it."""
        with gate.held():
            self.comm.Iprobe()

    def _get_runs(self, out: np.ndarray, positions: np.ndarray, local: np.ndarray, rank: int, request: bool,
                  flight: Flight) -> None:
        """One contiguous Get per run of rows consecutive on both sides: every one an ``Rget`` with
        the MPI lock on; otherwise plain Gets, the last an ``Rget`` with ``request`` (``yield``),
        and the owner flushed after."""
        breaks = np.flatnonzero((np.diff(local) != 1) | (np.diff(positions) != 1)) + 1
        starts = np.concatenate([[0], breaks])
        lengths = np.diff(np.concatenate([starts, [positions.size]]))
        get, row_type, items = self.win.Get, self.row_type, self.row_items
        runs = list(zip(positions[starts].tolist(), lengths.tolist(), local[starts].tolist()))
        if request and gate.ENABLED:
            rget = self.win.Rget
            flight.requests += [rget([out[first:first + n], n, row_type], rank, target=(row * items, n, row_type))
                                for first, n, row in runs]
            return
        for first, n, row in runs[:-1] if request else runs:
            get([out[first:first + n], n, row_type], rank, target=(row * items, n, row_type))
        if request:
            first, n, row = runs[-1]
            flight.requests.append(self.win.Rget([out[first:first + n], n, row_type], rank, target=(row * items, n, row_type)))
        flight.flush.append(rank)

    def _get_indexed(self, out: np.ndarray, positions: np.ndarray, local: np.ndarray, rank: int, part,
                     flight: Flight) -> None:
        """One ``Rget`` of the owner's rows (an indexed type on its side) into consecutive rows of
        ``out``, or of a scratch block scattered into place once it lands: four MPI calls an owner
        (build, commit, get, free; MPI frees a type in use once its operation completes), and
        no Flush (the request's completion is the rows' arrival)."""
        if local.max() > np.iinfo(np.int32).max:  # MPI datatype displacements are C ints
            raise OverflowError(f"row {int(local.max())} of partition {part} is beyond the 2^31 rows one RMA read can address")
        n, first = positions.size, int(positions[0])
        if int(positions[-1]) - first + 1 == n and (n < 3 or bool((np.diff(positions) == 1).all())):
            into = out[first:first + n]
        else:
            into = np.empty((n, *self.row_shape), dtype=self.dtype)
            flight.scatters.append((into, positions))
        target = self.row_type.Create_indexed_block(1, local.astype(np.int32)).Commit()
        flight.requests.append(self.win.Rget([into, n, self.row_type], rank, target=(0, 1, target)))
        target.Free()

    def publish(self) -> None:
        """Collective over ``comm``: rows written into segments (own or same-node views) after
        construction become visible to every reader."""
        def publish():
            self.win.Sync()
            self.comm.Barrier()
            self.win.Sync()
        gate.collective(self.comm, publish)

    def close(self) -> None:
        """Collective over ``comm``: call on every rank once no rank reads any more."""
        if self.win is not None:
            gate.collective(self.comm, self.comm.Barrier)
            with gate.held():
                self.win.Unlock_all()
                self.row_type.Free()
            self.own = None
            self.views.clear()
            gate.collective(self.comm, self.win.Free)
            self.win = None
