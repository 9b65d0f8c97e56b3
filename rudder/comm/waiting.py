"""How a thread waits for MPI operations to complete: ``spin`` in MPI's own blocking calls, which
poll the network until done, or ``yield``: test, and sleep between tests.

A blocking MPICH call keeps its thread runnable the whole time it waits (over OFI/TCP each poll
is a system call). Where every rank's two threads (training and pipeline) have a core each, that
costs nothing. Where they share fewer cores (ranks oversubscribed on a laptop, or this project's
2-core hosts), the waiting threads take the cores from the threads with work: the slowest
trainer's sampling, assembly and forward pass run a fraction of the time, and the run is slower
than its wire (docs/network.md, "Waiting without spinning"). ``yield`` tests after a short sleep
that doubles up to ``MAX_SLEEP``, so a quick completion costs a few microseconds and a long wait
a small share of a core. The cap is short because over OFI/TCP a rank serves the Gets of its
rows only while one of its threads is in MPI: with sleeps of up to 1 ms the wire idled between
wake-ups and bandwidth-bound runs were slower than spinning.

With the MPI lock on (``rudder.comm.gate``, the default) ``spin`` is a loop of tests too, with no
sleep between them: a blocking ``Waitall`` would hold the lock the whole wait.

``auto`` (``resolve``) yields when a rank may use fewer cores than it has threads (the layout's
``threads_per_rank``), and spins otherwise (a cluster node's cores bound to its ranks).
"""
from __future__ import annotations

from rudder.comm import gate

WAITS = ("auto", "spin", "yield")
FIRST_SLEEP, MAX_SLEEP = gate.FIRST_SLEEP, gate.MAX_SLEEP  # ``yield``'s sleeps (kept in gate, where the loop is)
THREADS_PER_TRAINER = 2  # the training thread and the pipeline thread


def resolve(choice: str, threads_per_rank: int) -> str:
    """``spin`` or ``yield`` for a ``--mpi-wait`` choice on a rank allowed ``threads_per_rank`` cores."""
    if choice not in WAITS:
        raise ValueError(f"--mpi-wait {choice}: expected one of {', '.join(WAITS)}")
    if choice != "auto":
        return choice
    return "yield" if threads_per_rank < THREADS_PER_TRAINER else "spin"


def wait_all(requests: list, mode: str) -> None:
    """Complete every request (mpi4py ``Request``s) the way ``mode`` says, one test at a time
    under the rank's MPI lock (``rudder.comm.gate``): ``spin`` never sleeps, yet lets the rank's
    other thread into MPI between two tests."""
    gate.complete(requests, mode)
