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
