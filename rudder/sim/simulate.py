"""Trace-driven simulation of the buffer policies at any partition count: no MPI, no features.

Each partition of a partition directory is one simulated trainer (``--partition-mode trainer``).
It runs the same minibatch schedule, the same keyed neighbour sampler and the same
feature assembly (``rudder.prefetch.assembly``) with the same policy class as a trainer rank of ``drivers/train.py``; only
the transport differs: the graph's in-edge CSR is one in-memory array instead of RMA windows,
and feature rows are counted instead of read. So, for the same flags and seed, the per-minibatch
counts (input and remote nodes, hits, misses, refills, replacements, remote rows fetched) equal
a real run's exactly; ``--validate RUN`` re-simulates a run from its logs and compares them.

Agent policies (heuristic, classifier, llm) ask an in-process ``DecisionService`` (the agent's
own code) whose answer is applied ``--agent-latency`` minibatches after the request, as a real
run with the same ``--agent-latency`` does; a run without one applied answers whenever they
arrived, so ``--validate`` replays its replacements to check its buffer mechanics exactly.

Times are modelled, not measured (``rudder.sim.timing``, docs/simulator.md): per minibatch and
trainer the sampling, assembly and block CPU, the latency and calls of its reads and its off-node
bytes over links shared as the machine's are, then forward+backward; the pipeline overlaps the
next minibatch's preparation with this one's step (or not, at depth 0), and the trainers meet in
every step's allreduce. The epoch time is the median over the steady epochs (``rudder.logs.metrics``).

    python -m rudder.simulate --data PARTS [--policies none,static,fixed,lookahead,heuristic] [--epochs 3]
        [--batch-size B] [--fanouts 10,25] [--buffer-fraction 0.25] [--machine perlmutter-gpu] [--out FILE.json]
    python -m rudder.simulate --validate RUN
"""
from __future__ import annotations

import dataclasses
import multiprocessing
from dataclasses import dataclass

import numpy as np

from rudder.agent.deciders import make_decider
from rudder.agent.protocol import trainer_facts
from rudder.agent.service import DecisionService
from rudder.data.adjacency import resolve_topology
from rudder.data.feature_encoding import FeatureEncoding
from rudder.data.partition_store import halo_count
from rudder.logs import metrics
from rudder.prefetch.assembly import feature_source
from rudder.prefetch.buffers import BufferSettings
from rudder.prefetch.policies import POLICIES, PolicyContext, make_policy
from rudder.prefetch.vip import fill_ranking
from rudder.sampling.neighbors import NeighborSampler
from rudder.sampling.phases import RunPhases, phase_sampler_fanouts, phase_seeds
from rudder.sampling.schedule import minibatch_schedule
from rudder.sim import timing
from rudder.sim.machine import Machine, sage_flops
from rudder.sim.transport import CountedStore, Graph, MemoryLog, ModelledLink, SimulatedAdjacency
from rudder.train import options
from rudder.train.config import TrainConfig


@dataclass
class Sampled:
    """One trainer's whole run of minibatches, sampled once and replayed under every policy."""
    epoch: np.ndarray
    step: np.ndarray
    inputs: list  # input node IDs per minibatch (dropped once every policy has replayed them)
    input_nodes: np.ndarray
    input_remote: np.ndarray
    input_halo: np.ndarray
    sample_seconds: np.ndarray  # modelled Get calls of the CSR reads (their round trips and bytes: below)
    adjacency_rounds: np.ndarray
    adjacency_rows_remote: np.ndarray
    adjacency_bytes_remote: np.ndarray
    edges: np.ndarray  # sampled edges, all layers
    flops: np.ndarray  # GraphSAGE forward + backward


def run_phases(cfg: TrainConfig, graph: Graph) -> RunPhases:
    """The run's phases (their equal steps per epoch and batch sizes), as ``Trainer`` computes them."""
    seed = cfg.training.seed
    trains = [p.node_start + np.flatnonzero(p.train_mask) for p in graph.parts]
    return cfg.run_phases([max(phase_seeds(seed, i, t, s.seed_fraction).size for i, t in enumerate(trains))
                           for s in cfg.phase_settings()])


def steps_and_batch(cfg: TrainConfig, graph: Graph) -> tuple[int, int]:
    """The first phase's steps per epoch and batch size."""
    first = run_phases(cfg, graph).phases[0]
    return first.steps_per_epoch, first.batch_size


def sample_trainer(graph: Graph, cfg: TrainConfig, part: int, machine: Machine | None, widths: list[int]) -> Sampled:
    """One trainer's minibatches: their counts, reads priced by ``machine`` (``SimulatedReads``)."""
    p = graph.parts[part]
    phases = run_phases(cfg, graph)
    seed = cfg.training.seed
    adjacency = SimulatedAdjacency(graph, part, machine, 0,
                                   replicated=resolve_topology(cfg.data.topology, graph.meta) == "replicated")
    sampler = NeighborSampler(adjacency, cfg.sampling.fanouts, seed=[seed, part], fanouts_of=phase_sampler_fanouts(phases))
    halo = np.sort(p.halo_nodes)
    rows = []
    train = p.node_start + np.flatnonzero(p.train_mask)
    for epoch, step, seeds in minibatch_schedule(seed, part, train, lambda order: order, phases):
        rounds = adjacency.rounds
        mb = sampler.sample(seeds, key=(epoch, step))
        remote = mb.input_nodes[graph.meta.owner_of(mb.input_nodes) != part]
        flops = sage_flops(mb.layers, widths) if seeds.size else 0.0
        rows.append((epoch, step, mb.input_nodes, mb.input_nodes.size, remote.size,
                     halo_count(remote, halo), mb.stats.seconds_remote, adjacency.rounds - rounds,
                     mb.stats.rows_remote,
                     mb.stats.bytes_remote, sum(layer.src.size for layer in mb.layers), flops))
    cols = list(zip(*rows))
    return Sampled(np.array(cols[0]), np.array(cols[1]), list(cols[2]), *(np.array(c) for c in cols[3:]))


def facts_of(graph: Graph, cfg: TrainConfig, part: int, capacity: int, limits=None) -> dict:
    """What ``Trainer.facts`` holds for this partition's trainer (``limits``: its agent actions')."""
    phases = run_phases(cfg, graph)
    return trainer_facts(graph.meta, part, part, phases.phases[0].batch_size, phases.total, graph.parts[part].halo_nodes.size,
                         capacity, limits)


COLUMNS = ("rows_fetched", "rows_rma", "bytes_rma", "hits", "misses", "refills", "candidates", "replaced", "fetch_seconds",
           "fetch_rounds", "decisions_at")


def replay_policy(graph: Graph, cfg: TrainConfig, part: int, sampled: Sampled, machine: Machine | None,
                  row_bytes: int) -> dict:
    """One trainer's minibatches under ``cfg``'s policy: per-minibatch columns (``COLUMNS``) and
    the initial fill."""
    phases = run_phases(cfg, graph)
    steps = phases.phases[0].steps_per_epoch
    policy = make_policy(cfg)
    settings, p = BufferSettings.of(cfg.buffer), graph.parts[part]
    train = p.node_start + np.flatnonzero(p.train_mask)  # the trainer's seeds (--partition-mode trainer)
    ranking = fill_ranking(settings, policy, SimulatedAdjacency(graph, part, None, 0), train, train.size / steps,
                           cfg.sampling.fanouts)
    store = CountedStore(graph, part, machine, row_bytes, cfg.data.rma_gets)
    features = feature_source(store, policy, settings, p, graph.meta.num_nodes,
                              np.random.default_rng([cfg.training.seed, 2, part]), ranking=ranking)
    fill = features.fill()
    capacity = features.buffer.capacity if features.buffer is not None else 0
    service = DecisionService(make_decider(cfg), MemoryLog()) if policy.needs_agent else None
    facts = facts_of(graph, cfg, part, capacity, policy.action_limits(features.buffer))
    policy.start(PolicyContext(facts, MemoryLog(), part, phases,
                               lambda window, latency: ModelledLink(service, part, facts, window, latency,
                                                                   cfg.agent.transport == "collective")))
    out = {c: np.zeros(len(sampled.inputs), dtype=np.float64 if c == "fetch_seconds" else np.int64) for c in COLUMNS}
    window = policy.lookahead
    try:
        for i, nodes in enumerate(sampled.inputs):
            rounds = store.rounds
            _, a = features.assemble(nodes, sampled.inputs[i + 1:i + 1 + window] if window else [])
            f = a.fetch
            out["rows_fetched"][i] = f.rows_shared + f.rows_remote
            out["rows_rma"][i] = f.rows_remote
            out["bytes_rma"][i] = f.bytes_remote
            for c in ("hits", "misses", "refills", "candidates"):
                out[c][i] = getattr(a, c)
            out["replaced"][i] = a.replaced
            out["fetch_seconds"][i] = f.seconds_remote
            out["fetch_rounds"][i] = store.rounds - rounds
    finally:
        policy.close()
        if service is not None:
            service.decider.close()
    decisions = service.log.tables.get("decisions", []) if service is not None else []
    at = np.array([d["minibatch"] for d in decisions], dtype=np.int64)
    out["decisions_at"][:] = np.bincount(at[at < len(sampled.inputs)], minlength=len(sampled.inputs))
    return {**out, "fill_rows": fill.rows_shared + fill.rows_remote, "capacity": capacity, "decisions": len(decisions)}


_GRAPH: Graph | None = None  # set before the worker pool forks, so workers share it copy-on-write


def _simulate_trainer(job):
    cfg, policies, part, machine, widths, row_bytes = job
    sampled = sample_trainer(_GRAPH, cfg, part, machine, widths)
    per_policy = {name: replay_policy(_GRAPH, cfg.replace(**overrides), part, sampled, machine, row_bytes)
                  for name, overrides in policies.items()}
    sampled.inputs = []  # the parent needs the counts only
    return part, sampled, per_policy


def buffer_work(cfg: TrainConfig) -> str:
    """What a profile's ``buffer_cpu`` keys a run's buffer CPU by: its policy, then the settings
    that change that CPU (the policy's ``work_settings``), e.g. ``fixed buffer_fraction=0.25
    ... delta=8 refill_budget=1.0``."""
    flat = options.to_flat(cfg)
    settings = POLICIES[cfg.buffer.policy].work_settings
    return " ".join([cfg.buffer.policy] + [f"{name}={flat[name]}" for name in sorted(settings)])


def simulate(cfg: TrainConfig, policies: dict[str, dict], machine: Machine | None, feat_dim: int | None = None,
             workers: int = 1, graph: Graph | None = None, progress=None) -> dict:
    """Every trainer of ``cfg``'s data under each of ``policies`` ({label: flat option overrides}).
    Returns {"steps_per_epoch", "parts", "sampled": {part: Sampled}, "policies": {label: {part: columns}},
    "buffer_work": {label: its ``buffer_work``}}."""
    global _GRAPH
    _GRAPH = graph or Graph(cfg.data.path)
    meta = _GRAPH.meta
    dim = feat_dim or meta.feat_dim
    widths = [dim] + [cfg.model.hidden] * (len(cfg.sampling.fanouts) - 1) + [meta.num_classes]
    row_bytes = FeatureEncoding(meta.feature_dtype, dim).row_bytes  # rows move in their stored type
    jobs = [(cfg, policies, p, machine, widths, row_bytes) for p in range(meta.num_parts)]
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
    phases = run_phases(cfg, _GRAPH)
    steps, batch = phases.phases[0].steps_per_epoch, phases.phases[0].batch_size
    params = sum(2 * a * b + b for a, b in zip(widths[:-1], widths[1:]))
    return {"steps_per_epoch": steps, "batch_size": batch, "phases": phases.describe(), "epoch_phases": phases.index_of,
            "parts": meta.num_parts,
            "params": params, "feat_dim": dim,
            "sampled": {p: r[0] for p, r in sorted(results.items())},
            "policies": {label: {p: r[1][label] for p, r in sorted(results.items())} for label in policies},
            "buffer_work": {label: buffer_work(cfg.replace(**overrides)) for label, overrides in policies.items()}}


def summarize(result: dict, epochs: int, machine: Machine | None, depth: int = 1, waiting: str = "spin") -> dict:
    """Per policy: remote rows fetched per epoch (all trainers, over the timed epochs), the
    initial fill, hit %, decisions, and modelled epoch seconds without overlap and with the
    pipeline ``depth`` (at least 1), the threads waiting for MPI as ``waiting`` (spin, yield) says."""
    parts, steps = result["parts"], result["steps_per_epoch"]
    sampled = [result["sampled"][p] for p in range(parts)]
    epoch_of = sampled[0].epoch  # the same schedule shape on every trainer
    # one set of steady epochs for every figure, with and without overlap: the overlapped pipeline's
    reach = metrics.pipeline_reach(metrics.run_ahead(max(1, depth), 0), steps)
    timed = metrics.timed_epochs(list(range(epochs)), reach)
    if not timed:
        raise options.ConfigError(f"--epochs {epochs}: {metrics.too_short(list(range(epochs)), reach)}")
    later = np.isin(epoch_of, timed)
    sync = timing.allreduce_seconds(result["params"], parts, machine) if machine else 0.0
    out = {}
    for label, per_part in result["policies"].items():
        fetched = [per_part[p] for p in range(parts)]
        cols = {c: np.stack([f[c] for f in fetched]) for c in COLUMNS}
        rows = {"input_remote": np.stack([s.input_remote for s in sampled]), "hits": cols["hits"], "refills": cols["refills"]}
        row = {"rows_per_epoch": float(metrics.remote_rows_fetched(rows)[:, later].sum() / len(timed)),
               "rows_off_node_per_epoch": float(cols["rows_rma"][:, later].sum() / len(timed)),
               "fill_rows": int(sum(f["fill_rows"] for f in fetched)),
               "hit_percent": metrics.hit_percent(int(cols["hits"].sum()), int(cols["misses"].sum())),
               "replacements": int(cols["replaced"].sum()), "decisions": int(sum(f["decisions"] for f in fetched))}
        if machine is not None:
            serial, overlapped = (timing.modelled_epoch(machine, sampled, fetched, result["feat_dim"], d, sync, epoch_of,
                                                        epochs, waiting=waiting, buffer_work=result["buffer_work"][label],
                                                        phases=result["epoch_phases"], reach=reach)
                                   for d in (0, max(1, depth)))
            row["epoch_seconds"] = serial["seconds"]
            row["epoch_seconds_overlap"] = overlapped["seconds"]
            row["comm_share"] = serial["comm_share"]
        out[label] = row
    return {"parts": parts, "steps_per_epoch": steps, "batch_size": result["batch_size"], "phases": result["phases"],
            "feat_dim": result["feat_dim"],
            "epochs_counted": metrics.steady_text(list(range(epochs)), reach), "allreduce_seconds": sync,
            "machine": dataclasses.asdict(machine) if machine else None, "mpi_wait": waiting, "policies": out}


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
        line = (f"{label:<12} {r['rows_per_epoch']:>12,.0f} {ratio(r['rows_per_epoch'], none, 'rows_per_epoch'):>7} "
                f"{ratio(r['rows_per_epoch'], fixed, 'rows_per_epoch'):>8} {r['hit_percent']:>7.1f} {r['replacements']:>9}")
        if timed:
            line += (f" {r['epoch_seconds']:>9.4f} {ratio(r['epoch_seconds'], none, 'epoch_seconds'):>7} "
                     f"{r['epoch_seconds_overlap']:>10.4f} {ratio(r['epoch_seconds_overlap'], none, 'epoch_seconds_overlap'):>7}")
        lines.append(line)
    return "\n".join(lines)


def ratio(value: float, base: dict | None, key: str) -> str:
    return f"{value / base[key]:.3f}" if base and base.get(key) else "-"
