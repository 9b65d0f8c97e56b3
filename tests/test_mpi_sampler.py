"""Distributed sampling under real MPI ranks equals DGL's single-process sampling in
distribution: exact degree-capped counts, only true in-neighbours, no repeats, and neighbour
frequencies within binomial bounds of DGL's own, for seeds owned anywhere. Any process count."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA, partition_on_rank0

pytestmark = pytest.mark.mpi

SPECS = {"cora": f"planetoid:{BUNDLED_CORA}:cora", "sbm": "synthetic:sbm:nodes=1500,blocks=4,avg_degree=10,feat_dim=4,seed=3"}


@pytest.fixture(scope="module", params=sorted(SPECS))
def setup(request, tmp_path_factory):
    from rudder.comm.layout import build_layout, exposer_table
    from rudder.data.adjacency import Adjacency
    from rudder.data.partition_store import PartitionMeta, global_csr, read_partition

    out = partition_on_rank0(tmp_path_factory, SPECS[request.param], request.param)
    meta = PartitionMeta.load(out)
    layout = build_layout(meta.num_parts)
    parts = [read_partition(out, p, meta) for p in range(meta.num_parts)]  # the truth, from the files
    adjacency = Adjacency(layout, meta, parts[layout.partition_id], exposer_table(layout, meta.num_parts))
    indptr, indices = global_csr(parts)
    yield meta, layout, parts, adjacency, indptr, indices, out
    adjacency.close()


def test_two_hop_blocks_are_exact(setup):
    from rudder.sampling.neighbors import NeighborSampler

    meta, layout, parts, adjacency, indptr, indices, out = setup
    part = parts[layout.partition_id]
    seeds = part.node_start + np.flatnonzero(part.train_mask)
    fanouts = [3, 5]  # DGL order: seeds get 5, the next hop 3
    mb = NeighborSampler(adjacency, fanouts, seed=layout.trainer_rank).sample(seeds)
    assert len(mb.layers) == 2
    # Layer i's source nodes; its destinations are their first num_dst (DGL's block layout),
    # and they are layer i+1's source nodes.
    src_by_layer = [mb.input_nodes]
    for layer in mb.layers[:-1]:
        src_by_layer.append(src_by_layer[-1][:layer.num_dst])
    assert np.array_equal(src_by_layer[-1][:mb.layers[-1].num_dst], seeds)
    for layer, src_nodes, fanout in zip(mb.layers, src_by_layer, fanouts):
        dst_nodes = src_nodes[:layer.num_dst]
        assert layer.num_src == src_nodes.size and np.unique(src_nodes).size == src_nodes.size
        degree = indptr[dst_nodes + 1] - indptr[dst_nodes]
        np.testing.assert_array_equal(np.bincount(layer.dst, minlength=layer.num_dst), np.minimum(degree, fanout))
        # Every sampled edge is a true in-edge, and no neighbour repeats for one destination.
        s, d = src_nodes[layer.src], dst_nodes[layer.dst]
        for v in dst_nodes[:300]:
            chosen = s[d == v]
            assert np.isin(chosen, indices[indptr[v]:indptr[v + 1]]).all() and np.unique(chosen).size == chosen.size
    assert mb.stats.rows_local > 0


def test_frequencies_match_dgl(setup):
    """1-hop samples of high-degree nodes owned by every partition: each neighbour's frequency
    is within 5 sigma of k/d, for ours and for DGL's sample_neighbors on the whole graph."""
    import torch

    from rudder.data.dgl_bridge import load_dgl
    from rudder.sampling.neighbors import NeighborSampler

    meta, layout, parts, adjacency, indptr, indices, out = setup
    degree = np.diff(indptr)
    k, trials = 3, 300
    rng = np.random.default_rng(7)
    candidates = np.flatnonzero((degree > k) & (degree <= 40))
    probe = rng.choice(candidates, size=min(12, candidates.size), replace=False)
    sampler = NeighborSampler(adjacency, [k], seed=11 + layout.trainer_rank)
    dgl = load_dgl()
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.tensor([], dtype=torch.int64))),
                  num_nodes=meta.num_nodes)
    dgl.seed(5 + layout.trainer_rank)
    ours = {int(v): {} for v in probe}
    theirs = {int(v): {} for v in probe}
    for _ in range(trials):
        mb = sampler.sample(probe)
        layer = mb.layers[0]
        for s, d in zip(mb.input_nodes[layer.src], probe[layer.dst]):
            ours[int(d)][int(s)] = ours[int(d)].get(int(s), 0) + 1
        sg = dgl.sampling.sample_neighbors(g, torch.from_numpy(probe), k)
        for s, d in zip(*(t.numpy() for t in sg.edges())):
            theirs[int(d)][int(s)] = theirs[int(d)].get(int(s), 0) + 1
    for v in probe:
        nbrs = indices[indptr[v]:indptr[v + 1]]
        p = k / nbrs.size
        bound = 5 * np.sqrt(trials * p * (1 - p))
        for counts in (ours[int(v)], theirs[int(v)]):
            assert set(counts) <= set(nbrs.tolist())
            freq = np.array([counts.get(int(u), 0) for u in nbrs])
            assert np.abs(freq - trials * p).max() < bound, (int(v), freq)
    assert adjacency.indptr.own.shape[0] == meta.parts[layout.partition_id].num_owned + 1


def test_replicated_topology_samples_the_same(setup):
    """--topology replicated: the node's one copy of the whole CSR gives the same minibatches,
    key for key, as the distributed CSR, and reads nothing by RMA."""
    from rudder.data.adjacency import ReplicatedAdjacency, csr_bytes, resolve_topology
    from rudder.sampling.neighbors import NeighborSampler

    meta, layout, parts, adjacency, indptr, indices, out = setup
    replicated = ReplicatedAdjacency(layout, meta, out)
    try:
        np.testing.assert_array_equal(replicated.indices, indices)
        part = parts[layout.partition_id]
        seeds = part.node_start + np.flatnonzero(part.train_mask)
        for key in range(3):
            a = NeighborSampler(adjacency, [5, 10], seed=layout.trainer_rank).sample(seeds, key=(0, key))
            b = NeighborSampler(replicated, [5, 10], seed=layout.trainer_rank).sample(seeds, key=(0, key))
            np.testing.assert_array_equal(a.input_nodes, b.input_nodes)
            for x, y in zip(a.layers, b.layers):
                np.testing.assert_array_equal(x.src, y.src)
                np.testing.assert_array_equal(x.dst, y.dst)
            assert b.stats.rows_remote == b.stats.rows_shared == 0 and b.stats.bytes_remote == 0
    finally:
        replicated.close()
    assert resolve_topology("auto", meta) == "replicated" and csr_bytes(meta) < 1 << 20
    assert resolve_topology("distributed", meta) == "distributed"
