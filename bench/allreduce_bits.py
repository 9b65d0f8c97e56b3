"""Diagnostic (not a test): do the trainers' gradient ``Iallreduce``s give every rank the same bits?
The trainer's epoch-end digest check once found one rank's parameters apart from the others'
(docs/training.md, "On a GPU"); this isolates the reduction itself.

    MPIR_CVAR_NUM_CLIQUES=4 mpiexec -n 4 python bench/allreduce_bits.py [--floats 46000] [--iters 300] [--rma]

Each iteration sums a fresh float32 buffer of values spanning six orders of magnitude (so that
the order of the additions shows in the bits) with ``Iallreduce`` and ``Waitall``, as
``rudder.train.data_parallel`` does, then compares a digest of the result across the ranks.
``--rma``: a second thread meanwhile reads rows of the other ranks' RMA windows (``Get`` and
``Flush`` under ``Lock_all``), as the pipeline thread does during training. Prints the number of
iterations whose results differed between ranks.
"""
from __future__ import annotations

import argparse
import hashlib
import threading

import mpi4py

mpi4py.rc.thread_level = "multiple"
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

ROWS, DIM, ROWS_A_GET = 20_000, 64, 64


def read_windows(win, comm, stop: threading.Event) -> None:
    rng, out = np.random.default_rng(comm.rank + 7), np.empty((ROWS_A_GET, DIM), np.float32)
    while not stop.is_set():
        target = int(rng.integers(comm.size))
        if target == comm.rank:
            continue
        first = int(rng.integers(ROWS - ROWS_A_GET))
        win.Get([out, ROWS_A_GET * DIM, MPI.FLOAT], target, target=(first * DIM, ROWS_A_GET * DIM, MPI.FLOAT))
        win.Flush(target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floats", type=int, default=46_000)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rma", action="store_true")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    win = reader = None
    stop = threading.Event()
    if args.rma:
        win = MPI.Win.Allocate(ROWS * DIM * 4, disp_unit=4, comm=comm)
        np.frombuffer(win.tomemory(), dtype=np.float32)[:] = np.random.default_rng(comm.rank).standard_normal(ROWS * DIM)
        comm.Barrier()
        win.Lock_all(MPI.MODE_NOCHECK)
        reader = threading.Thread(target=read_windows, args=(win, comm, stop))
        reader.start()
    rng, differing = np.random.default_rng(comm.rank), 0
    for _ in range(args.iters):
        buf = (rng.standard_normal(args.floats) * 10.0 ** rng.uniform(-3, 3, args.floats)).astype(np.float32)
        MPI.Request.Waitall([comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)])
        digests = comm.allgather(hashlib.blake2b(buf.tobytes(), digest_size=8).digest())
        differing += len(set(digests)) != 1
    if reader is not None:
        stop.set()
        reader.join()
        comm.Barrier()
        win.Unlock_all()
        win.Free()
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.floats} floats, {args.iters} Iallreduces{' beside RMA reads' if args.rma else ''}: "
              f"{differing} gave ranks different bits ({MPI.Get_library_version().splitlines()[0].strip()})")


if __name__ == "__main__":
    main()
