"""Benchmark (not a test): the simulator's predicted epoch time against real shaped runs.

    python bench/simulator_time.py [--out runs/simtime] [--rates 1gbit,250mbit] [--links shared]
                                   [--policies none-serial,none,fixed,lookahead] [--epochs 3] [--steps all]

1. Partitions Facebook Page-Page (when ../shared/data has it) and RMAT-16 (128-d) into 4, float32.
2. Local unshaped runs of ``none --no-overlap`` (all ranks one node: shared memory) for the CPU
   figures, and of each buffer policy asked for (``--no-overlap``) for what its buffer adds,
   then ``bench/calibrate_machine.py`` per rate: the Get microbenchmark under the same shaping
   and the compute fit from those unshaped runs. The profiles see no shaped training run.
3. Every (dataset, rate, policy) as a real ``drivers/train.py`` job behind ``python -m rudder.netem``
   (its stats beside the logs as netem.json), then ``python -m rudder.simulate --validate RUN
   --machine PROFILE``: rows exactly, and predicted over measured epoch time.
Prints the table and the worst error; runs already done with the same flags are reused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from mpi_job import MPIEXEC, bench_datasets, cached_partition, label_flags, shaped

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
POLICY_FLAGS = {label: label_flags(label) + (["--delta", "8"] if label == "fixed" else [])
                for label in ("none-serial", "none", "static", "fixed", "lookahead")}


def env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)


def background_runnable(samples: int = 20, every: float = 0.1) -> float:
    """Runnable threads on the host now, this sampler left out (/proc/loadavg's running count,
    averaged over 2 s): taken before a job starts, what other jobs run beside it."""
    counts = []
    for _ in range(samples):
        with open("/proc/loadavg") as f:
            counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        time.sleep(every)
    return sum(counts) / len(counts)


def train(parts: str, run_dir: str, flags: list[str], rate: str | None, links: str, ranks: int) -> str:
    """One drivers/train.py job (reused when it completed with the same command), with the other
    jobs' load when it started in RUN/host_load.json (which ``--validate`` reads)."""
    stamp = os.path.join(run_dir, "bench.json")
    train_cmd = [MPIEXEC, "-n", str(ranks), PY, os.path.join(REPO, "drivers", "train.py"), "--data", parts,
                 "--run-dir", run_dir, "--overwrite", "--eval-every", "0", "--progress", "none", "--no-verify-data",
                 *flags]
    wrapper = shaped(rate, links, ranks, "--stats", os.path.join(run_dir, "netem.json")) if rate else []
    record = {"command": wrapper + train_cmd}
    if os.path.exists(stamp) and json.load(open(stamp)) == record:
        return run_dir
    os.makedirs(run_dir, exist_ok=True)
    load = {"background_runnable": background_runnable(), "loadavg_before": os.getloadavg()}
    t = time.time()
    extra = {} if rate else {"MPIR_CVAR_NUM_CLIQUES": "1"}  # unshaped: every rank one node (shared memory)
    proc = subprocess.run(wrapper + train_cmd, capture_output=True, text=True, timeout=3600, env={**env(), **extra})
    if proc.returncode:
        raise SystemExit(f"{run_dir} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    json.dump({**load, "loadavg_after": os.getloadavg()}, open(os.path.join(run_dir, "host_load.json"), "w"))
    json.dump(record, open(stamp, "w"))
    print(f"  ran {os.path.relpath(run_dir)} ({time.time() - t:.0f} s)", flush=True)
    return run_dir


def validate(run_dir: str, profile: str) -> dict:
    proc = subprocess.run([PY, "-m", "rudder.simulate", "--validate", run_dir, "--machine", profile, "--workers", "1",
                           "--out", os.path.join(run_dir, "validate.json")], capture_output=True, text=True,
                          timeout=1800, env=env())
    if proc.returncode:
        raise SystemExit(f"--validate {run_dir} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return json.load(open(os.path.join(run_dir, "validate.json")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "simtime"))
    ap.add_argument("--rates", default="1gbit,250mbit")
    ap.add_argument("--links", default="shared", choices=("shared", "per-node"))
    ap.add_argument("--policies", default="none-serial,none,fixed,lookahead")
    ap.add_argument("--datasets", default="", help="comma-separated subset of facebook,rmat16 (default: both)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--runs-only", action="store_true", help="run the jobs, calibrate and validate nothing")
    a = ap.parse_args()
    ranks, common = 4, ["--epochs", str(a.epochs), "--hidden", "16", "--batch-size", "256", "--fanouts", "10,25",
                        "--buffer-fraction", "0.25", "--seed", "0"]
    datasets = bench_datasets(16, 128)
    every = {name: cached_partition(spec, ranks, os.path.join(a.out, f"{name}-{ranks}"), "float32")
             for name, spec in datasets.items()}
    parts = {k: v for k, v in every.items() if not a.datasets or k in a.datasets.split(",")}
    print(f"datasets {', '.join(parts)}; {ranks} ranks; rates {a.rates}, {a.links} link; {os.cpu_count()} cores",
          flush=True)
    # the CPU figures come from every dataset's local runs, whichever datasets are validated: none's for
    # the step, each buffer policy's for what its buffer adds
    buffers = [p for p in a.policies.split(",") if p not in ("none", "none-serial")]
    local = [train(p, os.path.join(a.out, f"{name}-local-{label}"), common + POLICY_FLAGS[label]
                   + ([] if label == "none-serial" else ["--no-overlap"]), None, a.links, ranks)
             for name, p in every.items() for label in ["none-serial", *buffers]]
    profiles = {}
    for rate in a.rates.split(","):
        profiles[rate] = os.path.join(a.out, f"host-{a.links}-{rate}.json")
        if not a.runs_only and not os.path.exists(profiles[rate]):
            subprocess.run([PY, os.path.join(REPO, "bench", "calibrate_machine.py"), "--rate", rate, "--links", a.links,
                            "--compute-runs", *local, "--out", profiles[rate]], check=True, env=env(),
                           timeout=3600)
    rows = []
    for name, p in parts.items():
        for rate in a.rates.split(","):
            for policy in a.policies.split(","):
                run = train(p, os.path.join(a.out, f"{name}-{a.links}-{rate}-{policy}"), common + POLICY_FLAGS[policy],
                            rate, a.links, ranks)
                if not a.runs_only:
                    v = validate(run, profiles[rate])
                    rows.append({"dataset": name, "rate": rate, "policy": policy, **v["epoch_time"]})
                    print(f"  {name} {rate} {policy}: measured {v['epoch_time']['measured']:.2f} s, predicted "
                          f"{v['epoch_time']['predicted']:.2f} s, {v['epoch_time']['ratio']:.3f}x", flush=True)
    if not rows:
        return
    print(f"\n{'dataset':<10} {'rate':>8} {'policy':<12} {'measured s':>11} {'predicted s':>12} {'pred/meas':>10} "
          f"{'wait share':>11} {'background':>11}")
    for r in rows:
        print(f"{r['dataset']:<10} {r['rate']:>8} {r['policy']:<12} {r['measured']:>11.2f} {r['predicted']:>12.2f} "
              f"{r['ratio']:>10.3f} {r['wait_share']:>11.2f} {r['background']:>11.1f}")
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    print(f"worst: {worst['dataset']} {worst['rate']} {worst['policy']}, {worst['ratio']:.3f}x "
          f"({100 * abs(worst['ratio'] - 1):.1f}% off)")
    with open(os.path.join(a.out, f"simulator_time-{a.rates.replace(',', '_')}-{'_'.join(parts)}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
