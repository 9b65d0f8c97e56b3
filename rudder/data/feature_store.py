"""Rows indexed by global node ID, served to every trainer through one-sided MPI: the node
features, and (during layer-wise evaluation) each layer's hidden embeddings.

Partition p's rows are exposed by one trainer: partition p's own trainer in ``trainer`` mode,
the lowest trainer of the node in ``node`` mode (its node peers expose nothing and read the
partition through shared memory). A gather maps global IDs to (partition, row) through the
contiguous ID ranges and reads them through ``DistributedArray``: own segment or same-node
shared memory by a row copy, other nodes by RMA Gets plus one Flush per owner. Every call
returns its counters (rows and bytes by path, owners touched, RMA time) for the per-minibatch log.

Node features are held and moved in the type the partition directory stores them in
(``rudder.data.feature_encoding``: bits, uint8, float16, bfloat16 or float32), and widened to
float32 once gathered, into the caller's input matrix: the model sees the same float32 rows
whatever the storage, and the logged RMA bytes are the stored rows' bytes.
"""
from __future__ import annotations

import numpy as np

from rudder.comm.dist_array import DistributedArray, ReadStats
from rudder.comm.layout import exposer_table
from rudder.data.partition_store import PartitionMeta, read_stored_features


class NodeRows:
    """A ``DistributedArray`` with one segment per partition, addressed by global node ID."""

    def __init__(self, meta: PartitionMeta, rows: DistributedArray):
        self.meta, self.rows = meta, rows
        self.offsets = np.asarray(meta.offsets, dtype=np.int64)
        self.dim = rows.row_shape[0] if rows.row_shape else 1

    @property
    def own(self) -> np.ndarray:
        return self.rows.own

    @property
    def views(self) -> dict:
        return self.rows.views

    def in_shared_memory(self, gids: np.ndarray) -> np.ndarray:
        """Per global ID: its row is read by a copy from memory this process maps (its own
        segment or a same-node peer's), not by RMA."""
        gids = np.asarray(gids, dtype=np.int64)
        return np.isin(self.meta.owner_of(gids), np.fromiter(self.rows.views, dtype=np.int64))

    def gather(self, gids: np.ndarray, out: np.ndarray | None = None, at: np.ndarray | None = None,
               spare: bool = False, while_fetching=None) -> tuple[np.ndarray, ReadStats]:
        """Rows of global IDs ``gids`` (any order, repeats allowed), into ``out`` if given, at
        its rows ``at`` if given (else its first rows); ``spare``: ``out``'s other rows may be
        overwritten; ``while_fetching``: the caller's work to overlap the Gets
        (``DistributedArray.read``)."""
        gids = np.asarray(gids, dtype=np.int64)
        parts = self.meta.owner_of(gids)
        return self.rows.read(parts, gids - self.offsets[parts], out, at, spare, while_fetching)

    def close(self) -> None:
        """Collective over the trainers."""
        self.rows.close()


class FeatureStore(NodeRows):
    """The node features of every partition: rows ``meta.feat_dim`` wide, stored as
    ``meta.feature_encoding``, gathered as float32."""

    def __init__(self, layout, meta: PartitionMeta, data_dir: str, exposer: np.ndarray | None = None,
                 gets: str = "auto"):
        exposer = exposer_table(layout, meta.num_parts) if exposer is None else exposer
        self.encoding = enc = meta.feature_encoding
        super().__init__(meta, DistributedArray(
            layout.trainers, [p.num_owned for p in meta.parts], exposer, layout.partition_id, enc.stored_dtype,
            (enc.width,), fill=lambda own: read_stored_features(data_dir, layout.partition_id, meta, out=own), gets=gets,
            wait=layout.mpi_wait, nearby=layout.node_trainer_ranks))
        self.dim = meta.feat_dim

    def gather(self, gids: np.ndarray, out: np.ndarray | None = None, at: np.ndarray | None = None,
               spare: bool = False, while_fetching=None) -> tuple[np.ndarray, ReadStats]:
        """Float32 rows of ``gids`` (``NodeRows.gather``); compact rows are gathered as stored,
        then widened into ``out`` (rows ``while_fetching`` writes are others than ``at``'s)."""
        if self.encoding.name == "float32":
            return super().gather(gids, out, at, spare, while_fetching)
        stored, stats = super().gather(gids, while_fetching=while_fetching)
        return self.encoding.decode(stored, out, at), stats
