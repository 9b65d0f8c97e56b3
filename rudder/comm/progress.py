"""A rank's progress thread (``--rma-progress``): other nodes' Gets of this rank's rows served while
the rank's own threads compute outside MPI (issue 40).

Where the network does not serve a Get by itself, the owner's MPI library must do work for it,
and a library works only inside an MPI call of the owner: MPICH serves indexed (non-contiguous)
Gets between nodes by active messages on every transport, and over OFI with libfabric's tcp
provider (the mpich wheel's, and this project's emulated nodes) contiguous Gets as well. Without
help, a reader's minibatch waited for its slowest owner's compute phase (docs/cluster.md, "Reads
from owners that compute").

The thread sleeps ``interval`` seconds, wakes, and when no thread of the rank is inside MPI and
none left it within the interval (then MPI progressed just now), makes one call that progresses
everything in flight (an ``Iprobe``) under the rank's MPI lock (``rudder.comm.gate``), taken
without waiting: a thread that holds it is inside MPI, progressing the same requests. So the
discipline of issue 38 holds (one thread of a rank inside MPI at a time), and the thread keeps the
others out of MPI for one such call at most. MPICH's own asynchronous progress
(``MPIR_CVAR_ASYNC_PROGRESS``) is not used: its thread runs inside the library beside the rank's
own, where the lock cannot reach it.

``auto`` runs the thread on trainers whose rows other nodes read (a job on one node reads its
peers' rows through shared memory, and needs no Get served) and whose threads have a core each
(``threads_per_rank`` of 2 or more, as ``--mpi-wait auto`` spins): where ranks share cores, the
thread's wake-ups and its turns at the interpreter lock come out of the training threads' time
(Facebook p4 on 2 cores ran 1.15x slower an epoch with it: docs/cluster.md).
"""
from __future__ import annotations

import threading
import time

from rudder.comm import gate, runtime
from rudder.comm.waiting import THREADS_PER_TRAINER

MODES = ("auto", "thread", "off")
# Seconds between the thread's wake-ups where a rank has a core to itself: a Get waits about this
# long for its owner's first call (docs/cluster.md has the measured read times and the cost).
INTERVAL = 1e-3


def wake_interval(ranks_per_core: float) -> float:
    """The thread's interval on a rank whose cores ``ranks_per_core`` ranks share a core of: longer
    where ranks share cores, so that a host's threads wake about 1/INTERVAL times a second a core
    whatever the number of ranks (64 ranks on 2 cores: every 32 ms; a rank's share of a core
    serves its readers no sooner than the scheduler runs it anyway)."""
    return INTERVAL * max(1.0, ranks_per_core)


def resolve(choice: str, num_nodes: int, exposes: bool, threads_per_rank: int) -> str:
    """``thread`` or ``off`` for a ``--rma-progress`` choice on a rank of a job spanning
    ``num_nodes`` nodes that ``exposes`` rows for others to read and may use ``threads_per_rank``
    cores."""
    if choice not in MODES:
        raise ValueError(f"--rma-progress {choice}: expected one of {', '.join(MODES)}")
    if choice != "auto":
        return choice
    return "thread" if num_nodes > 1 and exposes and threads_per_rank >= THREADS_PER_TRAINER else "off"


class ProgressThread:
    """Polls MPI's progress for ``comm``'s rank while its other threads stay out of MPI; start it
    once the rank's other threads enter MPI only through the lock, ``close`` it before they leave
    that discipline (or before MPI ends). ``polls``: the progress calls it made."""

    def __init__(self, comm, interval: float = INTERVAL):
        self.comm, self.interval = comm, interval
        self.polls = 0
        self.running = True
        self.thread = threading.Thread(target=self._run, name="rma-progress", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        probe = self.comm.Iprobe
        try:
            while self.running:
                time.sleep(self.interval)
                if self.running and gate.GATE.poke(probe, self.interval):
                    self.polls += 1
        except BaseException as e:  # an MPI error here would otherwise leave the readers waiting forever
            runtime.abort_job(e)

    def close(self) -> None:
        self.running = False
        self.thread.join()
