"""``python -m partitioning verify DIR``: check a partition directory end to end.

One part at a time: memory is one part (its features a block at a time) plus arrays per node
(global in-degrees, the first part holding each input ID). Under mpiexec the ranks share the
parts (part p on rank p mod K) and combine the arrays per node and the totals; every rank then
raises the same first problem (lowest part first, as the serial check would find it).

Raises InputError (file: reason) at the first problem; returns a summary dict otherwise.
"""
from __future__ import annotations

import os

import numpy as np

from partitioning.features import rows_per_block
from partitioning.graph import InputError
from partitioning.partition import load_meta_or_error
from rudder.data.partition_store import (
    PartitionFormatError,
    edge_multiset_hash,
    read_partition,
    read_stored_features,
    sha256_file,
)


class PartProblem(Exception):
    """A problem with one part file (``what``), raised inside a pass and reported by part."""


def _combine(comm, array: np.ndarray, op: str) -> None:
    if comm is not None:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, array, op={"max": MPI.MAX, "min": MPI.MIN}[op])


def _first_problem(comm, directory, meta, problem) -> None:
    """Raise the problem of the lowest part, across ranks."""
    problems = [problem] if comm is None else comm.allgather(problem)
    problems = [p for p in problems if p is not None]
    if problems:
        p, what = min(problems)
        raise InputError(os.path.join(directory, meta.parts[p].file), what)


def _read(directory, p, meta, structure):
    try:
        return read_partition(directory, p, meta, structure=structure)
    except PartitionFormatError as e:
        raise PartProblem(str(e).split(": ", 1)[-1]) from None


def _pass1(directory, meta, p, offsets, global_in_degree, first_part) -> None:
    """File checksum, owned range; fills the part's in-degrees and first-holder marks."""
    info = meta.parts[p]
    path = os.path.join(directory, info.file)
    if not os.path.isfile(path):
        raise PartProblem("partition file missing")
    if sha256_file(path) != info.sha256:
        raise PartProblem("sha256 differs from metadata.json (file changed or truncated)")
    part = _read(directory, p, meta, structure=False)
    if (part.node_start, part.node_end) != (offsets[p], offsets[p + 1]):
        raise PartProblem(f"owns [{part.node_start}, {part.node_end}), metadata says [{offsets[p]}, {offsets[p + 1]})")
    global_in_degree[part.node_start:part.node_end] = part.in_degree if part.in_degree.shape == (part.num_owned,) else -1
    ids = part.orig_ids[(part.orig_ids >= 0) & (part.orig_ids < meta.num_nodes)]
    first_part[ids] = np.minimum(first_part[ids], p)


def _check_features(directory, meta, p, owned, lo) -> None:
    try:  # stored in the metadata's type, in rows of its width
        stored = read_stored_features(directory, p, meta)
    except PartitionFormatError as e:
        raise PartProblem(str(e).split(": ", 1)[-1]) from None
    if stored.shape[0] != owned:
        raise PartProblem(f"{stored.shape[0]} feature rows, expected {owned}")
    encoding = meta.feature_encoding
    if encoding.name == "bits" and meta.feat_dim % 8 and (stored[:, -1] & ((1 << (8 - meta.feat_dim % 8)) - 1)).any():
        raise PartProblem(f"bits features have padding bits set beyond column {meta.feat_dim}")
    step = rows_per_block(4 * meta.feat_dim)
    for a in range(0, owned, step):  # widened a block at a time
        bad = ~np.isfinite(encoding.decode(stored[a:a + step])).all(axis=1)
        if bad.any():
            raise PartProblem(f"features of node {lo + a + int(np.flatnonzero(bad)[0])} contain NaN or inf")


def _pass2(directory, meta, p, global_in_degree, first_part) -> tuple[int, int, int]:
    """Structure of one part; (in-edges, edge checksum, halo size)."""
    info, n = meta.parts[p], meta.num_nodes
    part = _read(directory, p, meta, structure=True)
    owned, lo, hi = part.num_owned, part.node_start, part.node_end
    for name in ("labels", "train_mask", "val_mask", "test_mask", "orig_ids", "in_degree"):
        if getattr(part, name).shape != (owned,):
            raise PartProblem(f"{name} has shape {getattr(part, name).shape}, expected ({owned},)")
    _check_features(directory, meta, p, owned, lo)
    in_split = part.train_mask | part.val_mask | part.test_mask
    if ((part.labels >= meta.num_classes) | (part.labels < np.where(in_split, 0, -1))).any():
        raise PartProblem(f"labels out of range [0, {meta.num_classes})")
    counts = (int(part.train_mask.sum()), int(part.val_mask.sum()), int(part.test_mask.sum()))
    if counts != (info.num_train, info.num_val, info.num_test):
        raise PartProblem(f"train/val/test counts {counts} differ from metadata {(info.num_train, info.num_val, info.num_test)}")
    orig = part.orig_ids
    if owned and (orig.min() < 0 or orig.max() >= n or (first_part[orig] < p).any() or np.unique(orig).size != owned):
        raise PartProblem("orig_ids are out of range or repeat an id of this or another partition")
    indptr, indices = part.indptr, part.indices
    if indptr.shape != (owned + 1,) or indptr[0] != 0 or indptr[-1] != indices.size or (np.diff(indptr) < 0).any():
        raise PartProblem("csr/indptr is not a valid row pointer for csr/indices")
    if not np.array_equal(np.diff(indptr), part.in_degree):
        raise PartProblem("in_degree disagrees with csr/indptr")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise PartProblem(f"csr/indices hold ids outside [0, {n})")
    if indices.size != info.num_in_edges:
        raise PartProblem(f"{indices.size} in-edges, metadata says {info.num_in_edges}")
    part_hash = edge_multiset_hash(np.repeat(np.arange(lo, hi, dtype=np.int64), part.in_degree), indices, n)
    if f"{part_hash:016x}" != info.edge_hash:
        raise PartProblem("edge checksum differs from metadata (edges changed, lost or duplicated)")
    halo = np.unique(indices[(indices < lo) | (indices >= hi)])
    if not np.array_equal(halo, part.halo_nodes):
        raise PartProblem(f"halo/nodes ({part.halo_nodes.size}) differ from the remote sources of csr/indices ({halo.size})")
    if not np.array_equal(part.halo_owners, meta.owner_of(halo)):
        raise PartProblem("halo/owners disagree with the partition offsets")
    if not np.array_equal(part.halo_in_degree, global_in_degree[halo]):
        raise PartProblem("halo/in_degree disagrees with the owners' in-degrees")
    if part.halo_nodes.size != info.num_halo:
        raise PartProblem(f"{part.halo_nodes.size} halo nodes, metadata says {info.num_halo}")
    return int(indices.size), part_hash, int(halo.size)


def verify(directory: str, comm=None) -> dict:
    """``comm``: an MPI communicator to share the parts over (None: this process checks all)."""
    meta = load_meta_or_error(directory)
    n, k, offsets = meta.num_nodes, meta.num_parts, np.asarray(meta.offsets, dtype=np.int64)
    meta_path = os.path.join(directory, "metadata.json")
    if offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) <= 0).any():
        raise InputError(meta_path, f"offsets {meta.offsets} do not split [0, {n}) into non-empty ranges")
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    mine = range(rank, k, size)

    # Pass 1: file checksums, global in-degrees (to check every halo's), the first part holding each input ID.
    global_in_degree = np.full(n, -1, dtype=np.int64)
    first_part = np.full(n, k, dtype=np.int64)
    problem = None
    for p in mine:
        try:
            _pass1(directory, meta, p, offsets, global_in_degree, first_part)
        except PartProblem as e:
            problem = (p, str(e))
            break
    _first_problem(comm, directory, meta, problem)
    _combine(comm, global_in_degree, "max")
    _combine(comm, first_part, "min")

    # Pass 2: structure of each partition, and totals across them.
    total_edges, total_hash, halos, problem = 0, 0, {}, None
    for p in mine:
        try:
            edges, part_hash, halos[p] = _pass2(directory, meta, p, global_in_degree, first_part)
        except PartProblem as e:
            problem = (p, str(e))
            break
        total_edges += edges
        total_hash = (total_hash + part_hash) % (1 << 64)
    _first_problem(comm, directory, meta, problem)
    if comm is not None:
        total_edges = sum(comm.allgather(total_edges))
        total_hash = sum(comm.allgather(total_hash)) % (1 << 64)
        halos = {p: h for d in comm.allgather(halos) for p, h in d.items()}
    if total_edges != meta.num_edges:
        raise InputError(meta_path, f"partitions hold {total_edges} edges, metadata says {meta.num_edges}")
    if f"{total_hash:016x}" != meta.edge_hash:
        raise InputError(meta_path, "the partitions' edge checksums do not add up to the graph's")
    if (first_part == k).any():
        raise InputError(meta_path, f"{int((first_part == k).sum())} input nodes belong to no partition")
    return {"num_parts": k, "num_nodes": n, "num_edges": total_edges, "halo": [halos[p] for p in range(k)]}
