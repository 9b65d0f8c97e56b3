"""Global node-feature rows, served to every trainer through one-sided MPI.

Partition p's rows are exposed by one trainer: partition p's own trainer in ``trainer`` mode,
the lowest trainer of the node in ``node`` mode (its node peers expose nothing and read the
partition through shared memory). A gather maps global IDs to (partition, row) through the
contiguous ID ranges and reads them through ``DistributedArray``: own segment or same-node
shared memory by numpy take, other nodes by one indexed RMA Get per owner plus Flush. Every call
returns its counters (rows and bytes by path, owners touched) for the per-minibatch log.
"""
from __future__ import annotations

import numpy as np

from rudder.dist_array import DistributedArray, ReadStats
from rudder.layout import exposer_table
from rudder.partition_store import PartitionMeta, read_features


class FeatureStore:
    def __init__(self, layout, meta: PartitionMeta, data_dir: str, exposer: np.ndarray | None = None):
        self.meta, self.dim = meta, meta.feat_dim
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        exposer = exposer_table(layout, meta.num_parts) if exposer is None else exposer
        self.rows = DistributedArray(
            layout.trainers, [p.num_owned for p in meta.parts], exposer, layout.partition_id, np.float32,
            (self.dim,), fill=lambda own: read_features(data_dir, layout.partition_id, meta, out=own))

    @property
    def own(self) -> np.ndarray:
        return self.rows.own

    @property
    def views(self) -> dict:
        return self.rows.views

    def gather(self, gids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, ReadStats]:
        """Feature rows of global IDs ``gids`` (any order, repeats allowed), into ``out`` if given."""
        gids = np.asarray(gids, dtype=np.int64)
        parts = self.meta.owner_of(gids)
        return self.rows.read(parts, gids - self.offsets[parts], out)

    def close(self) -> None:
        """Collective over the trainers."""
        self.rows.close()
