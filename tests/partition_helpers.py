"""Reassemble a partition directory back into input-ID space, for round-trip checks."""
from __future__ import annotations

import numpy as np

from rudder.data.partition_store import PartitionMeta, read_features, read_partition


def reassemble(directory: str) -> dict:
    meta = PartitionMeta.load(directory)
    parts = [read_partition(directory, p, meta) for p in range(meta.num_parts)]
    orig_of_new = np.concatenate([p.orig_ids for p in parts])
    n = meta.num_nodes
    feats = np.empty((n, meta.feat_dim), dtype=np.float32)
    labels = np.empty(n, dtype=np.int64)
    masks = {k: np.empty(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
    src, dst = [], []
    for p in parts:
        feats[p.orig_ids] = read_features(directory, p.part_id, meta)
        labels[p.orig_ids] = p.labels
        for k in masks:
            masks[k][p.orig_ids] = getattr(p, k)
        owned_new = np.arange(p.node_start, p.node_end)
        dst.append(orig_of_new[np.repeat(owned_new, np.diff(p.indptr))])
        src.append(orig_of_new[p.indices])
    src, dst = np.concatenate(src), np.concatenate(dst)
    order = np.lexsort((src, dst))  # the loaders' canonical (dst, src) order
    return {"meta": meta, "parts": parts, "orig_of_new": orig_of_new, "features": feats, "labels": labels,
            "src": src[order], "dst": dst[order], **masks}
