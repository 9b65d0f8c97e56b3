"""Single-process DGL GraphSAGE training: the yardstick distributed training is held to.

Same partitions (reassembled into one graph), same model class and hyperparameters, but all of
it DGL's: its SAGEConv layer (``--model-impl dgl``; distributed training defaults to our torch
layer), its neighbour sampler and DataLoader in one process, and its full-neighbour sampler for
evaluation. Returns the test accuracy after the last epoch."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rudder.data.dgl_bridge import load_dgl
from rudder.data.partition_store import PartitionMeta, global_csr, read_features, read_partition
from rudder.train.model import GraphSAGE


def train_reference(parts_dir: str, *, epochs: int, batch_size: int, fanouts=(10, 25), hidden=16, lr=0.003,
                    dropout=0.5, seed=0) -> float:
    dgl = load_dgl()
    meta = PartitionMeta.load(parts_dir)
    parts = [read_partition(parts_dir, p, meta) for p in range(meta.num_parts)]
    indptr, indices = global_csr(parts)
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.tensor([], dtype=torch.int64))),
                  num_nodes=meta.num_nodes)
    x = torch.from_numpy(np.concatenate([read_features(parts_dir, p, meta) for p in range(meta.num_parts)]))
    y = torch.from_numpy(np.concatenate([p.labels for p in parts]))
    train = torch.from_numpy(np.flatnonzero(np.concatenate([p.train_mask for p in parts])))
    test = torch.from_numpy(np.flatnonzero(np.concatenate([p.test_mask for p in parts])))

    torch.manual_seed(seed)
    dgl.seed(seed)
    model = GraphSAGE(meta.feat_dim, hidden, meta.num_classes, len(fanouts), dropout, impl="dgl")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loader = dgl.dataloading.DataLoader(g, train, dgl.dataloading.NeighborSampler(list(fanouts)),
                                        batch_size=batch_size, shuffle=True)
    for _ in range(epochs):
        for input_nodes, seeds, blocks in loader:
            loss = F.cross_entropy(model(blocks, x[input_nodes]), y[seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    full = dgl.dataloading.MultiLayerFullNeighborSampler(len(fanouts))
    correct = 0
    with torch.no_grad():
        for input_nodes, seeds, blocks in dgl.dataloading.DataLoader(g, test, full, batch_size=100_000):
            correct += int((model(blocks, x[input_nodes]).argmax(1) == y[seeds]).sum())
    return correct / test.numel()
