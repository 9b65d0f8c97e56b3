"""Distributed GraphSAGE training on a partitioned graph, one MPI rank per trainer.

    srun -n N python drivers/train.py --data PARTS --run-dir RUN [options]     (cluster)
    mpiexec -n N python drivers/train.py --data PARTS --run-dir RUN [options]  (locally)

PARTS comes from ``python -m partitioning``; with ``--partition-mode trainer`` (default) it holds
one partition per rank, with ``node`` one per node. Each rank writes RUN/rank-NNNNN.h5; rank 0
shows progress and prints a summary. ``--help`` lists every option (docs/options.md by section);
``--config FILE`` takes them from a TOML or JSON file. Exit status: 0 done, 2 bad input,
130/143 stopped by SIGINT/SIGTERM. The job itself is ``rudder.train.job``.
"""
import gc
import os
import sys

import mpi4py

# The imports (mpi4py, numpy, h5py, the library; torch once a rank knows it trains) make objects
# that live for the whole run, and the collector's hundreds of passes over them cost 5-9% of the
# imports' CPU (docs/results-scale.md): it stays off until rudder.train.job has imported the rank's
# role.
gc.disable()

# The pipeline thread issues RMA and sends while the main thread is in a collective: ask for
# MPI_THREAD_MULTIPLE before MPI starts (the job checks that it was granted).
mpi4py.rc.thread_level = "multiple"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rudder.comm.mpi_env import prepare_mpi_environment  # noqa: E402

prepare_mpi_environment()  # before rudder.train.job starts MPI

from rudder.comm.runtime import leave  # noqa: E402
from rudder.train.job import main  # noqa: E402

if __name__ == "__main__":
    leave(main())
