"""The RMA probe that bench/netem_rate.py and tests/test_netem.py run with mpiexec -n 2 inside python
-m rudder.netem: rank 0 reads rank 1's window with ``Get`` + ``Flush`` (the path remote features
take), COUNT times SIZE bytes, checks every byte, and prints one JSON line: the bytes it moved,
each Get's seconds, the 4-byte round trip, and MPICH's view of the nodes.

    rma_gets.py SIZE_BYTES COUNT
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI

size, count = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD
win = MPI.Win.Allocate(size, comm=comm)
mine = np.frombuffer(win.tomemory(), dtype=np.uint8)
mine[:] = np.arange(size, dtype=np.uint64).astype(np.uint8) + comm.rank
node = comm.Split_type(MPI.COMM_TYPE_SHARED)
comm.Barrier()
win.Lock_all(MPI.MODE_NOCHECK)
seconds, small = [], []
if comm.rank == 0:
    out, tiny = np.empty(size, np.uint8), np.empty(4, np.uint8)
    expected = np.arange(size, dtype=np.uint64).astype(np.uint8) + 1
    for _ in range(count):
        t = time.perf_counter()
        win.Get(out, 1)
        win.Flush(1)
        seconds.append(time.perf_counter() - t)
        assert (out == expected).all(), "a Get returned wrong bytes"
    for _ in range(20):
        t = time.perf_counter()
        win.Get(tiny, 1)
        win.Flush(1)
        small.append(time.perf_counter() - t)
comm.Barrier()
win.Unlock_all()
win.Free()
if comm.rank == 0:
    print(json.dumps({"bytes": size * count, "get_seconds": seconds, "small_get_us": float(np.median(small)) * 1e6,
                      "ranks_on_my_node": node.size}), flush=True)
