"""Issue 38's replica check in its original configuration, for a machine with many cores (the
replicas diverged in 2 of 10 such runs on 16 cores): training jobs, alternately with
``--mpi-lock off`` (the threads enter MPI together, as then) and ``on`` (the default), until
``--seconds`` have passed; a row in a run's ``repairs`` table is a divergence the run caught and
repaired (``--on-divergence repair``), a failed job is counted apart.

    python bench/replica_runs.py --data CORA4 [--seconds 240] [--ranks 4] [--epochs 100] [--train-args "..."]
        [--json FILE]

The configuration: Cora in 4 parts, 4 ranks with no CPU binding (so 4 threads a rank on 16
cores: rudder.comm.layout), each rank its own emulated node (``MPIR_CVAR_NUM_CLIQUES``: the
pipeline thread's Gets go through the netmod while the training thread's Allreduce is in flight),
``--policy fixed``, ``--mpi-wait spin``. The summary gives per setting the jobs, the jobs with a
divergence and, where none had one, the rule of three's 95% bound 3/N on the chance a job has one.
bench/many_core_check.sh runs it on the lent machine; docs/replicas.md has what it found.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import train_job  # noqa: E402
from rudder.logs.reader import read_rank  # noqa: E402

SETTINGS = ("off", "on")


def one_job(args, run_dir: str, lock: str) -> dict:
    flags = ["--policy", "fixed", "--mpi-wait", "spin", "--mpi-lock", lock, "--on-divergence", "repair",
             "--epochs", str(args.epochs), "--seed", str(args.seed), *args.train_args.split()]
    start = time.perf_counter()
    try:
        paths = train_job(args.data, run_dir, args.ranks, args.ranks, flags)
    except SystemExit as failed:  # the job's stderr, kept: a failure is a finding here, not the end
        return {"lock": lock, "status": "failed", "seconds": time.perf_counter() - start, "error": str(failed)[-800:]}
    logs = [read_rank(p) for p in paths]
    trainers = [log for log in logs if log.role == "trainer"]
    repairs = trainers[0].tables["repairs"] if trainers else []  # every trainer logs the same repairs
    return {"lock": lock, "status": "completed", "seconds": time.perf_counter() - start,
            "threads": trainers[0].attrs["layout"]["threads_per_rank"], "repairs": len(repairs),
            "repaired_minibatches": [int(r["minibatch"]) for r in repairs]}


def summary(jobs: list[dict]) -> dict:
    out = {}
    for lock in SETTINGS:
        mine = [j for j in jobs if j["lock"] == lock]
        done = [j for j in mine if j["status"] == "completed"]
        diverged = sum(1 for j in done if j["repairs"])
        out[lock] = {"jobs": len(mine), "completed": len(done), "failed": len(mine) - len(done),
                     "jobs_with_divergence": diverged, "divergences": sum(j["repairs"] for j in done),
                     "bound_95": min(1.0, 3 / len(done)) if done and not diverged else None,
                     "threads_per_rank": sorted({j["threads"] for j in done})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="Cora in RANKS parts (python -m partitioning ... --num-parts 4)")
    ap.add_argument("--seconds", type=float, default=240, help="start no job after this many seconds")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-args", default="", help="more options for every job (--inject-divergence 3:1 checks the count)")
    ap.add_argument("--json", help="write the jobs and the summary here too")
    args = ap.parse_args()
    jobs, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        while len(jobs) < 2 or len(jobs) % 2 or time.perf_counter() - start < args.seconds:  # whole pairs, one at least
            lock = SETTINGS[len(jobs) % 2]
            jobs.append(one_job(args, os.path.join(work, f"job{len(jobs)}"), lock))
            print(json.dumps(jobs[-1]), flush=True)
    result = {"jobs": jobs, "summary": summary(jobs), "seconds": time.perf_counter() - start}
    print(json.dumps(result["summary"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
