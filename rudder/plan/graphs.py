"""The graph a plan is made for, as each trainer's partition sees it: from a partition directory's
metadata (exact counts a part) or from a dataset's published statistics split evenly into the
job's parts (estimates: the halo from an assumed edge cut).

A part's halo is the set of remote nodes with an edge into it. From published statistics it is
estimated as the distinct endpoints of the part's cut in-edges, drawn uniformly from the nodes
outside it: h = R (1 - exp(-c e / R)), R = N - n, with c the share of in-edges that cross parts
(``--edge-cut``). That assumption, not the counting, is what a plan from statistics rests on.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from rudder.data.feature_encoding import FeatureEncoding
from rudder.data.partition_store import PartitionMeta

# Published statistics (OGB). Edges: directed edges after symmetrising, the CSR the partitioner
# writes. ``edge_cut``: the share of in-edges crossing parts assumed for METIS parts, an
# assumption of this tool, not a published figure (papers100M's 0.8 gives the ~10M-node halo a
# trainer issue 40 estimated at 256 parts): pass --edge-cut where it is known.
LIKE = {
    "products": {"num_nodes": 2_449_029, "num_edges": 123_718_280, "feat_dim": 100, "num_classes": 47,
                 "num_train": 196_615, "num_val": 39_323, "num_test": 2_213_091, "edge_cut": 0.2},
    "papers100M": {"num_nodes": 111_059_956, "num_edges": 3_231_371_744, "feat_dim": 128, "num_classes": 172,
                   "num_train": 1_207_179, "num_val": 125_265, "num_test": 214_338, "edge_cut": 0.8},
}
NODE_FILE_BYTES = 8 + 3 + 8 + 8  # labels, three masks, original IDs, in-degree (int64, bool)
HALO_FILE_BYTES = 8 + 4 + 8  # halo nodes, their owners, their in-degrees


@dataclass
class Part:
    owned: int
    in_edges: int
    halo: int
    train: int
    val: int
    test: int
    file_bytes: int  # the part file on storage


@dataclass
class GraphShape:
    name: str
    num_nodes: int
    num_edges: int
    feat_dim: int
    num_classes: int
    feature_dtype: str
    parts: list[Part]
    estimated: bool  # from published statistics (else from a partition directory's metadata)
    edge_cut: float | None = None
    data: str | None = None  # the partition directory

    @property
    def row_bytes(self) -> int:
        return FeatureEncoding(self.feature_dtype, self.feat_dim).row_bytes

    @property
    def csr_bytes(self) -> int:
        """The whole in-edge CSR (rudder.data.adjacency.csr_bytes)."""
        return 8 * sum(p.owned + 1 + p.in_edges for p in self.parts)


def from_partitions(directory: str) -> GraphShape:
    """Every part as its metadata counts it (PartitionFormatError: not a partition directory)."""
    meta = PartitionMeta.load(directory)
    parts = []
    for info in meta.parts:
        path = os.path.join(directory, info.file)
        parts.append(Part(info.num_owned, info.num_in_edges, info.num_halo, info.num_train, info.num_val,
                          info.num_test, os.path.getsize(path) if os.path.isfile(path) else 0))
    return GraphShape(meta.dataset or os.path.basename(os.path.normpath(directory)), meta.num_nodes, meta.num_edges,
                      meta.feat_dim, meta.num_classes, meta.feature_dtype, parts, False, data=directory)


def halo_estimate(num_nodes: int, owned: int, in_edges: int, edge_cut: float) -> int:
    outside = num_nodes - owned
    return int(round(outside * -math.expm1(-edge_cut * in_edges / outside))) if outside > 0 else 0


def from_statistics(name: str, num_parts: int, edge_cut: float | None = None, feature_dtype: str = "float32") -> GraphShape:
    """``LIKE[name]`` split into ``num_parts`` equal parts."""
    s = LIKE[name]
    cut = s["edge_cut"] if edge_cut is None else edge_cut
    n, e = s["num_nodes"] / num_parts, s["num_edges"] / num_parts
    row = FeatureEncoding(feature_dtype, s["feat_dim"]).row_bytes
    halo = halo_estimate(s["num_nodes"], int(n), int(e), cut)
    part = Part(int(n), int(e), halo, s["num_train"] // num_parts, s["num_val"] // num_parts,
                s["num_test"] // num_parts,
                int(n * (NODE_FILE_BYTES + row) + 8 * (n + 1 + e) + halo * HALO_FILE_BYTES))
    return GraphShape(name, s["num_nodes"], s["num_edges"], s["feat_dim"], s["num_classes"], feature_dtype,
                      [part] * num_parts, True, cut)
