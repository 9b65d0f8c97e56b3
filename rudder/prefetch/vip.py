"""Vertex-inclusion probabilities (SALIENT++, MLSys'23): for each node, the probability that it is
an input of a given minibatch of this trainer under the run's fanouts, propagated hop by hop from
the trainer's seeds. Ranking the halo by it (``--buffer-init vip``) fills a static buffer with
the rows minibatches are likeliest to need, where ranking by in-degree only guesses.

A minibatch holds each of the trainer's T seeds with probability B/T (B seeds a step). A node v
in the frontier of hop l keeps each of its deg(v) in-neighbours with probability
min(1, f_l / deg(v)) (uniform sampling without replacement, DGL's), independently of the other
frontier nodes, and the frontier keeps its own nodes (a block's sources include its
destinations), so

    q_{l+1}(u) = 1 - (1 - q_l(u)) * prod_{v: u -> v} (1 - q_l(v) min(1, f_l / deg(v)))

and the inputs are the last hop's frontier. Products are sums of log1p, in float64. The
frontier's adjacency is read through the same interface as the sampler's (``rows`` and
``neighbours``: RMA in a real run, the in-memory CSR in the simulator), whole neighbour lists
this time, once before training.
"""
from __future__ import annotations

import numpy as np

from rudder.comm.dist_array import ReadStats


def inclusion_probabilities(adjacency, seeds: np.ndarray, batch_size: int, fanouts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(node IDs sorted, probability of each being an input of a minibatch); ``fanouts`` input side
    first, as the sampler takes them."""
    ids = np.unique(np.asarray(seeds, dtype=np.int64))
    q = np.full(ids.size, min(1.0, batch_size / max(ids.size, 1)), dtype=np.float64)
    stats = ReadStats()
    for fanout in reversed(fanouts):  # seed side first
        parts, start, degree = adjacency.rows(ids, stats)
        keep = q * (1.0 if fanout < 0 else np.minimum(1.0, fanout / np.maximum(degree, 1)))
        # every in-edge (u -> v) of the frontier, as (position in its partition's indices, v's row)
        owner = np.repeat(np.arange(ids.size), degree)
        positions = np.repeat(start, degree) + (np.arange(owner.size) - np.repeat(np.cumsum(degree) - degree, degree))
        sources = adjacency.neighbours(np.repeat(parts, degree), positions, stats)
        nodes, where = np.unique(np.concatenate([ids, sources]), return_inverse=True)
        log_out = np.zeros(nodes.size)  # log of the probability of staying out of the next frontier
        np.add.at(log_out, where[:ids.size], np.log1p(-np.minimum(q, 1.0 - 1e-300)))
        np.add.at(log_out, where[ids.size:], np.log1p(-np.minimum(keep[owner], 1.0 - 1e-300)))
        ids, q = nodes, -np.expm1(log_out)
    return ids, q


def halo_ranking(adjacency, seeds: np.ndarray, batch_size: int, fanouts: list[int], halo: np.ndarray) -> np.ndarray:
    """Each halo node's inclusion probability (0 for one no minibatch can reach)."""
    ids, q = inclusion_probabilities(adjacency, seeds, batch_size, fanouts)
    pos = np.searchsorted(ids, halo)
    found = (pos < ids.size) & (ids[np.minimum(pos, ids.size - 1)] == halo)
    return np.where(found, q[np.minimum(pos, ids.size - 1)], 0.0)
