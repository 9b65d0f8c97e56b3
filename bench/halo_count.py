"""Benchmark (not a test): the per-step log row's ``input_halo`` count, ``np.isin`` (what the
training thread ran before) against ``rudder.data.partition_store.halo_count`` (a binary search
an ID in the sorted halo), side by side on one synthetic minibatch.

    python bench/halo_count.py [--halo 10000000] [--nodes 111000000] [--inputs 30000] [--reps 20]

The halo: --halo sorted distinct IDs out of --nodes (ogbn-papers100M's 111M by default); the
remote inputs: --inputs distinct IDs in random order, half of them from the halo. Prints each
one's median CPU milliseconds (the thread's own clock, which other jobs on a shared host disturb
less than wall time) and the ratio; both counts must be equal.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rudder.data.partition_store import halo_count  # noqa: E402


def cpu_ms(fn, reps: int) -> tuple[float, int]:
    times, value = [], 0
    for _ in range(reps):
        t = time.thread_time()
        value = fn()
        times.append(time.thread_time() - t)
    return 1e3 * float(np.median(times)), value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--halo", type=int, default=10_000_000)
    ap.add_argument("--nodes", type=int, default=111_000_000)
    ap.add_argument("--inputs", type=int, default=30_000)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    halo = np.unique(rng.integers(0, args.nodes, int(args.halo * 1.1)))
    halo = np.sort(rng.choice(halo, min(args.halo, halo.size), replace=False))
    inside = rng.choice(halo, args.inputs // 2, replace=False)
    remote = np.unique(np.concatenate([inside, rng.integers(0, args.nodes, args.inputs - inside.size)]))
    rng.shuffle(remote)
    old, a = cpu_ms(lambda: int(np.isin(remote, halo, assume_unique=True).sum()), args.reps)
    new, b = cpu_ms(lambda: halo_count(remote, halo), args.reps)
    assert a == b, (a, b)
    print(f"halo {halo.size:,} IDs, {remote.size:,} remote inputs ({a:,} in the halo), median of {args.reps}:")
    print(f"  np.isin     {old:9.2f} ms CPU a step")
    print(f"  halo_count  {new:9.2f} ms CPU a step   ({old / new:,.0f}x less)")


if __name__ == "__main__":
    main()
