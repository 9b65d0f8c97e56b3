"""Vertex-inclusion probabilities (rudder.prefetch.vip) against the sampler itself: on Cora's
partition 0, thousands of sampled minibatches (fixed seeds, so the check is deterministic) give
each node's inclusion frequency, which one hop matches exactly (up to sampling error) and two
hops rank alike."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.sim.transport import Graph

    out = str(tmp_path_factory.mktemp("vip") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return Graph(out)


def frequencies(graph, seeds, batch, fanouts, draws):
    from rudder.sampling.neighbors import NeighborSampler
    from rudder.sim.transport import SimulatedAdjacency

    sampler = NeighborSampler(SimulatedAdjacency(graph, 0, None, 0), fanouts, seed=[7])
    rng = np.random.default_rng(11)
    counts = np.zeros(graph.meta.num_nodes)
    for _ in range(draws):
        mb = sampler.sample(rng.choice(seeds, size=batch, replace=False))
        counts[mb.input_nodes] += 1
    return counts / draws


def test_one_hop_matches_the_sampler(graph):
    from rudder.prefetch.vip import inclusion_probabilities
    from rudder.sim.transport import SimulatedAdjacency

    p = graph.parts[0]
    seeds = p.node_start + np.flatnonzero(p.train_mask | p.val_mask)
    ids, q = inclusion_probabilities(SimulatedAdjacency(graph, 0, None, 0), seeds, 32, [3])
    freq = frequencies(graph, seeds, 32, [3], 4000)
    sigma = np.sqrt(q * (1 - q) / 4000)
    assert np.all(np.abs(freq[ids] - q) <= 5 * sigma + 1e-3)  # independent over frontier nodes: exact in expectation
    assert set(np.flatnonzero(freq)) <= set(ids.tolist())  # nothing reachable is missed


def test_two_hops_rank_the_halo_as_the_sampler_does(graph):
    from scipy.stats import spearmanr

    from rudder.prefetch.vip import halo_ranking
    from rudder.sim.transport import SimulatedAdjacency

    p = graph.parts[0]
    seeds = p.node_start + np.flatnonzero(p.train_mask | p.val_mask)
    halo = np.sort(p.halo_nodes)
    vip = halo_ranking(SimulatedAdjacency(graph, 0, None, 0), seeds, 32, [5, 10], halo)
    freq = frequencies(graph, seeds, 32, [5, 10], 1500)[halo]
    assert spearmanr(vip, freq).statistic > 0.95
    top = max(1, halo.size // 4)
    best = set(np.argsort(-freq, kind="stable")[:top])
    assert len(best & set(np.argsort(-vip, kind="stable")[:top])) >= 0.7 * top  # near-ties at the cut: not all
    degree = set(np.argsort(-p.halo_in_degree[np.argsort(p.halo_nodes)], kind="stable")[:top])
    assert len(best & set(np.argsort(-vip, kind="stable")[:top])) > len(best & degree)  # closer than in-degree
