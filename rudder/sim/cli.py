"""``python -m rudder.simulate``: the simulator's command line (docs/simulator.md).

    python -m rudder.simulate --data PARTS [--policies none,static,fixed,lookahead,heuristic] [--epochs 5]
        [--batch-size B] [--fanouts 10,25] [--buffer-fraction 0.25] [--machine perlmutter-gpu] [--out FILE.json]
    python -m rudder.simulate --validate RUN [--machine PROFILE.json] [--out FILE.json]

Run options are drivers/train.py's own (the same declarations, ``rudder.train.config``), with
the simulator's defaults: 5 epochs (3 steady ones, rudder.logs.metrics), and agent answers
applied one minibatch after their request.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from rudder.comm import waiting as waits
from rudder.data.partition_store import PartitionFormatError
from rudder.logs.reader import LogError
from rudder.prefetch.policies import POLICIES
from rudder.sim.machine import MACHINES, MachineError, parse_rate, resolve
from rudder.sim.simulate import __doc__ as SIMULATOR_DOC
from rudder.sim.simulate import simulate, summarize, table
from rudder.sim.transport import Graph
from rudder.sim.validate import validate_run
from rudder.train import options
from rudder.train.config import ConfigError, TrainConfig

SECTIONS = ("model", "sampling", "training", "buffer", "agent")
DEFAULTS = {"epochs": 5, "agent_latency": 1}
NOT_SIMULATED = ("eval_every", "eval_batch_size", "device", "collect_traces", "replay", "agent_delay",
                 "agent_cores", "agent_windows_in_flight")


def parser() -> argparse.ArgumentParser:
    ap = options.Parser(prog="python -m rudder.simulate", description=SIMULATOR_DOC,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="partition directory (python -m partitioning); one simulated trainer per partition")
    ap.add_argument("--validate", metavar="RUN", help="re-simulate a drivers/train.py run and compare its logs")
    ap.add_argument("--policies", default="none,static,fixed,lookahead,heuristic",
                    help="comma-separated policies (--policy of train.py); LABEL=POLICY:FLAG=V:... sets per-policy flags")
    ap.add_argument("--machine", default=None, metavar="NAME|FILE",
                    help=f"the time model (docs/simulator.md): {', '.join(MACHINES)} (default with --data: "
                         "perlmutter-gpu), a profile file of bench/calibrate_machine.py, or none: rows only; "
                         "with --validate, also compare the predicted epoch time")
    ap.add_argument("--rate", default=None, help="the rate whose machine a profile file gives (with --data; "
                    "--validate takes the run's, from RUN/netem.json)")
    ap.add_argument("--ranks-per-node", type=int, default=0, help="trainers per node (default: the machine's)")
    ap.add_argument("--feat-dim", type=int, default=0,
                    help="feature width for bytes and flops (default: the data's; bytes a row by the data's storage type)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", help="write the summary as JSON here")
    options.add_arguments(ap, TrainConfig, DEFAULTS, SECTIONS, skip=NOT_SIMULATED)
    return ap


def parse_policies(text: str, base: TrainConfig) -> dict[str, dict]:
    """"none,fixed,f1=fixed:delta=1" -> {label: flat option overrides}, each checked as train.py checks it."""
    known = options.by_name(TrainConfig)
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        label, _, spec = item.partition("=") if "=" in item.split(":")[0] else (item.split(":")[0], "", item)
        name, *flags = spec.split(":")
        if name not in POLICIES:
            raise ConfigError(f"--policies {item!r}: {name!r} is not one of {', '.join(POLICIES)}")
        overrides = {"policy": name} if name == "classifier" else {"policy": name, "classifier_model": ""}
        buffer = POLICIES[name].buffer_class
        if base.buffer.init == "vip" and (buffer is None or not buffer.fills_statically):
            overrides["buffer_init"] = "degree"  # a global --buffer-init vip: for the policies whose buffer fills once
        for flag in flags:
            key, _, value = flag.partition("=")
            key = key.replace("-", "_")
            if key not in known or not value:
                raise ConfigError(f"--policies {item!r}: {flag!r} is not FLAG=VALUE with a train.py flag")
            kind = known[key].kind
            try:
                overrides[key] = [int(v) for v in value.split("/")] if kind is list else kind(value)
            except ValueError:
                raise ConfigError(f"--policies {item!r}: {flag!r}: expected {options.KIND_WORDS[kind]}") from None
        base.replace(**overrides).check()
        out[label] = overrides
    if not out:
        raise ConfigError("--policies: expected at least one policy")
    return out


def main(argv=None) -> int:
    args = vars(parser().parse_args(argv))
    sim = {k: args.pop(k) for k in ("data", "validate", "policies", "machine", "rate", "ranks_per_node", "feat_dim",
                                    "workers", "out")}
    try:
        if sim["validate"]:
            t = time.time()
            named = sim["machine"] if sim["machine"] not in (None, "none") else None
            report = validate_run(sim["validate"], sim["workers"], named)
            bad = report["mismatches"]
            for line in bad[:20]:
                print(line)
            verdict = "MISMATCH" if bad else "match"
            print(f"{sim['validate']}: {report['compared']} minibatches compared, {verdict} ({time.time() - t:.1f} s)")
            if "epoch_time" in report:
                e = report["epoch_time"]
                print(f"epoch time (epochs {', '.join(str(x + 1) for x in e['epochs'])}, rudder.logs.metrics): measured "
                      f"{e['measured']:.3f} s, predicted {e['predicted']:.3f} s on {e['machine']}, predicted/measured "
                      f"{e['ratio']:.3f}")
                if e["measured_train_slowdown"] is not None:  # a log with its threads' CPU seconds
                    print(f"training threads' compute: {e['measured_train_slowdown']:.2f}x its CPU seconds measured, "
                          f"{e['slowdown']['train']:.2f}x modelled")
            elif "epoch_time_skipped" in report:
                print(f"epoch time not compared: {report['epoch_time_skipped']}")
            if sim["out"]:
                with open(sim["out"], "w") as f:
                    json.dump({"run": sim["validate"], **report}, f, indent=1)
            return 1 if bad else 0
        if not sim["data"]:
            raise ConfigError("--data: expected a partition directory (or --validate RUN)")
        rate_bit = parse_rate(sim["rate"]) if sim["rate"] else None
        machine = None if sim["machine"] == "none" else resolve(sim["machine"] or "perlmutter-gpu", rate_bit)
        values = {**DEFAULTS, **{k: v for k, v in args.items() if v is not None}}
        base = TrainConfig.from_flat({**values, "data": os.path.abspath(sim["data"]), "run_dir": "(simulated)"})
        options.check_options(base)
        if base.agent.latency < 1:
            raise ConfigError(f"--agent-latency {base.agent.latency}: expected a positive number of minibatches")
        policies = parse_policies(sim["policies"], base)
        if machine is not None and sim["ranks_per_node"]:
            machine = dataclasses.replace(machine, ranks_per_node=sim["ranks_per_node"])
        t = time.time()
        graph = Graph(base.data.path)
        epochs = base.training.epochs
        print(f"{graph.meta.dataset}: {graph.meta.num_nodes:,} nodes, {graph.meta.num_edges:,} edges, "
              f"{graph.meta.num_parts} partitions (read in {time.time() - t:.1f} s); {epochs} epochs; "
              f"policies {', '.join(policies)}; machine {machine.name if machine else 'none'}", flush=True)

        def progress(done, total):
            if done == total or done % max(1, total // 10) == 0:
                print(f"  {done}/{total} trainers simulated ({time.time() - t:.0f} s)", flush=True)

        result = simulate(base, policies, machine, sim["feat_dim"] or None, sim["workers"], graph, progress)
        # its trainers' threads wait as a run on that machine's host would (rudder.comm.layout's rule)
        waiting = (waits.resolve(base.training.mpi_wait, max(1, machine.cores // result["parts"]))
                   if machine is not None and machine.cores else "spin")
        summary = summarize(result, epochs, machine, base.sampling.prefetch_depth, waiting)
        summary.update(data=base.data.path, dataset=graph.meta.dataset, config=json.loads(base.to_json()),
                       seconds=time.time() - t)
        shifted = "".join(f", from epoch {p['first_epoch']} {p['steps_per_epoch']} of {p['batch_size']} (fanouts "
                          f"{','.join(map(str, p['fanouts']))}, seeds {p['seeds']:g})" for p in summary["phases"][1:])
        print(f"{summary['parts']} trainers, {summary['steps_per_epoch']} steps/epoch of {summary['batch_size']} seeds"
              f"{shifted}; rows = remote feature rows fetched per epoch, all trainers, epochs {summary['epochs_counted']}")
        print(table(summary))
        if sim["out"]:
            with open(sim["out"], "w") as f:
                json.dump(summary, f, indent=1)
        return 0
    except (ConfigError, PartitionFormatError, LogError, MachineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
