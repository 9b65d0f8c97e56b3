"""Shared by the MPI benchmarks: a benchmark script re-launches itself under mpiexec with
``--worker --workdir DIR`` and the same arguments; rank 0 prints one JSON line of results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_worker_job(script: str, argv: list[str], ranks: int, env: dict | None = None, timeout: int = 1200) -> dict:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", os.path.abspath(script),
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
