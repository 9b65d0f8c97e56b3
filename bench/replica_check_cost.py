"""The per-step replica check's cost (issue 38): step time with the check (``--on-divergence
repair``, the default) over step time without it (``off``), side by side in one run.

    python bench/replica_check_cost.py --data runs/cora4 [--ranks 4] [--pairs 3] [--epochs 10] [--batch-size 8]

Each pair runs both settings back to back, in alternating order (so a host that drifts slows
neither side more than the other). A run's step time is the mean over its minibatches after
epoch 0 of the slowest trainer's t_wait + t_forward_backward + t_allreduce + t_update (the
digest is computed inside the allreduce call, so its time is in t_allreduce). Prints each pair's
ratio and their median, and the digest's own time on this model.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import MPIEXEC  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402

STEP_TIMERS = ("t_wait", "t_forward_backward", "t_allreduce", "t_update")


def step_seconds(run_dir: str) -> float:
    """Mean over the minibatches after epoch 0 of the slowest trainer's step time."""
    tables = [r.minibatches for r in load_run(run_dir).ranks]
    steps = np.max([sum(t[c] for c in STEP_TIMERS) for t in tables], axis=0)
    return float(steps[tables[0]["epoch"] > 0].mean())


def train(args, run_dir: str, mode: str) -> float:
    proc = subprocess.run([MPIEXEC, "-n", str(args.ranks), sys.executable, os.path.join(REPO, "drivers", "train.py"),
                           "--data", args.data, "--run-dir", run_dir, "--epochs", str(args.epochs), "--batch-size",
                           str(args.batch_size), "--eval-every", "0", "--progress", "none", "--policy", args.policy,
                           "--on-divergence", mode], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return step_seconds(run_dir)


def digest_seconds(data: str) -> float:
    """step_digest's time on the run's model (as GraphSAGE is built for this data)."""
    from rudder.data.partition_store import PartitionMeta
    from rudder.train.data_parallel import step_digest
    from rudder.train.model import GraphSAGE

    meta = PartitionMeta.load(data)
    params = list(GraphSAGE(meta.feat_dim, 16, meta.num_classes, 2, 0.5, "torch").parameters())
    step_digest(params)
    start, n = time.perf_counter(), 200
    for _ in range(n):
        step_digest(params)
    return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--policy", default="fixed")
    args = ap.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as work:
        for pair in range(args.pairs):
            order = ("off", "repair") if pair % 2 == 0 else ("repair", "off")
            seconds = {mode: train(args, os.path.join(work, f"{pair}-{mode}"), mode) for mode in order}
            ratios.append(seconds["repair"] / seconds["off"])
            print(json.dumps({"pair": pair, "order": order, "step_s": seconds, "ratio": ratios[-1]}), flush=True)
    print(json.dumps({"median_ratio": float(np.median(ratios)), "ratios": ratios,
                      "digest_s": digest_seconds(args.data)}))


if __name__ == "__main__":
    main()
