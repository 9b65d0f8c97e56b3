"""``python -m partitioning verify DIR``: check a partition directory end to end.

Raises InputError (file: reason) at the first problem; returns a summary dict otherwise.
"""
from __future__ import annotations

import os

import numpy as np

from partitioning.graph import InputError, first_nonfinite_row
from partitioning.partition import load_meta_or_error
from rudder.data.partition_store import (
    PartitionFormatError,
    edge_multiset_hash,
    read_partition,
    read_stored_features,
    sha256_file,
)


def verify(directory: str) -> dict:
    meta = load_meta_or_error(directory)
    n, offsets = meta.num_nodes, np.asarray(meta.offsets, dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) <= 0).any():
        raise InputError(os.path.join(directory, "metadata.json"),
                         f"offsets {meta.offsets} do not split [0, {n}) into non-empty ranges")

    def fail(p, what):
        raise InputError(os.path.join(directory, meta.parts[p].file), what)

    # Pass 1: file checksums, and global in-degrees (needed to check every halo's in-degree).
    global_in_degree = np.empty(n, dtype=np.int64)
    parts = []
    for p, info in enumerate(meta.parts):
        path = os.path.join(directory, info.file)
        if not os.path.isfile(path):
            fail(p, "partition file missing")
        if sha256_file(path) != info.sha256:
            fail(p, "sha256 differs from metadata.json (file changed or truncated)")
        try:
            part = read_partition(directory, p, meta)
        except PartitionFormatError as e:
            fail(p, str(e).split(": ", 1)[-1])
        if (part.node_start, part.node_end) != (offsets[p], offsets[p + 1]):
            fail(p, f"owns [{part.node_start}, {part.node_end}), metadata says [{offsets[p]}, {offsets[p + 1]})")
        global_in_degree[part.node_start:part.node_end] = part.in_degree if part.in_degree.shape == (part.num_owned,) else -1
        parts.append(part)

    # Pass 2: structure of each partition, and totals across them.
    seen_orig = np.zeros(n, dtype=bool)
    total_edges, total_hash = 0, 0
    for p, (info, part) in enumerate(zip(meta.parts, parts)):
        owned, lo, hi = part.num_owned, part.node_start, part.node_end
        for name in ("labels", "train_mask", "val_mask", "test_mask", "orig_ids", "in_degree"):
            if getattr(part, name).shape != (owned,):
                fail(p, f"{name} has shape {getattr(part, name).shape}, expected ({owned},)")
        try:  # stored in the metadata's type, in rows of its width
            stored = read_stored_features(directory, p, meta)
        except PartitionFormatError as e:
            fail(p, str(e).split(": ", 1)[-1])
        if stored.shape[0] != owned:
            fail(p, f"{stored.shape[0]} feature rows, expected {owned}")
        encoding = meta.feature_encoding
        if encoding.name == "bits" and meta.feat_dim % 8 and (stored[:, -1] & ((1 << (8 - meta.feat_dim % 8)) - 1)).any():
            fail(p, f"bits features have padding bits set beyond column {meta.feat_dim}")
        feats = encoding.decode(stored)
        bad = first_nonfinite_row(feats)
        if bad is not None:
            fail(p, f"features of node {lo + bad} contain NaN or inf")
        in_split = part.train_mask | part.val_mask | part.test_mask
        if ((part.labels >= meta.num_classes) | (part.labels < np.where(in_split, 0, -1))).any():
            fail(p, f"labels out of range [0, {meta.num_classes})")
        counts = (int(part.train_mask.sum()), int(part.val_mask.sum()), int(part.test_mask.sum()))
        if counts != (info.num_train, info.num_val, info.num_test):
            fail(p, f"train/val/test counts {counts} differ from metadata {(info.num_train, info.num_val, info.num_test)}")
        if owned and (part.orig_ids.min() < 0 or part.orig_ids.max() >= n or seen_orig[part.orig_ids].any()
                      or np.unique(part.orig_ids).size != owned):
            fail(p, "orig_ids are out of range or repeat an id of this or another partition")
        seen_orig[part.orig_ids] = True
        indptr, indices = part.indptr, part.indices
        if indptr.shape != (owned + 1,) or indptr[0] != 0 or indptr[-1] != indices.size or (np.diff(indptr) < 0).any():
            fail(p, "csr/indptr is not a valid row pointer for csr/indices")
        if not np.array_equal(np.diff(indptr), part.in_degree):
            fail(p, "in_degree disagrees with csr/indptr")
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            fail(p, f"csr/indices hold ids outside [0, {n})")
        if indices.size != info.num_in_edges:
            fail(p, f"{indices.size} in-edges, metadata says {info.num_in_edges}")
        part_hash = edge_multiset_hash(np.repeat(np.arange(lo, hi, dtype=np.int64), part.in_degree), indices, n)
        if f"{part_hash:016x}" != info.edge_hash:
            fail(p, "edge checksum differs from metadata (edges changed, lost or duplicated)")
        total_edges += indices.size
        total_hash = (total_hash + part_hash) % (1 << 64)
        halo = np.unique(indices[(indices < lo) | (indices >= hi)])
        if not np.array_equal(halo, part.halo_nodes):
            fail(p, f"halo/nodes ({part.halo_nodes.size}) differ from the remote sources of csr/indices ({halo.size})")
        if not np.array_equal(part.halo_owners, meta.owner_of(halo)):
            fail(p, "halo/owners disagree with the partition offsets")
        if not np.array_equal(part.halo_in_degree, global_in_degree[halo]):
            fail(p, "halo/in_degree disagrees with the owners' in-degrees")
        if part.halo_nodes.size != info.num_halo:
            fail(p, f"{part.halo_nodes.size} halo nodes, metadata says {info.num_halo}")
    meta_path = os.path.join(directory, "metadata.json")
    if total_edges != meta.num_edges:
        raise InputError(meta_path, f"partitions hold {total_edges} edges, metadata says {meta.num_edges}")
    if f"{total_hash:016x}" != meta.edge_hash:
        raise InputError(meta_path, "the partitions' edge checksums do not add up to the graph's")
    if not seen_orig.all():
        raise InputError(meta_path, f"{int((~seen_orig).sum())} input nodes belong to no partition")
    return {"num_parts": meta.num_parts, "num_nodes": n, "num_edges": total_edges,
            "halo": [p.halo_nodes.size for p in parts]}
