"""The per-node choice of DGL's uniform sampling without replacement: exact counts, distinct
positions, and uniform frequencies (binomial bounds), in all three regimes of degree; the full
neighbourhood read a bounded number of edges at a time is the sampler's, node for node and edge
for edge."""
from __future__ import annotations

import numpy as np
import pytest

from rudder.comm.dist_array import ReadStats
from rudder.sampling.neighbors import (
    NeighborSampler,
    Numbering,
    edge_chunks,
    full_neighbourhood,
    sample_positions,
    with_new_nodes,
)


def test_counts_and_distinct_positions():
    rng = np.random.default_rng(0)
    degrees = np.array([0, 1, 3, 5, 6, 11, 20, 21, 1000, 7, 0, 100000])
    rows, pos = sample_positions(degrees, 5, rng)
    assert np.all(np.diff(rows) >= 0)
    counts = np.bincount(rows, minlength=degrees.size)
    np.testing.assert_array_equal(counts, np.minimum(degrees, 5))
    for r in range(degrees.size):
        p = pos[rows == r]
        assert len(set(p.tolist())) == p.size and (p >= 0).all() and (p < degrees[r]).all()
    assert sorted(pos[rows == 2].tolist()) == [0, 1, 2]  # degree <= fanout: all of them


def test_uniform_frequencies():
    """Each position of a degree-d row is chosen with probability k/d; counts over T trials stay
    within 5 standard deviations (a false alarm is ~1e-6 per position)."""
    rng = np.random.default_rng(1)
    k, trials = 4, 4000
    degrees = np.array([9, 16, 50])  # the random-key regime (<= 4k) and the redraw regime
    hits = [np.zeros(d) for d in degrees]
    for _ in range(trials):
        rows, pos = sample_positions(degrees, k, rng)
        for r in range(degrees.size):
            hits[r][pos[rows == r]] += 1
    for d, h in zip(degrees, hits):
        p = k / d
        assert np.abs(h - trials * p).max() < 5 * np.sqrt(trials * p * (1 - p)), (d, h)


def test_block_source_order():
    src, index = with_new_nodes(np.array([7, 3]), np.array([9, 3, 9, 1, 7]))
    assert src.tolist() == [7, 3, 9, 1]  # destinations first, then new nodes by first appearance
    assert index.tolist() == [2, 1, 2, 3, 0]


class CSR:
    """An in-memory in-edge CSR behind the sampler's adjacency interface, in two parts (the
    first half of the IDs and the rest), counting the neighbour entries each read asks for."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray):
        self.indptr, self.indices, self.split, self.largest_read = indptr, indices, (indptr.size - 1) // 2, 0

    def rows(self, gids, stats: ReadStats):
        start = self.indptr[gids]
        stats.rows_local += 2 * gids.size
        return (gids >= self.split).astype(np.int64), start, self.indptr[gids + 1] - start

    def neighbours(self, parts, positions, stats: ReadStats):
        self.largest_read = max(self.largest_read, positions.size)
        stats.rows_local += positions.size
        return self.indices[positions]


def hub_graph(nodes: int = 400, seed: int = 0) -> CSR:
    """Random in-edges, a few hubs among them (in-degree up to 150) and nodes without in-edges."""
    rng = np.random.default_rng(seed)
    degrees = rng.integers(0, 6, nodes)
    degrees[rng.choice(nodes, 5, replace=False)] = rng.integers(60, 150, 5)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(nodes, d, replace=False)) for d in degrees]).astype(np.int64)
    return CSR(indptr, indices)


def test_edge_chunks_bound_the_edges_and_nodes():
    degrees = np.array([3, 0, 5, 200, 1, 1, 1, 0, 9, 4])
    chunks = edge_chunks(degrees, 10, max_nodes=3)
    assert chunks[0][0] == 0 and chunks[-1][1] == degrees.size
    assert all(a < b and b == c for (a, b), (c, _) in zip(chunks, chunks[1:] + [(degrees.size, 0)]))
    for a, b in chunks:  # within both bounds, but for a node over the edge bound alone
        assert b - a <= 3 and (degrees[a:b].sum() <= 10 or b - a == 1)
    assert (3, 4) in chunks  # the hub, alone
    assert edge_chunks(np.zeros(0, dtype=np.int64), 10) == []
    assert edge_chunks(np.zeros(4, dtype=np.int64), 10) == [(0, 4)]


def test_numbering_numbers_by_first_appearance_over_chunks():
    numbering = Numbering(np.array([7, 3]))
    assert numbering.add(np.array([9, 3, 9])).tolist() == [2, 1, 2]
    assert numbering.add(np.array([1, 7, 9, 20])).tolist() == [3, 0, 2, 4]
    assert numbering.nodes().tolist() == [7, 3, 9, 1, 20]


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("max_edges", [1, 7, 64, 10**9])
def test_full_neighbourhood_is_the_samplers_in_bounded_reads(hops, max_edges):
    graph = hub_graph()
    seeds = np.random.default_rng(1).choice(400, 30, replace=False)
    reference = NeighborSampler(graph, [-1] * hops, seed=0).sample(seeds)
    graph.largest_read = 0
    held = full_neighbourhood(graph, seeds, hops, max_edges)
    np.testing.assert_array_equal(held.input_nodes, reference.input_nodes)
    assert held.sizes == [layer.num_src for layer in reference.layers] + [seeds.size]
    assert held.stats.rows_local == reference.stats.rows_local  # every entry read once, as the sampler does
    for i, layer in enumerate(reference.layers):
        whole = held.layer(i)
        np.testing.assert_array_equal(whole.src, layer.src)
        np.testing.assert_array_equal(whole.dst, layer.dst)
        assert held.src[i].dtype == np.int32  # 4 bytes an edge held
    assert graph.largest_read <= max(max_edges, 150)  # a hub (150 in-edges at most) is read alone
    # a piece of a layer: only its destinations' in-edges, over all sources and destinations
    piece = held.layer(hops - 1, 2, 5)
    assert (piece.num_src, piece.num_dst) == (held.sizes[hops - 1], seeds.size)
    keep = (reference.layers[-1].dst >= 2) & (reference.layers[-1].dst < 5)
    np.testing.assert_array_equal(piece.src, reference.layers[-1].src[keep])
    np.testing.assert_array_equal(piece.dst, reference.layers[-1].dst[keep])
    nodes_only = full_neighbourhood(graph, seeds, hops, max_edges, keep_edges=False)
    np.testing.assert_array_equal(nodes_only.input_nodes, reference.input_nodes)
    assert all(src is None for src in nodes_only.src)
