"""Shared fixtures: real datasets from ../shared/data when present, small generated ones always."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from bench.mpi_job import launch_jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("RUDDER_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
BUNDLED_CORA = os.path.join(REPO, "data", "cora")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Under mpiexec every rank runs pytest with the same --basetemp; give each rank its own
    # (pytest clears basetemp at start, so shared ones race).
    if getattr(config.option, "with_mpi", False) and config.option.basetemp:
        from mpi4py import MPI

        if MPI.COMM_WORLD.size > 1:
            os.makedirs(config.option.basetemp, exist_ok=True)  # pytest creates only the last level
            config.option.basetemp = os.path.join(config.option.basetemp, f"rank{MPI.COMM_WORLD.rank}")
            if MPI.COMM_WORLD.rank and getattr(config.option, "xmlpath", None):  # rank 0 writes the report
                config.option.xmlpath = f"{config.option.xmlpath}.rank{MPI.COMM_WORLD.rank}"


MPI_TEST_FILES = "test_mpi_"  # tests/run_suite.sh runs only these files under mpiexec


def pytest_collection_modifyitems(config, items):
    # The suite's MPI runs collect only tests/test_mpi_*.py (collecting every file cost each rank
    # about 3 s of CPU): an MPI test anywhere else would never run, so it is an error here.
    stray = sorted({item.path.name for item in items
                    if item.get_closest_marker("mpi") and not item.path.name.startswith(MPI_TEST_FILES)})
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)}: MPI tests (marked mpi) belong in tests/{MPI_TEST_FILES}*.py, "
                                "the only files tests/run_suite.sh runs under mpiexec")


def shared_dataset(kind: str, name: str) -> str:
    """Spec of a real dataset in ../shared/data, or skip the test with the reason."""
    if kind == "planetoid":
        path = os.path.join(SHARED_DATA, "planetoid")
        needed = os.path.join(path, f"ind.{name}.graph")
    else:
        path = os.path.join(SHARED_DATA, "musae")
        needed = os.path.join(path, f"{name}_edges.csv")
    if not os.path.isfile(needed):
        pytest.skip(f"real dataset {name} not present at {needed} (../shared/data is absent on this machine)")
    return f"{kind}:{path}:{name}"


def mpiexec() -> str:
    """The venv's mpiexec (mpich extra), else the system one; skips the test when there is none."""
    from rudder.comm.runtime import find_mpiexec

    path = find_mpiexec()
    if not path:
        pytest.skip("no mpiexec on this machine (install the mpich extra)")
    return path


def train_command(ranks: int, *args) -> list[str]:
    """``mpiexec -n RANKS python drivers/train.py ARGS``, as a user launches training."""
    return [mpiexec(), "-n", str(ranks), sys.executable, os.path.join(REPO, "drivers", "train.py"), *map(str, args)]


def run_train(ranks: int, *args, timeout=300, env=None):
    return subprocess.run(train_command(ranks, *args), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def run_trains(ranks: int, jobs: list, workdir, timeout=600, env=None, script=None):
    """Several training jobs of ``ranks`` ranks in one launch (drivers/train_jobs.py, through
    ``bench.mpi_job.launch_jobs``; ``script``: a launcher of its own that runs it): ``jobs``, a list
    of argument lists as ``run_train`` takes them, run one after another in the same processes
    (``{"argv": [...], "trainers_only": True}``: a job without the agent ranks of the others, see
    drivers/train_jobs.py). A check of each job's logs is a check of that job, as launched alone;
    only the start-up's imports are paid once."""
    def entry(job):
        return ({**job, "argv": [str(a) for a in job["argv"]]} if isinstance(job, dict) else [str(a) for a in job])

    return launch_jobs([entry(job) for job in jobs], ranks, str(workdir), env=env, timeout=timeout, mpiexec=mpiexec(),
                       script=script and str(script))


def read_logs(run_dir) -> list[dict]:
    """Every rank's log in RUN_DIR, in rank order, read by the library's reader
    (``rudder.logs.reader``): ``attrs`` (JSON ones parsed), ``layout``, ``run``, ``role``,
    ``status``, each table there (``minibatches``, ``epochs``, ``decisions``, ``outcomes``,
    ``classifier_trace``), a trainer's ``trace`` (remote input IDs per minibatch, with ``--trace``)
    and an agent's ``prompt``, ``answer`` and ``fallback_reason`` texts."""
    import glob

    from rudder.logs.reader import read_rank

    out = []
    for path in sorted(glob.glob(os.path.join(str(run_dir), "rank-*.h5"))):
        log = read_rank(path)
        out.append({"attrs": log.attrs, "layout": log.layout, "run": log.run, "role": log.role, "status": log.status,
                    **log.tables, **log.texts, "trace": log.trace})
    return out


def as_older_log(path) -> None:
    """Rewrite a rank's log as a version before the threads' CPU columns (``cpu_*``) wrote it: its
    minibatch and epoch tables without them, still extendable (a resumed run appends to them)."""
    import h5py
    import numpy as np

    from rudder.logs.schema import CPU_TIMERS

    with h5py.File(path, "r+") as f:
        for name in ("minibatches", "epochs"):
            table = f[name][()]
            kept = [c for c in table.dtype.names if c not in CPU_TIMERS]
            del f[name]
            f.create_dataset(name, data=np.array(table[kept].tolist(), dtype=[(c, table.dtype[c]) for c in kept]),
                             maxshape=(None,), chunks=True)


def rank_pids(run) -> list[int]:
    """PIDs of the Python ranks writing into ``run`` (not mpiexec's)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"python" in os.path.basename(argv[0]) and str(run).encode() in argv:
            pids.append(int(pid))
    return pids


def signal_all(pids: list[int], sig) -> None:
    """Send ``sig`` to each of ``pids`` that is still running (a rank may end meanwhile)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run_cli(*args, cwd=REPO, timeout=300, env=None):
    """Run ``python -m partitioning ARGS`` as a user would; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    return subprocess.run([sys.executable, "-m", "partitioning", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


@pytest.fixture
def cora_copy(tmp_path):
    """A writable copy of the bundled Cora files (for corrupting in bad-input tests)."""
    dst = tmp_path / "cora"
    shutil.copytree(BUNDLED_CORA, dst)
    return dst


def partition_on_rank0(tmp_path_factory, spec: str, name: str, method: str = "metis", seed: int = 0,
                       feature_dtype: str = "auto") -> str:
    """Under MPI: rank 0 partitions ``spec`` into one part per rank and every rank gets the
    directory. A failure on rank 0 reaches every rank, so none waits in bcast forever."""
    from mpi4py import MPI

    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    comm = MPI.COMM_WORLD
    out, error = None, None
    if comm.rank == 0:
        try:
            out = str(tmp_path_factory.mktemp(name) / "parts")
            partition_graph(load_spec(spec), comm.size, out, method=method, seed=seed, feature_dtype=feature_dtype)
        except Exception as e:
            error = f"rank 0 could not partition {spec}: {type(e).__name__}: {e}"
    out, error = comm.bcast((out, error), root=0)
    if error:
        pytest.fail(error)
    return out


def assert_trained_alike(runs, first_steps: int):
    """Both layers start from the same parameters (one seed), see the same minibatches and drop
    the same units: their losses agree to float32 rounding on the first steps; later, rounding
    may grow through training as any change of summation order does, so the final accuracy is held
    to the seed-to-seed spread of tests/test_train.py's accuracy test (2 points), not to the bit."""
    import numpy as np

    for ours, theirs in zip(runs["torch"], runs["dgl"]):
        np.testing.assert_allclose(ours["minibatches"]["loss"][:first_steps], theirs["minibatches"]["loss"][:first_steps],
                                   rtol=1e-5)
        np.testing.assert_array_equal(ours["minibatches"]["input_nodes"], theirs["minibatches"]["input_nodes"])
    accuracy = {impl: float(files[0]["epochs"]["test_acc"][-1]) for impl, files in runs.items()}
    assert abs(accuracy["torch"] - accuracy["dgl"]) <= 0.02, accuracy
    return accuracy
