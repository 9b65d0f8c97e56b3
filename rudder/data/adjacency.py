"""The partitioned in-edge CSR, readable from every trainer, in one of two topologies
(``--topology``):

* ``distributed``: each partition's row pointers and neighbour IDs are two ``DistributedArray``s,
  so a remote node's degree and its chosen neighbours are read one-sidedly (shared memory on the
  node, indexed RMA Gets elsewhere), never needing the owner's help. Only the chosen neighbour
  entries are read, not whole neighbour lists;
* ``replicated``: every node holds the whole graph's CSR once, in memory its trainers share
  (``NodeSharedArrays``), read from the partition files at start-up; sampling then reads nothing
  remotely. Over a network an indexed Get of 8-byte entries costs a round trip and, on transports
  without hardware RMA (MPICH over OFI/TCP), waits for the owner to enter MPI: sampling's reads
  were most of a shaped epoch's non-feature time (docs/network.md), for a structure that is small
  beside the features (8 bytes an edge);
* ``auto``: replicated when the whole CSR takes at most ``REPLICATE_MAX_BYTES`` a node (decided
  from the partition metadata alone, so the simulator and every rank agree), else distributed.

Both give the same degrees and neighbours, so sampling, and so training, is bit-identical.
"""
from __future__ import annotations

import numpy as np

from rudder.comm import gate
from rudder.comm.dist_array import DistributedArray, ReadStats
from rudder.comm.shared_memory import NodeSharedArrays
from rudder.data.partition_store import read_csr_into

TOPOLOGIES = ("auto", "distributed", "replicated")
REPLICATE_MAX_BYTES = 2 << 30  # a node's copy of the CSR under auto: small beside a cluster node's memory


def csr_bytes(meta) -> int:
    """Bytes of the whole graph's in-edge CSR (int64 row pointers per partition and neighbour IDs)."""
    return 8 * sum(p.num_owned + 1 + p.num_in_edges for p in meta.parts)


def resolve_topology(choice: str, meta) -> str:
    """``distributed`` or ``replicated`` for ``--topology choice`` on this partitioning."""
    if choice not in TOPOLOGIES:
        raise ValueError(f"--topology {choice!r}: expected one of {', '.join(TOPOLOGIES)}")
    if choice == "auto":
        return "replicated" if csr_bytes(meta) <= REPLICATE_MAX_BYTES else "distributed"
    return choice


class Adjacency:
    """The partitioned in-edge CSR over RMA windows (``distributed``)."""

    def __init__(self, layout, meta, partition, exposer):
        self.meta = meta
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        comm, mine = layout.trainers, layout.partition_id

        def fill(name):
            def copy(own):
                own[:] = getattr(partition, name)
            return copy

        self.indptr = DistributedArray(comm, [p.num_owned + 1 for p in meta.parts], exposer, mine, np.int64,
                                       fill=fill("indptr"), wait=layout.mpi_wait, nearby=layout.node_trainer_ranks)
        self.indices = DistributedArray(comm, [p.num_in_edges for p in meta.parts], exposer, mine, np.int64,
                                        fill=fill("indices"), wait=layout.mpi_wait, nearby=layout.node_trainer_ranks)

    def rows(self, gids: np.ndarray, stats: ReadStats):
        """(partition, start in that partition's indices, in-degree) of each global ID."""
        parts = self.meta.owner_of(gids)
        local = gids - self.offsets[parts]
        both, s = self.indptr.read(np.concatenate([parts, parts]), np.concatenate([local, local + 1]))
        stats.add(s)
        start, end = both[:gids.size], both[gids.size:]
        return parts, start, end - start

    def neighbours(self, parts: np.ndarray, positions: np.ndarray, stats: ReadStats) -> np.ndarray:
        out, s = self.indices.read(parts, positions)
        stats.add(s)
        return out

    def close(self) -> None:
        self.indptr.close()
        self.indices.close()


class ReplicatedAdjacency:
    """The whole in-edge CSR once per node (``replicated``), behind ``Adjacency``'s interface:
    every partition's row pointers and neighbour IDs end to end, filled by the node's first
    trainer. Collective over the node's trainers (construction and ``close``)."""

    def __init__(self, layout, meta, data_dir: str):
        self.meta = meta
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        self.shared = NodeSharedArrays(layout.node_trainers)
        sizes = [(p.num_owned + 1, p.num_in_edges) for p in meta.parts]
        self.indptr_base = np.concatenate([[0], np.cumsum([a for a, _ in sizes])]).astype(np.int64)
        self.indices_base = np.concatenate([[0], np.cumsum([b for _, b in sizes])]).astype(np.int64)
        self.indptr = self.shared.alloc(int(self.indptr_base[-1]), np.int64)
        self.indices = self.shared.alloc(int(self.indices_base[-1]), np.int64)
        if layout.node_trainers.rank == 0:
            for part in range(meta.num_parts):
                read_csr_into(data_dir, part, meta, self.indptr[self.indptr_base[part]:self.indptr_base[part + 1]],
                              self.indices[self.indices_base[part]:self.indices_base[part + 1]])
        gate.collective(layout.node_trainers, layout.node_trainers.Barrier)  # filled before anyone samples

    def rows(self, gids: np.ndarray, stats: ReadStats):
        parts = self.meta.owner_of(gids)
        at = self.indptr_base[parts] + gids - self.offsets[parts]
        start = self.indptr[at]
        stats.rows_local += 2 * gids.size
        return parts, start, self.indptr[at + 1] - start

    def neighbours(self, parts: np.ndarray, positions: np.ndarray, stats: ReadStats) -> np.ndarray:
        stats.rows_local += positions.size
        return self.indices[self.indices_base[parts] + positions]

    def close(self) -> None:
        self.shared.close()


def open_adjacency(topology: str, layout, meta, partition, exposer, data_dir: str):
    """The trainer's CSR reader for ``--topology topology`` (collective over the trainers)."""
    if resolve_topology(topology, meta) == "replicated":
        return ReplicatedAdjacency(layout, meta, data_dir)
    return Adjacency(layout, meta, partition, exposer)
