"""Assign nodes to partitions, relabel them into contiguous ranges, and write the partition
directory atomically (a temp directory renamed into place at the end)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import UTC, datetime

import numpy as np

from partitioning.graph import GraphData, InputError, canonical_edges
from rudder.data.feature_encoding import STORAGE_TYPES, choose_encoding
from rudder.data.partition_store import (
    METADATA_FILE,
    PartInfo,
    PartitionFormatError,
    PartitionMeta,
    edge_multiset_hash,
    part_file_name,
    sha256_file,
    write_partition_file,
)


# ----------------------------------------------------------------------------- assignment
def assign_metis(graph: GraphData, num_parts: int, seed: int) -> np.ndarray:
    """METIS k-way with three balance constraints per node (non-training, training, degree): the
    multi-constraint weights of DistDGL's partition_graph(balance_ntypes=train_mask,
    balance_edges=True), so parts get equal nodes, training nodes and edges."""
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    from partitioning.metis import part_graph_kway

    n = graph.num_nodes
    src, dst = graph.src, graph.dst
    if not graph.info.get("symmetrised", False):  # METIS needs an undirected graph
        src, dst = canonical_edges(src, dst, n, symmetric=True)
    # canonical edges are sorted by dst, so the src column is a CSR adjacency list
    xadj = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    train = graph.train_mask.astype(np.int64)
    vweights = np.stack([1 - train, train, np.diff(xadj)], axis=1).reshape(-1)  # node-major, ncon = 3
    _, parts = part_graph_kway(xadj, src, vweights, 3, num_parts, seed)
    return parts


def assign_random(graph: GraphData, num_parts: int, seed: int) -> np.ndarray:
    """Seeded random assignment with equal part sizes (+-1)."""
    perm = np.random.default_rng(seed).permutation(graph.num_nodes)
    parts = np.empty(graph.num_nodes, dtype=np.int64)
    parts[perm] = np.arange(graph.num_nodes) % num_parts
    return parts


METHODS = {"metis": assign_metis, "random": assign_random}
FEATURE_DTYPES = ("auto", *STORAGE_TYPES)


def check_feature_dtype(name: str) -> None:
    if name not in FEATURE_DTYPES:
        raise InputError("--feature-dtype", f"'{name}' is not one of {', '.join(FEATURE_DTYPES)}")


# ----------------------------------------------------------------------------- output directory
def check_output(out: str, force: bool) -> None:
    """Refuse to overwrite anything that is not an empty dir or (with --force) a partition dir."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(out, "exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise InputError(out, "exists and is not empty (pass --force to replace a partition directory)")
        if not os.path.isfile(os.path.join(out, METADATA_FILE)):
            raise InputError(out, f"is not empty and holds no {METADATA_FILE}: refusing to replace it even with --force")


def publish(tmp: str, out: str) -> None:
    """Move a finished temp directory to ``out``; an old ``out`` is removed only afterwards."""
    old = None
    if os.path.isdir(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rename(out, os.path.join(old, "dir"))
    os.rename(tmp, out)
    if old:
        shutil.rmtree(old)


# ----------------------------------------------------------------------------- the pipeline
def partition_graph(graph: GraphData, num_parts: int, out: str, method: str = "metis", seed: int = 0,
                    force: bool = False, source: str = "", feature_dtype: str = "auto") -> tuple[PartitionMeta, dict]:
    """``feature_dtype``: the features' storage type (``rudder.data.feature_encoding``), or
    ``auto``: the smallest one that stores them exactly."""
    out = os.path.abspath(out)
    check_output(out, force)
    n = graph.num_nodes
    if not 1 <= num_parts <= n:
        raise InputError("--num-parts", f"{num_parts} must lie in [1, {n}] (the number of nodes)")
    check_feature_dtype(feature_dtype)
    timings = {}
    t0 = time.perf_counter()
    encoding, lossless, max_error = choose_encoding(graph.features, feature_dtype)
    timings["encoding_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    parts = METHODS[method](graph, num_parts, seed)
    timings["assign_s"] = time.perf_counter() - t0
    counts = np.bincount(parts, minlength=num_parts)
    if (counts == 0).any():
        raise InputError("--num-parts", f"{method} left partition {int(np.flatnonzero(counts == 0)[0])} empty; use fewer parts")

    t0 = time.perf_counter()
    orig_of_new = np.argsort(parts, kind="stable")  # new id -> input id; input order kept within a part
    del parts
    new_of_orig = np.empty(n, dtype=np.int64)
    new_of_orig[orig_of_new] = np.arange(n, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # One int64 key per edge (new dst * N + new src) and one in-place sort give the in-edge CSR;
    # in-place arithmetic keeps the peak at one extra array per edge.
    key = new_of_orig[graph.dst]
    key *= n
    key += new_of_orig[graph.src]
    key.sort()
    indptr = np.concatenate([[0], np.cumsum(np.bincount(key // n, minlength=n))]).astype(np.int64)
    key %= n
    indices = key  # source ids, sorted within each destination's row
    del key
    in_degree = np.diff(indptr)
    timings["relabel_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        infos, total_hash = [], 0
        for p in range(num_parts):
            lo, hi = int(offsets[p]), int(offsets[p + 1])
            e_lo, e_hi = int(indptr[lo]), int(indptr[hi])
            src_p = indices[e_lo:e_hi]
            remote = src_p[(src_p < lo) | (src_p >= hi)]
            halo = np.unique(remote)
            owners = (np.searchsorted(offsets, halo, side="right") - 1).astype(np.int32)
            rows = orig_of_new[lo:hi]
            masks = [graph.train_mask[rows], graph.val_mask[rows], graph.test_mask[rows]]
            path = os.path.join(tmp, part_file_name(p))
            write_partition_file(path, part_id=p, num_parts=num_parts, node_start=lo, num_nodes=n,
                                 features=np.asarray(graph.features[rows]),
                                 labels=graph.labels[rows], train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                                 orig_ids=rows, in_degree=in_degree[lo:hi], indptr=indptr[lo:hi + 1] - e_lo,
                                 indices=src_p, halo_nodes=halo, halo_owners=owners, halo_in_degree=in_degree[halo],
                                 encoding=encoding)
            part_hash = edge_multiset_hash(np.repeat(np.arange(lo, hi, dtype=np.int64), in_degree[lo:hi]), src_p, n)
            total_hash = (total_hash + part_hash) % (1 << 64)
            infos.append(PartInfo(file=part_file_name(p), sha256=sha256_file(path), num_owned=hi - lo,
                                  num_in_edges=e_hi - e_lo, num_halo=int(halo.size), num_train=int(masks[0].sum()),
                                  num_val=int(masks[1].sum()), num_test=int(masks[2].sum()), edge_hash=f"{part_hash:016x}"))
        meta = PartitionMeta(source=source or graph.info.get("source", ""), dataset=graph.name, num_nodes=n,
                             num_edges=graph.num_edges, feat_dim=graph.feat_dim, num_classes=graph.num_classes,
                             method=method, seed=seed, offsets=[int(x) for x in offsets],
                             created=datetime.now(UTC).isoformat(timespec="seconds"),
                             edge_hash=f"{total_hash:016x}", preprocessing=dict(graph.info), parts=infos,
                             partitioner=partitioner_info(method), feature_dtype=encoding.name,
                             feature_lossless=lossless, feature_max_abs_error=max_error)
        meta.write(tmp)
        timings["write_s"] = time.perf_counter() - t0
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta, timings


def partitioner_info(method: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = {"tool": "python -m partitioning", "method": method}
    for pkg in ("rudder", "dgl", "numpy", "h5py"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return info


def load_meta_or_error(directory: str) -> PartitionMeta:
    try:
        return PartitionMeta.load(directory)
    except PartitionFormatError as e:
        where, _, what = str(e).partition(": ")  # PartitionFormatError reads "PATH: problem"
        raise InputError(where, what) from None
