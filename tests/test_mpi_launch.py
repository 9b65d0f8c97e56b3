"""The launch convention the suite and drivers rely on: a rank that raises ends every rank of
the job within seconds (python -m mpi4py aborts COMM_WORLD), instead of a hang."""
from __future__ import annotations

import subprocess
import sys
import time

from conftest import mpiexec


def test_failing_rank_aborts_the_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "if comm.rank == 1:\n"
        "    raise RuntimeError('rank 1 fails')\n"
        "comm.barrier()  # the others would wait here forever without the abort\n")
    start = time.monotonic()
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", str(script)], capture_output=True,
                          text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "rank 1 fails" in proc.stderr
    assert elapsed < 20, f"job took {elapsed:.1f} s to end"
