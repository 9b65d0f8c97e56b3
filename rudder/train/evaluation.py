"""Distributed evaluation: full-neighbour, layer-wise inference (as DistDGL and the paper do).

Sampled minibatch inference with full neighbours expands every seed's whole L-hop neighbourhood;
layer-wise inference computes each hidden layer once for every node instead. Layer l's output
for all nodes lives in a ``DistributedArray`` laid out like the features, so layer l+1 reads
its neighbours' rows one-sidedly, exactly as training reads features. Each trainer computes the
rows of the nodes it owns (in ``node`` mode the node's trainers split the partition and write
into the shared segment directly); only the last layer is restricted to the evaluated nodes.
Collective over the trainers; the result is the same on every rank.
"""
from __future__ import annotations

import numpy as np
import torch

from rudder.comm import gate
from rudder.comm.dist_array import DistributedArray
from rudder.data.feature_store import NodeRows
from rudder.sampling.neighbors import NeighborSampler
from rudder.sampling.schedule import my_share


@torch.no_grad()
def evaluate(model, layout, meta, partition, features: NodeRows, adjacency, exposer, eval_sets: dict[str, np.ndarray],
             batch_size: int, device, progress=lambda: None) -> dict[str, float]:
    """Accuracy on each named set of seeds (global IDs owned by this partition, already split
    among the node's trainers), over all trainers."""
    from mpi4py import MPI

    was_training = model.training
    model.eval()
    full = NeighborSampler(adjacency, [-1], seed=0)  # no randomness with every neighbour
    num_layers, pid, start = len(model.layers), layout.partition_id, partition.node_start
    owned = np.arange(partition.node_start, partition.node_end, dtype=np.int64)
    # In node mode the node's trainers write into the exposer's segment through shared memory,
    # if every one of them can map it; otherwise the exposer computes the whole partition.
    hidden_rows, current = None, features
    for layer in range(num_layers - 1):
        rows = DistributedArray(layout.trainers, [p.num_owned for p in meta.parts], exposer, pid, np.float32,
                                (model.widths[layer + 1],), wait=layout.mpi_wait)
        target = rows.views.get(pid)
        node = layout.node_trainers  # collectives beside the pipeline thread: through the MPI lock (rudder.comm.gate)
        shared_ok = gate.collective(node, node.allreduce, target is not None, op=MPI.LAND)
        mine = my_share(owned, layout) if shared_ok else (owned if rows.own.shape[0] else owned[:0])
        for lo in range(0, mine.size, batch_size):
            dst = mine[lo:lo + batch_size]
            target[dst - start] = _layer_output(model, layer, full, current, dst, device).cpu().numpy()
            progress()
        rows.publish()
        if hidden_rows is not None:
            hidden_rows.close()
        hidden_rows = current = NodeRows(meta, rows)
    counts = np.zeros(2 * len(eval_sets), dtype=np.int64)
    for i, seeds in enumerate(eval_sets.values()):
        for lo in range(0, seeds.size, batch_size):
            dst = seeds[lo:lo + batch_size]
            logits = _layer_output(model, num_layers - 1, full, current, dst, device)
            labels = torch.from_numpy(partition.labels[dst - start]).to(device)
            counts[2 * i] += int((logits.argmax(dim=1) == labels).sum())
            progress()
        counts[2 * i + 1] = seeds.size
    gate.collective(layout.trainers, layout.trainers.Allreduce, MPI.IN_PLACE, counts, op=MPI.SUM)
    if hidden_rows is not None:
        hidden_rows.close()
    model.train(was_training)
    return {name: float(counts[2 * i] / counts[2 * i + 1]) if counts[2 * i + 1] else float("nan")
            for i, name in enumerate(eval_sets)}


def _layer_output(model, layer: int, full: NeighborSampler, inputs: NodeRows, dst: np.ndarray, device) -> torch.Tensor:
    mb = full.sample(dst)
    x, _ = inputs.gather(mb.input_nodes)
    block = model.blocks(mb.layers, backward=False)[0].to(device)  # no backward: no out-edges
    return model.layer_forward(layer, block, torch.from_numpy(x).to(device))
