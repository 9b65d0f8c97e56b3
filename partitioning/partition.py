"""Assign nodes to partitions, relabel them into contiguous ranges, and write the partition
directory atomically (a temp directory renamed into place at the end).

The pipeline holds the graph's CSR (``GraphData``: 4 bytes an edge) and arrays per node; each
part is sliced from the CSR, relabelled, sorted and written on its own (``write_part``): its file
is built in memory (its features read from the source block by block), then written to disk and
hashed in the same pass (the bytes HDF5 writes to a file itself). Under mpiexec
(``partitioning.parallel``) the ranks share the parts: rank 0 sends each rank the CSR rows of its
parts; the ranks relabel them, read their features, write and hash them, byte for byte as serially.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from partitioning import multilevel
from partitioning.csr import CHUNK_EDGES, build_csr, index_dtype
from partitioning.features import array_reference, choose_encoding, gather_rows
from partitioning.graph import GraphData, InputError
from rudder.data.feature_encoding import STORAGE_TYPES, FeatureEncoding
from rudder.data.partition_store import (
    METADATA_FILE,
    PartInfo,
    PartitionFormatError,
    PartitionMeta,
    edge_multiset_hash,
    part_file_name,
    write_partition_file,
)

HASH_BLOCK = 1 << 24


# ----------------------------------------------------------------------------- assignment
def csr_chunks(indptr: np.ndarray, indices: np.ndarray):
    """Edge chunks (src, dst) of an in-edge CSR, about CHUNK_EDGES at a time."""
    def edges():
        n, row = indptr.shape[0] - 1, 0
        while row < n:
            end = min(max(int(np.searchsorted(indptr, indptr[row] + CHUNK_EDGES, side="right")) - 1, row + 1), n)
            lo, hi = int(indptr[row]), int(indptr[end])
            yield indices[lo:hi], np.repeat(np.arange(row, end, dtype=np.int64), np.diff(indptr[row:end + 1]))
            row = end
    return edges


def metis_inputs(graph: GraphData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xadj, adjncy, vweights) of the undirected graph, in the narrowest index type that holds
    them, so that a 32-bit METIS takes them without another copy: adjncy is the graph's own CSR
    (a symmetrised copy of it only for directed inputs). Weights: three per node, node-major:
    non-training, training, degree (DistDGL's balance_ntypes=train_mask, balance_edges=True)."""
    n = graph.num_nodes
    xadj, adjncy = graph.indptr, graph.indices
    if not graph.info.get("symmetrised", False):  # METIS needs an undirected graph
        xadj, adjncy = build_csr(csr_chunks(xadj, adjncy), n, True, "graph")
    idx = np.int32 if adjncy.shape[0] <= np.iinfo(np.int32).max else np.int64
    vweights = np.empty(3 * n, dtype=idx)
    vweights[0::3] = ~graph.train_mask
    vweights[1::3] = graph.train_mask
    vweights[2::3] = np.diff(xadj)
    return xadj.astype(idx), adjncy, vweights


def assign_random(graph: GraphData, num_parts: int, seed: int) -> np.ndarray:
    """Seeded random assignment with equal part sizes (+-1)."""
    perm = np.random.default_rng(seed).permutation(graph.num_nodes)
    parts = np.empty(graph.num_nodes, dtype=np.int64)
    parts[perm] = np.arange(graph.num_nodes) % num_parts
    return parts


def assign(graph: GraphData, num_parts: int, seed: int, method: str, metis_levels: str = "disk"
           ) -> tuple[np.ndarray, str, dict]:
    """(part of each node, the method that ran, what metadata.json's partitioner keeps of the choice).
    metis/multilevel/auto: multi-constraint k-way on the CSR (``partitioning.multilevel.assign``
    picks METIS, or the path beyond its 32-bit indices), balanced on non-training nodes, training
    nodes and degree as DistDGL's partition_graph(balance_ntypes=train_mask, balance_edges=True);
    random: seeded, equal sizes."""
    if method == "random":
        return assign_random(graph, num_parts, seed), "random", {}
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64), "metis" if method == "auto" else method, {}
    xadj, adjncy, vweights = metis_inputs(graph)
    result = multilevel.assign(method, xadj, adjncy, vweights, 3, num_parts, seed, metis_levels)
    return result.parts, result.method, result.record(method)


METHODS = {name: assign for name in (*multilevel.METHODS, "random")}
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


def make_temp_dir(out: str) -> str:
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)


def publish(tmp: str, out: str) -> None:
    """Move a finished temp directory to ``out``; an old ``out`` is removed only afterwards."""
    old = None
    if os.path.isdir(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rename(out, os.path.join(old, "dir"))
    os.rename(tmp, out)
    if old:
        shutil.rmtree(old)


# ----------------------------------------------------------------------------- one part
@dataclass
class Layout:
    """What every part's writer needs besides its own rows: arrays per node, no edges."""

    num_nodes: int
    num_parts: int
    offsets: np.ndarray  # int64 [K + 1]
    new_of_orig: np.ndarray  # [N] new ID of each input node (int32 while N allows)
    in_degree: np.ndarray  # int64 [N] by new ID
    encoding: FeatureEncoding
    features: dict | None  # array_reference of file-backed features (each writer reads its rows), or None


@dataclass
class PartRows:
    """One part's slice of the input: its nodes (input IDs, ascending: input order is kept within a
    part), their in-edges' sources (input IDs, row by row), node data, and their feature rows when
    the features are not file-backed."""

    part: int
    rows: np.ndarray
    lengths: np.ndarray
    sources: np.ndarray
    labels: np.ndarray
    masks: tuple[np.ndarray, np.ndarray, np.ndarray]
    features: np.ndarray | None


def part_rows(graph: GraphData, layout: Layout, orig_of_new: np.ndarray, p: int) -> PartRows:
    lo, hi = int(layout.offsets[p]), int(layout.offsets[p + 1])
    rows = orig_of_new[lo:hi]
    starts = graph.indptr[rows]
    lengths = graph.indptr[rows + 1] - starts
    at = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    at += np.arange(at.shape[0], dtype=np.int64)
    sources = graph.indices[at]
    del at
    masks = (graph.train_mask[rows], graph.val_mask[rows], graph.test_mask[rows])
    feats = None if layout.features is not None else gather_rows(graph.features, rows)
    return PartRows(p, rows, lengths, sources, graph.labels[rows], masks, feats)


def part_features(part: PartRows, features: np.ndarray | None) -> np.ndarray:
    """The part's float32 feature rows: sent with the rows, or read from the file-backed source
    block by block (the part's rows, and never the whole source, in memory)."""
    return part.features if part.features is not None else gather_rows(features, part.rows)


def write_hashed(image: bytes, path: str) -> str:
    """Write a file image to ``path``, hashing it on the way (SHA-256, hex)."""
    digest = hashlib.sha256()
    view = memoryview(image)
    with open(path, "wb") as f:
        for lo in range(0, len(view), HASH_BLOCK):
            chunk = view[lo:lo + HASH_BLOCK]
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


def write_part(part: PartRows, layout: Layout, directory: str, features: np.ndarray | None = None) -> PartInfo:
    """Relabel, sort and write one part into ``directory``; its PartInfo (file hash, counts,
    edge checksum). ``features``: the source rows are read from (file-backed features)."""
    p, n = part.part, layout.num_nodes
    lo, hi = int(layout.offsets[p]), int(layout.offsets[p + 1])
    # One int64 key per in-edge (local row * N + new source) and one sort give the rows sorted.
    key = np.repeat(np.arange(hi - lo, dtype=np.int64), part.lengths)
    key *= n
    key += layout.new_of_orig[part.sources]
    key.sort()
    indices = key
    indices %= n
    del key
    indptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(part.lengths, out=indptr[1:])
    halo = np.unique(indices[(indices < lo) | (indices >= hi)])
    owners = (np.searchsorted(layout.offsets, halo, side="right") - 1).astype(np.int32)
    path = os.path.join(directory, part_file_name(p))
    image = write_partition_file(path, part_id=p, num_parts=layout.num_parts, node_start=lo, num_nodes=n,
                                 features=part_features(part, features), labels=part.labels,
                                 train_mask=part.masks[0], val_mask=part.masks[1], test_mask=part.masks[2],
                                 orig_ids=part.rows, in_degree=part.lengths, indptr=indptr, indices=indices,
                                 halo_nodes=halo, halo_owners=owners, halo_in_degree=layout.in_degree[halo],
                                 encoding=layout.encoding, in_memory=True)
    sha = write_hashed(image, path)
    del image
    part_hash = edge_multiset_hash(np.repeat(np.arange(lo, hi, dtype=np.int64), part.lengths), indices, n)
    return PartInfo(file=part_file_name(p), sha256=sha, num_owned=hi - lo, num_in_edges=int(indices.size),
                    num_halo=int(halo.size), num_train=int(part.masks[0].sum()), num_val=int(part.masks[1].sum()),
                    num_test=int(part.masks[2].sum()), edge_hash=f"{part_hash:016x}")


# ----------------------------------------------------------------------------- the pipeline
def check_request(graph: GraphData, num_parts: int, out: str, force: bool, feature_dtype: str) -> str:
    out = os.path.abspath(out)
    check_output(out, force)
    if not 1 <= num_parts <= graph.num_nodes:
        raise InputError("--num-parts", f"{num_parts} must lie in [1, {graph.num_nodes}] (the number of nodes)")
    check_feature_dtype(feature_dtype)
    return out


def assign_and_layout(graph: GraphData, num_parts: int, method: str, seed: int, feature_dtype: str, timings: dict,
                      metis_levels: str = "disk"):
    """The storage type, the assignment, and the relabelling: (layout, orig_of_new, choice), the
    choice: the encoding's exactness and the method that ran, for the metadata."""
    t0 = time.perf_counter()
    encoding, lossless, max_error = choose_encoding(graph.features, feature_dtype)
    timings["encoding_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if method not in METHODS:
        raise InputError("--method", f"'{method}' is not one of {', '.join(sorted(METHODS))}")
    parts, ran, record = assign(graph, num_parts, seed, method, metis_levels)
    timings["assign_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = graph.num_nodes
    counts = np.bincount(parts, minlength=num_parts)
    if (counts == 0).any():
        raise InputError("--num-parts", f"{ran} left partition {int(np.flatnonzero(counts == 0)[0])} empty; use fewer parts")
    orig_of_new = np.argsort(parts, kind="stable")  # new id -> input id; input order kept within a part
    del parts
    new_of_orig = np.empty(n, dtype=index_dtype(n))
    new_of_orig[orig_of_new] = np.arange(n, dtype=new_of_orig.dtype)
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    in_degree = graph.in_degree[orig_of_new]
    layout = Layout(n, num_parts, offsets, new_of_orig, in_degree, encoding, array_reference(graph.features))
    timings["relabel_s"] = time.perf_counter() - t0
    choice = {"lossless": lossless, "max_error": max_error, "method": ran, "partitioner": record}
    return layout, orig_of_new, choice


def partition_meta(graph: GraphData, layout: Layout, infos: list[PartInfo], seed: int, source: str,
                   choice: dict) -> PartitionMeta:
    total_hash = sum(int(info.edge_hash, 16) for info in infos) % (1 << 64)
    return PartitionMeta(source=source or graph.info.get("source", ""), dataset=graph.name, num_nodes=graph.num_nodes,
                         num_edges=graph.num_edges, feat_dim=graph.feat_dim, num_classes=graph.num_classes,
                         method=choice["method"], seed=seed, offsets=[int(x) for x in layout.offsets],
                         created=datetime.now(UTC).isoformat(timespec="seconds"),
                         edge_hash=f"{total_hash:016x}", preprocessing=dict(graph.info), parts=infos,
                         partitioner={**partitioner_info(choice["method"]), **choice["partitioner"]},
                         feature_dtype=layout.encoding.name, feature_lossless=choice["lossless"],
                         feature_max_abs_error=choice["max_error"])


def partition_graph(graph: GraphData, num_parts: int, out: str, method: str = "auto", seed: int = 0,
                    force: bool = False, source: str = "", feature_dtype: str = "auto",
                    metis_levels: str = "disk") -> tuple[PartitionMeta, dict]:
    """``method``: as the CLI's ``--method`` (``auto``, its default too: METIS below its index
    limit, the multilevel path above it); ``feature_dtype``: the features' storage type
    (``rudder.data.feature_encoding``), or ``auto``: the smallest one that stores them exactly;
    ``metis_levels``: as ``--metis-levels`` (``metis.METIS_LEVELS``)."""
    out = check_request(graph, num_parts, out, force, feature_dtype)
    timings = {}
    layout, orig_of_new, choice = assign_and_layout(graph, num_parts, method, seed, feature_dtype, timings, metis_levels)
    t0 = time.perf_counter()
    tmp = make_temp_dir(out)
    try:
        infos = [write_part(part_rows(graph, layout, orig_of_new, p), layout, tmp, graph.features)
                 for p in range(num_parts)]
        meta = partition_meta(graph, layout, infos, seed, source, choice)
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

