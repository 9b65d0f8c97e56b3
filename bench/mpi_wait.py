"""How trainers wait for MPI, side by side: ``--mpi-wait spin`` against ``yield`` (rudder.comm.waiting),
each policy's runs alternating between the two, behind a shaped network (python -m rudder.netem),
every trainer an emulated node. Prints each run's epoch time (the slowest trainer's, median of
the steady epochs, rudder.logs.metrics) and the host's CPU busy and system shares over the job, then yield / spin per
policy (medians over the repetitions); writes the figures as JSON with ``--out``.

    python bench/mpi_wait.py --dataset rmat16 --ranks 4 --rate 250mbit --policies none-serial,none,lookahead
    python bench/mpi_wait.py --dataset facebook --ranks 4 --rate 1gbit --links per-node --reps 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import bench_datasets, cached_partition, cpu_ticks, label_flags, shaped, train_job  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import read_rank  # noqa: E402

MODES = ("spin", "yield")


def one_run(parts: str, run_dir: str, ranks: int, policy: str, mode: str, a) -> dict:
    flags = [*label_flags(policy), "--mpi-wait", mode, "--epochs", str(a.epochs),
             "--batch-size", str(a.batch_size), "--buffer-fraction", str(a.fraction)]
    wrapper = shaped(a.rate, a.links, ranks)
    before = cpu_ticks()
    paths = train_job(parts, run_dir, ranks, ranks, flags, wrapper)
    spent = [y - x for x, y in zip(before, cpu_ticks())]
    logs = [read_rank(p) for p in paths]
    seconds = metrics.run_epoch_time([x.tables["epochs"] for x in logs if x.role == "trainer"])
    total = max(1, sum(spent))
    assert {x.layout["mpi_wait"] for x in logs} == {mode}, f"{run_dir}: the job did not wait as asked"
    return {"policy": policy, "mpi_wait": mode, "epoch_seconds": seconds, "cpu_busy": 1 - spent[3] / total,
            "cpu_system": spent[2] / total, "run": run_dir}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="rmat16", help="facebook (from ../shared/data) or rmatN")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", default="250mbit")
    ap.add_argument("--links", default="shared", choices=("shared", "per-node"))
    ap.add_argument("--policies", default="none-serial,none,lookahead")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "rudder-bench-mpi-wait"))
    ap.add_argument("--out", default=None, help="write the figures here (JSON)")
    a = ap.parse_args()
    scale = int(a.dataset[4:]) if a.dataset.startswith("rmat") and a.dataset[4:].isdigit() else 16
    datasets = bench_datasets(scale, 128)
    if a.dataset not in datasets:
        raise SystemExit(f"--dataset {a.dataset}: not available here (have {', '.join(datasets)})")
    parts = cached_partition(datasets[a.dataset], a.ranks, os.path.join(a.workdir, f"{a.dataset}-p{a.ranks}"),
                             feature_dtype="float32")
    runs = []
    for rep in range(a.reps):
        for policy in a.policies.split(","):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # alternate which goes first
                r = one_run(parts, os.path.join(a.workdir, "runs", f"{policy}-{mode}-{rep}"), a.ranks, policy, mode, a)
                runs.append(r)
                print(f"{policy:12} {mode:5}  epoch {r['epoch_seconds']:.3f} s  cpu busy {r['cpu_busy']:.0%}, "
                      f"system {r['cpu_system']:.0%}", flush=True)
    print(f"\n{a.dataset} p{a.ranks}, {a.rate} {a.links}, batch {a.batch_size}, f={a.fraction}, {a.reps} rep(s), "
          f"load {os.getloadavg()[0]:.2f}")
    print("| policy | spin s | yield s | yield / spin |\n|---|---|---|---|")
    ratios = {}
    for policy in a.policies.split(","):
        spin, yld = (statistics.median(r["epoch_seconds"] for r in runs if r["policy"] == policy and r["mpi_wait"] == m)
                     for m in MODES)
        ratios[policy] = yld / spin
        print(f"| {policy} | {spin:.3f} | {yld:.3f} | {yld / spin:.3f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"settings": vars(a), "runs": runs, "yield_over_spin": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
