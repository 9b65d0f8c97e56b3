"""Several training jobs one after another in the same MPI processes: a grid of runs, or a test
suite's, pays MPI_Init and the imports (about 2 s of CPU a rank, most of a small job's start-up,
minutes at 256 ranks on a cluster) once per launch instead of once per run.

    mpiexec -n N python drivers/train_jobs.py JOBS.json

JOBS.json is a list of jobs, each a drivers/train.py argument list, or ``{"argv": [...],
"trainers_only": true}`` for a job without agents in a launch whose other jobs have one a node:
the highest rank of each node (where an agent would run) sits that job out, and the job runs on
the other ranks. Each job is ``rudder.train.job.main`` with its own arguments, exactly as
drivers/train.py runs it, with its own run directory and logs. Rank 0 prints ``== job K`` before
job K's output and ``== job K done`` once every rank has finished it; a job that fails ends the
launch with its status (the jobs after it do not run).
"""
import gc
import json
import os
import sys
import time

import mpi4py

gc.disable()  # for the imports, as drivers/train.py does (rudder.train.job turns it back on)

mpi4py.rc.thread_level = "multiple"  # as drivers/train.py asks, before MPI starts
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's library first

from rudder.comm.mpi_env import prepare_mpi_environment  # noqa: E402

prepare_mpi_environment()  # before MPI starts

from mpi4py import MPI  # noqa: E402

from rudder.comm.runtime import leave  # noqa: E402
from rudder.train.job import main  # noqa: E402

if len(sys.argv) != 2:
    sys.exit("usage: mpiexec -n N python drivers/train_jobs.py JOBS.json")
with open(sys.argv[1]) as f:
    jobs = json.load(f)
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
agent_slot = node.rank == node.size - 1
trainer_slots = world.Split(MPI.UNDEFINED if agent_slot else 0, key=world.rank)
for k, job in enumerate(jobs):
    if world.rank == 0:
        print(f"== job {k}", flush=True)
    argv, trainers_only = (job["argv"], job.get("trainers_only", False)) if isinstance(job, dict) else (job, False)
    if trainers_only and agent_slot:
        status = 0
    else:
        status = main([str(a) for a in argv], world=trainer_slots if trainers_only else world)
    if status:  # the same on every rank: start-up agrees on its errors, and a failure aborts the job
        sys.exit(status)
    # A rank that sat the job out (or finished first) waits here for the others: a blocking Barrier
    # would spin on a core the job's ranks need (these launches oversubscribe the host's cores)
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(0.005)
    if world.rank == 0:
        print(f"== job {k} done", flush=True)
leave(0)
