"""One buffer for the trainers of a node that each train their own partition
(``--buffer-sharing node`` with ``--partition-mode trainer``): a pool over the union of their
halos.

Separate buffers of a node's trainers hold the same remote rows several times over wherever
their halos overlap, and spend slots on rows of the node's own partitions, which every trainer
of the node reads from shared memory anyway. The pool admits each halo node of any of the node's
trainers once, leaving out those a same-node partition owns, and has the slots the trainers'
own buffers would have had together (f x the sum of their halos; no more than the pool holds),
so it costs the same memory. Split in quotas (``--buffer-split quota``) its trainers, whose
demands now differ, each replace their own part of it by their own misses.

A node rank's in-degree of a halo node is its global in-degree, the same in every halo, so the
degree fill ranks the pool by it. The ``vip`` fill ranks by the probability that some trainer of
the node samples the node in a step, 1 - prod_k (1 - p_k) over the trainers' own probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.comm import gate
from rudder.prefetch.buffers import capacity_of


@dataclass
class NodePool:
    """What a buffer's ``build`` reads of a partition, for the node's pool."""
    halo_nodes: np.ndarray  # admissible nodes, sorted
    halo_in_degree: np.ndarray  # their global in-degrees
    node_start: int  # the building trainer's own partition (the pool admits its halo scope only)
    node_end: int
    capacity: int  # slots


def gather_node_pool(comm, partition, in_shared_memory, fraction: float,
                     ranking: tuple[np.ndarray, np.ndarray] | None) -> tuple[NodePool, tuple | None]:
    """Collective over the node's trainers (``comm``): the pool over their halos, with
    ``in_shared_memory(ids)`` saying which rows a same-node partition holds, and the node's
    ``vip`` ranking from each trainer's own ``ranking`` (None without one)."""
    halos = gate.collective(comm, comm.allgather, (partition.halo_nodes, partition.halo_in_degree))
    nodes = np.concatenate([np.asarray(h, dtype=np.int64) for h, _ in halos])
    degree = np.concatenate([np.asarray(d, dtype=np.int64) for _, d in halos])
    union, first = np.unique(nodes, return_index=True)
    remote = ~in_shared_memory(union)
    union, degree = union[remote], degree[first][remote]
    capacity = min(union.size, sum(capacity_of(fraction, np.asarray(h).size) for h, _ in halos))
    pool = NodePool(union, degree, partition.node_start, partition.node_end, capacity)
    rankings = gate.collective(comm, comm.allgather, ranking)
    if any(r is None for r in rankings):
        return pool, None
    ids = np.concatenate([r[0] for r in rankings])
    keep_log = np.concatenate([np.log1p(-np.minimum(np.asarray(r[1], dtype=np.float64), 1.0 - 1e-12))
                               for r in rankings])  # log(1 - p_k), summed per node
    ranked, where = np.unique(ids, return_inverse=True)
    total = np.zeros(ranked.size)
    np.add.at(total, where, keep_log)
    return pool, (ranked, -np.expm1(total))
