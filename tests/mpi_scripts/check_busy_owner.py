"""Launched by tests/test_gate.py under ``mpiexec -n 2`` over OFI/TCP with MPIR_CVAR_NUM_CLIQUES=2
(two emulated nodes): rank 0 reads rows of rank 1's partition by one indexed Get while rank 1
sleeps in Python without entering MPI, first with rank 1's progress thread off, then on
(rudder.comm.progress). Rank 0 checks the rows and prints one JSON line: {mode: [seconds the read
took, seconds the owner slept]}.

    python -m mpi4py check_busy_owner.py PARTS_DIR SLEEP_OFF SLEEP_ON
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from rudder.comm import gate, waiting
from rudder.comm.layout import build_layout
from rudder.comm.progress import ProgressThread
from rudder.data.feature_store import FeatureStore
from rudder.data.partition_store import PartitionMeta, read_features

parts_dir, sleeps = sys.argv[1], {"off": float(sys.argv[2]), "thread": float(sys.argv[3])}
world = MPI.COMM_WORLD
meta = PartitionMeta.load(parts_dir)
layout = build_layout(meta.num_parts, mpi_wait="yield")
store = FeatureStore(layout, meta, parts_dir, gets="indexed")
assert layout.num_nodes == 2 and (world.rank == 1 or 1 not in store.views), "rank 1's rows must come by RMA Get"
ids = np.arange(meta.offsets[1], meta.offsets[2])[::2]
truth = read_features(parts_dir, 1, meta)[::2]


def meet() -> None:  # through the MPI lock: the progress thread may be running
    with gate.held():
        barrier = world.Ibarrier()
    waiting.wait_all([barrier], "yield")


took = {}
for mode, sleep in sleeps.items():
    thread = ProgressThread(layout.trainers) if mode == "thread" and world.rank == 1 else None
    meet()
    start = time.perf_counter()
    if world.rank == 0:
        rows, stats = store.gather(ids)
        took[mode] = [time.perf_counter() - start, sleep]
        assert stats.rows_remote == ids.size and np.array_equal(rows, truth), "rows differ from the owner's"
    else:
        time.sleep(sleep)  # the owner computes: no thread of it inside MPI (but the progress thread's)
    if thread is not None:
        thread.close()
    meet()
store.close()
if world.rank == 0:
    print(json.dumps(took), flush=True)
