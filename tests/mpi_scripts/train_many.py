"""Several training jobs one after another in the same MPI processes (``run_trains`` in
tests/conftest.py): the suite's way to train many configurations without paying each launch's
start-up again (MPI_Init and the imports, about 2 s of CPU a rank, most of a small test job).
Each job is ``rudder.train.job.main`` with its own arguments, as drivers/train.py runs it; rank 0
prints ``== job K`` before job K's output. A job that fails ends the launch with its status.

    mpiexec -n N python tests/mpi_scripts/train_many.py JOBS.json   (JOBS.json: a list of argument lists)
"""
import json
import os
import sys

import mpi4py

mpi4py.rc.thread_level = "multiple"  # as drivers/train.py asks, before MPI starts
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi4py import MPI  # noqa: E402

from rudder.train.job import main  # noqa: E402

with open(sys.argv[1]) as f:
    jobs = json.load(f)
for k, argv in enumerate(jobs):
    if MPI.COMM_WORLD.rank == 0:
        print(f"== job {k}", flush=True)
    status = main([str(a) for a in argv])
    if status:  # the same on every rank: start-up agrees on its errors, and a failure aborts the job
        sys.exit(status)
    MPI.COMM_WORLD.Barrier()
