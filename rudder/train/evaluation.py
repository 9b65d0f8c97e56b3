"""Distributed evaluation: full-neighbour inference of the val/test nodes (as DistDGL and the
paper do), computed one of three ways (``--eval-inference``; docs/evaluation.md has their costs):

- ``khop``: each trainer computes its own scored nodes from their L-hop in-neighbourhood and
  nothing else, layer by layer, a minibatch of ``--eval-batch-size`` scored nodes at a time: the
  minibatch's in-neighbourhood is read once (the full-neighbour sampler: remote CSR rows read
  one-sidedly), the input rows of its outermost nodes are read once (held at once: a smaller
  minibatch holds fewer, and reads again the rows minibatches share), and layer l computes only
  the nodes within L-1-l hops of its scored ones. Nothing collective but the final count.
- ``layerwise``: every hidden layer computed once for every node, each trainer the nodes it
  owns (in ``node`` mode the node's trainers split the partition and write into the shared
  segment directly), into a ``DistributedArray`` laid out like the features, so that layer l+1
  reads its neighbours' rows one-sidedly as training reads features; only the last layer is
  restricted to the scored nodes. Its reads grow with the halo, whatever the scored nodes.
- ``sampled``: ``khop``'s computation over the training fanouts' neighbourhood instead of the
  full one (DGL's examples' sampled inference), drawn from a stream of its own; accuracy differs.

``auto`` takes ``khop`` where it reads fewer bytes than ``layerwise`` would over all trainers
(decided once, collectively, at the first evaluation: it depends on the graph and the scored
nodes, not on the model), ``layerwise`` otherwise: ``khop`` wins where the scored nodes are few
(papers100M scores 0.3% of its nodes), ``layerwise`` where they are a large share of the graph,
whose L-hop neighbourhood then spans rows two hops away that ``layerwise`` never reads.

Memory: a neighbourhood is read and aggregated ``EVAL_CHUNK_EDGES`` in-edges at a time
(``rudder.sampling.neighbors.full_neighbourhood``) and held as its nodes, their rows and a 4-byte
source index an edge, never as whole edge lists: on a graph with hubs the full neighbourhood has
far more edges than nodes (RMAT-16, P = 16: 1.57M in-edges to 46k nodes a trainer), and reading it
whole held about 60 bytes an edge. The evaluation's freed pages go back to the system when it
ends (glibc kept them otherwise, in the rank's PSS). docs/evaluation.md has the figures.

The logits of ``khop`` and ``layerwise`` are the same function of the same rows: each node's
neighbours are summed in the same order (tested bit for bit), and a layer aggregated a chunk of
in-edges at a time still multiplies matrices of the whole layer's shape. Collective over the
trainers; the accuracy is the same on every rank.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from mpi4py import MPI

from rudder.comm import gate
from rudder.comm.dist_array import DistributedArray, ReadStats
from rudder.data.feature_store import NodeRows
from rudder.data.row_blocks import RowBlocks
from rudder.logs.schema import EVAL_INFERENCES
from rudder.sampling.neighbors import EVAL_CHUNK_EDGES, NeighborSampler, Neighbourhood, edge_chunks, full_neighbourhood
from rudder.sampling.schedule import my_share

SAMPLED_STREAM = 3  # the sampled inference's random stream, apart from training's (seed, trainer)


def give_back_heap() -> bool:
    """Return the allocator's free pages to the system (glibc's ``malloc_trim(0)``): the
    evaluation's arrays, once freed, stay in glibc's heap otherwise and count in the rank's PSS
    (25 MB a trainer at RMAT-16, P = 16). False where there is no glibc."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _TRIM = False
    if not _TRIM:
        return False
    _TRIM(0)
    return True


_TRIM = None


@dataclass
class Evaluation:
    accuracy: dict[str, float]  # per named set of seeds, over all trainers
    inference: str  # how it ran (one of EVAL_INFERENCES)
    reads: ReadStats = field(default_factory=ReadStats)  # this trainer's feature rows (and layerwise's hidden rows)
    adjacency: ReadStats = field(default_factory=ReadStats)  # this trainer's CSR reads (the neighbourhoods)
    logits: dict[str, np.ndarray] = field(default_factory=dict)  # this trainer's seeds', per set, in the set's order


class Evaluator:
    """Evaluates the model on each named set of seeds (global IDs owned by this partition, already
    split among the node's trainers). ``inference``: one of EVAL_INFERENCES or ``auto``; ``seed``:
    the sampled inference's stream's."""

    def __init__(self, layout, meta, partition, features: NodeRows, adjacency, exposer, eval_sets: dict[str, np.ndarray],
                 batch_size: int, device, inference: str = "auto", seed: int = 0):
        self.layout, self.meta, self.partition, self.features = layout, meta, partition, features
        self.adjacency, self.exposer, self.eval_sets = adjacency, exposer, eval_sets
        self.batch_size, self.device = batch_size, device
        self.inference, self.seed = inference, seed
        self.blocks: dict[int, RowBlocks] = {}  # each width's input matrices, reused within an evaluation
        self.scored = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in eval_sets.values()] or
                                               [np.zeros(0, dtype=np.int64)]))

    @torch.no_grad()
    def evaluate(self, model, fanouts=(), progress=lambda: None) -> Evaluation:
        """Collective over the trainers; ``fanouts``: the sampled inference's (input side first)."""
        was_training = model.training
        model.eval()
        result = Evaluation({}, self.inference)
        every = [-1] * len(model.layers)
        if self.inference == "auto":  # decided once: the same graph and seeds every time
            # counted one neighbourhood at a time, its nodes only, then read again if khop is
            # chosen (every neighbour: the same minibatches), so that no more than one is held at once
            counting = self._neighbourhoods(every, result.adjacency, keep_edges=False)
            self.inference = "khop" if self._khop_reads_less(counting, model.widths) else "layerwise"
            give_back_heap()  # the count's pages, before the inference needs its own
        result.inference = self.inference
        if self.inference == "layerwise":
            logits = self._layerwise(model, result, progress)
        else:
            sampled = self.inference == "sampled"
            neighbourhoods = self._neighbourhoods(list(fanouts) if sampled else every, result.adjacency, sampled=sampled)
            logits = self._over_neighbourhoods(model, neighbourhoods, result, progress)
        counts = np.zeros(2 * len(self.eval_sets), dtype=np.int64)
        start = self.partition.node_start
        for i, (name, seeds) in enumerate(self.eval_sets.items()):
            result.logits[name] = scores = logits[np.searchsorted(self.scored, seeds)]
            counts[2 * i] = int((scores.argmax(axis=1) == self.partition.labels[seeds - start]).sum())
            counts[2 * i + 1] = seeds.size
        gate.collective(self.layout.trainers, self.layout.trainers.Allreduce, MPI.IN_PLACE, counts, op=MPI.SUM)
        result.accuracy = {name: float(counts[2 * i] / counts[2 * i + 1]) if counts[2 * i + 1] else float("nan")
                           for i, name in enumerate(self.eval_sets)}
        model.train(was_training)
        self.blocks.clear()
        give_back_heap()  # the evaluation's freed arrays, before the rank's memory is sampled
        return result

    # -- khop and sampled ----------------------------------------------------------------------
    def _neighbourhoods(self, fanouts: list[int], stats: ReadStats, sampled: bool = False, keep_edges: bool = True):
        """The L-hop in-neighbourhood (every neighbour, or ``fanouts`` of them) of each minibatch
        of ``batch_size`` scored nodes, as its layers (layer l's destinations: the nodes within
        L-1-l hops of the minibatch's), one minibatch at a time; every neighbour read a bounded
        number of edges at a time (``full_neighbourhood``), its edges kept only with ``keep_edges``."""
        sampler = NeighborSampler(self.adjacency, fanouts, seed=[self.seed, SAMPLED_STREAM, self.layout.trainer_rank]) \
            if sampled else None
        for lo in range(0, self.scored.size, self.batch_size):
            seeds = self.scored[lo:lo + self.batch_size]
            if sampler is not None:
                mb = Neighbourhood.of(sampler.sample(seeds))
            else:
                mb = full_neighbourhood(self.adjacency, seeds, len(fanouts), EVAL_CHUNK_EDGES, keep_edges=keep_edges)
            stats.add(mb.stats)
            yield mb
            del mb  # not held while the next one is read

    def _khop_reads_less(self, neighbourhoods: Iterable[Neighbourhood], widths: list[int]) -> bool:
        """Over all trainers: the bytes ``khop`` reads (the feature rows of its neighbourhoods'
        outermost nodes that other partitions own) against those ``layerwise`` would: each hidden
        layer's input rows of the halo (split among the partition's trainers), the features' at
        the first layer and float32 hidden rows after it, and the last layer's, of the scored
        nodes' remote neighbours. Bytes, not rows: a hidden row is far narrower than a feature row."""
        p, feature_bytes = self.partition, self.meta.feature_encoding.row_bytes
        share = my_share(np.arange(p.num_owned), self.layout).size / max(p.num_owned, 1)
        in_bytes = [feature_bytes] + [4 * w for w in widths[1:-1]]  # each layer's input row
        # a minibatch's seed-side layer's sources, its scored nodes and their in-neighbours, are a
        # prefix of its input nodes (every layer's sources begin with its destinations)
        first_hop = outer = 0
        for mb in neighbourhoods:
            first_hop += self._other(mb.input_nodes[:mb.sizes[-2]])
            outer += self._other(mb.input_nodes)
        layerwise = p.halo_nodes.size * share * sum(in_bytes[:-1]) + first_hop * in_bytes[-1]
        khop = outer * feature_bytes
        total = np.array([khop, layerwise], dtype=np.float64)
        gate.collective(self.layout.trainers, self.layout.trainers.Allreduce, MPI.IN_PLACE, total, op=MPI.SUM)
        return bool(total[0] <= total[1])

    def _other(self, nodes: np.ndarray) -> int:
        """How many of ``nodes`` other partitions own."""
        return int(np.count_nonzero((nodes < self.partition.node_start) | (nodes >= self.partition.node_end)))

    def _over_neighbourhoods(self, model, neighbourhoods, result: Evaluation, progress) -> np.ndarray:
        """Logits of the scored nodes, a minibatch at a time from its neighbourhood: its input rows
        read once and held, then each layer over its own destinations."""
        logits = [np.zeros((0, model.widths[-1]), dtype=np.float32)]
        for mb in neighbourhoods:
            x, reads = self._read(self.features, mb.input_nodes)
            result.reads.add(reads)
            logits.append(self._forward(model, mb, torch.from_numpy(x).to(self.device)).cpu().numpy())
            del mb, x
            progress()
        return np.concatenate(logits)

    def _read(self, inputs: NodeRows, nodes: np.ndarray):
        """``inputs.gather(nodes)`` into a matrix of an earlier minibatch's, once it is free: an
        evaluation reads one at a time, each a fresh mapping otherwise (``RowBlocks``)."""
        if inputs.dim not in self.blocks:
            self.blocks[inputs.dim] = RowBlocks(inputs.dim, keep=1)
        return inputs.gather(nodes, out=self.blocks[inputs.dim].take(nodes.size))

    def _forward(self, model, mb: Neighbourhood, h: torch.Tensor, first: int = 0) -> torch.Tensor:
        """Layers ``first``, ``first`` + 1, ... over ``mb``'s layers from its input rows ``h``, each
        layer's in-edges read and aggregated at most ``EVAL_CHUNK_EDGES`` at a time
        (``GraphSAGE.layer_forward_in_pieces``): the layer's matrix products have the shape, and
        their rows the bits, of the whole layer's (torch's CPU products give other bits to a
        product of fewer rows), and each row sums the same neighbours in the same order."""
        for i in range(mb.num_layers):
            pieces = edge_chunks(np.diff(mb.indptr[i]), EVAL_CHUNK_EDGES)
            if len(pieces) <= 1:
                h = model.layer_forward(first + i, self._block(model, mb.layer(i)), h)
            else:  # one piece's block at a time
                blocks = ((self._block(model, mb.layer(i, a, b)), a, b) for a, b in pieces)
                h = model.layer_forward_in_pieces(first + i, mb.sizes[i + 1], blocks, h)
        return h

    def _block(self, model, layer):
        return model.blocks([layer], backward=False)[0].to(self.device)

    # -- layerwise -----------------------------------------------------------------------------
    def _layerwise(self, model, result: Evaluation, progress) -> np.ndarray:
        """Every hidden layer for every owned node, then the last layer for the scored ones."""
        layout, meta, part = self.layout, self.meta, self.partition
        num_layers, pid, start = len(model.layers), layout.partition_id, part.node_start
        owned = np.arange(part.node_start, part.node_end, dtype=np.int64)
        # In node mode the node's trainers write into the exposer's segment through shared memory,
        # if every one of them can map it; otherwise the exposer computes the whole partition.
        hidden_rows, current = None, self.features
        for layer in range(num_layers - 1):
            rows = DistributedArray(layout.trainers, [p.num_owned for p in meta.parts], self.exposer, pid, np.float32,
                                    (model.widths[layer + 1],), wait=layout.mpi_wait, nearby=layout.node_trainer_ranks)
            target = rows.views.get(pid)
            node = layout.node_trainers  # collectives beside the pipeline thread: through the MPI lock (rudder.comm.gate)
            shared_ok = gate.collective(node, node.allreduce, target is not None, op=MPI.LAND)
            mine = my_share(owned, layout) if shared_ok else (owned if rows.own.shape[0] else owned[:0])
            for lo in range(0, mine.size, self.batch_size):
                dst = mine[lo:lo + self.batch_size]
                target[dst - start] = self._layer_output(model, layer, current, dst, result).cpu().numpy()
                progress()
            rows.publish()
            if hidden_rows is not None:
                hidden_rows.close()
            hidden_rows = current = NodeRows(meta, rows)
        logits = np.zeros((self.scored.size, model.widths[-1]), dtype=np.float32)
        for lo in range(0, self.scored.size, self.batch_size):
            dst = self.scored[lo:lo + self.batch_size]
            logits[lo:lo + dst.size] = self._layer_output(model, num_layers - 1, current, dst, result).cpu().numpy()
            progress()
        if hidden_rows is not None:
            hidden_rows.close()
        return logits

    def _layer_output(self, model, layer: int, inputs: NodeRows, dst: np.ndarray, result: Evaluation) -> torch.Tensor:
        """Layer ``layer`` of the nodes ``dst`` from their in-neighbours' rows in ``inputs`` (every
        neighbour: no randomness), its in-edges read and aggregated a bounded number at a time."""
        mb = full_neighbourhood(self.adjacency, dst, 1, EVAL_CHUNK_EDGES)
        result.adjacency.add(mb.stats)
        x, reads = self._read(inputs, mb.input_nodes)
        result.reads.add(reads)
        return self._forward(model, mb, torch.from_numpy(x).to(self.device), first=layer)


__all__ = ["EVAL_INFERENCES", "Evaluation", "Evaluator"]
