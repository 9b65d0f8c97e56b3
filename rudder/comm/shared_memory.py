"""Arrays shared by the trainers of one node, with a node-wide mutex.

Each array is its own ``Win.Allocate_shared`` window on the node's trainer communicator, held by
the node's first trainer and mapped by the others (``Shared_query``), so every trainer loads and
stores the same memory. ``lock()`` is an exclusive passive-target lock on the first window:
MPI serialises exclusive epochs on one target, which makes it a mutex between the processes,
and ``Sync`` inside it orders the loads and stores (MPI's unified memory model).
"""
from __future__ import annotations

import contextlib

import numpy as np


class NodeSharedArrays:
    def __init__(self, comm):
        self.comm, self.windows = comm, []

    def alloc(self, shape, dtype) -> np.ndarray:
        """Collective over ``comm``: a zeroed array every trainer of the node sees."""
        from mpi4py import MPI

        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        win = MPI.Win.Allocate_shared(nbytes if self.comm.rank == 0 else 0, dtype.itemsize, comm=self.comm)
        buf, _ = win.Shared_query(0)
        array = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
        if self.comm.rank == 0:
            array.fill(0)
        self.windows.append(win)
        self.comm.Barrier()
        return array

    @contextlib.contextmanager
    def lock(self):
        from mpi4py import MPI

        win = self.windows[0]
        win.Lock(0, MPI.LOCK_EXCLUSIVE)
        win.Sync()
        try:
            yield
        finally:
            win.Sync()
            win.Unlock(0)

    def close(self) -> None:
        """Collective over ``comm``."""
        self.comm.Barrier()
        for win in self.windows:
            win.Free()
        self.windows.clear()
