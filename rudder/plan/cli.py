"""``python -m rudder.plan``: a run's costs a trainer rank, before an allocation is spent.

    python -m rudder.plan --data PARTS [--trainers-per-node 4] [--policy P] [--buffer-fraction F]
        [--batch-size B] [--fanouts 10,25] [--no-sample] [--json]
    python -m rudder.plan --like products|papers100M --ranks 256 [--trainers-per-node 4] [--edge-cut C] ...

With no MPI (torch only where the simulator copies a buffer's rows): per trainer rank, its memory
(PSS) by owner, its start-up reads from storage, the remote feature rows and bytes it fetches an
epoch (the simulator's counts where it can sample the graph: ``--data``; an estimate from published
statistics: ``--like``), a checkpoint's bytes, and the job script line that launches it
(jobscripts/, rudder.train.launch). ``--ranks`` counts trainer ranks (one partition each); the agent
ranks of an agent policy come on top, one a node. Where the figures come from: rudder.plan.estimate;
docs/cluster.md."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from rudder.data.partition_store import PartitionFormatError
from rudder.plan import estimate
from rudder.plan.graphs import LIKE, GraphShape, from_partitions, from_statistics
from rudder.prefetch.policies import POLICIES
from rudder.sim.simulate import simulate
from rudder.train import options
from rudder.train.config import ConfigError, TrainConfig
from rudder.train.launch import launch_plan

SECTIONS = ("model", "sampling", "training", "buffer", "agent", "data")
SKIP = ("data", "eval_every", "collect_traces", "replay", "agent_delay", "agent_cores",
        "agent_windows_in_flight", "epochs")
# The job script for a device (jobscripts/): it sets --device itself, so the flag is not repeated
JOB_SCRIPTS = {"cpu": "jobscripts/cpu.sbatch", "cuda": "jobscripts/gpu.sbatch"}
MB = 1 << 20


def parser() -> argparse.ArgumentParser:
    ap = options.Parser(prog="python -m rudder.plan", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="PARTS", help="partition directory (python -m partitioning)")
    source.add_argument("--like", choices=sorted(LIKE), help="a dataset's published statistics, split evenly")
    ap.add_argument("--ranks", type=int, default=0, help="trainer ranks (default with --data: its partitions)")
    ap.add_argument("--trainers-per-node", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=0,
                    help="ranks sharing a host's library pages (default: a node's tasks, trainers and agent)")
    ap.add_argument("--edge-cut", type=float, default=None,
                    help="with --like: the share of in-edges crossing parts (default: the dataset's assumed one)")
    ap.add_argument("--no-sample", action="store_true", help="with --data: estimate the minibatches, do not sample them")
    ap.add_argument("--cpus", type=int, default=128, help="CPUs (hardware threads) of a node, for the launch line")
    ap.add_argument("--threads-per-core", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    options.add_arguments(ap, TrainConfig, {}, SECTIONS, skip=SKIP)
    return ap


def plan(argv: list[str] | None = None) -> dict:
    """The plan for a command line (ConfigError or PartitionFormatError: bad input, one line)."""
    return plan_of(parser().parse_args(argv))


def plan_of(parsed: argparse.Namespace) -> dict:
    args = dict(vars(parsed))
    ours = {k: args.pop(k) for k in ("data", "like", "ranks", "trainers_per_node", "ranks_per_host", "edge_cut",
                                     "no_sample", "cpus", "threads_per_core", "json")}
    if not ours["data"] and not ours["like"]:
        raise ConfigError("expected --data PARTS (a partition directory) or --like products|papers100M")
    if ours["trainers_per_node"] < 1:
        raise ConfigError(f"--trainers-per-node {ours['trainers_per_node']}: expected at least 1")
    if ours["edge_cut"] is not None and not 0 <= ours["edge_cut"] <= 1:
        raise ConfigError(f"--edge-cut {ours['edge_cut']}: expected a share in [0, 1]")
    if ours["data"]:
        graph = from_partitions(ours["data"])
        if ours["ranks"] and ours["ranks"] != len(graph.parts):
            raise ConfigError(f"--ranks {ours['ranks']}: {ours['data']} holds {len(graph.parts)} partitions, one a "
                              f"trainer; repartition with --num-parts {ours['ranks']} or plan {len(graph.parts)} ranks")
    else:
        if ours["ranks"] < 1:
            raise ConfigError(f"--ranks {ours['ranks']}: expected the trainer ranks (at least 1) with --like")
        graph = from_statistics(ours["like"], ours["ranks"], ours["edge_cut"])
    values = {k: v for k, v in args.items() if v is not None}
    sampled_values = {"agent_latency": 1, **values}  # the simulator applies answers a minibatch on, at the least
    cfg = TrainConfig.from_flat({**sampled_values, "data": os.path.abspath(ours["data"]) if ours["data"] else ours["like"],
                                 "run_dir": "(planned)", "epochs": 2})
    options.check_options(cfg)
    trainers, per_node = len(graph.parts), ours["trainers_per_node"]
    agents = int(POLICIES[cfg.buffer.policy].needs_agent)
    layout = estimate.Layout(trainers, per_node, agents, ours["ranks_per_host"] or per_node + agents)
    phases = cfg.run_phases([max(p.train for p in graph.parts)])
    steps, batch = phases.phases[0].steps_per_epoch, phases.phases[0].batch_size
    sim = None
    if ours["data"] and not ours["no_sample"]:
        sim = simulate(cfg, {cfg.buffer.policy: {}}, None)
    ranks = []
    for i, part in enumerate(graph.parts):
        mb = (estimate.sampled_minibatches(cfg, sim, i) if sim is not None
              else estimate.estimated_minibatches(graph, part, cfg, steps, batch, per_node))
        memory = estimate.memory(graph, part, cfg, layout, mb)
        ranks.append({"trainer": i, "owned": part.owned, "halo": part.halo, "memory": memory,
                      "memory_total": sum(v for k, v in memory.items() if k != "evaluation"),
                      "startup_io": estimate.startup_io(graph, part, cfg, first_of_node=i % per_node == 0),
                      "input_nodes": mb.input_nodes, "remote_rows_per_epoch": mb.remote_rows,
                      "remote_bytes_per_epoch": mb.remote_rows * graph.row_bytes,
                      "rows_off_node_per_epoch": mb.rows_off_node,
                      "checkpoint": estimate.checkpoint_bytes(graph, part, cfg)})
    return {"graph": describe(graph), "layout": vars(layout) | {"nodes": layout.nodes, "tasks": layout.tasks},
            "policy": cfg.buffer.policy, "buffer_fraction": cfg.buffer.fraction, "batch_size": batch,
            "steps_per_epoch": steps, "fanouts": cfg.sampling.fanouts, "topology": estimate.topology(cfg, graph),
            "minibatches": "simulated" if sim is not None else "estimated", "runtime": vars(estimate.RUNTIME),
            "ranks": ranks, "launch": launch_lines(cfg, graph, layout, ours, argv_flags(values))}


def describe(graph: GraphShape) -> dict:
    return {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges, "feat_dim": graph.feat_dim,
            "feature_dtype": graph.feature_dtype, "row_bytes": graph.row_bytes, "parts": len(graph.parts),
            "estimated": graph.estimated, "edge_cut": graph.edge_cut, "csr_bytes": graph.csr_bytes}


def argv_flags(values: dict) -> list[str]:
    """drivers/train.py flags for the run options given on this command line (the policy and the
    device aside: the job script sets them)."""
    flags = []
    for name, value in sorted(values.items()):
        if name in ("policy", "device"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return flags


def launch_lines(cfg, graph: GraphShape, layout: estimate.Layout, ours: dict, flags: list[str]) -> dict:
    """The sbatch line (the device's job script, through rudder-job.sh) and the srun line it runs:
    ``--device cuda`` plans GPU nodes (jobscripts/gpu.sbatch: a GPU a trainer)."""
    device = cfg.model.device
    shape = launch_plan(cfg.buffer.policy, layout.trainers_per_node, ours["cpus"], ours["threads_per_core"])
    data = ours["data"] or f"PARTS  # python -m partitioning ... --num-parts {layout.trainers}"
    env = [f"RUDDER_DATA={shlex.quote(ours['data']) if ours['data'] else 'PARTS'}",
           f"RUDDER_POLICY={cfg.buffer.policy}", f"RUDDER_TRAINERS_PER_NODE={layout.trainers_per_node}"]
    if flags:
        env.append(f"RUDDER_ARGS={shlex.quote(' '.join(flags))}")
    bind = (f"--cpus-per-task={shape['cpus_per_task']} --cpu-bind=cores" if shape["cpus_per_task"]
            else "--cpu-bind=none")
    gpus = f"--gpus-per-node={layout.trainers_per_node} " if device == "cuda" else ""
    return {"sbatch": " ".join(env) + f" sbatch -N {layout.nodes} {JOB_SCRIPTS[device]}",
            "srun": (f"srun --ntasks={layout.nodes * shape['tasks_per_node']} --ntasks-per-node={shape['tasks_per_node']} "
                     f"--distribution=block:block {bind} {gpus}--kill-on-bad-exit=1 python drivers/train.py "
                     f"--data {data.split('  #')[0]} --policy {cfg.buffer.policy} --device {device}"
                     + "".join(f" {f}" for f in flags)),
            **shape}


def megabytes(n: float) -> str:
    return f"{n / MB:,.1f}"


def text(p: dict) -> str:
    g, lay = p["graph"], p["layout"]
    source = (f"published statistics split into {g['parts']} equal parts, halo from an assumed {g['edge_cut']:.0%} edge cut"
              if g["estimated"] else f"{g['parts']} partitions' metadata")
    worst = max(p["ranks"], key=lambda r: r["memory_total"])
    mean = {k: sum(r["memory"][k] for r in p["ranks"]) / len(p["ranks"]) for k in worst["memory"]}
    agents = f" + {lay['nodes']} agent ranks" if lay["agents_per_node"] else ""
    lines = [f"{g['name']}: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges, {g['feat_dim']} features "
             f"({g['feature_dtype']}, {g['row_bytes']} B a row); {source}",
             f"{lay['trainers']} trainers{agents} on {lay['nodes']} nodes ({lay['tasks']} tasks); policy {p['policy']}, "
             f"buffer fraction {p['buffer_fraction']:g}, {p['steps_per_epoch']} steps/epoch of {p['batch_size']} seeds, "
             f"fanouts {','.join(map(str, p['fanouts']))}, topology {p['topology']}",
             "", f"memory a trainer rank (PSS, MB)    mean    largest (trainer {worst['trainer']})"]
    for owner in worst["memory"]:
        label = "evaluation (transient)" if owner == "evaluation" else owner
        lines.append(f"  {label:<30} {megabytes(mean[owner]):>8} {megabytes(worst['memory'][owner]):>10}")
    total = sum(r["memory_total"] for r in p["ranks"]) / len(p["ranks"])
    lines.append(f"  {'total (without evaluation)':<30} {megabytes(total):>8} {megabytes(worst['memory_total']):>10}")
    first = p["ranks"][0]["startup_io"]
    other = p["ranks"][1]["startup_io"] if len(p["ranks"]) > 1 else first
    lines += ["", "start-up reads a trainer (MB)      " + ", ".join(f"{k} {megabytes(v)}" for k, v in other.items()),
              "  a node's first trainer           " + ", ".join(f"{k} {megabytes(v)}" for k, v in first.items())]
    rows = sum(r["remote_rows_per_epoch"] for r in p["ranks"]) / len(p["ranks"])
    off = sum(r["rows_off_node_per_epoch"] for r in p["ranks"]) / len(p["ranks"])
    lines += [f"remote feature rows an epoch a trainer ({p['minibatches']}): {rows:,.0f} rows, "
              f"{megabytes(rows * g['row_bytes'])} MB ({off:,.0f} rows off its node)",
              f"checkpoint: {megabytes(worst['checkpoint']['a trainer'])} MB a trainer, trainer 0 "
              f"{megabytes(worst['checkpoint']['trainer 0 adds'])} MB more (the model and Adam's moments)",
              f"runtime: {p['runtime']['measured']}",
              "", "launch (jobscripts/README.md):", "  " + p["launch"]["sbatch"], "which runs:", "  " + p["launch"]["srun"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        parsed = parser().parse_args(argv)
        result = plan_of(parsed)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (ConfigError, PartitionFormatError, ValueError) as e:
        print(f"python -m rudder.plan: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if parsed.json else text(result))
    return 0
