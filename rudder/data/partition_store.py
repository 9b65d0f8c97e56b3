"""The on-disk partition format: one metadata JSON plus one HDF5 file per partition.

This module is the single definition of the format; the partition tool writes through it and
the trainers read through it, so the two cannot drift apart.

Layout of ``DIR``::

    metadata.json        format name/version, source spec, counts, partition offsets, checksums
    part-00000.h5        partition 0 (one file per partition)
    ...

Global node IDs are relabelled so that partition p owns the contiguous range
``[offsets[p], offsets[p+1])``; ``orig_ids`` maps them back to the input's IDs. Each part file::

    attrs: format, format_version, part_id, num_parts, node_start, node_end, num_nodes, feature_dtype
    features      [owned, W] in the storage type ``feature_dtype`` (chunked, ~1 MiB chunks)
    labels        int64   [owned]     -1 = unlabelled (in no split)
    train_mask, val_mask, test_mask   bool [owned]
    orig_ids      int64   [owned]     input ID of each owned node
    in_degree     int64   [owned]     global in-degree of owned nodes
    csr/indptr    int64   [owned + 1] in-edge CSR of owned nodes (edge u -> v stored at v)
    csr/indices   int64   [in-edges]  source global IDs, sorted within each row
    halo/nodes    int64   [H]         sorted 1-hop in-neighbours not owned by this partition
    halo/owners   int32   [H]         partition owning each halo node
    halo/in_degree int64  [H]         global in-degree of each halo node (buffer init by degree)

Features are stored in the type the partition tool chose (``metadata.json``: ``feature_dtype``,
``feature_lossless``, ``feature_max_abs_error``; the part files' ``feature_dtype`` attribute):
float32, float16, bfloat16, uint8 or bits, W = D items a row, or ceil(D / 8) bytes for bits
(``rudder.data.feature_encoding`` defines each type and its widening back to float32).
Directories written before there was a choice have neither field nor attribute: float32.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from rudder.data.feature_encoding import STORAGE_TYPES, FeatureEncoding

FORMAT_NAME = "rudder-partitions"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"


class PartitionFormatError(Exception):
    """A partition directory that is missing, foreign, or not what its metadata says."""


def part_file_name(part_id: int) -> str:
    return f"part-{part_id:05d}.h5"


def sha256_file(path: str, block: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def edge_multiset_hash(dst: np.ndarray, src: np.ndarray, num_nodes: int, chunk: int = 1 << 22) -> int:
    """Order-independent hash of a multiset of edges: the sum mod 2^64 of splitmix64(dst*N + src).

    Partitions can hash their edges separately and the sums add up to the whole graph's hash,
    so ``verify`` checks that every edge is accounted for exactly once without a global sort.
    """
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for lo in range(0, dst.shape[0], chunk):
            z = (np.asarray(dst[lo:lo + chunk], dtype=np.uint64) * np.uint64(num_nodes)
                 + np.asarray(src[lo:lo + chunk], dtype=np.uint64))
            z += np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            total += np.add.reduce(z, dtype=np.uint64)
    return int(total & _MASK64)


@dataclass
class PartInfo:
    file: str
    sha256: str
    num_owned: int
    num_in_edges: int
    num_halo: int
    num_train: int
    num_val: int
    num_test: int
    edge_hash: str  # hex of edge_multiset_hash over this part's in-edges


@dataclass
class PartitionMeta:
    source: str
    dataset: str
    num_nodes: int
    num_edges: int
    feat_dim: int
    num_classes: int
    method: str
    seed: int
    offsets: list[int]
    created: str
    edge_hash: str
    preprocessing: dict = field(default_factory=dict)
    parts: list[PartInfo] = field(default_factory=list)
    partitioner: dict = field(default_factory=dict)
    feature_dtype: str = "float32"  # the storage type (rudder.data.feature_encoding); absent in older directories
    feature_lossless: bool = True  # widening the stored rows gives back the input's float32 bits
    feature_max_abs_error: float = 0.0  # largest |stored - input| when not lossless
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    @property
    def num_parts(self) -> int:
        return len(self.offsets) - 1

    @property
    def feature_encoding(self) -> FeatureEncoding:
        return FeatureEncoding(self.feature_dtype, self.feat_dim)

    def owner_of(self, gids: np.ndarray) -> np.ndarray:
        """Partition owning each global ID (binary search on the contiguous ranges)."""
        return (np.searchsorted(np.asarray(self.offsets, dtype=np.int64), gids, side="right") - 1).astype(np.int32)

    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in ("format", "format_version", "source", "dataset", "num_nodes", "num_edges",
                                           "feat_dim", "num_classes", "method", "seed", "created", "edge_hash",
                                           "feature_dtype", "feature_lossless", "feature_max_abs_error",
                                           "partitioner", "preprocessing", "offsets")}
        d["num_parts"] = self.num_parts
        d["parts"] = [vars(p) for p in self.parts]
        return json.dumps(d, indent=1)

    def write(self, directory: str) -> None:
        with open(os.path.join(directory, METADATA_FILE), "w") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def load(cls, directory: str) -> "PartitionMeta":
        path = os.path.join(directory, METADATA_FILE)
        if not os.path.isdir(directory):
            raise PartitionFormatError(f"{directory}: not a directory")
        if not os.path.isfile(path):
            raise PartitionFormatError(f"{path}: missing (not a partition directory; make one with python -m partitioning)")
        try:
            with open(path) as f:
                d = json.load(f)
        except ValueError as e:
            raise PartitionFormatError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise PartitionFormatError(f"{path}: not a {FORMAT_NAME} metadata file")
        if d.get("format_version") != FORMAT_VERSION:
            raise PartitionFormatError(f"{path}: format version {d.get('format_version')} is not supported (expected {FORMAT_VERSION})")
        try:
            parts = [PartInfo(**p) for p in d.pop("parts")]
            d.pop("num_parts", None)
            meta = cls(**d, parts=parts)
        except (TypeError, KeyError) as e:
            raise PartitionFormatError(f"{path}: malformed metadata ({e})") from None
        if len(meta.parts) != meta.num_parts:
            raise PartitionFormatError(f"{path}: {len(meta.parts)} part entries for {meta.num_parts} partitions")
        if meta.feature_dtype not in STORAGE_TYPES:
            raise PartitionFormatError(f"{path}: feature_dtype {meta.feature_dtype!r} is not one of {', '.join(STORAGE_TYPES)}")
        return meta


@dataclass
class Partition:
    """One partition as read from its HDF5 file (features read separately, see read_features)."""

    part_id: int
    node_start: int
    node_end: int
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    orig_ids: np.ndarray
    in_degree: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    halo_nodes: np.ndarray
    halo_owners: np.ndarray
    halo_in_degree: np.ndarray

    @property
    def num_owned(self) -> int:
        return self.node_end - self.node_start


def halo_count(ids: np.ndarray, halo: np.ndarray) -> int:
    """How many of ``ids`` are in ``halo`` (sorted): one binary search an ID, O(n log h). The
    per-step log row counts this on the training thread, where ``np.isin`` sorted the halo with
    the IDs every step (bench/halo_count.py: 171 against 10.5 ms at a 10M-node halo). The IDs are
    sorted first (n log n, n small): numpy's search then starts each key where the last one ended, and
    walks the halo in one direction instead of missing the cache on every probe (5x less)."""
    if not halo.size or not ids.size:
        return 0
    ids = np.sort(ids)
    at = np.minimum(np.searchsorted(halo, ids), halo.size - 1)
    return int(np.count_nonzero(halo[at] == ids))


def global_csr(parts: list[Partition]) -> tuple[np.ndarray, np.ndarray]:
    """The whole graph's in-edge CSR (indptr, indices) in global IDs, from all partitions in
    order (offline checks and single-process baselines; trainers never hold this)."""
    indptr = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(p.indptr) for p in parts]))])
    return indptr.astype(np.int64), np.concatenate([p.indices for p in parts])


def feature_chunk_rows(row_bytes: int, target_bytes: int = 1 << 20) -> int:
    return max(1, min(1 << 16, target_bytes // max(row_bytes, 1)))


def write_partition_file(path: str, *, part_id: int, num_parts: int, node_start: int, num_nodes: int,
                         features: np.ndarray, labels, train_mask, val_mask, test_mask, orig_ids, in_degree,
                         indptr, indices, halo_nodes, halo_owners, halo_in_degree,
                         encoding: FeatureEncoding | None = None, in_memory: bool = False) -> bytes | None:
    """``features``: float32 rows, stored by ``encoding`` (default float32). ``in_memory``: build
    the file in memory and return its bytes (the bytes a write to ``path`` gives; nothing is
    written), so that the caller can write and hash it in one pass."""
    import h5py

    owned = features.shape[0]
    encoding = encoding or FeatureEncoding("float32", features.shape[1])
    stored = encoding.encode(features)
    del features  # the caller's reference may be the last one: the file keeps the stored rows
    f = h5py.File(path, "w", **({"driver": "core", "backing_store": False} if in_memory else {}))
    try:
        f.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "part_id": part_id,
                        "num_parts": num_parts, "node_start": node_start, "node_end": node_start + owned,
                        "num_nodes": num_nodes, "feature_dtype": encoding.name})
        f.create_dataset("features", data=stored, dtype=encoding.stored_dtype,
                         chunks=(min(max(owned, 1), feature_chunk_rows(encoding.row_bytes)), max(encoding.width, 1)) if owned else None)
        del stored
        for name, arr, dtype in (("labels", labels, np.int64), ("train_mask", train_mask, bool),
                                 ("val_mask", val_mask, bool), ("test_mask", test_mask, bool),
                                 ("orig_ids", orig_ids, np.int64), ("in_degree", in_degree, np.int64),
                                 ("csr/indptr", indptr, np.int64), ("csr/indices", indices, np.int64),
                                 ("halo/nodes", halo_nodes, np.int64), ("halo/owners", halo_owners, np.int32),
                                 ("halo/in_degree", halo_in_degree, np.int64)):
            f.create_dataset(name, data=np.asarray(arr, dtype=dtype))
        if in_memory:
            f.flush()
            return f.id.get_file_image()
        return None
    finally:
        f.close()


def _h5_path(directory: str, meta: PartitionMeta, part_id: int) -> str:
    if not 0 <= part_id < meta.num_parts:
        raise PartitionFormatError(f"{directory}: partition {part_id} does not exist ({meta.num_parts} partitions)")
    path = os.path.join(directory, meta.parts[part_id].file)
    if not os.path.isfile(path):
        raise PartitionFormatError(f"{path}: partition file missing")
    return path


def read_partition(directory: str, part_id: int, meta: PartitionMeta | None = None, structure: bool = True) -> Partition:
    """A partition's node data, and with ``structure`` its CSR (a node's trainers that read the
    partition's CSR through another rank's window skip it)."""
    import h5py

    meta = meta or PartitionMeta.load(directory)
    path = _h5_path(directory, meta, part_id)
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            if a.get("format") != FORMAT_NAME or int(a.get("format_version", -1)) != FORMAT_VERSION or int(a["part_id"]) != part_id:
                raise PartitionFormatError(f"{path}: not partition {part_id} of format {FORMAT_NAME} v{FORMAT_VERSION}")
            _check_feature_dtype(path, a, meta)
            heavy = ("csr/indptr", "csr/indices")
            return Partition(part_id, int(a["node_start"]), int(a["node_end"]),
                             *(f[k][()] if structure or k not in heavy else np.empty(0, f[k].dtype)
                               for k in ("labels", "train_mask", "val_mask", "test_mask", "orig_ids", "in_degree")
                               + heavy + ("halo/nodes", "halo/owners", "halo/in_degree")))
    except (OSError, KeyError) as e:
        raise PartitionFormatError(f"{path}: unreadable partition file ({e})") from None


def _check_feature_dtype(path: str, attrs, meta: PartitionMeta) -> None:
    stored = str(attrs.get("feature_dtype", "float32"))
    if stored != meta.feature_dtype:
        raise PartitionFormatError(f"{path}: features stored as {stored}, metadata.json says {meta.feature_dtype}")


def read_csr_into(directory: str, part_id: int, meta: PartitionMeta, indptr: np.ndarray, indices: np.ndarray) -> None:
    """A partition's in-edge CSR (its own row pointers, global neighbour IDs) read straight into
    ``indptr`` (num_owned + 1 entries) and ``indices`` (its in-edges), e.g. slices of one node-wide
    copy of the whole graph's CSR."""
    import h5py

    path = _h5_path(directory, meta, part_id)
    try:
        with h5py.File(path, "r") as f:
            for name, out in (("csr/indptr", indptr), ("csr/indices", indices)):
                ds = f[name]
                if ds.shape != out.shape:
                    raise PartitionFormatError(f"{path}: {name} has {ds.shape[0]} entries, metadata.json implies {out.size}")
                if out.size:
                    ds.read_direct(out)
    except (OSError, KeyError) as e:
        raise PartitionFormatError(f"{path}: unreadable partition file ({e})") from None


def read_stored_features(directory: str, part_id: int, meta: PartitionMeta | None = None,
                         out: np.ndarray | None = None) -> np.ndarray:
    """Owned feature rows of a partition as stored (``meta.feature_encoding``), read into ``out``
    when given (e.g. an RMA window's memory) so that large feature blocks are never held twice."""
    import h5py

    meta = meta or PartitionMeta.load(directory)
    path = _h5_path(directory, meta, part_id)
    encoding = meta.feature_encoding
    with h5py.File(path, "r") as f:
        _check_feature_dtype(path, f.attrs, meta)
        ds = f["features"]
        if ds.dtype != encoding.stored_dtype or ds.shape[1:] != (encoding.width,):
            raise PartitionFormatError(f"{path}: features are {ds.dtype} {ds.shape}, expected {encoding.stored_dtype} "
                                       f"rows of {encoding.width} for {encoding.name} features {meta.feat_dim} wide")
        if out is None:
            out = np.empty(ds.shape, dtype=ds.dtype)
        elif out.shape != ds.shape or out.dtype != ds.dtype:
            raise PartitionFormatError(f"{path}: features are {ds.dtype} {ds.shape}, buffer is {out.dtype} {out.shape}")
        if ds.shape[0]:
            ds.read_direct(out)
    return out


def read_features(directory: str, part_id: int, meta: PartitionMeta | None = None) -> np.ndarray:
    """Owned feature rows of a partition, widened to float32 (offline checks and baselines)."""
    meta = meta or PartitionMeta.load(directory)
    return meta.feature_encoding.decode(read_stored_features(directory, part_id, meta))
