"""How a job ends: the same error on every rank, a failing rank taking the job down, and
signals that stop training cleanly.

* Errors every rank can see (bad flags, bad --data, a layout mismatch) are agreed on with one
  allgather, so every rank exits with the same one-line message printed once, by rank 0.
* Any other exception on any rank prints that rank's error and calls ``COMM_WORLD.Abort``, which
  ends every rank of the job within a second under mpiexec and srun (instead of the others
  waiting forever in the next collective). The rank first waits, briefly, until its launcher has
  read that line, and exits at once should Abort return.
* SIGINT/SIGTERM (Ctrl-C under mpiexec, scancel or the time limit under Slurm) ask for a stop:
  the request rides in the next gradient Allreduce, so all ranks stop after the same step and
  close their logs. A second signal, or no clean stop within ``grace`` seconds, aborts at once.
"""
from __future__ import annotations

import ctypes
import fcntl
import importlib.metadata
import os
import platform
import shutil
import signal
import socket
import stat
import struct
import sys
import termios
import threading
import time
import traceback
from typing import NoReturn

import numpy as np

import rudder
from rudder.comm import gate
from rudder.comm.mpi_env import NETMOD, PROVIDER


def find_mpiexec() -> str | None:
    """The launcher beside this Python (the venv's, from the mpich extra), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


def require_thread_multiple() -> None:
    """The pipeline thread issues Gets and Isends while the main thread is in Allreduce, which MPI
    allows only at ``MPI_THREAD_MULTIPLE``: raise a one-line RuntimeError naming the MPI if it was
    not granted (Cray MPICH grants it with MPICH_MAX_THREAD_SAFETY=multiple, set by jobscripts/)."""
    from mpi4py import MPI

    granted = MPI.Query_thread()
    if granted != MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED"}
        library = MPI.Get_library_version().splitlines()[0].strip()
        raise RuntimeError(f"the MPI library ({library}) granted MPI_THREAD_{names.get(granted, granted)}, but Rudder needs "
                           f"MPI_THREAD_MULTIPLE (on Cray MPICH: export MPICH_MAX_THREAD_SAFETY=multiple)")


def mpi_cuda_support() -> bool | None:
    """Whether the MPI library takes CUDA device buffers: mpi4py's own query where it has one,
    else ``MPIX_Query_cuda_support`` (MPICH, Open MPI) from the libmpi this process loaded; None
    when neither answers (then nothing is assumed)."""
    from mpi4py import MPI

    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        return bool(query())
    for path in _loaded_libraries("libmpi"):
        try:
            function = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        function.restype, function.argtypes = ctypes.c_int, []
        return bool(function())
    return None


def _loaded_libraries(prefix: str) -> list[str]:
    """Paths of the shared libraries mapped into this process whose names start with ``prefix``."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(prefix))


def library_versions() -> dict:
    """The versions a run log records (read from the installed distributions: no library imported)."""
    import h5py
    from mpi4py import MPI

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    with gate.held():  # a query, but an MPI call beside the progress thread's
        mpi = MPI.Get_library_version().splitlines()[0].strip()
    return {"rudder": rudder.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "torch": version("torch"), "dgl": version("dgl"), "mpi4py": version("mpi4py"),
            "mpi": mpi, "mpi_netmod": os.environ.get(NETMOD, "default"),
            "fi_provider": os.environ.get(PROVIDER, "default"), "h5py": h5py.__version__,
            "hdf5": h5py.version.hdf5_version}


def agree_on_error(comm, error: str | None) -> str | None:
    """Collective: the first error any rank saw (prefixed with its rank when not all saw it)."""
    errors = gate.collective(comm, comm.allgather, error)
    bad = [(rank, e) for rank, e in enumerate(errors) if e]
    if not bad:
        return None
    rank, message = bad[0]
    return message if len(bad) == len(errors) else f"rank {rank}: {message}"


# How long an aborting rank waits for its launcher to read its last line (``written_out``).
ABORT_DRAIN_SECONDS = 2.0


def written_out(fd: int, seconds: float) -> bool:
    """Whether the reader of ``fd``, where it is a pipe (mpiexec's proxy or slurmstepd reading a
    rank's stderr), has read everything written to it, waiting up to ``seconds`` for it; True at
    once for anything else (a file, a terminal). A pipe's unread bytes are its FIONREAD count,
    from either end."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return True
        deadline = time.monotonic() + seconds
        while True:
            unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
            if unread == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
    except OSError:
        return True


def abort_job(exc: BaseException | None, message: str = "", log=None, code: int = 1) -> NoReturn:
    """Print this rank's error, mark its log failed, and abort every rank of the job; never returns."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    where = f"rank {world.rank} ({socket.gethostname()}, pid {os.getpid()})"
    text = ""
    if exc is not None:
        text = "".join(traceback.format_exception(exc))
        message = message or f"{type(exc).__name__}: {exc}"
    # One write for the traceback and the line: after Abort, mpiexec's I/O forwarding may drop
    # what a rank wrote last, and two writes lost the line behind its traceback (a test saw it).
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"{text}train.py: error on {where}: {message}; aborting the job\n".encode())
    if log is not None:
        try:
            log.close("failed", f"{where}: {message}")
        except Exception as e:  # the log must not stop the abort
            sys.stderr.write(f"train.py: {where}: could not finalise log {log.path}: {e}\n")
    # The launcher reads the line before it hears of the Abort: on a busy host a test once got
    # none of an aborting rank's stderr, not even MPICH's own line, as if its pipe was never read.
    sys.stderr.flush()
    written_out(sys.stderr.fileno(), ABORT_DRAIN_SECONDS)
    world.Abort(code)
    # MPICH's MPI_Abort may return once it has told the launcher (the PyPI wheel under mpiexec did,
    # most times; pmodels/mpich#7716): the rank would go on with its job, past the error, until the
    # launcher kills it.
    os._exit(code)


def leave(status: int | None) -> None:
    """End a rank's process with ``status`` once its job has returned (its logs and files closed).
    Python's own teardown would destroy torch's and the library's objects one by one, about half a
    second of CPU a rank (docs/results-scale.md): the rank flushes its output, finalises MPI and
    exits at once, unless a thread of its own is still at work (Python's exit waits for it) or the
    rank used a GPU."""
    from mpi4py import MPI

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        sys.exit(status)  # a GPU rank's CUDA context is torn down as torch expects (not tried without: no GPU here)
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    # C's exit, not os._exit: the MPI library's own exit handlers must run, or its process manager
    # takes the exit for a crash and kills the ranks still finishing (MPICH's hydra: exit code 9)
    ctypes.CDLL(None).exit(int(status or 0))


class StopRequest:
    """Call it to learn whether a stop was requested; ``signum``/``signame`` say which signal."""

    def __init__(self, on_force, grace: float = 15.0):
        self.signum, self.signame = 0, None
        self.on_force, self.grace, self.timer = on_force, grace, None
        self.previous: dict = {}

    def install(self) -> StopRequest:
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __call__(self) -> bool:
        return self.signame is not None

    def _handle(self, signum, frame):
        if self.signame is not None:  # asked twice: stop now
            self.on_force(f"second signal {signal.Signals(signum).name}")
            return
        self.signum, self.signame = signum, signal.Signals(signum).name
        self.timer = threading.Timer(self.grace, self.on_force, args=(f"no clean stop {self.grace:.0f} s after {self.signame}",))
        self.timer.daemon = True
        self.timer.start()

    def stopped_cleanly(self) -> None:
        """The job stopped in time: no forced abort any more, and the signals handled as before."""
        if self.timer is not None:
            self.timer.cancel()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
