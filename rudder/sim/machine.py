"""The simulator's time model: alpha-beta figures of a cluster node and what a GraphSAGE step
costs on it (docs/simulator.md)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """Alpha-beta figures of a cluster node (field notes, "time floor per minibatch")."""
    name: str
    ranks_per_node: int  # trainers per node (their partitions' rows are read on-node)
    latency: float  # seconds per off-node owner read in a minibatch (one indexed Get per owner)
    bandwidth: float  # bytes/s off-node, per trainer (the node's NICs shared by its trainers)
    node_bandwidth: float  # bytes/s on-node (shared memory / NVLink)
    flops: float  # sustained GraphSAGE flop/s of one trainer
    step_overhead: float  # seconds per step (kernel launches, optimiser)


# Perlmutter: a GPU node has 4 A100 and 4 Slingshot-11 NICs (200 Gb/s = 25 GB/s each), a CPU node
# 2 EPYC 7763 and 1 NIC. Latency: ~2 us per one-sided Get over Slingshot. flops: A100 FP32 19.5
# TFLOP/s at half of peak; a CPU node's 128 cores at ~2 TFLOP/s sustained, split over 4 trainers.
MACHINES = {
    "perlmutter-gpu": Machine("perlmutter-gpu", 4, 2e-6, 25e9, 100e9, 9.75e12, 1e-3),
    "perlmutter-cpu": Machine("perlmutter-cpu", 4, 2e-6, 25e9 / 4, 50e9, 0.5e12, 1e-3),
}


def sage_flops(layers, widths: list[int]) -> float:
    """Forward + backward flops of a GraphSAGE minibatch (mean aggregation over the block's edges,
    then two dense products per destination node); backward ~ twice forward."""
    fwd = 0.0
    for layer, (d_in, d_out) in zip(layers, zip(widths[:-1], widths[1:])):
        fwd += layer.src.size * d_in + 2 * 2 * layer.num_dst * d_in * d_out
    return 3 * fwd


def allreduce_seconds(params: int, trainers: int, m: Machine) -> float:
    """Ring allreduce of float32 gradients: 2(p-1) latency steps and 2(p-1)/p of the bytes."""
    if trainers < 2:
        return 0.0
    return 2 * (trainers - 1) * m.latency + 2 * (trainers - 1) / trainers * 4 * params / m.bandwidth
