"""Vertex-inclusion probabilities (rudder.prefetch.vip) against the sampler itself: on Cora's
partition 0, thousands of sampled minibatches (fixed seeds, so the check is deterministic) give
each node's inclusion frequency, which one hop matches exactly (up to sampling error) and two
hops rank alike; and the ``--buffer-init vip`` fill is the top of that ranking."""
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


def vip_buffer(graph, fanouts, scope="halo"):
    from rudder.prefetch.buffers import BufferSettings
    from rudder.prefetch.policies import make_policy
    from rudder.prefetch.scored_buffer import ScoredBuffer
    from rudder.prefetch.vip import fill_ranking
    from rudder.sim.transport import SimulatedAdjacency
    from rudder.train.config import TrainConfig

    cfg = TrainConfig.from_flat({"policy": "static", "buffer_init": "vip", "buffer_scope": scope})
    p = graph.parts[0]
    seeds = p.node_start + np.flatnonzero(p.train_mask)
    ranking = fill_ranking(BufferSettings.of(cfg.buffer), make_policy(cfg), SimulatedAdjacency(graph, 0, None, 0), seeds,
                           8.0, fanouts)
    buf = ScoredBuffer.build(BufferSettings.of(cfg.buffer), p, graph.meta.num_nodes, 1, np.random.default_rng(0),
                             ranking=ranking)
    return buf, seeds


@pytest.mark.parametrize("fanouts", [[10, 25], [3]])
def test_vip_fill_is_the_top_of_the_halo_ranking(graph, fanouts):
    """The top-B halo nodes by ``halo_ranking`` (ties by ID), those no minibatch reaches left out:
    with one hop of 3 fewer halo nodes are reachable than there are slots, and the rest stay empty."""
    from rudder.prefetch.vip import halo_ranking
    from rudder.sim.transport import SimulatedAdjacency

    buf, seeds = vip_buffer(graph, fanouts)
    p = graph.parts[0]
    halo = np.sort(p.halo_nodes)
    score = halo_ranking(SimulatedAdjacency(graph, 0, None, 0), seeds, 8.0, fanouts, halo)
    top = np.argsort(-score, kind="stable")[:buf.capacity]
    expected = np.sort(halo[top[score[top] > 0]])
    slots, filled = buf.held_rows()
    np.testing.assert_array_equal(filled, expected)
    assert buf.occupancy == expected.size and buf.capacity == int(0.25 * halo.size)
    assert (expected.size < buf.capacity) == (fanouts == [3])
    degree = np.sort(halo[np.argsort(-p.halo_in_degree[np.argsort(p.halo_nodes)], kind="stable")[:buf.capacity]])
    assert not np.array_equal(filled, degree)  # not the degree fill under another name


def test_vip_fill_with_scope_remote_reaches_past_the_halo(graph):
    """Scope remote: any node owned elsewhere is admissible, and two hops reach past the halo."""
    from rudder.prefetch.vip import inclusion_probabilities
    from rudder.sim.transport import SimulatedAdjacency

    buf, seeds = vip_buffer(graph, [10, 25], scope="remote")
    p = graph.parts[0]
    ids, q = inclusion_probabilities(SimulatedAdjacency(graph, 0, None, 0), seeds, 8.0, [10, 25])
    remote = (ids < p.node_start) | (ids >= p.node_end)
    ids, q = ids[remote], q[remote]
    np.testing.assert_array_equal(buf.held_rows()[1], np.sort(ids[np.argsort(-q, kind="stable")[:buf.capacity]]))
    assert not np.isin(buf.held_rows()[1], p.halo_nodes).all()


def test_each_neighbour_list_is_read_once(graph):
    """Three hops read the row pointers and whole in-neighbour list of every node within two hops
    of the seeds, once each (what docs/policies.md prices), not once per hop."""
    from rudder.comm.dist_array import ReadStats
    from rudder.prefetch.vip import inclusion_probabilities
    from rudder.sim.transport import SimulatedAdjacency

    p = graph.parts[0]
    seeds = p.node_start + np.flatnonzero(p.train_mask)
    adjacency = SimulatedAdjacency(graph, 0, None, 0)
    stats = ReadStats()
    inclusion_probabilities(adjacency, seeds, 8.0, [5, 10, 15], stats)
    within_two, _ = inclusion_probabilities(adjacency, seeds, 8.0, [10, 15])  # the frontier whose lists the third hop reads
    degree = graph.indptr[within_two + 1] - graph.indptr[within_two]
    assert stats.rows_local + stats.rows_shared + stats.rows_remote == 2 * within_two.size + int(degree.sum())
