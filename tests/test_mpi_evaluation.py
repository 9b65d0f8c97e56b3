"""Distributed evaluation, with either GraphSAGE layer, at any process count: layer-wise inference
equals full-neighbour inference of the same parameters on the whole graph in one process (DGL's
MultiLayerFullNeighborSampler and DGL's SAGEConv); k-hop inference gives layer-wise's logits bit
for bit, in one minibatch or several, and in one reads each row of its scored nodes' L-hop
in-neighbourhood once (that neighbourhood computed here from the partition files), also when its
layers aggregate a few in-edges a call (as a hub's neighbourhood is, rudder.train.evaluation's
EVAL_CHUNK_EDGES); sampled inference reads a part of it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import BUNDLED_CORA, partition_on_rank0

pytestmark = pytest.mark.mpi


def in_neighbourhood(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, hops: int) -> np.ndarray:
    """The nodes within ``hops`` in-hops of ``seeds`` (seeds included), by breadth-first search."""
    reached = np.unique(seeds)
    frontier = reached
    for _ in range(hops):
        edges = np.concatenate([indices[indptr[v]:indptr[v + 1]] for v in frontier] + [np.zeros(0, dtype=np.int64)])
        frontier = np.setdiff1d(edges, reached)
        reached = np.union1d(reached, frontier)
    return reached


@pytest.mark.parametrize("impl", ["torch", "dgl"])
@pytest.mark.parametrize("num_layers", [2, 3])
def test_layerwise_equals_full_graph_inference_and_khop_reads_only_the_neighbourhood(tmp_path_factory, monkeypatch,
                                                                                    num_layers, impl):
    from rudder.comm.layout import build_layout, exposer_table
    from rudder.data.adjacency import Adjacency
    from rudder.data.dgl_bridge import load_dgl
    from rudder.data.feature_store import FeatureStore
    from rudder.data.partition_store import PartitionMeta, global_csr, read_features, read_partition
    from rudder.train import evaluation
    from rudder.train.evaluation import Evaluator
    from rudder.train.model import GraphSAGE

    out = partition_on_rank0(tmp_path_factory, f"planetoid:{BUNDLED_CORA}:cora", f"cora-eval{num_layers}{impl}")
    meta = PartitionMeta.load(out)
    layout = build_layout(meta.num_parts)
    part = read_partition(out, layout.partition_id, meta)
    exposer = exposer_table(layout, meta.num_parts)
    features, adjacency = FeatureStore(layout, meta, out, exposer), Adjacency(layout, meta, part, exposer)
    torch.manual_seed(3)  # the same random model on every rank
    model = GraphSAGE(meta.feat_dim, 16, meta.num_classes, num_layers, dropout=0.5, impl=impl)
    with torch.no_grad():  # make the classes non-trivial for an untrained model
        for p in model.parameters():
            p.mul_(4)
    sets = {"val": part.node_start + np.flatnonzero(part.val_mask), "test": part.node_start + np.flatnonzero(part.test_mask)}

    def evaluate(inference, batch_size=97):
        return Evaluator(layout, meta, part, features, adjacency, exposer, sets, batch_size, "cpu", inference).evaluate(
            model, fanouts=[3] * num_layers)

    everything = 10**6  # scored nodes per minibatch: all of them in one
    layerwise, khop, chunked, sampled, auto = (evaluate(*a) for a in (("layerwise",), ("khop", everything), ("khop",),
                                                                       ("sampled", everything), ("auto",)))
    monkeypatch.setattr(evaluation, "EVAL_CHUNK_EDGES", 100)  # some 25 of Cora's nodes a call (about 4 in-edges each)
    khop_pieces, layerwise_pieces = evaluate("khop", everything), evaluate("layerwise")
    monkeypatch.undo()
    adjacency.close()
    features.close()

    parts = [read_partition(out, p, meta) for p in range(meta.num_parts)]
    indptr, indices = global_csr(parts)
    # k-hop: layer-wise's logits bit for bit, each row of the L-hop in-neighbourhood read once (in
    # minibatches of 97 scored nodes, the rows they share read again)
    for name in sets:
        np.testing.assert_array_equal(khop.logits[name], layerwise.logits[name], err_msg=name)
        np.testing.assert_array_equal(chunked.logits[name], layerwise.logits[name], err_msg=name)
        np.testing.assert_array_equal(khop_pieces.logits[name], layerwise.logits[name], err_msg=name)
        np.testing.assert_array_equal(layerwise_pieces.logits[name], layerwise.logits[name], err_msg=name)
    assert khop.accuracy == layerwise.accuracy and (khop.inference, layerwise.inference) == ("khop", "layerwise")
    needed = in_neighbourhood(indptr, indices, np.concatenate(list(sets.values())), num_layers)
    other = int(np.count_nonzero((needed < part.node_start) | (needed >= part.node_end)))
    assert khop.reads.rows_local == needed.size - other
    assert khop.reads.rows_shared + khop.reads.rows_remote == other
    rows = ("rows_local", "rows_shared", "rows_remote", "bytes_remote")  # the same rows read once, whatever the pieces
    assert [getattr(khop_pieces.reads, k) for k in rows] == [getattr(khop.reads, k) for k in rows]
    assert chunked.reads.rows_shared + chunked.reads.rows_remote >= other
    # sampled (3 neighbours a layer here): a part of that neighbourhood; auto: one of the exact two
    assert sampled.inference == "sampled" and sampled.reads.rows_shared + sampled.reads.rows_remote <= other
    assert 0.05 < sampled.accuracy["test"] < 0.95
    assert auto.inference in ("khop", "layerwise") and auto.accuracy == layerwise.accuracy

    dgl = load_dgl()
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.tensor([], dtype=torch.int64))),
                  num_nodes=meta.num_nodes)
    x = torch.from_numpy(np.concatenate([read_features(out, p, meta) for p in range(meta.num_parts)]))
    y = np.concatenate([p.labels for p in parts])
    reference = GraphSAGE(meta.feat_dim, 16, meta.num_classes, num_layers, dropout=0.5, impl="dgl")
    reference.load_state_dict(model.state_dict())
    reference.eval()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(num_layers)
    for name, mask in (("val", "val_mask"), ("test", "test_mask")):
        nodes = torch.from_numpy(np.flatnonzero(np.concatenate([getattr(p, mask) for p in parts])))
        input_nodes, seeds, blocks = sampler.sample_blocks(g, nodes)
        with torch.no_grad():
            pred = reference(blocks, x[input_nodes]).argmax(1).numpy()
        correct = int((pred == y[seeds.numpy()]).sum())
        # Sums in another order may flip a near-tie; allow one node either way.
        assert abs(layerwise.accuracy[name] * nodes.numel() - correct) <= 1, (name, layerwise.accuracy[name],
                                                                              correct / nodes.numel())
        assert 0.05 < layerwise.accuracy[name] < 0.95  # a non-trivial check
