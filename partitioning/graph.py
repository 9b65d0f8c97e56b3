"""The in-memory graph every loader produces and the partitioner consumes.

Edges are directed ``src -> dst`` (messages flow from src to dst, so a node aggregates over its
in-edges). Loaders of undirected data symmetrise, drop self-loops and duplicates through
``canonical_edges`` so that every input kind yields the same canonical form, and the round trip
through the partitions can be checked exactly against it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class InputError(Exception):
    """Bad input, reported as one line: ``WHERE: WHAT``.

    ``where`` names the file, flag or spec at fault; ``what`` says what was expected.
    """

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


@dataclass
class GraphData:
    name: str
    num_nodes: int
    src: np.ndarray  # int64 [E]
    dst: np.ndarray  # int64 [E]
    features: np.ndarray  # float32 [N, D] (may be a memmap)
    labels: np.ndarray  # int64 [N]
    num_classes: int
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray
    test_mask: np.ndarray
    # Provenance and preprocessing, copied into the partition metadata.
    info: dict = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    def validate(self, where: str) -> None:
        """Check shapes, ranges and values; raise InputError naming ``where`` otherwise."""
        n = self.num_nodes
        if self.features.ndim != 2 or self.features.shape[0] != n or self.features.shape[1] < 1:
            raise InputError(where, f"features have shape {tuple(self.features.shape)}, expected ({n}, D) for {n} nodes")
        if self.features.dtype != np.float32:
            raise InputError(where, f"features are {self.features.dtype}, expected float32")
        bad_row = first_nonfinite_row(self.features)
        if bad_row is not None:
            raise InputError(where, f"features of node {bad_row} contain NaN or inf")
        if self.labels.shape != (n,):
            raise InputError(where, f"labels have shape {self.labels.shape}, expected ({n},)")
        for name in ("train_mask", "val_mask", "test_mask"):
            m = getattr(self, name)
            if m.shape != (n,) or m.dtype != np.bool_:
                raise InputError(where, f"{name} has shape {m.shape} and dtype {m.dtype}, expected ({n},) bool")
        # -1 marks an unlabelled node (OGB papers100M); it may not sit in any split.
        in_split = self.train_mask | self.val_mask | self.test_mask
        bad = (self.labels >= self.num_classes) | (self.labels < np.where(in_split, 0, -1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(where, f"label {int(self.labels[i])} of node {i} is out of range [0, {self.num_classes})")
        if self.src.shape != self.dst.shape:
            raise InputError(where, "edge source and destination arrays differ in length")
        check_ids_in_range(self.src, n, where, "edge source")
        check_ids_in_range(self.dst, n, where, "edge destination")


def check_ids_in_range(ids: np.ndarray, n: int, where: str, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids[(ids < 0) | (ids >= n)][0])
        raise InputError(where, f"{what} id {bad} is out of range [0, {n})")


def first_nonfinite_row(features: np.ndarray, rows_per_chunk: int = 1 << 16) -> int | None:
    """Index of the first row holding NaN/inf, scanning in chunks so memmaps stay cheap."""
    for start in range(0, features.shape[0], rows_per_chunk):
        block = np.asarray(features[start:start + rows_per_chunk])
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            return start + int(np.flatnonzero(bad)[0])
    return None


def canonical_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, symmetric: bool = True):
    """Drop self-loops and duplicate edges, optionally adding every reverse edge.

    Returns (src, dst) int64, sorted by (dst, src): the order of an in-edge CSR.
    One int64 key per edge (dst * N + src) keeps this a single in-place sort, which matters at
    RMAT scale 22 (10^8 edges).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if num_nodes > 3_000_000_000:
        raise InputError("graph", f"{num_nodes} nodes exceed the 3e9 supported by the edge-key encoding")
    keep = src != dst
    src, dst = src[keep], dst[keep]
    del keep
    m = src.shape[0]
    key = np.empty(2 * m if symmetric else m, dtype=np.int64)
    np.multiply(dst, num_nodes, out=key[:m])
    key[:m] += src
    if symmetric:
        np.multiply(src, num_nodes, out=key[m:])
        key[m:] += dst
    del src, dst
    key.sort()
    if key.size:
        distinct = np.empty(key.size, dtype=bool)
        distinct[0] = True
        np.not_equal(key[1:], key[:-1], out=distinct[1:])
        key = key[distinct]
        del distinct
    dst = key // num_nodes
    key %= num_nodes
    return key, dst


def seeded_split(num_nodes: int, fractions: tuple[float, float, float], seed: int):
    """Boolean train/val/test masks from a seeded permutation (the DistDGL baseline's scheme:
    ``np.random.default_rng(seed).permutation(n)``, first 60% train, next 20% val, rest test)."""
    tr, va, te = fractions
    if min(fractions) < 0 or tr + va + te > 1 + 1e-9:
        raise InputError("split", f"fractions {fractions} must be >= 0 and sum to at most 1")
    perm = np.random.default_rng(seed).permutation(num_nodes)
    a = int(tr * num_nodes)
    b = int((tr + va) * num_nodes)
    c = num_nodes if abs(tr + va + te - 1) < 1e-9 else int((tr + va + te) * num_nodes)
    masks = []
    for lo, hi in ((0, a), (a, b), (b, c)):
        m = np.zeros(num_nodes, dtype=bool)
        m[perm[lo:hi]] = True
        masks.append(m)
    return masks
