"""Vertex-inclusion probabilities (SALIENT++, MLSys'23): for each node, the probability that it is
an input of a given minibatch of this trainer under the run's fanouts, propagated hop by hop from
the trainer's seeds. Ranking the admissible nodes by it (``--buffer-init vip``) fills a buffer
with the rows minibatches are likeliest to need, where ranking by in-degree only guesses.

A minibatch holds each of the T seeds with probability s/T (s seeds a step on average). A node v
in the frontier of hop l keeps each of its deg(v) in-neighbours with probability
min(1, f_l / deg(v)) (uniform sampling without replacement, DGL's), independently of the other
frontier nodes, and the frontier keeps its own nodes (a block's sources include its
destinations), so

    q_{l+1}(u) = 1 - (1 - q_l(u)) * prod_{v: u -> v} (1 - q_l(v) min(1, f_l / deg(v)))

and the inputs are the last hop's frontier. Products are sums of log1p, in float64, added in a
fixed order (``np.bincount``), so the trainer (RMA reads) and the simulator (its in-memory CSR)
get the same bits. The frontier's adjacency is read through the sampler's interface (``rows``
and ``neighbours``): whole neighbour lists this time, hop by hop, once before training; what
that costs is in docs/policies.md.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from rudder.comm.dist_array import ReadStats
from rudder.prefetch.buffers import find_sorted


def inclusion_probabilities(adjacency, seeds: np.ndarray, batch_size: float, fanouts: list[int],
                            stats: ReadStats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(node IDs sorted, probability of each being an input of a minibatch); ``batch_size``: seeds
    of ``seeds`` a minibatch holds on average; ``fanouts`` input side first, as the sampler takes
    them; the adjacency reads are added to ``stats``. Each frontier keeps the last one, so each
    node's neighbour list is read once, on the hop it first enters the frontier."""
    ids = np.unique(np.asarray(seeds, dtype=np.int64))
    q = np.full(ids.size, min(1.0, batch_size / max(ids.size, 1)), dtype=np.float64)
    stats = stats if stats is not None else ReadStats()
    known, known_degree = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)  # the last frontier, its degrees
    dst, src = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)  # its in-edges (u -> v as src u, dst v)
    for fanout in reversed(fanouts):  # seed side first
        pos, seen = find_sorted(known, ids)
        new = ids[~seen]
        parts, start, degree = adjacency.rows(new, stats)
        offsets = np.arange(int(degree.sum())) - np.repeat(np.cumsum(degree) - degree, degree)
        sources = adjacency.neighbours(np.repeat(parts, degree), np.repeat(start, degree) + offsets, stats)
        dst, src = np.concatenate([dst, np.repeat(new, degree)]), np.concatenate([src, sources])
        deg = np.empty(ids.size, dtype=np.int64)
        deg[seen], deg[~seen] = known_degree[pos[seen]], degree
        known, known_degree = ids, deg
        keep = q * (1.0 if fanout < 0 else np.minimum(1.0, fanout / np.maximum(deg, 1)))
        nodes, where = sorted_codes(np.concatenate([ids, src]))
        # log of the probability of staying out of the next frontier, summed in input order
        with np.errstate(divide="ignore"):  # a certain node: log 0 = -inf, and q = 1 exactly
            stay_out = np.log1p(-np.minimum(np.concatenate([q, keep[np.searchsorted(ids, dst)]]), 1.0))
        ids, q = nodes, -np.expm1(np.bincount(where, weights=stay_out, minlength=nodes.size))
    return ids, q


def sorted_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` by hashing (pandas' factorize), sorting only the
    distinct values: the edges outnumber the nodes they reach by their degree, and an argsort of
    every edge cost most of the whole computation."""
    codes, uniques = pd.factorize(values)
    order = np.argsort(uniques)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return np.asarray(uniques, dtype=np.int64)[order], rank[codes]


def halo_ranking(adjacency, seeds: np.ndarray, batch_size: float, fanouts: list[int], halo: np.ndarray) -> np.ndarray:
    """Each halo node's inclusion probability (0 for one no minibatch can reach)."""
    ids, q = inclusion_probabilities(adjacency, seeds, batch_size, fanouts)
    pos = np.searchsorted(ids, halo)
    found = (pos < ids.size) & (ids[np.minimum(pos, ids.size - 1)] == halo)
    return np.where(found, q[np.minimum(pos, ids.size - 1)], 0.0)


def fill_ranking(settings, policy, adjacency, train_nodes: np.ndarray, seeds_per_step: float, fanouts: list[int],
                 stats: ReadStats | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """What the buffer of ``policy`` fills by under ``settings`` (a ``BufferSettings``):
    ``inclusion_probabilities`` of the partition's training nodes with ``seeds_per_step`` of them
    in a minibatch of this trainer, when the fill is ``vip`` and the buffer fills statically;
    None otherwise (nothing to compute). The trainer and the simulator both call this."""
    buffer = policy.buffer_class
    if settings.init != "vip" or buffer is None or not buffer.fills_statically:
        return None
    return inclusion_probabilities(adjacency, train_nodes, seeds_per_step, fanouts, stats)
