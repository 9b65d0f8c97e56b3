"""Exactness of every buffer policy: for the same sampled minibatches, the assembled input
feature matrix is bit-identical to a plain gather from the feature store, so no policy can change
accuracy. Also the counters: hits + misses cover exactly the cacheable inputs, and traffic only
falls. Any process count (the issue asks for 2 and 4; the suite runs 1, 2 and 4)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA, partition_on_rank0

pytestmark = pytest.mark.mpi

VARIANTS = [
    ("static", {}), ("fixed", {"delta": 1}), ("fixed", {"delta": 2, "compat": True}),
    ("fixed", {"delta": 3, "init": "empty"}), ("fixed", {"delta": 1, "init": "random", "scope": "remote"}),
    ("lookahead", {"lookahead": 1}), ("lookahead", {"lookahead": 4, "scope": "remote"}),
    ("static", {"init": "vip"}), ("fixed", {"delta": 2, "init": "vip", "scope": "remote"}),
]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    from rudder.comm.layout import build_layout, exposer_table
    from rudder.data.adjacency import Adjacency
    from rudder.data.feature_store import FeatureStore
    from rudder.data.partition_store import PartitionMeta, read_partition
    from rudder.sampling.neighbors import NeighborSampler

    out = partition_on_rank0(tmp_path_factory, f"planetoid:{BUNDLED_CORA}:cora", "cora-assembly")
    meta = PartitionMeta.load(out)
    layout = build_layout(meta.num_parts)
    part = read_partition(out, layout.partition_id, meta)
    exposer = exposer_table(layout, meta.num_parts)
    store, adjacency = FeatureStore(layout, meta, out, exposer), Adjacency(layout, meta, part, exposer)
    sampler = NeighborSampler(adjacency, [10, 25], seed=[0, layout.trainer_rank])
    rng = np.random.default_rng(layout.trainer_rank)
    seeds = part.node_start + np.flatnonzero(~part.test_mask)  # plenty of minibatches
    inputs = [sampler.sample(rng.choice(seeds, size=min(16, seeds.size), replace=False)).input_nodes for _ in range(40)]
    yield meta, layout, part, store, inputs, adjacency, out
    adjacency.close()
    store.close()


@pytest.mark.parametrize("policy,opts", VARIANTS, ids=[f"{p}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for p, o in VARIANTS])
def test_assembled_features_are_bit_identical(stream, policy, opts):
    from rudder.prefetch.assembly import CachedFeatures, UncachedFeatures, feature_source
    from rudder.prefetch.buffers import BufferSettings
    from rudder.prefetch.policies import make_policy
    from rudder.prefetch.vip import fill_ranking
    from rudder.train.config import TrainConfig

    meta, layout, part, store, inputs, adjacency, _ = stream
    cfg = TrainConfig.from_flat({"policy": policy, "delta": opts.get("delta", 25), "lookahead": opts.get("lookahead", 4),
                                 "buffer_init": opts.get("init", "degree"), "buffer_scope": opts.get("scope", "halo"),
                                 "compat": "massivegnn" if opts.get("compat") else "none"})
    settings = BufferSettings.of(cfg.buffer)
    plain = UncachedFeatures(store)
    policy = make_policy(cfg)
    ranking = fill_ranking(settings, policy, adjacency, part.node_start + np.flatnonzero(part.train_mask), 4.0, [10, 25])
    assert (ranking is not None) == (settings.init == "vip")
    ours = feature_source(store, policy, settings, part, meta.num_nodes, np.random.default_rng(0), ranking=ranking)
    assert isinstance(ours, CachedFeatures)
    ours.fill()
    remote_rows = {"plain": 0, "ours": 0}
    owned = (part.node_start, part.node_end)
    for i, nodes in enumerate(inputs):
        expected, base = plain.assemble(nodes)
        got, stats = ours.assemble(nodes, inputs[i + 1:i + 1 + cfg.buffer.lookahead])
        assert got.tobytes() == expected.tobytes(), f"minibatch {i}"
        remote = (nodes < owned[0]) | (nodes >= owned[1])
        cacheable = remote & (np.isin(nodes, part.halo_nodes) if settings.scope == "halo" else True)
        assert stats.hits + stats.misses == int(cacheable.sum())
        remote_rows["plain"] += base.fetch.rows_shared + base.fetch.rows_remote
        remote_rows["ours"] += stats.fetch.rows_shared + stats.fetch.rows_remote - stats.refills
    assert remote_rows["ours"] <= remote_rows["plain"]
    if layout.num_trainers > 1 and part.halo_nodes.size:
        assert ours.hit_total > 0  # the buffer did serve rows


def test_vip_over_rma_equals_the_simulators(stream):
    """The inclusion probabilities a trainer computes from RMA reads of the distributed CSR are
    the simulator's, from its in-memory CSR, bit for bit (so ``--validate`` can rebuild a vip
    fill), and the reads it made are counted."""
    from rudder.comm.dist_array import ReadStats
    from rudder.prefetch.vip import inclusion_probabilities
    from rudder.sim.transport import Graph, SimulatedAdjacency

    meta, layout, part, store, inputs, adjacency, out = stream
    seeds = part.node_start + np.flatnonzero(part.train_mask)
    stats = ReadStats()
    ids, q = inclusion_probabilities(adjacency, seeds, 4.0, [5, 10, 25], stats)
    graph = Graph(out)
    sim_ids, sim_q = inclusion_probabilities(SimulatedAdjacency(graph, layout.partition_id, None, 0), seeds, 4.0, [5, 10, 25])
    np.testing.assert_array_equal(ids, sim_ids)
    assert q.tobytes() == sim_q.tobytes()
    assert np.all((q > 0) & (q <= 1)) and set(seeds.tolist()) <= set(ids.tolist())
    assert stats.rows_local > 0  # the own partition's lists, read in place
    if layout.num_trainers > 1:  # the frontier left the partition, and its lists were read from the others'
        assert ((ids < part.node_start) | (ids >= part.node_end)).any() and stats.rows_shared + stats.rows_remote > 0
