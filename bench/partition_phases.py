"""Profile (not a test): the partition tool's resident memory phase by phase, in one process.

    python bench/partition_phases.py --scale 21 --parts 8

Runs ``load_spec`` and ``partition_graph`` on ``synthetic:rmat:scale=S,edge_factor=16,feat_dim=128,
classes=16,seed=1`` with the process's RSS sampled every 20 ms, and the pipeline's steps wrapped to
time them; prints each step's largest RSS and its bytes per directed edge beyond the start.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from partitioning import multilevel, partition, sources, spec, synthetic  # noqa: E402

STEPS = [(synthetic, "smooth_labels"), (synthetic, "class_features"), (spec, "build_csr"),
         (sources, "validate_graph"), (partition, "choose_encoding"), (multilevel, "assign"), (partition, "write_part")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--parts", type=int, default=8)
    a = ap.parse_args()
    proc, samples, spans, running = psutil.Process(), [], [], [True]

    def sample():
        while running[0]:
            samples.append((time.perf_counter(), proc.memory_info().rss))
            time.sleep(0.02)

    def wrap(module, name):
        inner = getattr(module, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = inner(*args, **kwargs)
            spans.append((name, t0, time.perf_counter()))
            return result
        setattr(module, name, timed)

    for module, name in STEPS:
        wrap(module, name)
    start = proc.memory_info().rss
    threading.Thread(target=sample, daemon=True).start()
    out = tempfile.mkdtemp()
    t0 = time.perf_counter()
    graph = sources.load_spec(f"synthetic:rmat:scale={a.scale},edge_factor=16,feat_dim=128,classes=16,seed=1")
    spans.append(("load_spec", t0, time.perf_counter()))
    t0 = time.perf_counter()
    partition.partition_graph(graph, a.parts, os.path.join(out, "parts"), method="metis")
    spans.append(("partition_graph", t0, time.perf_counter()))
    running[0] = False
    shutil.rmtree(out)
    edges = graph.num_edges
    print(f"RMAT-{a.scale}, {a.parts} parts: {edges} directed edges; RSS at start {start >> 20} MiB, "
          f"peak {max(r for _, r in samples) >> 20} MiB")
    steps: dict[str, list] = {}
    for name, lo, hi in spans:
        peak = max([r for t, r in samples if lo <= t <= hi] or [0])
        row = steps.setdefault(name, [0, 0.0, 0])
        row[0], row[1], row[2] = max(row[0], peak), row[1] + hi - lo, row[2] + 1
    for name, (peak, seconds, calls) in steps.items():
        print(f"{name:16} peak {peak >> 20:7d} MiB  {(peak - start) / edges:6.1f} B/edge beyond the start  "
              f"{seconds:7.1f} s  x{calls}")


if __name__ == "__main__":
    main()
