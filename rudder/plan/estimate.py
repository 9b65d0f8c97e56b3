"""A trainer rank's costs, owner by owner, from the graph's parts and the run's options.

Memory (PSS, what a rank adds to its node), by owner:

* runtime: the interpreter, numpy, h5py, torch and MPI: ``Runtime``, measured on the 2-core host by
  bench/scale.py (docs/results-scale.md), its heap per rank and its libraries' pages shared by the
  ranks of a host (PSS divides them), and MPICH's own shared-memory segments;
* model: parameters, gradients and Adam's two moments (float32);
* graph: the partition's node and halo arrays as read, and the CSR the rank holds: its own part in
  an RMA window (``distributed``) or its share of the node's copy of the whole CSR (``replicated``);
* features: its own part's rows in the feature window, at the stored row size;
* buffer: the policy's buffer built for real at a small halo and scaled to the part's (its arrays
  are per slot and per halo node), so a policy's buffer class is costed by its own code;
* minibatches in flight: the input matrices a trainer holds at once (``matrices_in_flight``: the
  queue's, the one being prepared and the one being trained) with their float32 rows and blocks,
  from the simulator's sampling where it can sample the graph;
* evaluation (transient, after an epoch, given back when it ends): what the evaluation holds at
  its high point (``evaluation_bytes``), the inference ``auto`` would take decided as the trainers
  decide it: ``layerwise`` a hidden layer's window over the rank's own nodes and one batch's
  1-hop in-neighbourhood, ``khop`` a minibatch's L-hop one, each held as float32 rows and 4 bytes
  an in-edge, with at most ``EVAL_CHUNK_EDGES`` in-edges being read or aggregated at once;
  ``auto`` first counts every minibatch's neighbourhood, its nodes only.

Start-up file I/O: the metadata, the part file's checksum (the rank exposing the part, with
``--verify-data``), the node and halo arrays, the own CSR (distributed) or every part's CSR (the
node's first trainer, replicated), and the own feature rows.
"""
from __future__ import annotations

import math
import types
from dataclasses import dataclass

import numpy as np

from rudder.data.adjacency import REPLICATE_MAX_BYTES
from rudder.plan.graphs import HALO_FILE_BYTES, NODE_FILE_BYTES, GraphShape, Part
from rudder.prefetch.buffers import BufferSettings
from rudder.prefetch.pipeline import matrices_in_flight
from rudder.prefetch.policies import make_policy
from rudder.sampling.neighbors import EVAL_CHUNK_EDGES
from rudder.train.footprint import array_bytes

# In memory: the node arrays as read (labels, masks, original IDs, in-degrees), the halo's three
# arrays and the trainer's sorted copy of its IDs.
NODE_BYTES = NODE_FILE_BYTES
HALO_BYTES = HALO_FILE_BYTES + 8
SEED_BYTES = 8  # the training nodes' IDs
BLOCK_EDGE_BYTES = 16  # a sampled edge in a block: source and destination positions (int64)
# An evaluation's in-edge while it is read (positions, owners, IDs, local indices: int64 arrays
# and their temporaries) or aggregated: RMAT-16's layer-wise batch of 117k in-edges at P = 16 rose
# 16.8 MB over its start, 10.9 MB of it the batch's float32 rows (docs/evaluation.md)
EVAL_EDGE_BYTES = 50
EVAL_NODE_BYTES = 32  # a neighbourhood's node while read (ID, sorted ID, local index, the IDs in order)


@dataclass(frozen=True)
class Runtime:
    """What a trainer rank holds besides the owners below, as bench/scale.py measured it (its peak
    PSS in training less them): its own heap (the interpreter, torch, MPI, the step's transient
    tensors), the libraries' file-backed pages (shared by every rank of a host) and MPICH's
    shared-memory segments a rank."""
    anon_bytes: int
    file_bytes: int  # the whole mapping; a rank's PSS holds 1/(ranks on its host) of it
    shmem_bytes: int
    measured: str

    def pss(self, ranks_per_host: int) -> int:
        return self.anon_bytes + self.file_bytes // max(1, ranks_per_host) + self.shmem_bytes


# torch 2.13 CPU, numpy, h5py, mpi4py 4.1 on MPICH 4 over OFI/TCP (the venv's wheels), Python 3.11,
# x86-64: a trainer's peak PSS in training (its evaluation's aside) less the owners modelled here
# (bench/scale.py's calibration line).
# A CUDA build of torch maps several times the libraries and holds a CUDA context on top.
RUNTIME = Runtime(anon_bytes=217_041_483, file_bytes=59_320_320, shmem_bytes=1_066_420,
                  measured="bench/scale.py at P=4 (RMAT-12, policy none) on the 2-core host, 6 December 2026: "
                           "torch 2.13 CPU, MPICH 4 over OFI/TCP (docs/results-scale.md); a CUDA torch holds more")


@dataclass
class Layout:
    trainers: int
    trainers_per_node: int
    agents_per_node: int
    ranks_per_host: int  # ranks sharing one host's library pages (a cluster node's tasks; here, the whole job)

    @property
    def nodes(self) -> int:
        return math.ceil(self.trainers / self.trainers_per_node)

    @property
    def tasks(self) -> int:
        return self.trainers + self.nodes * self.agents_per_node


def topology(cfg, graph: GraphShape) -> str:
    """``--topology`` resolved as rudder.data.adjacency does it, from the CSR's size."""
    choice = cfg.data.topology
    if choice == "auto":
        return "replicated" if graph.csr_bytes <= REPLICATE_MAX_BYTES else "distributed"
    return choice


def model_params(graph: GraphShape, cfg) -> int:
    """GraphSAGE's parameters: per layer two weight matrices and a bias (as the simulator counts them)."""
    widths = [graph.feat_dim] + [cfg.model.hidden] * (len(cfg.sampling.fanouts) - 1) + [graph.num_classes]
    return sum(2 * a * b + b for a, b in zip(widths[:-1], widths[1:]))


def buffer_bytes(cfg, part: Part, num_nodes: int, dim: int) -> tuple[int, int]:
    """(memory, checkpoint state) of the policy's buffer for ``part``: built for real with the
    part's halo size (up to 8192 halo nodes spread over the graph's IDs; beyond, scaled linearly
    from 4096 and 8192, its arrays being per slot and per halo node)."""
    policy = make_policy(cfg)
    if policy.buffer_class is None or not part.halo:
        return 0, 0
    settings = BufferSettings.of(cfg.buffer)

    def build(halo: int) -> tuple[int, int]:
        # parts of the same sizes build the same buffer (a plan from published statistics has
        # equal parts, and asks for each part's memory and its checkpoint): built once
        key = (policy.buffer_class, repr(settings), part.owned, num_nodes, dim, halo)
        if key not in _BUILT:
            ids = np.linspace(part.owned, num_nodes - 1, halo).astype(np.int64)
            fake = types.SimpleNamespace(halo_nodes=ids, halo_in_degree=np.ones(halo, np.int64), node_start=0,
                                         node_end=part.owned)
            buffer = policy.buffer_class.build(settings, fake, num_nodes, dim, np.random.default_rng(0))
            _BUILT[key] = array_bytes(buffer), array_bytes(buffer.state_dict())
        return _BUILT[key]

    if part.halo <= 8192:
        return build(part.halo)
    (m1, s1), (m2, s2) = build(4096), build(8192)
    scale = (part.halo - 4096) / 4096
    return int(m1 + (m2 - m1) * scale), int(s1 + (s2 - s1) * scale)


_BUILT: dict[tuple, tuple[int, int]] = {}  # buffer_bytes's builds, by what they depend on


def distinct(draws: float, population: int) -> float:
    """Expected distinct values among ``draws`` uniform draws from ``population``."""
    return population * -math.expm1(-draws / population) if population else 0.0


@dataclass
class Minibatches:
    """A trainer's minibatches in an epoch: sampled by the simulator, or estimated."""
    steps: int
    batch: int
    input_nodes: float  # mean a minibatch
    sampled_edges: float
    remote_rows: float  # remote feature rows fetched an epoch (misses and refills; all remote inputs without a buffer)
    rows_off_node: float  # of them, read by RMA (not from a same-node peer)
    sampled: bool


def estimated_minibatches(graph: GraphShape, part: Part, cfg, steps: int, batch: int, trainers_per_node: int) -> Minibatches:
    """No sampling: each layer draws min(fanout, mean in-degree) in-neighbours of every node of
    its frontier, uniformly over the graph; a share ``edge_cut`` of a hop's draws leaves the part,
    so an input L hops out is remote with probability 1 - (1 - cut)^L. No buffer's hits counted
    (an upper bound for the buffer policies)."""
    degree = graph.num_edges / graph.num_nodes
    frontier, inputs, edges, remote = float(batch), float(batch), 0.0, 0.0
    cut = graph.edge_cut if graph.edge_cut is not None else 0.0
    for hop, fanout in enumerate(reversed(cfg.sampling.fanouts), start=1):
        draws = frontier * (degree if fanout < 0 else min(fanout, degree))
        edges += draws
        grown = distinct(inputs + draws, graph.num_nodes)
        new = max(0.0, grown - inputs)
        remote += new * (1 - (1 - cut) ** hop)
        frontier, inputs = new, grown
    off_node = 1 - (trainers_per_node - 1) / max(1, len(graph.parts) - 1)
    return Minibatches(steps, batch, inputs, edges, remote * steps, remote * steps * off_node, False)


def sampled_minibatches(cfg, sim_result: dict, part_id: int) -> Minibatches:
    """The simulator's counts for one trainer, epoch 1 (the second: the buffer past its fill)."""
    sampled = sim_result["sampled"][part_id]
    cols = next(iter(sim_result["policies"].values()))[part_id]
    epoch = sampled.epoch == sampled.epoch.max()
    rows = sampled.input_remote[epoch] - cols["hits"][epoch] + cols["refills"][epoch]
    return Minibatches(int(epoch.sum()), sim_result["batch_size"], float(sampled.input_nodes[epoch].mean()),
                       float(sampled.edges[epoch].mean()), float(rows.sum()), float(cols["rows_rma"][epoch].sum()), True)


def neighbourhood(graph: GraphShape, part: Part, cfg, sampled: bool = False) -> tuple[float, float]:
    """(nodes, in-edges) of an evaluation minibatch's L-hop in-neighbourhood (every neighbour, or
    with ``sampled`` the training fanouts), ``eval_batch_size`` of the part's scored nodes, its
    neighbours drawn uniformly over the graph as estimated_minibatches draws them."""
    degree = graph.num_edges / graph.num_nodes
    frontier = inputs = float(min(part.val + part.test, cfg.training.eval_batch_size))
    edges = 0.0
    for fanout in reversed(cfg.sampling.fanouts):
        draws = frontier * (degree if not sampled or fanout < 0 else min(fanout, degree))
        edges += draws
        grown = distinct(inputs + draws, graph.num_nodes)
        frontier, inputs = max(0.0, grown - inputs), grown
    return inputs, edges


def khop_reads_less(graph: GraphShape, cfg) -> bool:
    """``auto``'s choice as the trainers make it (rudder.train.evaluation, ``_khop_reads_less``), from
    the estimated neighbourhoods: over all parts, the feature bytes ``khop`` reads from other parts
    against ``layerwise``'s (the halo's rows at each hidden layer's input, then the scored nodes'
    remote in-neighbours' last hidden rows)."""
    feature = graph.row_bytes
    hidden = [4 * cfg.model.hidden] * (len(cfg.sampling.fanouts) - 1)
    in_bytes = [feature] + hidden[:-1] + hidden[-1:]  # each layer's input row (the last: a hidden row)
    khop = layerwise = 0.0
    for part in graph.parts:
        remote = 1 - part.owned / graph.num_nodes
        nodes, _ = neighbourhood(graph, part, cfg)
        scored = float(part.val + part.test)
        batches = math.ceil(scored / cfg.training.eval_batch_size) if scored else 0
        # per minibatch, as the trainers count it: a neighbour two minibatches share counts twice
        batch = min(scored, cfg.training.eval_batch_size)
        first_hop = batches * distinct(batch * (1 + graph.num_edges / graph.num_nodes), graph.num_nodes)
        khop += batches * nodes * remote * feature
        layerwise += part.halo * sum(in_bytes[:-1]) + first_hop * remote * in_bytes[-1]
    return khop <= layerwise


def evaluation_bytes(graph: GraphShape, part: Part, cfg, inference: str | None = None) -> int:
    """What an evaluation holds at its high point above the training's (``inference``: the one
    ``auto`` takes, else decided here): see the module's docstring."""
    how = inference or cfg.training.eval_inference
    nodes, edges = neighbourhood(graph, part, cfg, sampled=how == "sampled")
    row, chunk = 4 * graph.feat_dim, min(EVAL_CHUNK_EDGES, edges) * EVAL_EDGE_BYTES  # the in-edges read at once
    if how == "auto":
        chosen = "khop" if khop_reads_less(graph, cfg) else "layerwise"
        return max(chunk + int(nodes * EVAL_NODE_BYTES), evaluation_bytes(graph, part, cfg, chosen))
    if how == "layerwise":  # the hidden layer's window and a batch of eval_batch_size own nodes
        batch = min(part.owned, cfg.training.eval_batch_size)
        batch_edges = part.in_edges * batch / max(part.owned, 1)
        # its sources: the whole part and its halo, or as many as a batch's in-edges reach
        rows = part.owned + part.halo if batch == part.owned else \
            max(batch, distinct(batch + batch_edges, part.owned + part.halo))
        return int(4 * part.owned * cfg.model.hidden + rows * (row + EVAL_NODE_BYTES) + 4 * batch_edges
                   + min(EVAL_CHUNK_EDGES, batch_edges) * EVAL_EDGE_BYTES)
    if how == "sampled":  # the sampler's minibatch, whole
        return int(nodes * (row + EVAL_NODE_BYTES) + edges * EVAL_EDGE_BYTES)
    return int(nodes * (row + EVAL_NODE_BYTES) + 4 * edges + chunk)  # khop: its rows and edges held, a chunk read


def memory(graph: GraphShape, part: Part, cfg, layout: Layout, mb: Minibatches, runtime: Runtime = RUNTIME) -> dict:
    """Bytes a trainer rank holds, by owner (``evaluation``: transient, after an epoch)."""
    dim, row = graph.feat_dim, graph.row_bytes
    topo = topology(cfg, graph)
    csr = 8 * (part.owned + 1 + part.in_edges) if topo == "distributed" else graph.csr_bytes // layout.trainers_per_node
    buffer, _ = buffer_bytes(cfg, part, graph.num_nodes, dim)
    in_flight = matrices_in_flight(cfg.sampling.prefetch_depth) * (mb.input_nodes * 4 * dim
                                                                   + mb.sampled_edges * BLOCK_EDGE_BYTES)
    return {"runtime": runtime.pss(layout.ranks_per_host), "model": 16 * model_params(graph, cfg),
            "graph": NODE_BYTES * part.owned + HALO_BYTES * part.halo + SEED_BYTES * part.train + csr,
            "features": part.owned * row, "buffer": buffer, "minibatches": int(in_flight),
            "evaluation": evaluation_bytes(graph, part, cfg)}


def startup_io(graph: GraphShape, part: Part, cfg, first_of_node: bool) -> dict:
    """Bytes a trainer rank reads from storage at start-up, by what it reads."""
    replicated = topology(cfg, graph) == "replicated"
    return {"checksum": part.file_bytes if cfg.data.verify_data else 0,
            "node arrays": NODE_FILE_BYTES * part.owned + HALO_FILE_BYTES * part.halo,
            "CSR": (graph.csr_bytes if first_of_node else 0) if replicated else 8 * (part.owned + 1 + part.in_edges),
            "features": part.owned * graph.row_bytes}


def checkpoint_bytes(graph: GraphShape, part: Part, cfg) -> dict:
    """Bytes a checkpoint writes: every trainer its buffer's state, trainer 0 the model and Adam's moments."""
    _, state = buffer_bytes(cfg, part, graph.num_nodes, graph.feat_dim)
    return {"a trainer": state, "trainer 0 adds": 12 * model_params(graph, cfg)}
