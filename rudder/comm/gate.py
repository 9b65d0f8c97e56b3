"""One thread of a rank inside MPI at a time: the process-wide discipline every MPI call of a
rank's threads (training, pipeline, agent link) follows (issue 38).

Two threads of one rank inside MPICH at once were the suspect of the replicas that diverged on a
16-core machine (docs/training.md, "Replicas that diverged"): the training thread spinning in
``Waitall`` on the gradient ``Iallreduce`` while the pipeline thread's Gets and Flushes progressed
the same VCI. Whatever the library's bug, a rank whose threads never meet inside MPI cannot
trigger it. The library still grants ``MPI_THREAD_MULTIPLE`` (calls come from several threads,
one at a time).

The discipline, and why it cannot deadlock: the lock (``held``) is taken around calls that
return without waiting for another rank (issuing Gets and Rgets, building datatypes, starting an
``Iallreduce``, one ``Testall``, one ``Iprobe``, a ``Flush`` of Gets already completed). A wait
for another rank is a test loop (``complete``) that takes the lock for each test and releases it
between tests, so the rank's other thread gets in between and its Gets still progress; a test
that finds the lock held is skipped, not waited for (the holder is progressing MPI). A
blocking collective (``collective``) first meets its peers in an ``Ibarrier`` completed the same
way, and only then enters the call under the lock: by then every peer has reached it too, and
each peer's lock is held only for calls that return without waiting on a rank, so the call waits
for nothing but the peers' locks. ``MPI_Abort`` is exempt: it ends the process. The RMA progress
thread (``rudder.comm.progress``) takes the lock only when it is free (``Gate.poke``), for one
progress call that returns at once. Every MPI call of a rank's start-up follows the discipline
too, so the thread can run from the rank's first RMA window on; until ``started``, a
collective's meeting sleeps longer between tests (``STARTING_SLEEP``): start-up waits are long
(ranks finish their imports and file reads seconds apart) and no minibatch waits on them.

``--mpi-lock off`` (``enable(False)``) turns the discipline off, the code's behaviour before it
(for measuring its cost side by side, and for the stress harness's bisection). Whether the
discipline holds is counted below Python, by a PMPI shim that wraps every MPI function
(``bench/mpi_overlap.py``; ``tests/test_gate.py``).
"""
from __future__ import annotations

import contextlib
import threading
import time

ENABLED = True  # ``enable``: set once, before a rank's second thread starts
FIRST_SLEEP = 10e-6  # ``yield``: seconds before the second test
MAX_SLEEP = 100e-6  # ``yield``: the longest sleep between tests (a sleeping rank serves no one's Gets)
# A starting rank's wait for its peers in a collective: the sleep between tests grows with the wait
# so far (STARTING_GROWTH of it, so a wake-up comes at most that share late) up to STARTING_SLEEP.
# Ranks start at different times (an import or a file read of one rank takes seconds more than
# another's), and a rank polling all that time takes a core from the ranks still working where
# ranks share cores. A rank's readers are served meanwhile by its progress thread where it runs.
STARTING_SLEEP = 5e-3
STARTING_GROWTH = 1 / 8
STARTING = True  # until ``started``: the rank's start-up, whose collectives wait with growing sleeps


class Gate:
    """The lock, with a count of threads waiting for it, so that a thread testing in a loop lets
    a waiting thread in (Python's lock is not fair: a thread that releases and takes it again at
    once would keep it from a waiter for long stretches)."""

    def __init__(self):
        self.lock = threading.RLock()  # reentrant: a call under the lock may call another (a read's progress pokes)
        self.counting = threading.Lock()
        self.waiting = 0
        self.left = 0.0  # perf_counter when a thread last released the lock (MPI progressed until then)

    @contextlib.contextmanager
    def held(self):
        if not self.lock.acquire(blocking=False):
            with self.counting:
                self.waiting += 1
            self.lock.acquire()
            with self.counting:
                self.waiting -= 1
        try:
            yield
        finally:
            self.left = time.perf_counter()
            self.lock.release()

    def attempt(self, call) -> tuple[bool, object]:
        """``(True, call())`` under the lock if no thread holds it now; ``(False, None)`` at once if
        one does: that thread is inside MPI, progressing what the caller waits for too, and the
        caller tries again after its own pause instead of sleeping on the lock until the holder's
        release wakes it (on an oversubscribed host each such wake-up waited about half a
        millisecond for a core: docs/replicas.md, "The lock's cost")."""
        if not self.lock.acquire(blocking=False):
            return False, None
        try:
            return True, call()
        finally:
            self.left = time.perf_counter()
            self.lock.release()

    def poke(self, call, quiet: float) -> bool:
        """``call()`` under the lock, without waiting for it: only if no thread holds it (a thread
        that does is inside MPI, progressing it) and none released it within the last ``quiet``
        seconds (MPI progressed just now). Whether it called (``rudder.comm.progress``)."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if time.perf_counter() - self.left < quiet:
                return False
            call()
            self.left = time.perf_counter()
            return True
        finally:
            self.lock.release()

    def let_in(self) -> None:
        """Between two tests: if a thread waits for the lock, give it the interpreter until it has it."""
        while self.waiting:
            time.sleep(0)


GATE = Gate()


def enable(on: bool) -> None:
    """Turn the discipline on or off for this process; only before a second thread enters MPI."""
    global ENABLED
    ENABLED = bool(on)


def held():
    """The lock around calls that return without waiting for another rank (a no-op when off)."""
    return GATE.held() if ENABLED else contextlib.nullcontext()


def attempt(call) -> tuple[bool, object]:
    """``(tested, call())``: ``Gate.attempt`` with the gate on (``(False, None)`` while another
    thread holds the lock); with it off, the call at once."""
    return GATE.attempt(call) if ENABLED else (True, call())


def complete(requests: list, mode: str) -> None:
    """Complete every request (mpi4py ``Request``s): ``spin`` tests back to back, ``yield``
    sleeps between tests (``rudder.comm.waiting``). With the gate on, each test is an ``attempt``:
    under the lock when it is free, skipped when another thread holds it (that thread's call
    progresses these requests too), and the other thread gets in between; off, ``spin`` waits in
    ``Waitall`` as before."""
    from mpi4py import MPI

    if not ENABLED and mode == "spin":
        MPI.Request.Waitall(requests)
        return
    delay = FIRST_SLEEP
    test = lambda: MPI.Request.Testall(requests)  # noqa: E731
    while True:
        tested, done = attempt(test)
        if done:
            return
        if mode == "spin":
            if tested:
                GATE.let_in()
            else:
                time.sleep(0)  # the holder is inside MPI: let it have the interpreter, then try again
        else:
            time.sleep(delay)
            delay = min(MAX_SLEEP, 2 * delay)


def started() -> None:
    """The rank's start-up is over: from now on a collective's wait sleeps at most ``MAX_SLEEP``
    between tests, as every wait in training does (a peer may be reading this rank's rows)."""
    global STARTING
    STARTING = False


def settle(request, sleep: float) -> None:
    """Wait for one request testing every ``sleep`` seconds (for waits that must not spin: an
    agent that may share this core), each test under the lock."""
    wait_growing(request, 0.0, sleep, shortest=sleep)


def collective(comm, call, /, *args, **kwargs):
    """``call(*args, **kwargs)``, a blocking collective over ``comm``, entered once every rank of
    ``comm`` has reached it (an ``Ibarrier`` completed by tests: during the rank's start-up with
    sleeps that grow with the wait, ``wait_growing``), under the lock; its result. Off: the call
    alone."""
    if not ENABLED:
        return call(*args, **kwargs)
    with held():
        barrier = comm.Ibarrier()
    if STARTING:
        wait_growing(barrier, STARTING_GROWTH, STARTING_SLEEP)
    else:
        complete([barrier], "yield")
    with held():
        return call(*args, **kwargs)


def wait_growing(request, growth: float, longest: float, shortest: float = FIRST_SLEEP) -> None:
    """Wait for one request, each test under the lock, sleeping between tests ``growth`` times the
    wait so far (at least ``shortest``, at most ``longest``): a short wait is noticed within
    microseconds, a long one costs a test every ``longest`` seconds."""
    start = time.perf_counter()
    while True:
        _, done = attempt(request.Test)
        if done:
            return
        time.sleep(min(longest, max(shortest, growth * (time.perf_counter() - start))))
