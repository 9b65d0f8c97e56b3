"""Epoch time of the no-prefetch baseline, and the share of it spent waiting on remote data, at
several rank counts, on Facebook Page-Page (when ../shared/data has it) and on an RMAT graph.

Each configuration runs the real driver (mpiexec -n N python drivers/train.py) twice, side by
side in this one script:
  * "1 node":   all ranks on this host, so remote partitions are read through shared memory;
  * "N nodes":  MPICH told each rank is its own node (MPIR_CVAR_NUM_CLIQUES=N), so every remote
                row crosses RMA (loopback here; the network on a cluster).
Epoch time is the slowest trainer's, median over the steady epochs (rudder.logs.metrics). Shares are per-trainer time
over epoch time, averaged over trainers: "wait" = sampling + feature assembly (the training
thread blocked on its inputs), "rma" = time inside RMA Get..Flush (sampling's CSR reads and
feature rows). Remote rows are input rows owned by another partition, summed over trainers.

    python bench/epoch_time.py [--ranks 2,4,8] [--epochs 5] [--rmat-scale 15]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import bench_datasets, cached_partition, train_job  # noqa: E402
from rudder.logs import metrics  # noqa: E402


def run(parts_dir: str, ranks: int, run_dir: str, cliques: int, args) -> dict:
    epochs = []
    for path in train_job(parts_dir, run_dir, ranks, cliques, ["--epochs", str(args.epochs), "--batch-size",
                                                               str(args.batch_size), "--hidden", str(args.hidden)]):
        with h5py.File(path, "r", locking=False) as f:
            epochs.append(f["epochs"][()])
    timed = metrics.run_timed_epochs(epochs)
    if not timed:
        raise SystemExit(f"bench/epoch_time.py: --epochs {args.epochs}: {metrics.run_too_short(epochs)}")
    ep = np.stack([t[np.isin(t["epoch"], timed)] for t in epochs])  # [ranks, steady epochs]
    seconds = ep["seconds"].max(axis=0)
    return {"epoch_s": metrics.epoch_time(seconds), "wait": float(np.mean(ep["t_wait"] / seconds)),
            "rma": float(np.mean(ep["t_rma"] / seconds)), "fetch": float(np.mean(ep["t_fetch"] / seconds)),
            "remote_rows": float(np.median(ep["input_remote"].sum(axis=0))),
            "rma_mib": float(np.median(ep["bytes_rma"].sum(axis=0)) / 2**20),
            "test_acc": float(epochs[0]["test_acc"][-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--rmat-scale", type=int, default=15)
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-epoch"))
    a = ap.parse_args()
    datasets = bench_datasets(a.rmat_scale, feat_dim=256)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load {load:.2f} at start; {a.epochs} epochs, batch {a.batch_size}/trainer, "
          f"hidden {a.hidden}, fanouts 10,25")
    print(f"{'dataset':<10} {'ranks':>5} {'layout':<8} {'epoch s':>8} {'wait %':>7} {'rma %':>6} {'fetch %':>8} "
          f"{'remote rows/ep':>15} {'RMA MiB/ep':>11} {'test acc':>9}")
    for name, spec in datasets.items():
        for ranks in (int(r) for r in a.ranks.split(",")):
            parts = cached_partition(spec, ranks, os.path.join(a.work, f"{name}-{ranks}"))
            for label, cliques in (("1 node", 1), (f"{ranks} nodes", ranks)):
                t = time.time()
                r = run(parts, ranks, os.path.join(a.work, f"run-{name}-{ranks}-{cliques}"), cliques, a)
                print(f"{name:<10} {ranks:>5} {label:<8} {r['epoch_s']:>8.3f} {100 * r['wait']:>7.1f} {100 * r['rma']:>6.1f} "
                      f"{100 * r['fetch']:>8.1f} {r['remote_rows']:>15,.0f} {r['rma_mib']:>11.1f} {r['test_acc']:>9.3f}"
                      f"   ({time.time() - t:.0f} s wall)", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
