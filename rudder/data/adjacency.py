"""The partitioned in-edge CSR, readable from every trainer: each partition's row pointers and
neighbour IDs are two ``DistributedArray``s, so a remote node's degree and its chosen neighbours
are read one-sidedly (shared memory on the node, indexed RMA Gets elsewhere), never needing the
owner's help. Only the chosen neighbour entries are read, not whole neighbour lists."""
from __future__ import annotations

import numpy as np

from rudder.comm.dist_array import DistributedArray, ReadStats


class Adjacency:
    """The partitioned in-edge CSR, readable from every trainer."""

    def __init__(self, layout, meta, partition, exposer):
        self.meta = meta
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        comm, mine = layout.trainers, layout.partition_id

        def fill(name):
            def copy(own):
                own[:] = getattr(partition, name)
            return copy

        self.indptr = DistributedArray(comm, [p.num_owned + 1 for p in meta.parts], exposer, mine, np.int64,
                                       fill=fill("indptr"))
        self.indices = DistributedArray(comm, [p.num_in_edges for p in meta.parts], exposer, mine, np.int64,
                                        fill=fill("indices"))

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
