"""Bytes a trainer's checkpoint file takes, against the bytes of its buffer's rows: RMAT-16 in 4
partitions (each rank its own emulated node) at two feature widths (float32, ``--widths``), a
buffer of f = ``--fraction`` of the halo, for the scored buffer (``fixed``) and the window buffer
(``lookahead``). Each run trains one epoch with a checkpoint every ``--every`` minibatches; the
figures are the last checkpoint's files. ``--repo DIR`` runs another tree's drivers/train.py and
library (an earlier version: ``git archive REV | tar -x -C DIR``), with this tree's partitions.

Columns: rank file = rank-NNNNN.pt bytes, mean over trainers (max); buffer rows = the buffer's
capacity x the row's bytes (widened to float32, as the buffer holds them), mean over trainers;
model.pt = trainer 0's model and optimiser file.

    python bench/checkpoint_bytes.py [--widths 128,512] [--fraction 0.25] [--repo DIR]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import cached_partition, train_job  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--widths", default="128,512")
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--policies", default="fixed,lookahead")
    ap.add_argument("--repo", default=None, help="run this tree's drivers/train.py (default: this one)")
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-checkpoint-bytes"))
    a = ap.parse_args()
    print(f"# bench/checkpoint_bytes.py, {time.strftime('%Y-%m-%d %H:%M %Z')}, load {os.getloadavg()[0]:.2f}, "
          f"{a.parts} parts, f = {a.fraction}, repo {a.repo or REPO}")
    print("| features | policy | checkpoint format | rank file, bytes (max) | buffer rows, bytes | model.pt, bytes |")
    print("|---|---|---|---|---|---|")
    for width in map(int, a.widths.split(",")):
        spec = f"synthetic:rmat:scale=16,edge_factor=16,feat_dim={width},classes=16,seed=1"
        parts = cached_partition(spec, a.parts, os.path.join(a.work, f"rmat16-d{width}-p{a.parts}"), "float32")
        for policy in a.policies.split(","):
            run = os.path.join(a.work, f"rmat16-d{width}-{policy}" + ("-repo" if a.repo else ""))
            train_job(parts, run, a.parts, a.parts, ["--epochs", "1", "--batch-size", "256", "--policy", policy,
                                                     "--buffer-fraction", str(a.fraction), "--checkpoint-every",
                                                     str(a.every)], repo=a.repo)
            with open(os.path.join(run, "checkpoint", "latest.json")) as f:
                record = json.load(f)
            where = os.path.join(run, "checkpoint", f"minibatch-{record['counter']:09d}")
            sizes = [os.path.getsize(p) for p in sorted(glob.glob(os.path.join(where, "rank-*.pt")))]
            capacity = np.mean([r.run["buffer_capacity"] for r in load_run(run).ranks])
            print(f"| float32 x {width} | {policy} | {record['format_version']} | {np.mean(sizes):,.0f} ({max(sizes):,}) | "
                  f"{capacity * width * 4:,.0f} | {os.path.getsize(os.path.join(where, 'model.pt')):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
