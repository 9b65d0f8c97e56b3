"""Partitioning beyond 32-bit METIS, and the choice between it and METIS (``--method``).

``multilevel``: coarsen the graph by size-constrained label propagation until it has no more
directed edges than this METIS build takes, partition the coarse graph with multi-constraint METIS
(vertex and edge weights summed), project the parts back level by level and refine each level by
boundary moves that keep the three balance constraints. ``auto``: METIS when the graph fits its
indices, ``multilevel`` when it does not. Measured against METIS, and against coarsening by
heavy-edge matching instead, in docs/partitioning.md ("Graphs beyond 2^31 edges").

Every step is vectorised numpy over the edges in chunks of CHUNK_EDGES, so its temporaries stay a
few hundred MB whatever the graph's size; the finest graph is only read, never copied. Each coarse
graph is written to scratch disk as it is built, a chunk of rows at a time, and read back only
while it is coarsened further or refined, so at most one coarse level is in memory at once.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from partitioning import metis
from partitioning.graph import InputError
from partitioning.ondisk import need_disk, need_memory, scratch_dir

METHODS = ("auto", "metis", "multilevel")
# Tests and benchmarks lower the limit so small graphs take the multilevel path (docs/partitioning.md).
EDGE_LIMIT_ENV = "RUDDER_PARTITION_EDGE_LIMIT"
# Edges a pass over the graph handles at once: its numpy temporaries take about 100 bytes an edge
# of the chunk, so the chunk bounds them (at 1 << 23 they were 0.8 GB, the path's peak on RMAT-20)
CHUNK_EDGES = 1 << 20
COARSEN_TO = 4  # METIS sees at most 1 / COARSEN_TO of the graph's edges
IMBALANCE = 0.03  # refinement keeps each constraint's heaviest part within 1.03x the average (or the METIS result's, if higher)
REFINE_ROUNDS = 12
LP_ROUNDS = 8
CLUSTER_SHARE = 4  # no cluster heavier than 1 / (CLUSTER_SHARE * parts) of any constraint's total
MAX_LEVELS = 30
# The least METIS has taken beyond its input on this project's runs, by where its levels are
# (docs/partitioning.md: in memory RMAT-18's 29, 46 on RMAT-21 and RMAT-22; on disk RMAT-21's 9.6
# and 150 a node): below this much available memory it cannot finish, so the run stops with one
# line before METIS starts instead of being killed in it
METIS_LEAST_BYTES_PER_EDGE = {"memory": 29, "disk": 9}


@dataclass
class Assignment:
    parts: np.ndarray  # int64 [n]
    method: str  # the method that ran: metis or multilevel
    reason: str  # why (for --method auto), printed and kept in metadata.json
    edge_cut: int  # undirected edges between parts (weights summed)
    levels: list = field(default_factory=list)  # [nodes, directed edges] of each graph METIS or the refinement saw

    def record(self, requested: str) -> dict:
        """The fields metadata.json's ``partitioner`` keeps."""
        return {"requested_method": requested, "method": self.method, "reason": self.reason, "edge_cut": self.edge_cut,
                "levels": self.levels}


@dataclass
class Graph:
    """Undirected CSR (both directions stored, no self-loops) with multi-constraint vertex weights."""
    xadj: np.ndarray  # int64 [n + 1]
    adjncy: np.ndarray  # int [m]
    adjwgt: np.ndarray | None  # int64 [m]; None: every edge weighs 1
    vwgt: np.ndarray  # int64 [n, ncon]

    @property
    def n(self) -> int:
        return self.xadj.shape[0] - 1

    @property
    def m(self) -> int:
        return int(self.xadj[-1])

    def row_chunks(self):
        """Row ranges [lo, hi) of about CHUNK_EDGES edges each (a heavier row is a chunk of its own)."""
        lo = 0
        while lo < self.n:
            hi = int(np.searchsorted(self.xadj, self.xadj[lo] + CHUNK_EDGES, side="right")) - 1
            hi = min(max(hi, lo + 1), self.n)
            yield lo, hi
            lo = hi

    def weighted_degrees(self) -> np.ndarray:
        """Each vertex's summed edge weight (float64: exact below 2^53), a chunk of rows at a time."""
        if self.adjwgt is None:
            return np.diff(self.xadj).astype(np.float64)
        out = np.empty(self.n, dtype=np.float64)
        for lo, hi in self.row_chunks():
            rows, _, w = self.edges(lo, hi)
            out[lo:hi] = np.bincount(rows, weights=w, minlength=hi - lo)
        return out

    def edges(self, lo: int, hi: int):
        """(row, neighbour, weight) of the edges of rows [lo, hi), rows counted from lo."""
        e_lo, e_hi = int(self.xadj[lo]), int(self.xadj[hi])
        rows = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(self.xadj[lo:hi + 1]))
        w = np.ones(e_hi - e_lo, dtype=np.int64) if self.adjwgt is None else self.adjwgt[e_lo:e_hi].astype(np.int64)
        return rows, self.adjncy[e_lo:e_hi].astype(np.int64, copy=False), w


@dataclass
class SpilledGraph:
    """A coarse graph on scratch disk, four raw files beside ``path`` (``contract`` writes them)."""
    path: str
    n: int
    m: int
    ncon: int
    index_type: type
    weight_type: type

    def load(self) -> Graph:
        def read(suffix: str, dtype) -> np.ndarray:
            return np.fromfile(f"{self.path}.{suffix}", dtype=dtype)
        return Graph(read("xadj", np.int64), read("adjncy", self.index_type), read("adjwgt", self.weight_type),
                     read("vwgt", np.int64).reshape(self.n, self.ncon))


# ----------------------------------------------------------------------------- the choice
def edge_limit() -> int:
    """Directed edges METIS may take: this build's index limit, or the test/benchmark override."""
    value = os.environ.get(EDGE_LIMIT_ENV)
    if value is None:
        return metis.index_limit()
    if not value.isdigit() or int(value) < 1:
        raise InputError(EDGE_LIMIT_ENV, f"'{value}' is not a positive integer")
    return min(int(value), metis.index_limit())


def assign(method: str, xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray, ncon: int, nparts: int,
           seed: int, metis_levels: str = "disk") -> Assignment:
    """Parts of an undirected CSR graph (METIS's arguments: ``vweights`` node-major, ``ncon`` a
    node) by ``method``: metis, multilevel, or auto (metis if the graph fits its indices). The
    multilevel path keeps its coarse graphs in a temporary directory of the scratch directory
    (``partitioning.ondisk``: beside --out, or --scratch), removed when it returns; METIS's own
    levels go there too with ``metis_levels`` disk (``metis.METIS_LEVELS``)."""
    if method not in METHODS:
        raise InputError("--method", f"'{method}' is not one of {', '.join(METHODS)}")
    metis.check_levels(metis_levels)
    spill_dir = scratch_dir() if metis_levels == "disk" else None
    n, m, limit = xadj.shape[0] - 1, int(adjncy.shape[0]), edge_limit()
    requested = method
    if method == "auto":
        method = "metis" if m <= limit else "multilevel"
        reason = f"auto: {m} directed edges {'<=' if m <= limit else '>'} METIS's limit {limit}"
    else:
        reason = f"--method {method}"
    if method == "metis":
        need_memory(METIS_LEAST_BYTES_PER_EDGE[metis_levels] * m, f"--method {requested}",
                    f"METIS on {m} directed edges, its levels {'on disk' if metis_levels == 'disk' else 'in memory'} "
                    "(--method multilevel needs less)")
        cut, parts = metis.part_graph_kway(xadj, adjncy, vweights, ncon, nparts, seed, spill_dir=spill_dir)
        return Assignment(parts, "metis", reason, cut, [[n, m]])
    graph = Graph(np.asarray(xadj, dtype=np.int64), adjncy, None, np.asarray(vweights, dtype=np.int64).reshape(n, ncon))
    with tempfile.TemporaryDirectory(prefix=".rudder-levels-", dir=scratch_dir()) as levels_dir:
        cut, parts, levels = multilevel_kway(graph, nparts, seed, limit, levels_dir, spill_dir)
    return Assignment(parts, "multilevel", reason, cut, levels)


# ----------------------------------------------------------------------------- the multilevel path
def multilevel_kway(graph: Graph, nparts: int, seed: int, limit: int, levels_dir: str,
                    spill_dir: str | None = None) -> tuple[int, np.ndarray, list]:
    """Coarsen until at most ``limit`` directed edges remain (and at most a quarter of the graph's),
    METIS there, then project and refine back up; returns (edge cut, parts, [nodes, edges] of each level, finest first).
    The coarse graphs live in ``levels_dir`` between their uses."""
    rng = np.random.default_rng(seed)
    totals = graph.vwgt.sum(axis=0)
    cap = np.maximum(totals // (CLUSTER_SHARE * nparts), graph.vwgt.max(axis=0))
    # METIS gets at most a quarter of the edges (its own arrays take about 46 bytes an edge it sees:
    # a quarter keeps them near the input CSR's size; cut and halo within 1.02x of METIS on the
    # whole of RMAT-20, docs/partitioning.md), and below the build's own limit at most half of it:
    # the other half holds the summed edge weights.
    target = min(limit, metis.index_limit() // 2, max(graph.m // COARSEN_TO, 1))
    levels, cmaps, current = [graph], [], graph
    while current.m > target:
        if len(levels) > MAX_LEVELS:
            raise InputError("--method multilevel", f"could not coarsen below {target} directed edges in {MAX_LEVELS} levels")
        cmap, nc = cluster(current, cap, target, rng)
        coarse = contract(current, cmap, nc, os.path.join(levels_dir, f"level{len(levels)}"))
        if coarse.m > 0.99 * current.m:
            raise InputError("--method multilevel", f"coarsening stalled at {coarse.m} directed edges, above {target}")
        levels.append(coarse)
        cmaps.append(cmap)
        current = None  # the finer coarse graph goes before the next is read
        current = coarse.load()
    _, parts = metis_weighted(current, nparts, seed, spill_dir)
    maxw = np.maximum(np.ceil((1 + IMBALANCE) * totals / nparts), label_weights(current, parts, nparts).max(axis=0))
    cut = edge_cut(current, parts) if not cmaps else None
    current = None
    for level in range(len(cmaps) - 1, -1, -1):
        parts = parts[cmaps[level]]
        finer = levels[level] if level == 0 else levels[level].load()
        parts, cut = refine(finer, parts, nparts, maxw.astype(np.int64), rng)
        finer = None  # freed before the next, larger level is read
    return cut, parts, [[g.n, g.m] for g in levels]


def metis_weighted(graph: Graph, nparts: int, seed: int, spill_dir: str | None = None) -> tuple[int, np.ndarray]:
    """METIS on a coarse graph. Summed weights can exceed METIS's indices (papers100M's degree
    constraint sums to 3.2e9): such a column is divided, rounding up so nothing weighs 0, which
    keeps its proportions within the rounding."""
    limit = metis.index_limit()
    ncon = graph.vwgt.shape[1]
    vwgt = scale_to(graph.vwgt, limit // (2 * ncon))
    adjwgt = None if graph.adjwgt is None else scale_to(graph.adjwgt, limit)
    return metis.part_graph_kway(graph.xadj, graph.adjncy, vwgt.reshape(-1), ncon, nparts, seed, adjwgt, spill_dir)


def scale_to(weights: np.ndarray, cap: int) -> np.ndarray:
    """``weights`` divided (column by column, rounding up) so each column sums to at most ``cap``."""
    w = weights.reshape(weights.shape[0], -1)
    out = w.copy()
    for c in range(w.shape[1]):
        total, rows = int(w[:, c].sum()), w.shape[0]
        if total > cap:
            if rows >= cap:
                raise InputError("--method multilevel", f"{rows} coarse vertices exceed METIS's weight limit {cap}")
            out[:, c] = -(-w[:, c] // -(-total // (cap - rows)))
    return out.reshape(weights.shape)


# ----------------------------------------------------------------------------- coarsening
def edge_hash(a: np.ndarray, b: np.ndarray, salt: int) -> np.ndarray:
    """A uniform float in [0, 1) per undirected edge {a, b}, the same from both ends (splitmix64)."""
    x = (np.minimum(a, b).astype(np.uint64) << np.uint64(32)) ^ np.maximum(a, b).astype(np.uint64)
    x ^= np.uint64(salt)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def cluster(graph: Graph, cap: np.ndarray, target: int, rng) -> tuple[np.ndarray, int]:
    """Size-constrained label propagation: rounds in which a random half of the vertices each join
    the neighbouring cluster holding most of their edge weight, while clusters stay within ``cap``;
    stops once at most ``target`` directed edges run between clusters. Returns the compact cluster
    of each vertex and the number of clusters."""
    n = graph.n
    labels = np.arange(n, dtype=np.int64)
    weights = graph.vwgt.copy()
    for _ in range(LP_ROUNDS):
        v, to, gain, between = best_moves(graph, labels, n, rng.random(n) < 0.5, weights, cap, int(rng.integers(1 << 62)))
        if 2 * between <= target or not apply_moves(graph, labels, weights, cap, v, to, gain):
            break
    ids, cmap = np.unique(labels, return_inverse=True)
    return cmap.astype(np.int64), int(ids.size)


def contract(graph: Graph, cmap: np.ndarray, nc: int, path: str) -> SpilledGraph:
    """The coarse graph, written to files beside ``path``: vertex weights and parallel edges'
    weights summed, internal edges dropped. Coarse rows are built and written a chunk at a time
    from the fine vertices they hold, so the coarse graph is never whole in memory."""
    order = np.argsort(cmap, kind="stable")  # fine vertices grouped by coarse vertex
    first = np.concatenate([[0], np.cumsum(np.bincount(cmap, minlength=nc))])  # into order, per coarse vertex
    degree = np.diff(graph.xadj)
    edges_before = np.concatenate([[0], np.cumsum(degree[order])])  # fine edges before each position in order
    index_type = np.int32 if nc < np.iinfo(np.int32).max else np.int64
    # A coarse edge's weight (the fine edge weight between two clusters) is at most either
    # cluster's summed weighted degree; clusters are capped at 1/(4k) of each constraint, so on
    # papers100M that bound is far below 2^31 though the graph's total is not
    heaviest = float(np.bincount(cmap, weights=graph.weighted_degrees(), minlength=nc).max(initial=0.0))
    weight_type = np.int32 if heaviest <= np.iinfo(np.int32).max else np.int64
    bound = (graph.m * (np.dtype(index_type).itemsize + np.dtype(weight_type).itemsize)
             + nc * (8 + 8 * graph.vwgt.shape[1]))  # as many edges as the finer graph at most
    need_disk(os.path.dirname(path), bound, "a coarse graph of the multilevel path")
    m, a = 0, 0
    with open(f"{path}.xadj", "wb") as xadj, open(f"{path}.adjncy", "wb") as adjncy, open(f"{path}.adjwgt", "wb") as adjwgt:
        np.zeros(1, dtype=np.int64).tofile(xadj)
        while a < nc:
            pos = np.searchsorted(edges_before, edges_before[first[a]] + CHUNK_EDGES, side="right") - 1
            b = min(max(int(np.searchsorted(first, pos, side="right")) - 1, a + 1), nc)
            vs = order[first[a]:first[b]]
            lens = degree[vs]
            starts = graph.xadj[vs]
            offs = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()), dtype=np.int64)
            row = np.repeat(cmap[vs] - a, lens)
            col = cmap[graph.adjncy[offs]]
            w = np.ones(offs.size, dtype=np.int64) if graph.adjwgt is None else graph.adjwgt[offs].astype(np.int64)
            keep = col != row + a
            key = row[keep] * nc + col[keep]
            w = w[keep]
            sort = np.argsort(key)
            key, w = key[sort], w[sort]
            if key.size:
                new = np.concatenate([[True], key[1:] != key[:-1]])
                heads = np.flatnonzero(new)
                w = np.add.reduceat(w, heads)
                key = key[heads]
            (m + np.cumsum(np.bincount(key // nc, minlength=b - a))).tofile(xadj)
            (key % nc).astype(index_type).tofile(adjncy)
            w.astype(weight_type).tofile(adjwgt)
            m += key.size
            a = b
    vwgt = np.stack([np.bincount(cmap, weights=graph.vwgt[:, c], minlength=nc) for c in range(graph.vwgt.shape[1])],
                    axis=1).round().astype(np.int64)
    vwgt.tofile(f"{path}.vwgt")
    return SpilledGraph(path, nc, m, vwgt.shape[1], index_type, weight_type)


# ----------------------------------------------------------------------------- refinement
def label_weights(graph: Graph, parts: np.ndarray, nparts: int) -> np.ndarray:
    return np.stack([np.bincount(parts, weights=graph.vwgt[:, c], minlength=nparts) for c in range(graph.vwgt.shape[1])],
                    axis=1).round().astype(np.int64)


def edge_cut(graph: Graph, parts: np.ndarray) -> int:
    cut = 0
    for lo, hi in graph.row_chunks():
        rows, nbr, w = graph.edges(lo, hi)
        cut += int(w[parts[rows + lo] != parts[nbr]].sum())
    return cut // 2


def best_moves(graph: Graph, labels: np.ndarray, nlabels: int, active: np.ndarray, weights: np.ndarray,
               maxw: np.ndarray, salt: int):
    """For each active vertex, the other label (part or cluster) among its neighbours' that holds
    the most of its edge weight and can take its weight (``weights`` [nlabels, ncon] within
    ``maxw``), ties broken at random: (vertex, label, gain over its own label) where the gain is
    positive. Also the weight of the edges between labels, each edge counted once."""
    bits = max(1, (nlabels - 1).bit_length())
    found, cut = [], 0
    for lo, hi in graph.row_chunks():
        rows, nbr, w = graph.edges(lo, hi)
        own, other = labels[rows + lo], labels[nbr]
        external = own != other
        cut += int(w[external].sum())
        internal = np.bincount(rows[~external], weights=w[~external], minlength=hi - lo)
        sel = external & active[rows + lo]
        key = rows[sel] * nlabels + other[sel]
        ws = w[sel]
        if not key.size:
            continue
        sort = np.argsort(key)
        key, ws = key[sort], ws[sort]
        heads = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        conn, key = np.add.reduceat(ws, heads), key[heads]
        vertex, label = key // nlabels, key % nlabels
        fits = (weights[label] + graph.vwgt[vertex + lo] <= maxw).all(axis=1)
        vertex, label, conn = vertex[fits], label[fits], conn[fits]
        if not vertex.size:
            continue
        # One int64 per (vertex, label): connection weight, a random tie-break, the label.
        tie_bits = min(8, 62 - bits - int(conn.max()).bit_length())
        if tie_bits < 0:
            raise InputError("--method multilevel", f"edge weights too heavy to rank among {nlabels} labels")
        tie = (edge_hash(vertex + lo, label, salt) * (1 << tie_bits)).astype(np.int64)
        packed = (conn << (bits + tie_bits)) | (tie << bits) | label
        vheads = np.flatnonzero(np.concatenate([[True], vertex[1:] != vertex[:-1]]))
        best = np.maximum.reduceat(packed, vheads)
        v = vertex[vheads]
        gain = (best >> (bits + tie_bits)) - internal[v].astype(np.int64)
        good = gain > 0
        found.append((v[good] + lo, best[good] & ((1 << bits) - 1), gain[good]))
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), cut // 2
    v, to, gain = (np.concatenate(x) for x in zip(*found))
    return v, to, gain, cut // 2


def apply_moves(graph: Graph, labels: np.ndarray, weights: np.ndarray, maxw: np.ndarray, v, to, gain) -> int:
    """Move vertices to their labels, best gain first for each label, while the label's weights
    (counting the moves it took before, not those it gave away) stay within ``maxw``; updates
    ``labels`` and ``weights`` in place and returns the gain of the moves made."""
    order = np.lexsort((-gain, to))
    v, to, gain = v[order], to[order], gain[order]
    w = graph.vwgt[v]
    cum = np.cumsum(w, axis=0)
    first = np.searchsorted(to, to)  # each move's label's first move
    before = np.where((first > 0)[:, None], cum[np.maximum(first - 1, 0)], 0)
    fits = (weights[to] + cum - before <= maxw).all(axis=1)
    v, to, gain, w = v[fits], to[fits], gain[fits], w[fits]
    np.subtract.at(weights, labels[v], w)
    np.add.at(weights, to, w)
    labels[v] = to
    return int(gain.sum())


def refine(graph: Graph, parts: np.ndarray, nparts: int, maxw: np.ndarray, rng) -> tuple[np.ndarray, int]:
    """Rounds of greedy boundary moves (a random half of the vertices may move each round, so that
    neighbours rarely move at once) that keep every part's weights within ``maxw``. Stops when a
    round gains under 0.1% of the cut."""
    parts = parts.copy()
    weights = label_weights(graph, parts, nparts)
    for _ in range(REFINE_ROUNDS):
        v, to, gain, cut = best_moves(graph, parts, nparts, rng.random(graph.n) < 0.5, weights, maxw,
                                      int(rng.integers(1 << 62)))
        if apply_moves(graph, parts, weights, maxw, v, to, gain) < 1e-3 * max(cut, 1):
            break
    return parts, edge_cut(graph, parts)
