"""Benchmark (not a test): time and peak memory of the partition tool on RMAT graphs.

    python bench/partition_scale.py [--scales 18,20,22] [--parts 8] [--feat-dim 64] [--method metis]

Each scale runs the real CLI (`python -m partitioning`) in its own process; peak memory is that
process's max RSS (wait4), so scales do not pollute each other. Prints one table row per scale
with the memory per directed edge. Target (issue 2): scale 22, 8 parts, in < 15 min and < 24 GiB.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile

from partition_memory import run_measured  # the partition CLI in a process of its own, its peak by wait4


def run_one(scale: int, parts: int, feat_dim: int, method: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"rmat{scale}")
    spec = f"synthetic:rmat:scale={scale},edge_factor=16,feat_dim={feat_dim},classes=8,seed=0"
    cmd = [sys.executable, "-m", "partitioning", "--input", spec, "--num-parts", str(parts), "--out", out, "--method", method]
    text, wall, peak, _ = run_measured(cmd, os.getcwd(), dict(os.environ))
    edges = int(re.search(r"(\d+) directed edges", text).group(1))
    nodes = int(re.search(r"(\d+) nodes", text).group(1))
    phases = re.search(r"in ([\d.]+) s, relabelled in ([\d.]+) s, written in ([\d.]+) s", text).groups()
    load_s = float(re.search(r"classes, .*\(([\d.]+) s\)", text).group(1))
    disk = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    shutil.rmtree(out)
    return {"scale": scale, "nodes": nodes, "edges": edges, "wall_s": wall, "load_s": load_s,
            "assign_s": float(phases[0]), "relabel_s": float(phases[1]), "write_s": float(phases[2]),
            "peak_gib": peak / 2**30, "bytes_per_edge": peak / edges, "disk_gib": disk / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="18,20,22")
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--feat-dim", type=int, default=64)
    ap.add_argument("--method", default="metis", choices=["metis", "random"])
    ap.add_argument("--workdir", default=None, help="where partitions are written (default: a temp dir)")
    a = ap.parse_args()
    workdir = a.workdir or tempfile.mkdtemp(prefix="rudder-bench-")
    print(f"RMAT edge_factor 16, {a.feat_dim}-dim features, {a.parts} parts, {a.method}, {os.cpu_count()} cores")
    print(f"{'scale':>5} {'nodes':>10} {'dir. edges':>12} {'total s':>8} {'gen s':>7} {'part s':>7} {'relab s':>7} "
          f"{'write s':>7} {'peak GiB':>9} {'B/edge':>7} {'disk GiB':>8}", flush=True)
    for scale in map(int, a.scales.split(",")):
        r = run_one(scale, a.parts, a.feat_dim, a.method, workdir)
        print(f"{r['scale']:>5} {r['nodes']:>10} {r['edges']:>12} {r['wall_s']:>8.1f} {r['load_s']:>7.1f} {r['assign_s']:>7.1f} "
              f"{r['relabel_s']:>7.1f} {r['write_s']:>7.1f} {r['peak_gib']:>9.2f} {r['bytes_per_edge']:>7.1f} "
              f"{r['disk_gib']:>8.2f}",
              flush=True)
    if not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
