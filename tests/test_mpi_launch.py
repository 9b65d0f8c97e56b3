"""The launch convention the suite and drivers rely on: a rank that raises ends every rank of
the job within seconds (python -m mpi4py aborts COMM_WORLD), instead of a hang."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from conftest import REPO, mpiexec

from rudder.comm.runtime import written_out


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


def test_a_rank_leaves_with_its_status_and_its_output(tmp_path):
    """rudder.comm.runtime.leave, as drivers/train.py ends: every rank's last line, still in
    Python's buffer, is printed, and the job's status is the ranks' own every time (leaving by
    os._exit made MPICH's launcher kill the ranks still finishing, exit 9, in some launches); a
    rank whose own thread still works leaves as Python does, after it."""
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, threading, time\n"
        "from mpi4py import MPI\n"
        "from rudder.comm.runtime import leave\n"
        "rank = MPI.COMM_WORLD.rank\n"
        "if sys.argv[1] == 'thread':\n"
        "    threading.Thread(target=lambda: (time.sleep(0.5), print(f'thread of rank {rank} done'))).start()\n"
        "print(f'rank {rank} leaving', end='')\n"
        "leave(3)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # CI images set it; users do not
    for mode in ["plain"] * 6 + ["thread"]:
        proc = subprocess.run([mpiexec(), "-n", "4", sys.executable, str(script), mode], capture_output=True, text=True,
                              timeout=60, env={**env, "PYTHONPATH": REPO})
        assert proc.returncode == 3, (mode, proc.returncode, proc.stdout[-2000:])
        assert all(f"rank {r} leaving" in proc.stdout for r in range(4)), proc.stdout
        assert (proc.stdout.count("done") == 4) == (mode == "thread"), proc.stdout


def test_an_aborting_rank_waits_until_its_launcher_has_read_its_line(tmp_path):
    """``abort_job`` calls Abort only once the pipe to its launcher is read (``written_out``), at
    most a few seconds: unread, it gives up; read late, it returns after the read began; a file
    or anything but a pipe, at once."""
    r, w = os.pipe()
    os.write(w, b"train.py: error on rank 0: ...\n")
    assert not written_out(w, 0.05)  # nobody reads
    began, got = [], []

    def launcher():
        time.sleep(0.2)
        began.append(time.monotonic())
        got.append(os.read(r, 4096))

    reader = threading.Thread(target=launcher)
    reader.start()
    assert written_out(w, 30.0)
    returned = time.monotonic()
    reader.join()
    assert got == [b"train.py: error on rank 0: ...\n"] and returned >= began[0]
    os.close(r)
    os.close(w)
    with open(tmp_path / "stderr.txt", "wb") as f:
        f.write(b"a line")
        f.flush()
        assert written_out(f.fileno(), 0.0)


def test_an_aborting_rank_goes_no_further(tmp_path):
    """``abort_job`` ends its rank even where MPI_Abort returns (MPICH's did, most times, having
    told mpiexec): nothing after it runs, and the job ends with the one line, once."""
    script, went_on = tmp_path / "job.py", tmp_path / "went-on"
    script.write_text(
        "from mpi4py import MPI\n"
        "from rudder.comm.runtime import abort_job\n"
        "comm = MPI.COMM_WORLD\n"
        "if comm.rank == 0:\n"
        "    abort_job(None, 'rank 0 gives up', code=3)\n"
        f"    open({str(went_on)!r}, 'w').write('past the abort')\n"
        "comm.Barrier()  # the others wait here until the job is ended\n")
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode != 0 and proc.stderr.count("rank 0 gives up") == 1, proc.stderr[-2000:]
    assert not went_on.exists()
