"""The in-memory graph every loader produces and the partitioner consumes.

Edges are directed ``src -> dst`` (messages flow from src to dst, so a node aggregates over its
in-edges). The graph is held as the in-edge CSR of the input's node IDs (``indptr`` over
destinations, ``indices`` the sources, sorted within each row, no self-loops or duplicates),
built from the loaders' edge chunks by ``partitioning.csr``: 4 bytes an edge (int32 sources
while the node count allows), the form METIS takes and the partitioner slices parts from.
``src``/``dst`` give the canonical (dst, src)-sorted edge arrays for checks on small graphs.
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
    indptr: np.ndarray  # int64 [N + 1], over destinations
    indices: np.ndarray  # int32 (N < 2^31) or int64 [E]: sources, sorted within each row
    features: np.ndarray  # float32 [N, D], in memory or a read-only np.memmap of a scratch/.npy file
    labels: np.ndarray  # int64 [N]
    num_classes: int
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray
    test_mask: np.ndarray
    # Provenance and preprocessing, copied into the partition metadata.
    info: dict = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def src(self) -> np.ndarray:
        """Edge sources, int64, in canonical (dst, src) order (a new array: small graphs and checks)."""
        return self.indices.astype(np.int64)

    @property
    def dst(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.in_degree)


def check_ids_in_range(ids: np.ndarray, n: int, where: str, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids[(ids < 0) | (ids >= n)][0])
        raise InputError(where, f"{what} id {bad} is out of range [0, {n})")


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
