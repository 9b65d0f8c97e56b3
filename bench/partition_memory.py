"""Benchmark (not a test): peak memory per directed edge, time, and the plan's prediction, of the
partition tool on RMAT graphs.

    python bench/partition_memory.py --runs 20:8,22:8,23:64 [--tree DIR] [--ranks K] [--metis-levels disk|memory]

Each run is the real CLI (``python -m partitioning``, or ``mpiexec -n K`` with --ranks) in its own
process, on ``synthetic:rmat:scale=S,edge_factor=16,feat_dim=128,classes=16,seed=1`` into P parts;
``--tree`` runs another checkout's tool (e.g. a ``git worktree`` of an older commit) the same way.
Peak: the process tree's largest resident set (wait4's ru_maxrss, what ``/usr/bin/time -v``
reports as "Maximum resident set size"; under mpiexec, the largest rank's). ``cpu s``: the tree's
user + system CPU seconds, steadier than wall time on a shared host. Scratch: the largest the
files beside the partition directory grew to (the tool's scratch: generated features, coarse
levels, METIS's spilled levels), sampled every 0.25 s, against the plan's scratch.

    bytes per edge = (peak - baseline - one part's features) / directed edges

baseline: the resident set of a Python that has imported the tool (numpy, h5py, pandas, METIS
loaded), measured here first; one part's features: the largest part's rows in float32, the
allowance a writer holds; directed edges: the graph's after symmetrising and deduplicating.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import MPIEXEC  # noqa: E402
from partitioning.plan import plan_for  # noqa: E402

SPEC = "synthetic:rmat:scale={scale},edge_factor=16,feat_dim={dim},classes=16,seed=1"
BASELINE_CODE = ("import partitioning.cli, h5py, numpy, pandas; from partitioning import metis; "
                 "metis._metis()")


def run_measured(cmd: list[str], cwd: str, env: dict) -> tuple[str, float, int, float]:
    """(output, wall seconds, peak RSS bytes of the process tree, its CPU seconds: user + system)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{text}")
    return text, time.perf_counter() - t0, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def scratch_bytes(workdir: str, out: str) -> int:
    """Bytes of every file under ``workdir`` but the partition directory ``out`` and the one it is
    written into first (``.NAME.tmp-*``): the tool's scratch (it goes beside --out): generated
    features, coarse levels, METIS's spilled levels."""
    total, name = 0, os.path.basename(out)
    for root, dirs, files in os.walk(workdir):
        if root == workdir:
            dirs[:] = [d for d in dirs if d != name and not d.startswith(f".{name}.tmp-")]
        for file in files:
            try:
                total += os.path.getsize(os.path.join(root, file))
            except OSError:  # removed meanwhile
                pass
    return total


class ScratchWatch:
    """The largest ``scratch_bytes`` seen, sampled every ``interval`` seconds while a run lasts."""

    def __init__(self, workdir: str, out: str, interval: float = 0.25):
        self.peak, self.stopping = 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, args=(workdir, out, interval), daemon=True)
        self.thread.start()

    def _watch(self, workdir, out, interval):
        while not self.stopping.wait(interval):
            self.peak = max(self.peak, scratch_bytes(workdir, out))

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join()
        return self.peak


def run_one(scale: int, parts: int, dim: int, tree: str, workdir: str, ranks: int, baseline: int,
            method: str = "metis", metis_levels: str | None = None) -> dict:
    out = os.path.join(workdir, f"rmat{scale}-p{parts}")
    spec = SPEC.format(scale=scale, dim=dim)
    cmd = [sys.executable, "-m", "partitioning", "--input", spec, "--num-parts", str(parts), "--out", out,
           "--method", method, *(["--metis-levels", metis_levels] if metis_levels else [])]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    env = dict(os.environ, PYTHONPATH=tree)
    watch = ScratchWatch(workdir, out)
    text, wall, peak, cpu = run_measured(cmd, tree, env)
    scratch_peak = watch.stop()
    meta = json.load(open(os.path.join(out, "metadata.json")))
    edges, nodes = meta["num_edges"], meta["num_nodes"]
    part_features = max(b - a for a, b in zip(meta["offsets"], meta["offsets"][1:])) * 4 * dim
    phases = re.search(r"in ([\d.]+) s, relabelled in ([\d.]+) s, written in ([\d.]+) s", text).groups()
    disk = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    shutil.rmtree(out)
    predicted = plan_for(spec, parts, ranks, method=method, metis_levels=metis_levels or "disk")
    return {"scale": scale, "parts": parts, "ranks": ranks, "nodes": nodes, "edges": edges, "wall_s": wall, "cpu_s": cpu,
            "load_s": float(re.search(r"classes, .*\(([\d.]+) s\)", text).group(1)), "assign_s": float(phases[0]),
            "relabel_s": float(phases[1]), "write_s": float(phases[2]), "peak": peak, "part_features": part_features,
            "bytes_per_edge": (peak - baseline - part_features) / edges, "disk": disk,
            "predicted_peak": predicted["peak_bytes"],
            "predicted_s": predicted["total_seconds"],
            "predicted_disk": predicted["disk_bytes"], "predicted_scratch": predicted["scratch_bytes"],
            "scratch_peak": scratch_peak,
            "levels": meta.get("partitioner", {}).get("levels")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="20:8,22:8,23:64", help="SCALE:PARTS,... (default 20:8,22:8,23:64)")
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--tree", default=REPO, help="checkout whose tool runs (default: this one)")
    ap.add_argument("--ranks", type=int, default=1, help="mpiexec -n K (the parallel mode)")
    ap.add_argument("--method", default="metis", help="metis (default), multilevel, or random: the pipeline without METIS")
    ap.add_argument("--metis-levels", default=None, help="the tool's --metis-levels (default: not passed, the tool's default)")
    ap.add_argument("--workdir", default=None, help="where partitions are written (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    a = ap.parse_args()
    workdir = a.workdir or tempfile.mkdtemp(prefix="rudder-bench-")
    os.makedirs(workdir, exist_ok=True)  # before a run: the tool puts its scratch beside --out only if that exists
    _, _, baseline, _ = run_measured([sys.executable, "-c", BASELINE_CODE], a.tree, dict(os.environ, PYTHONPATH=a.tree))
    print(f"tree {a.tree}; --method {a.method}; --metis-levels {a.metis_levels or 'default'}; RMAT edge_factor 16, "
          f"{a.feat_dim}-dim features, {a.ranks} rank(s), "
          f"{os.cpu_count()} cores; "
          f"baseline {baseline / 2**20:.0f} MiB")
    print(f"{'scale':>5} {'parts':>5} {'dir. edges':>11} {'total s':>7} {'cpu s':>6} {'load s':>6} {'part s':>6} {'write s':>7} "
          f"{'peak GiB':>8} {'B/edge':>6} {'plan GiB':>8} {'meas/plan':>9} {'plan s':>6} {'disk GiB':>8} "
          f"{'scratch GiB':>11} {'plan':>6}",
          flush=True)
    rows = []
    for item in a.runs.split(","):
        scale, parts = map(int, item.split(":"))
        r = run_one(scale, parts, a.feat_dim, a.tree, workdir, a.ranks, baseline, a.method, a.metis_levels)
        rows.append(r)
        print(f"{r['scale']:>5} {r['parts']:>5} {r['edges']:>11} {r['wall_s']:>7.1f} {r['cpu_s']:>6.0f} {r['load_s']:>6.1f} "
              f"{r['assign_s']:>6.1f} {r['write_s']:>7.1f} {r['peak'] / 2**30:>8.2f} {r['bytes_per_edge']:>6.1f} "
              f"{r['predicted_peak'] / 2**30:>8.2f} {r['peak'] / r['predicted_peak']:>9.2f} "
              f"{r['predicted_s']:>6.0f} {r['disk'] / 2**30:>8.2f} "
              f"{r['scratch_peak'] / 2**30:>11.2f} {r['predicted_scratch'] / 2**30:>6.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"baseline": baseline, "rows": rows}, f, indent=1)
    if not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
