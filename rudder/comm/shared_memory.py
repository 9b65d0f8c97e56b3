"""Arrays shared by the trainers of one node, with a node-wide mutex.

Each array is its own ``Win.Allocate_shared`` window on the node's trainer communicator, held by
the node's first trainer and mapped by the others (``Shared_query``), so every trainer loads and
stores the same memory (MPI's unified memory model: plain loads and stores, ordered by the mutex).

``lock()`` is an exclusive ``flock`` on a file in node-local memory (``/dev/shm``, else the temp
directory) that every trainer of the node opened; the file is unlinked once all have, so a job
that dies leaves nothing behind. It used to be an exclusive MPI passive-target lock on the first
window, but MPICH grants that lock only when the window's owner next enters MPI: a trainer asking
while the owner computed waited that long (900 ms behind a 1 s computation; tens of ms a
minibatch in training, docs/results-agent.md). The kernel grants a flock at once, and taking and
releasing it are full memory barriers, which order the stores as ``Win.Sync`` did.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

import numpy as np

from rudder.comm import gate

LOCK_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class NodeSharedArrays:
    def __init__(self, comm):
        """Collective over ``comm`` (the trainers of one node). Every MPI call goes through the
        rank's MPI lock (``rudder.comm.gate``): a progress thread may be running."""
        self.comm, self.windows = comm, []
        path = None
        if comm.rank == 0:
            fd, path = tempfile.mkstemp(prefix="rudder-node-mutex-", dir=LOCK_DIR)
            os.close(fd)
        path = gate.collective(comm, comm.bcast, path, root=0)
        self.mutex = os.open(path, os.O_RDWR)
        gate.collective(comm, comm.Barrier)
        if comm.rank == 0:
            os.unlink(path)  # the open descriptors keep the file while the job runs

    def alloc(self, shape, dtype) -> np.ndarray:
        """Collective over ``comm``: a zeroed array every trainer of the node sees."""
        from mpi4py import MPI

        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        win = gate.collective(self.comm, MPI.Win.Allocate_shared, nbytes if self.comm.rank == 0 else 0, dtype.itemsize,
                              comm=self.comm)
        with gate.held():
            buf, _ = win.Shared_query(0)
        array = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
        if self.comm.rank == 0:
            array.fill(0)
        self.windows.append(win)
        gate.collective(self.comm, self.comm.Barrier)
        return array

    @contextlib.contextmanager
    def lock(self):
        fcntl.flock(self.mutex, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.mutex, fcntl.LOCK_UN)

    def close(self) -> None:
        """Collective over ``comm``."""
        gate.collective(self.comm, self.comm.Barrier)
        for win in self.windows:
            gate.collective(self.comm, win.Free)
        self.windows.clear()
        os.close(self.mutex)
