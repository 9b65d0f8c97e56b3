"""Buffer policies side by side: remote rows per epoch and epoch time for none (no overlap),
none (overlap), static, fixed and lookahead, at buffer fractions 0.05 and 0.25, on Facebook
Page-Page (when ../shared/data has it) and an RMAT graph, each rank its own emulated node
(MPIR_CVAR_NUM_CLIQUES = ranks) so every remote row crosses RMA.

Also the analysis-free check: the lookahead run's traced remote inputs are replayed offline
under Belady MIN with the same capacity and admissible set (rudder.analysis.bound); lookahead's rows
should be within 2% of MIN. Pipelining: the share of the no-overlap run's feature-assembly
time that overlap hides = (epoch no-overlap - epoch overlap) / assembly time no-overlap.

Rows = RMA feature rows fetched, summed over trainers, mean of the steady epochs; epoch time =
slowest trainer, median of the steady epochs (both as rudder.logs.metrics defines them).

    python bench/policies.py [--ranks 8] [--epochs 5] [--batch-size 256] [--rmat-scale 16]
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


def train(parts: str, run: str, ranks: int, a, flags: list[str]) -> list[h5py.File]:
    paths = train_job(parts, run, ranks, ranks, ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), *flags])
    return [h5py.File(p, "r", locking=False) for p in paths]


def figures(logs) -> dict:
    mb = [f["minibatches"][()] for f in logs]
    tables = [f["epochs"][()] for f in logs]
    timed = metrics.run_timed_epochs(tables)
    if not timed:
        raise SystemExit(f"bench/policies.py: {metrics.run_too_short(tables)}")
    ep = np.stack([t[np.isin(t["epoch"], timed)] for t in tables])
    return {"rows": metrics.per_epoch_mean(mb, "rows_rma", timed),
            "epoch_s": metrics.run_epoch_time(tables),
            "assembly_s": float(np.median(ep["t_fetch"].mean(axis=0))),
            "hit_pct": metrics.hit_percent(sum(int(t["hits"].sum()) for t in mb), sum(int(t["misses"].sum()) for t in mb))}


def min_rows(logs, parts: str, fraction: float) -> float:
    """Belady MIN over each trainer's traced remote inputs, per steady epoch (the buffer warm from epoch 1)."""
    from rudder.analysis.bound import belady_min
    from rudder.data.partition_store import PartitionMeta, read_partition

    meta = PartitionMeta.load(parts)
    timed = metrics.run_timed_epochs([f["epochs"][()] for f in logs])
    total = 0
    for rank, f in enumerate(logs):
        offsets, values = f["trace_remote_inputs/offsets"][()], f["trace_remote_inputs/values"][()]
        trace = [values[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)]
        halo = np.sort(read_partition(parts, rank, meta, structure=False).halo_nodes)
        result = belady_min(trace, halo, int(np.floor(fraction * halo.size)))
        epoch = f["minibatches"]["epoch"][()]
        total += int(result["per_minibatch"][np.isin(epoch, timed)].sum())
    return total / len(timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rmat-scale", type=int, default=16)
    ap.add_argument("--fractions", default="0.05,0.25")
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-policies"))
    a = ap.parse_args()
    datasets = bench_datasets(a.rmat_scale, feat_dim=128)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {a.ranks} ranks (each its own node), {a.epochs} epochs, "
          f"batch {a.batch_size}/trainer; rows = remote rows fetched per epoch (all trainers), steady epochs")
    for name, spec in datasets.items():
        parts = cached_partition(spec, a.ranks, os.path.join(a.work, f"{name}-{a.ranks}"))
        t = time.time()
        base = {label: figures(train(parts, os.path.join(a.work, f"run-{name}-{label}"), a.ranks, a, flags))
                for label, flags in (("none-serial", ["--no-overlap"]), ("none", []))}
        hidden = (base["none-serial"]["epoch_s"] - base["none"]["epoch_s"]) / base["none-serial"]["assembly_s"]
        serial = base["none-serial"]
        print(f"\n{name}: none (no overlap) {serial['rows']:,.0f} rows, {serial['epoch_s']:.3f} s/epoch; "
              f"none (overlap) {base['none']['epoch_s']:.3f} s/epoch: overlap hides {100 * hidden:.0f}% of the "
              f"{base['none-serial']['assembly_s']:.3f} s assembly time  ({time.time() - t:.0f} s)")
        print(f"{'f':>5} {'policy':<10} {'rows/epoch':>11} {'x none':>7} {'epoch s':>8} {'x none':>7} {'hits %':>7} {'x MIN':>7}")
        none = base["none"]
        for fraction in (float(x) for x in a.fractions.split(",")):
            best = None
            for policy, flags in (("static", []), ("fixed", ["--delta", "25", "--alpha", "0.05"]),
                                  ("lookahead", ["--lookahead", "4", "--trace"])):
                logs = train(parts, os.path.join(a.work, f"run-{name}-{policy}-{fraction}"), a.ranks, a,
                             ["--policy", policy, "--buffer-fraction", str(fraction), *flags])
                r = figures(logs)
                if policy == "lookahead":
                    best = min_rows(logs, parts, fraction)
                ratio_min = f"{r['rows'] / best:7.3f}" if best else f"{'':>7}"
                print(f"{fraction:>5} {policy:<10} {r['rows']:>11,.0f} {r['rows'] / none['rows']:>7.3f} {r['epoch_s']:>8.3f} "
                      f"{r['epoch_s'] / none['epoch_s']:>7.3f} {r['hit_pct']:>7.1f} {ratio_min}", flush=True)
            print(f"{fraction:>5} {'MIN':<10} {best:>11,.0f} {best / none['rows']:>7.3f}")
    print(f"\nload {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
