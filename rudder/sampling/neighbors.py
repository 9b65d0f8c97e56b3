"""Distributed L-hop uniform neighbour sampling over a partitioned graph, with DGL's semantics.

Each hop samples, for every destination node, ``fanout`` of its in-neighbours uniformly without
replacement, or all of them when its in-degree is at most ``fanout`` (DGL's
``sample_neighbors(replace=False)``), over the whole graph whatever the partitioning: the
in-edge CSR of every partition is exposed as two ``DistributedArray``s (row pointers and
neighbour IDs), so a remote node's degree and its chosen neighbours are read one-sidedly
(shared memory on the node, indexed RMA Gets elsewhere) and never need the owner's help.
Only the chosen neighbour entries are read, not whole neighbour lists, so hubs cost ``fanout``.

Fanouts are given input-side first, as DGL lists them ("10,25": seeds get 25 neighbours,
those get 10 each); -1 takes every neighbour (full-neighbour evaluation). The output is, per
layer (input side first), the edges of a bipartite block as local indices, with the destination
nodes first among the source nodes (DGL's block layout).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rudder.comm.dist_array import ReadStats


def sample_positions(degrees: np.ndarray, fanout: int, rng: np.random.Generator):
    """For each row i with in-degree d_i: all positions 0..d_i-1 when d_i <= fanout, else
    ``fanout`` distinct positions drawn uniformly (Floyd's algorithm, vectorised over rows:
    ``fanout`` steps, no sort, whatever the degrees). Returns (row, position) pairs, grouped by row."""
    degrees = np.asarray(degrees, dtype=np.int64)
    if fanout < 0:  # DGL's -1: every neighbour
        fanout = int(degrees.max(initial=0))
    counts = np.minimum(degrees, fanout)
    rows = np.repeat(np.arange(degrees.size, dtype=np.int64), counts)
    pos = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    big = np.flatnonzero(degrees > fanout)
    if big.size:
        d = degrees[big]
        chosen = np.empty((big.size, fanout), dtype=np.int64)
        for i in range(fanout):  # Floyd: for j = d-k .. d-1, t ~ U[0, j]; take t, or j if t was taken
            j = d - fanout + i
            t = (rng.random(big.size) * (j + 1)).astype(np.int64)
            taken = (chosen[:, :i] == t[:, None]).any(axis=1)
            chosen[:, i] = np.where(taken, j, t)
        # rows with d > fanout hold exactly ``fanout`` slots, in row order: overwrite them
        slots = np.repeat(np.cumsum(counts)[big] - fanout, fanout) + np.tile(np.arange(fanout), big.size)
        pos[slots] = chosen.ravel()
    return rows, pos


@dataclass
class Layer:
    src: np.ndarray  # edge sources, index into the layer's source nodes
    dst: np.ndarray  # edge destinations, index into the layer's destination nodes
    num_src: int
    num_dst: int


@dataclass
class SampledMinibatch:
    seeds: np.ndarray  # global IDs (the last layer's destination nodes)
    input_nodes: np.ndarray  # global IDs (the first layer's source nodes)
    layers: list[Layer]  # input side first
    stats: ReadStats = field(default_factory=ReadStats)  # adjacency reads


def with_new_nodes(dst_nodes: np.ndarray, neighbours: np.ndarray):
    """Source nodes = destination nodes, then unseen neighbours in order of first appearance;
    returns (source nodes, index of each neighbour among them)."""
    # factorize hashes instead of sorting and numbers values by first appearance, which puts
    # the (distinct) destination nodes first
    codes, uniques = pd.factorize(np.concatenate([dst_nodes, neighbours]))
    return np.asarray(uniques, dtype=np.int64), codes[dst_nodes.size:].astype(np.int64)


class NeighborSampler:
    """``adjacency``: anything with ``rows(gids, stats)`` and ``neighbours(parts, positions, stats)``
    (``rudder.data.adjacency.Adjacency`` over RMA; the simulator's in-memory CSR). ``fanouts_of``:
    ``key -> fanouts`` for keyed minibatches whose fanouts vary (a run's phases,
    ``rudder.sampling.phases``); ``fanouts`` otherwise."""

    def __init__(self, adjacency, fanouts: list[int], seed: int, fanouts_of=None):
        if not fanouts or any(f < 1 and f != -1 for f in fanouts):
            raise ValueError(f"fanouts {fanouts} must be positive integers, or -1 for all neighbours")
        self.adjacency, self.fanouts, self.fanouts_of = adjacency, list(fanouts), fanouts_of
        self.seed = list(np.atleast_1d(seed))
        self.rng = np.random.default_rng(seed)

    def sample(self, seeds: np.ndarray, key: tuple = ()) -> SampledMinibatch:
        """``key`` (e.g. epoch, step) gives the minibatch a random stream of its own, so that a
        run resumed from a checkpoint samples exactly what the uninterrupted run would have;
        without one, draws continue the sampler's single stream."""
        seeds = np.asarray(seeds, dtype=np.int64)
        rng = np.random.default_rng([*self.seed, *key]) if key else self.rng
        stats = ReadStats()
        dst_nodes, layers = seeds, []
        fanouts = self.fanouts_of(key) if key and self.fanouts_of is not None else self.fanouts
        for fanout in reversed(fanouts):  # seed side first
            parts, start, degree = self.adjacency.rows(dst_nodes, stats)
            row, pos = sample_positions(degree, fanout, rng)
            neighbours = self.adjacency.neighbours(parts[row], start[row] + pos, stats)
            src_nodes, src_index = with_new_nodes(dst_nodes, neighbours)
            layers.insert(0, Layer(src_index, row, src_nodes.size, dst_nodes.size))
            dst_nodes = src_nodes
        return SampledMinibatch(seeds, dst_nodes, layers, stats)


# In-edges an evaluation reads, or aggregates in one layer call, at once (rudder.train.evaluation;
# here for rudder.plan, which imports no MPI): the full neighbourhood of a graph with hubs has far
# more edges than nodes (RMAT-16's 1,687 scored nodes a trainer at P = 16: 46k input nodes, 1.57M
# in-edges), and the sampler held about 60 bytes an edge of it (95 MB) while reading it whole
EVAL_CHUNK_EDGES = 1 << 17


def edge_chunks(degrees: np.ndarray, max_edges: int, max_nodes: int | None = None) -> list[tuple[int, int]]:
    """Consecutive ranges [a, b) over nodes of in-degrees ``degrees``, in order, each of at most
    ``max_edges`` in-edges (a node of more: alone) and ``max_nodes`` nodes."""
    ends = np.cumsum(np.asarray(degrees, dtype=np.int64))
    n, limit = ends.size, max_nodes or ends.size or 1
    bounds, a = [], 0
    while a < n:
        base = int(ends[a - 1]) if a else 0
        b = int(np.searchsorted(ends, base + max_edges, side="right"))
        b = min(max(b, a + 1), a + limit, n)
        bounds.append((a, b))
        a = b
    return bounds


class Numbering:
    """Local indices of global IDs, numbered by first appearance as ``with_new_nodes`` numbers
    them, over neighbours given a chunk at a time: the destination nodes first (distinct), then
    each unseen neighbour as it first comes. Holds 16 bytes a node, nothing a neighbour."""

    def __init__(self, first: np.ndarray):
        first = np.asarray(first, dtype=np.int64)
        self.pieces, self.size = [first], first.size
        order = np.argsort(first, kind="stable")
        self.sorted, self.local = first[order], order.astype(np.int64)

    def add(self, ids: np.ndarray) -> np.ndarray:
        """The local index of each of ``ids`` (numbering the unseen ones)."""
        codes, uniques = pd.factorize(np.asarray(ids, dtype=np.int64))  # by first appearance: hashed, not sorted
        uniques = np.asarray(uniques, dtype=np.int64)
        local = np.empty(uniques.size, dtype=np.int64)
        known = np.zeros(uniques.size, dtype=bool)
        if self.sorted.size:
            at = np.minimum(np.searchsorted(self.sorted, uniques), self.sorted.size - 1)
            known = self.sorted[at] == uniques
            local[known] = self.local[at[known]]
        unseen = uniques[~known]  # still in order of first appearance
        if unseen.size:
            local[~known] = self.size + np.arange(unseen.size)
            order = np.argsort(unseen)
            where = np.searchsorted(self.sorted, unseen[order])
            self.sorted = np.insert(self.sorted, where, unseen[order])
            self.local = np.insert(self.local, where, self.size + order)
            self.pieces.append(unseen)
            self.size += unseen.size
        return local[codes]

    def nodes(self) -> np.ndarray:
        return np.concatenate(self.pieces)


@dataclass
class Neighbourhood:
    """Minibatch layers held compactly, input side first: layer l's source nodes are
    ``input_nodes[:sizes[l]]`` and its destinations ``input_nodes[:sizes[l + 1]]`` (every layer's
    sources begin with its destinations; ``sizes[-1]``: the seeds), its in-edges grouped by
    destination (``indptr[l]``), each edge's source a local index into the layer's sources
    (``src[l]``, int32 where the graph's IDs fit, None where not kept)."""
    input_nodes: np.ndarray
    sizes: list[int]
    indptr: list[np.ndarray]
    src: list[np.ndarray | None]
    stats: ReadStats = field(default_factory=ReadStats)

    @property
    def num_layers(self) -> int:
        return len(self.indptr)

    @property
    def num_edges(self) -> int:
        return int(sum(int(p[-1]) for p in self.indptr))

    def layer(self, i: int, a: int = 0, b: int | None = None) -> Layer:
        """Layer i with only destinations [a, b)'s in-edges (all of them by default), over all of
        its sources and destinations: a piece of the layer computes the same rows as the whole."""
        indptr, b = self.indptr[i], self.sizes[i + 1] if b is None else b
        lo, hi = int(indptr[a]), int(indptr[b])
        dst = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a:b + 1]))
        return Layer(self.src[i][lo:hi].astype(np.int64), dst, self.sizes[i], self.sizes[i + 1])

    @classmethod
    def of(cls, mb: SampledMinibatch) -> Neighbourhood:
        """A sampled minibatch's layers (whose edges come grouped by destination), held so."""
        indptr = [np.concatenate([[0], np.cumsum(np.bincount(layer.dst, minlength=layer.num_dst))]).astype(np.int64)
                  for layer in mb.layers]
        return cls(mb.input_nodes, [layer.num_src for layer in mb.layers] + [mb.layers[-1].num_dst], indptr,
                   [layer.src for layer in mb.layers], mb.stats)


def full_neighbourhood(adjacency, seeds: np.ndarray, hops: int, max_edges: int, keep_edges: bool = True) -> Neighbourhood:
    """The ``hops``-hop in-neighbourhood of ``seeds`` with every neighbour: what
    ``NeighborSampler(adjacency, [-1] * hops).sample(seeds)`` gives (the same nodes in the same
    order, the same edges), built reading the neighbours of at most ``max_edges`` in-edges at a
    time (a node of more: alone) and keeping each edge as a 4-byte source index (none without
    ``keep_edges``), so that a hub's neighbourhood is never materialised as whole edge lists: the
    sampler holds about 60 bytes an edge of its outermost hop while it builds it."""
    seeds = np.asarray(seeds, dtype=np.int64)
    stats, dst, sizes, indptrs, srcs = ReadStats(), seeds, [seeds.size], [], []
    for _ in range(hops):
        parts, start, degree = adjacency.rows(dst, stats)
        numbering = Numbering(dst)
        total = int(degree.sum())
        src = np.empty(total, dtype=np.int32 if total and dst.size + total < 2**31 else np.int64) if keep_edges else None
        at = 0
        for a, b in edge_chunks(degree, max_edges):
            row, pos = sample_positions(degree[a:b], -1, None)  # every neighbour: no draw
            neighbours = adjacency.neighbours(parts[a:b][row], start[a:b][row] + pos, stats)
            local = numbering.add(neighbours)
            if src is not None:
                src[at:at + local.size] = local
            at += local.size
        indptrs.insert(0, np.concatenate([[0], np.cumsum(degree)]).astype(np.int64))
        srcs.insert(0, src)
        dst = numbering.nodes()
        sizes.insert(0, dst.size)
    return Neighbourhood(dst, sizes, indptrs, srcs, stats)
