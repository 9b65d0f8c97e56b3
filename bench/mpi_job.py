"""Shared by the MPI benchmarks: a benchmark script re-launches itself under mpiexec with
``--worker --workdir DIR`` and the same arguments; rank 0 prints one JSON line of results."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile

from rudder.comm.runtime import find_mpiexec

# The launcher: $MPIEXEC if set (as tests/run_suite.sh reads it; a machine whose MPICH was installed
# apart, bench/device_mpi.sh), else the library's choice (the venv's, else PATH's); and this checkout
MPIEXEC = os.environ.get("MPIEXEC") or find_mpiexec() or "mpiexec"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_ticks() -> list[int]:
    """The host's CPU time so far (/proc/stat: user, nice, system, idle, iowait, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def run_worker_job(script: str, argv: list[str], ranks: int, env: dict | None = None, timeout: int = 1200) -> dict:
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", os.path.abspath(script),
                               "--worker", "--workdir", work, *argv],
                              capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_worker_flags(ap) -> None:
    import argparse

    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)


FACEBOOK = os.path.join(REPO, "..", "shared", "data", "musae")


def cached_partition(spec: str, parts: int, out: str, feature_dtype: str = "auto") -> str:
    """``spec`` partitioned into ``parts`` with METIS at ``out``, features stored as
    ``feature_dtype``, reused when already there (for ``auto``: a directory whose tool chose a
    type, not one written before the choice existed)."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.data.partition_store import METADATA_FILE, PartitionFormatError, PartitionMeta

    try:
        meta = PartitionMeta.load(out)
        with open(os.path.join(out, METADATA_FILE)) as f:
            chosen = json.load(f).get("feature_dtype")
        if meta.num_parts == parts and chosen and feature_dtype in ("auto", chosen):
            return out
    except PartitionFormatError:
        pass
    partition_graph(load_spec(spec), parts, out, method="metis", seed=0, force=True, feature_dtype=feature_dtype)
    return out


def sbm_parts_on_rank0(comm, workdir: str, nodes: int, dim: int, feature_dtype: str):
    """The gather benches' graph: rank 0 splits an SBM of ``nodes`` nodes at random into one part
    a rank at ``workdir``/parts; every rank waits for it. Returns (the directory, its metadata)."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.data.partition_store import PartitionMeta

    out = os.path.join(workdir, "parts")
    if comm.rank == 0:
        spec = f"synthetic:sbm:nodes={nodes},blocks=8,avg_degree=4,feat_dim={dim},seed=0"
        partition_graph(load_spec(spec), comm.size, out, method="random", force=True, feature_dtype=feature_dtype)
    comm.Barrier()
    return out, PartitionMeta.load(out)


def bench_datasets(rmat_scale: int, feat_dim: int) -> dict:
    """Facebook Page-Page when ../shared/data has it, and an RMAT graph: {name: input spec}."""
    datasets = {}
    if os.path.isfile(os.path.join(FACEBOOK, "facebook_edges.csv")):
        datasets["facebook"] = f"musae:{FACEBOOK}:facebook"
    else:
        print(f"(Facebook Page-Page not at {FACEBOOK}: skipped)")
    datasets[f"rmat{rmat_scale}"] = (f"synthetic:rmat:scale={rmat_scale},edge_factor=16,feat_dim={feat_dim},"
                                     f"classes=16,seed=1")
    return datasets


def label_flags(label: str) -> list[str]:
    """drivers/train.py's policy flags for a benchmark run labelled by a policy's name, or
    ``none-serial``: no buffer and no overlap (the DistDGL baseline's order)."""
    return ["--policy", "none", "--no-overlap"] if label == "none-serial" else ["--policy", label]


def shaped(rate: str, links: str, nodes: int, *options: str) -> list[str]:
    """What goes before a job's mpiexec to run it inside a shaped network: ``python -m rudder.netem
    --rate RATE --links LINKS --nodes NODES [options] --`` (docs/network.md)."""
    return [sys.executable, "-m", "rudder.netem", "--rate", rate, "--links", links, "--nodes", str(nodes), *options, "--"]


# What every benchmark job adds to its own flags: a fresh run directory, no evaluation, no progress
# lines, the partitions' checksums trusted (the benchmark made them)
JOB_FLAGS = ["--overwrite", "--eval-every", "0", "--progress", "none", "--no-verify-data"]


def train_job(parts: str, run_dir: str, ranks: int, cliques: int, flags: list[str], wrapper: list[str] = (),
              repo: str | None = None) -> list[str]:
    """``mpiexec -n RANKS python drivers/train.py`` on PARTS into RUN_DIR (replacing an earlier run),
    MPICH told the host is CLIQUES nodes, behind ``wrapper`` if given (a shaped network:
    ``python -m rudder.netem ... --``); exits with the job's stderr on failure. Returns the rank
    log paths. ``repo``: whose drivers/train.py (and library: it runs its own), this one's by default."""
    cmd = [*wrapper, MPIEXEC, "-n", str(ranks), sys.executable, os.path.join(repo or REPO, "drivers", "train.py"),
           "--data", parts, "--run-dir", run_dir, *JOB_FLAGS, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, MPIR_CVAR_NUM_CLIQUES=str(cliques)))
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return sorted(glob.glob(os.path.join(run_dir, "rank-*.h5")))


def launch_jobs(jobs: list, ranks: int, workdir: str, env: dict | None = None, timeout: float = 3600,
                mpiexec: str | None = None, script: str | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n RANKS python drivers/train_jobs.py JOBS.json``: ``jobs`` (JOBS.json's entries,
    each an argument list or ``{"argv": [...], "trainers_only": bool}``) written to a new file in
    ``workdir``, run one after another in one launch; ``env`` adds to this process's environment,
    ``mpiexec``: the launcher (the venv's by default), ``script``: one that runs
    drivers/train_jobs.py after setting up what its jobs need (a test registering its own policy)."""
    fd, path = tempfile.mkstemp(prefix="jobs-", suffix=".json", dir=workdir)
    with os.fdopen(fd, "w") as f:
        json.dump(jobs, f)
    script = script or os.path.join(REPO, "drivers", "train_jobs.py")
    return subprocess.run([mpiexec or MPIEXEC, "-n", str(ranks), sys.executable, script, path],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def train_jobs(jobs: list[tuple[str, str, list[str], bool]], ranks: int, cliques: int, workdir: str) -> tuple[int, str]:
    """Several jobs, each (parts, run directory, flags, trainers only), one after another in one
    ``launch_jobs`` launch (MPICH told the host is CLIQUES nodes), each as ``train_job`` runs it
    alone. Returns (how many jobs finished, in order; the launch's stderr tail when one failed,
    else "")."""
    proc = launch_jobs([{"argv": ["--data", parts, "--run-dir", run_dir, *JOB_FLAGS, *flags], "trainers_only": alone}
                        for parts, run_dir, flags, alone in jobs], ranks, workdir,
                       env={"MPIR_CVAR_NUM_CLIQUES": str(cliques)}, timeout=3600 * len(jobs))
    finished = sum(line.startswith("== job ") and line.endswith(" done") for line in proc.stdout.splitlines())
    return finished, (proc.stderr[-3000:] or f"exit {proc.returncode}") if proc.returncode else ""
