"""Trace-driven simulation of the buffer policies at any partition count: no MPI, no features.

Each partition of a partition directory is one simulated trainer (``--partition-mode trainer``).
It runs the same minibatch schedule, the same keyed neighbour sampler and the same
``FeatureAssembler`` with the same policy class as a trainer rank of ``drivers/train.py``; only
the transport differs: the graph's in-edge CSR is one in-memory array instead of RMA windows,
and feature rows are counted instead of read. So, for the same flags and seed, the per-minibatch
counts (input and remote nodes, hits, misses, refills, replacements, remote rows fetched) equal
a real run's exactly; ``--validate RUN`` re-simulates a run from its logs and compares them.

Agent policies (heuristic, classifier, llm) ask an in-process ``DecisionService`` (the agent's
own code) whose answer reaches the trainer ``--agent-latency`` minibatches later, where a real
agent's answer arrives after a wall-clock delay; to check the buffer mechanics of such a run
exactly, ``--validate`` replays its replacements.

Times are modelled, not measured (``docs/simulator.md``); per minibatch and trainer:
  comm    = alpha x (owners read off-node) + bytes off-node / beta + bytes on-node / beta_node,
            for the sampler's CSR reads and for the feature fetch (misses and refills);
  compute = GraphSAGE forward+backward flops / rate + a fixed cost per step;
a step takes the slowest trainer's comm + compute (``no overlap``), or its max(comm, compute)
(``overlap``: the pipeline prepares the next minibatch during this one's compute), plus a ring
allreduce of the gradients; an epoch is the sum of its steps.

    python -m rudder.simulate --data PARTS [--policies none,static,fixed,lookahead,heuristic] [--epochs 3]
        [--batch-size B] [--fanouts 10,25] [--buffer-fraction 0.25] [--machine perlmutter-gpu] [--out FILE.json]
    python -m rudder.simulate --validate RUN
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from rudder.agent import DecisionLink, DecisionService, make_decider, trainer_facts
from rudder.analyze import AnalysisError
from rudder.assembly import FeatureAssembler
from rudder.buffer import BufferSettings
from rudder.config import ConfigError, TrainConfig
from rudder.dist_array import ReadStats
from rudder.partition_store import PartitionFormatError, PartitionMeta, global_csr, read_partition
from rudder.policies import POLICIES, make_policy
from rudder.sampler import NeighborSampler, minibatch_schedule

@dataclass
class SimConfig(TrainConfig):
    """A run's config (``drivers/train.py``'s flags) plus what only the simulator has."""
    agent_latency: int = 1  # minibatches between an agent request and the trainer finding its answer


# -- the machine model ---------------------------------------------------------------------------


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


# -- the simulated transport ---------------------------------------------------------------------


class Graph:
    """Every partition's CSR in one process, and what a trainer needs of its own partition."""

    def __init__(self, data: str):
        self.meta = PartitionMeta.load(data)
        self.offsets = np.asarray(self.meta.offsets, dtype=np.int64)
        self.parts = [read_partition(data, p, self.meta) for p in range(self.meta.num_parts)]
        self.indptr, self.indices = global_csr(self.parts)


class SimulatedReads:
    """Counts reads as a trainer of partition ``part`` would do them, and prices them with the
    machine model: rows of the trainer's own partition are local, of a partition on the same
    node shared, of any other remote (one Get per owner)."""

    def __init__(self, graph: Graph, part: int, machine: Machine | None, row_bytes: int):
        self.graph, self.part, self.machine, self.row_bytes = graph, part, machine, row_bytes
        per_node = machine.ranks_per_node if machine else 1
        self.node_of = np.arange(graph.meta.num_parts) // per_node

    def count(self, owners: np.ndarray, row_bytes: int) -> ReadStats:
        other = owners != self.part
        same_node = other & (self.node_of[owners] == self.node_of[self.part])
        off = other & ~same_node
        s = ReadStats(rows_local=int((~other).sum()), rows_shared=int(same_node.sum()), rows_remote=int(off.sum()))
        s.bytes_remote = s.rows_remote * row_bytes
        s.owners_touched = int(np.unique(owners[off]).size)
        if self.machine is not None:
            m = self.machine
            s.seconds_remote = s.owners_touched * m.latency + s.bytes_remote / m.bandwidth + s.rows_shared * row_bytes / m.node_bandwidth
        return s


class SimulatedAdjacency(SimulatedReads):
    """``rudder.sampler.Adjacency`` over the in-memory CSR: the same degrees and neighbours."""

    def rows(self, gids: np.ndarray, stats: ReadStats):
        owners = self.graph.meta.owner_of(gids)
        start = self.graph.indptr[gids]
        stats.add(self.count(np.concatenate([owners, owners]), 8))  # indptr[g] and indptr[g + 1]
        return owners, start, self.graph.indptr[gids + 1] - start

    def neighbours(self, parts: np.ndarray, positions: np.ndarray, stats: ReadStats) -> np.ndarray:
        stats.add(self.count(parts, 8))
        return self.graph.indices[positions]


class CountedStore(SimulatedReads):
    """``rudder.feature_store.FeatureStore`` with rows of width 0: what a gather would read."""
    dim = 0

    def gather(self, ids: np.ndarray, out: np.ndarray | None = None, at: np.ndarray | None = None, spare: bool = False):
        ids = np.asarray(ids, dtype=np.int64)
        rows = out if out is not None else np.empty((ids.size, 0), np.float32)
        return rows, self.count(self.graph.meta.owner_of(ids), self.row_bytes)


class MemoryLog:
    """The rows a policy or the decision service would log, kept in memory."""

    def __init__(self):
        self.tables: dict[str, list] = {}

    def append(self, name: str, row) -> None:
        self.tables.setdefault(name, []).append(row)

    def append_ragged(self, name: str, values: np.ndarray) -> None:
        self.append(name, values)

    def maybe_flush(self) -> None:
        pass


class ModelledLink(DecisionLink):
    """A trainer's agent link answered in-process: the answer to a request sent after minibatch
    c is found by the trainer's poll on minibatch c + latency."""

    def __init__(self, service: DecisionService, trainer: int, facts: dict, window: int, latency: int):
        super().__init__(window)
        self.service, self.trainer, self.latency = service, trainer, latency
        service.hello(trainer, facts)

    def _post(self, request: dict) -> None:
        self.outstanding = [self.latency, self.service.answer(self.trainer, request)]

    def poll(self) -> np.ndarray | None:
        if self.outstanding is None:
            return None
        self.outstanding[0] -= 1
        if self.outstanding[0] > 0:
            return None
        answer, self.outstanding = self.outstanding[1], None
        return answer


# -- one simulated trainer -----------------------------------------------------------------------


@dataclass
class Sampled:
    """One trainer's whole run of minibatches, sampled once and replayed under every policy."""
    epoch: np.ndarray
    step: np.ndarray
    inputs: list  # input node IDs per minibatch (dropped once every policy has replayed them)
    input_nodes: np.ndarray
    input_remote: np.ndarray
    input_halo: np.ndarray
    sample_seconds: np.ndarray  # modelled CSR reads
    adjacency_rows_remote: np.ndarray
    compute_seconds: np.ndarray  # modelled forward + backward


def steps_and_batch(cfg: TrainConfig, graph: Graph) -> tuple[int, int]:
    """The run's equal steps per epoch and batch size, as ``Trainer`` computes them."""
    batch, steps = cfg.minibatch_shape(max(int(p.train_mask.sum()) for p in graph.parts))
    return steps, batch


def sample_trainer(graph: Graph, cfg: TrainConfig, part: int, machine: Machine | None, widths: list[int]) -> Sampled:
    p = graph.parts[part]
    steps, _ = steps_and_batch(cfg, graph)
    sampler = NeighborSampler(SimulatedAdjacency(graph, part, machine, 0), cfg.fanouts, seed=[cfg.seed, part])
    halo = np.sort(p.halo_nodes)
    rows = []
    train = p.node_start + np.flatnonzero(p.train_mask)
    for epoch, step, seeds in minibatch_schedule(cfg.seed, part, train, lambda order: order, steps, cfg.epochs):
        mb = sampler.sample(seeds, key=(epoch, step))
        remote = mb.input_nodes[graph.meta.owner_of(mb.input_nodes) != part]
        flops = sage_flops(mb.layers, widths) if seeds.size else 0.0
        rows.append((epoch, step, mb.input_nodes, mb.input_nodes.size, remote.size, int(np.isin(remote, halo, assume_unique=True).sum()),
                     mb.stats.seconds_remote, mb.stats.rows_remote,
                     (flops / machine.flops + machine.step_overhead) if machine else 0.0))
    cols = list(zip(*rows))
    return Sampled(np.array(cols[0]), np.array(cols[1]), list(cols[2]), *(np.array(c) for c in cols[3:]))


def facts_of(graph: Graph, cfg: TrainConfig, part: int, capacity: int) -> dict:
    """What ``Trainer.facts`` holds for this partition's trainer."""
    steps, batch = steps_and_batch(cfg, graph)
    return trainer_facts(graph.meta, part, part, batch, steps * cfg.epochs, graph.parts[part].halo_nodes.size, capacity)


COLUMNS = ("rows_fetched", "rows_rma", "hits", "misses", "refills", "candidates", "replaced", "fetch_seconds")


def replay_policy(graph: Graph, cfg: SimConfig, part: int, sampled: Sampled, machine: Machine | None,
                  row_bytes: int) -> dict:
    """One trainer's minibatches under ``cfg.policy``: per-minibatch columns (``COLUMNS``) and
    the initial fill."""
    p = graph.parts[part]
    steps, _ = steps_and_batch(cfg, graph)
    policy = make_policy(cfg)
    settings = BufferSettings(cfg.buffer_fraction, cfg.buffer_init, cfg.alpha, cfg.delta, cfg.compat == "massivegnn",
                              cfg.buffer_scope)
    store = CountedStore(graph, part, machine, row_bytes)
    assembler = FeatureAssembler(store, policy, settings, p, graph.meta.num_nodes,
                                 np.random.default_rng([cfg.seed, 2, part]))
    fill = assembler.fill()
    capacity = assembler.buffer.capacity if assembler.buffer is not None else 0
    log, service = MemoryLog(), None
    if policy.needs_agent:
        service = DecisionService(make_decider(cfg), MemoryLog())
    facts = facts_of(graph, cfg, part, capacity)
    trainer = SimpleNamespace(cfg=cfg, facts=facts, log=log, steps_per_epoch=steps,
                              layout=SimpleNamespace(trainer_rank=part, partition_id=part),
                              connect_agent=lambda window: ModelledLink(service, part, facts, window, cfg.agent_latency))
    policy.start(trainer)
    out = {c: np.zeros(len(sampled.inputs), dtype=np.float64 if c == "fetch_seconds" else np.int64) for c in COLUMNS}
    window = policy.lookahead
    try:
        for i, nodes in enumerate(sampled.inputs):
            _, a = assembler.assemble(nodes, sampled.inputs[i + 1:i + 1 + window] if window else [])
            f = a.fetch
            out["rows_fetched"][i] = f.rows_shared + f.rows_remote
            out["rows_rma"][i] = f.rows_remote
            for c in ("hits", "misses", "refills", "candidates"):
                out[c][i] = getattr(a, c)
            out["replaced"][i] = a.replaced
            out["fetch_seconds"][i] = f.seconds_remote
    finally:
        policy.close()
        if service is not None:
            service.decider.close()
    decisions = service.log.tables.get("decisions", []) if service is not None else []
    return {**out, "fill_rows": fill.rows_shared + fill.rows_remote, "capacity": capacity, "decisions": len(decisions)}


# -- the whole simulation ------------------------------------------------------------------------

_GRAPH: Graph | None = None  # set before the worker pool forks, so workers share it copy-on-write


def _simulate_trainer(job):
    cfg, policies, part, machine, widths, row_bytes = job
    sampled = sample_trainer(_GRAPH, cfg, part, machine, widths)
    per_policy = {name: replay_policy(_GRAPH, dataclasses.replace(cfg, **overrides), part, sampled, machine, row_bytes)
                  for name, overrides in policies.items()}
    sampled.inputs = []  # the parent needs the counts only
    return part, sampled, per_policy


def simulate(cfg: TrainConfig, policies: dict[str, dict], machine: Machine | None, feat_dim: int | None = None,
             workers: int = 1, graph: Graph | None = None, progress=None) -> dict:
    """Every trainer of ``cfg.data`` under each of ``policies`` ({label: TrainConfig overrides}).
    Returns {"steps_per_epoch", "parts", "sampled": {part: Sampled}, "policies": {label: {part: columns}}}."""
    global _GRAPH
    _GRAPH = graph or Graph(cfg.data)
    meta = _GRAPH.meta
    dim = feat_dim or meta.feat_dim
    widths = [dim] + [cfg.hidden] * (len(cfg.fanouts) - 1) + [meta.num_classes]
    jobs = [(cfg, policies, p, machine, widths, 4 * dim) for p in range(meta.num_parts)]
    results = {}
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
            for part, sampled, per_policy in pool.imap_unordered(_simulate_trainer, jobs):
                results[part] = (sampled, per_policy)
                if progress:
                    progress(len(results), len(jobs))
    else:
        for job in jobs:
            part, sampled, per_policy = _simulate_trainer(job)
            results[part] = (sampled, per_policy)
            if progress:
                progress(len(results), len(jobs))
    steps, batch = steps_and_batch(cfg, _GRAPH)
    params = sum(2 * a * b + b for a, b in zip(widths[:-1], widths[1:]))
    return {"steps_per_epoch": steps, "batch_size": batch, "parts": meta.num_parts, "params": params, "feat_dim": dim,
            "sampled": {p: r[0] for p, r in sorted(results.items())},
            "policies": {label: {p: r[1][label] for p, r in sorted(results.items())} for label in policies}}


def summarize(result: dict, epochs: int, machine: Machine | None) -> dict:
    """Per policy: remote rows per epoch (summed over trainers, mean of epochs 2..E, or epoch 1
    alone), the initial fill, hit %, decisions, and modelled epoch seconds with and without overlap."""
    parts, steps = result["parts"], result["steps_per_epoch"]
    sampled = result["sampled"]
    later = sampled[0].epoch >= (1 if epochs > 1 else 0)  # the same schedule shape on every trainer
    n_epochs = max(1, epochs - 1) if epochs > 1 else 1
    sample_t = np.stack([sampled[p].sample_seconds for p in range(parts)])
    compute_t = np.stack([sampled[p].compute_seconds for p in range(parts)])
    allreduce = allreduce_seconds(result["params"], parts, machine) if machine else 0.0
    out = {}
    for label, per_part in result["policies"].items():
        cols = {c: np.stack([per_part[p][c] for p in range(parts)]) for c in COLUMNS}
        looked = cols["hits"].sum() + cols["misses"].sum()
        row = {"rows_per_epoch": float(cols["rows_fetched"][:, later].sum() / n_epochs),
               "rows_off_node_per_epoch": float(cols["rows_rma"][:, later].sum() / n_epochs),
               "fill_rows": int(sum(per_part[p]["fill_rows"] for p in range(parts))),
               "hit_percent": float(100 * cols["hits"].sum() / looked) if looked else 0.0,
               "replacements": int(cols["replaced"].sum()), "decisions": int(sum(per_part[p]["decisions"] for p in range(parts)))}
        if machine is not None:
            comm = sample_t + cols["fetch_seconds"]
            serial = (comm + compute_t).max(axis=0) + allreduce
            overlap = np.maximum(comm, compute_t).max(axis=0) + allreduce
            row["epoch_seconds"] = float(serial[later].sum() / n_epochs)
            row["epoch_seconds_overlap"] = float(overlap[later].sum() / n_epochs)
            row["comm_share"] = float((comm.max(axis=0)[later]).sum() / max(1e-12, serial[later].sum()))
        out[label] = row
    return {"parts": parts, "steps_per_epoch": steps, "batch_size": result["batch_size"], "feat_dim": result["feat_dim"],
            "epochs_counted": "2.." + str(epochs) if epochs > 1 else "1", "allreduce_seconds": allreduce,
            "machine": dataclasses.asdict(machine) if machine else None, "policies": out}


def table(summary: dict) -> str:
    """Rows and modelled times per policy; time ratios to none in the same mode (with or without overlap)."""
    pol = summary["policies"]
    none = pol.get("none")
    fixed = pol.get("fixed")
    timed = any("epoch_seconds" in r for r in pol.values())
    head = f"{'policy':<12} {'rows/epoch':>12} {'x none':>7} {'x fixed':>8} {'hits %':>7} {'replaced':>9}"
    if timed:
        head += f" {'epoch s':>9} {'x none':>7} {'overlap s':>10} {'x none':>7}"
    lines = [head]
    for label, r in pol.items():
        line = (f"{label:<12} {r['rows_per_epoch']:>12,.0f} {_ratio(r['rows_per_epoch'], none, 'rows_per_epoch'):>7} "
                f"{_ratio(r['rows_per_epoch'], fixed, 'rows_per_epoch'):>8} {r['hit_percent']:>7.1f} {r['replacements']:>9}")
        if timed:
            line += (f" {r['epoch_seconds']:>9.4f} {_ratio(r['epoch_seconds'], none, 'epoch_seconds'):>7} "
                     f"{r['epoch_seconds_overlap']:>10.4f} {_ratio(r['epoch_seconds_overlap'], none, 'epoch_seconds_overlap'):>7}")
        lines.append(line)
    return "\n".join(lines)


def _ratio(value: float, base: dict | None, key: str) -> str:
    return f"{value / base[key]:.3f}" if base and base.get(key) else "-"


# -- validation against a real run ---------------------------------------------------------------

COMPARED = ("input_nodes", "input_remote", "input_halo", "hits", "misses", "refills", "replaced", "candidates")


def validate(run_dir: str, workers: int = 1) -> tuple[int, list[str]]:
    """Re-simulate a run of drivers/train.py from its logs; (minibatches compared, mismatches)."""
    from rudder.analyze import load_run

    run = load_run(run_dir)
    cfg = SimConfig(**run.config)
    if cfg.partition_mode != "trainer" or cfg.buffer_sharing != "trainer":
        raise ConfigError(f"--validate {run_dir}: simulates --partition-mode trainer runs only (this one: {cfg.partition_mode})")
    overrides = {}
    if POLICIES[cfg.policy].needs_agent:  # its decisions arrived at wall-clock times: replay them
        overrides = {"policy": "replay", "replay": run_dir, "classifier_model": "", "collect_traces": False}
    if cfg.collect_traces:
        overrides["collect_traces"] = False
    result = simulate(cfg, {cfg.policy: overrides}, None, workers=workers)
    per_part = result["policies"][cfg.policy]
    compared, bad = 0, []
    for r in run.ranks:
        part = r.layout["partition_id"]
        mb, sim, s = r.minibatches, per_part[part], result["sampled"][part]
        n = len(mb)
        if n > s.epoch.size:
            bad.append(f"trainer {part}: {n} minibatches logged, {s.epoch.size} simulated")
            continue
        ours = {"input_nodes": s.input_nodes[:n], "input_remote": s.input_remote[:n],
                "input_halo": s.input_halo[:n], **{c: sim[c][:n] for c in ("hits", "misses", "refills", "replaced", "candidates")}}
        theirs = {c: mb[c] for c in COMPARED}
        ours["rows_fetched"], theirs["rows_fetched"] = sim["rows_fetched"][:n], mb["rows_shared"] + mb["rows_rma"]
        for c in (*COMPARED, "rows_fetched"):
            diff = np.flatnonzero(np.asarray(ours[c]) != np.asarray(theirs[c]))
            if diff.size:
                i = diff[0]
                bad.append(f"trainer {part} epoch {mb['epoch'][i]} step {mb['step'][i]}: {c} {theirs[c][i]} logged, "
                           f"{ours[c][i]} simulated ({diff.size} minibatches differ)")
        compared += n
    return compared, bad


# -- command line --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rudder.simulate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="partition directory (python -m partitioning); one simulated trainer per partition")
    ap.add_argument("--validate", metavar="RUN", help="re-simulate a drivers/train.py run and compare its logs")
    ap.add_argument("--policies", default="none,static,fixed,lookahead,heuristic",
                    help="comma-separated policies (--policy of train.py); LABEL=POLICY:FLAG=V:... sets per-policy flags")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=0)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--buffer-fraction", type=float, default=0.25)
    ap.add_argument("--buffer-init", default="degree")
    ap.add_argument("--buffer-scope", default="halo")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--delta", type=int, default=25)
    ap.add_argument("--compat", default="none")
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--agent-window", type=int, default=1)
    ap.add_argument("--agent-latency", type=int, default=1, help="minibatches from an agent request to its answer")
    ap.add_argument("--classifier-model", default="")
    ap.add_argument("--machine", default="perlmutter-gpu", choices=[*MACHINES, "none"],
                    help="the time model (docs/simulator.md); none: rows only")
    ap.add_argument("--ranks-per-node", type=int, default=0, help="trainers per node (default: the machine's)")
    ap.add_argument("--feat-dim", type=int, default=0, help="feature width for bytes and flops (default: the data's)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", help="write the summary as JSON here")
    return ap


def parse_policies(text: str, base: SimConfig) -> dict[str, dict]:
    """"none,fixed,f1=fixed:delta=1" -> {label: TrainConfig overrides}."""
    fields = {f.name: f.type for f in dataclasses.fields(SimConfig)}
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        label, _, spec = item.partition("=") if "=" in item.split(":")[0] else (item.split(":")[0], "", item)
        name, *flags = spec.split(":")
        if name not in POLICIES:
            raise ConfigError(f"--policies {item!r}: {name!r} is not one of {', '.join(POLICIES)}")
        overrides = {"policy": name}
        for flag in flags:
            key, _, value = flag.partition("=")
            key = key.replace("-", "_")
            if key not in fields or not value:
                raise ConfigError(f"--policies {item!r}: {flag!r} is not FLAG=VALUE with a train.py flag")
            current = getattr(base, key)
            overrides[key] = type(current)(value) if not isinstance(current, list) else [int(v) for v in value.split("/")]
        out[label] = overrides
    if not out:
        raise ConfigError("--policies: expected at least one policy")
    return out


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        if a.validate:
            t = time.time()
            compared, bad = validate(a.validate, a.workers)
            for line in bad[:20]:
                print(line)
            verdict = "MISMATCH" if bad else "match"
            print(f"{a.validate}: {compared} minibatches compared, {verdict} ({time.time() - t:.1f} s)")
            return 1 if bad else 0
        if not a.data:
            raise ConfigError("--data: expected a partition directory (or --validate RUN)")
        fanouts = [int(x) for x in a.fanouts.split(",")]
        base = SimConfig(data=os.path.abspath(a.data), run_dir="(simulated)", epochs=a.epochs, batch_size=a.batch_size,
                         fanouts=fanouts, hidden=a.hidden, seed=a.seed, buffer_fraction=a.buffer_fraction,
                         buffer_init=a.buffer_init, buffer_scope=a.buffer_scope, alpha=a.alpha, delta=a.delta,
                         compat=a.compat, lookahead=a.lookahead, agent_window=a.agent_window, agent_latency=a.agent_latency)
        policies = parse_policies(a.policies, base)
        for overrides in policies.values():  # each policy's flags checked as train.py checks them
            if overrides["policy"] == "classifier":
                overrides["classifier_model"] = a.classifier_model
            TrainConfig(**{k: v for k, v in dataclasses.asdict(dataclasses.replace(base, **overrides)).items()
                           if k != "agent_latency"}).check()
        if a.agent_latency < 1:
            raise ConfigError(f"--agent-latency {a.agent_latency}: expected a positive number of minibatches")
        machine = None if a.machine == "none" else MACHINES[a.machine]
        if machine is not None and a.ranks_per_node:
            machine = dataclasses.replace(machine, ranks_per_node=a.ranks_per_node)
        t = time.time()
        graph = Graph(base.data)
        print(f"{graph.meta.dataset}: {graph.meta.num_nodes:,} nodes, {graph.meta.num_edges:,} edges, "
              f"{graph.meta.num_parts} partitions (read in {time.time() - t:.1f} s); {a.epochs} epochs; "
              f"policies {', '.join(policies)}; machine {a.machine}", flush=True)

        def progress(done, total):
            if done == total or done % max(1, total // 10) == 0:
                print(f"  {done}/{total} trainers simulated ({time.time() - t:.0f} s)", flush=True)

        result = simulate(base, policies, machine, a.feat_dim or None, a.workers, graph, progress)
        summary = summarize(result, a.epochs, machine)
        summary.update(data=base.data, dataset=graph.meta.dataset, config=json.loads(base.to_json()),
                       seconds=time.time() - t)
        print(f"{summary['parts']} trainers, {summary['steps_per_epoch']} steps/epoch of {summary['batch_size']} seeds; "
              f"rows = remote feature rows fetched per epoch, all trainers, epochs {summary['epochs_counted']}")
        print(table(summary))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(summary, f, indent=1)
        return 0
    except (ConfigError, PartitionFormatError, AnalysisError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
