"""One thread of a rank inside MPI at a time (rudder.comm.gate, issue 38): the lock's waits let the
other thread in, a training run with the lock has no two threads inside MPI at once (counted below
Python by bench/mpi_overlap.py's shim), its RMA progress thread included (rudder.comm.progress,
issue 40), and trains bit-identically to one without it, and the stress harness
(bench/replica_stress.py) runs and forces the overlap the lock removes. The progress thread serves
a read from an owner that computes outside MPI before the owner's compute ends."""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, mpiexec, read_logs, run_trains

from rudder.comm import gate, progress

sys.path.insert(0, os.path.join(REPO, "bench"))
import mpi_overlap  # noqa: E402


def test_a_spinning_wait_lets_the_other_thread_into_mpi():
    """The training thread tests its request in a loop without sleeping (``spin``); the pipeline
    thread's calls under the lock still get in between two tests, none beside another."""
    from mpi4py import MPI

    comm = MPI.COMM_SELF
    got = np.zeros(2, dtype=np.int64)
    request = comm.Irecv(got, source=0, tag=38)
    inside, most, entered = [0], [0], []

    def pipeline():
        for _ in range(200):
            with gate.held():
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                comm.Iprobe()
                entered.append(time.perf_counter())
                inside[0] -= 1
        with gate.held():
            comm.Send(np.array([3, 8], dtype=np.int64), dest=0, tag=38)

    other = threading.Thread(target=pipeline)
    start = time.perf_counter()
    other.start()
    gate.complete([request], "spin")
    other.join()
    assert got.tolist() == [3, 8] and len(entered) == 200 and most[0] == 1
    assert time.perf_counter() - start < 10, "the spinning wait kept the lock from the other thread"


def test_a_collective_goes_through_the_lock_and_the_switch_restores_the_old_waits():
    from mpi4py import MPI

    assert gate.collective(MPI.COMM_SELF, MPI.COMM_SELF.allgather, 5) == [5]
    try:
        gate.enable(False)
        assert isinstance(gate.held(), contextlib.nullcontext)  # off: no lock, MPI's own waits
        with gate.held():
            assert gate.collective(MPI.COMM_SELF, MPI.COMM_SELF.allgather, 6) == [6]
    finally:
        gate.enable(True)


def test_a_starting_ranks_long_wait_tests_a_few_times(monkeypatch):
    """A wait of 0.3 s for a late peer: while the rank starts up (``wait_growing``, sleeps growing
    to STARTING_SLEEP) at most a hundred-odd tests, where sleeps of at most MAX_SLEEP (training's
    ``complete``) would make thousands. Counted, not timed: a loaded host sleeps longer, which only
    lowers the count."""
    from mpi4py import MPI

    tests = [0]
    real_attempt = gate.attempt

    def counted(call):
        tests[0] += 1
        return real_attempt(call)

    monkeypatch.setattr(gate, "attempt", counted)

    def wait(waiter) -> int:
        tests[0] = 0
        got = np.zeros(1, dtype=np.int64)
        with gate.held():
            request = MPI.COMM_SELF.Irecv(got, source=0, tag=40)

        def late_peer():
            time.sleep(0.3)
            with gate.held():
                MPI.COMM_SELF.Send(np.array([40], dtype=np.int64), dest=0, tag=40)

        peer = threading.Thread(target=late_peer)
        peer.start()
        waiter(request)
        peer.join()
        assert got.tolist() == [40]
        return tests[0]

    patient = wait(lambda r: gate.wait_growing(r, gate.STARTING_GROWTH, gate.STARTING_SLEEP))
    # growing by 1/8 of the wait from FIRST_SLEEP (about 8 ln(wait / FIRST_SLEEP) tests), then one
    # test every STARTING_SLEEP
    most = 0.3 / gate.STARTING_SLEEP + math.log(0.3 / gate.FIRST_SLEEP) / gate.STARTING_GROWTH + 2
    assert patient <= most, f"{patient} tests in a starting rank's 0.3 s wait (at most {most:.0f} expected)"


def test_the_progress_thread_polls_only_while_no_thread_of_the_rank_is_in_mpi():
    """It calls MPI while the rank's threads are out of it, never while another holds the lock,
    and the auto rule runs it only where another node reads the rank's rows and its threads have a
    core each."""
    from mpi4py import MPI

    thread = progress.ProgressThread(MPI.COMM_SELF, interval=1e-3)
    try:
        time.sleep(0.2)
        assert thread.polls > 0, "no progress call while the rank was out of MPI"
        with gate.held():  # another thread inside MPI
            before = thread.polls
            time.sleep(0.2)
            assert thread.polls == before, "a progress call beside a thread holding the MPI lock"
    finally:
        thread.close()
    assert progress.resolve("auto", 2, True, 16) == "thread" and progress.resolve("auto", 1, True, 16) == "off"
    assert progress.resolve("auto", 4, False, 16) == "off" and progress.resolve("auto", 4, True, 1) == "off"
    assert progress.resolve("thread", 1, False, 1) == "thread" and progress.resolve("off", 4, True, 16) == "off"
    with pytest.raises(ValueError, match="--rma-progress on: expected one of auto, thread, off"):
        progress.resolve("on", 2, True, 16)


def test_a_read_from_an_owner_computing_outside_mpi_ends_before_its_compute(tmp_path):
    """Two emulated nodes over OFI/TCP, one indexed Get of 1,000 rows of the other node's partition,
    whose owner sleeps in Python without entering MPI: without the owner's progress thread the read
    waits for the owner's whole sleep (0.5 s: the setting reproduces the wait); with it, it ends well
    within the owner's 3 s sleep."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = tmp_path / "p"
    partition_graph(load_spec("synthetic:sbm:nodes=4000,blocks=4,avg_degree=4,feat_dim=64,seed=3"), 2, str(parts),
                    method="random", feature_dtype="float32")
    env = dict(os.environ, MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", MPIR_CVAR_NUM_CLIQUES="2",
               OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                           os.path.join(REPO, "tests", "mpi_scripts", "check_busy_owner.py"), str(parts), "0.5", "3"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    took = json.loads(proc.stdout.strip().splitlines()[-1])
    assert took["off"][0] >= 0.8 * took["off"][1], f"the read did not wait for the owner without the thread: {took}"
    assert took["thread"][0] < 0.5 * took["thread"][1], f"the read waited for the owner's compute: {took}"


def cora_jobs(parts, run, lock: str, topology: str = "replicated") -> list[str]:
    return ["--data", parts, "--run-dir", run, "--policy", "fixed", "--delta", "3", "--epochs", "2", "--batch-size", "8",
            "--mpi-wait", "spin", "--mpi-lock", lock, "--checkpoint-every", "5", "--eval-every", "1", "--progress", "none",
            "--rma-progress", "thread", "--buffer-sharing", "node", "--topology", topology]


def test_training_with_the_lock_never_has_two_threads_in_mpi_and_trains_as_without(tmp_path):
    """Cora at 4 ranks on 2 emulated nodes, ``spin`` waits, with the evaluation's windows and a
    checkpoint's barrier beside the pipeline thread, and the RMA progress thread running from the
    feature windows on, through the rest of the start-up (the node's shared buffer, its pool and its
    replicated CSR, all built collectively; a second job with the CSR in RMA windows instead): with
    the lock, no MPI call of any rank began while another thread of it was inside MPI; without it,
    the same losses bit for bit."""
    shim = mpi_overlap.build(str(tmp_path / "shim"))
    if shim is None:
        pytest.skip("the overlap shim needs x86-64 Linux, gcc, nm and the mpich wheel's libmpi")
    parts = tmp_path / "cora4"
    proc = subprocess.run([sys.executable, "-m", "partitioning", "--input", f"planetoid:{BUNDLED_CORA}:cora",
                           "--num-parts", "4", "--out", parts], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cliques = {"MPIR_CVAR_NUM_CLIQUES": "2"}
    counts = str(tmp_path / "overlap")
    locked = run_trains(4, [cora_jobs(parts, tmp_path / "on", "on"),  # and the CSR's windows opened beside the thread:
                            cora_jobs(parts, tmp_path / "distributed", "on", "distributed")],
                        tmp_path, env={**cliques, **mpi_overlap.env(shim, counts)})
    assert locked.returncode == 0, locked.stdout[-2000:] + locked.stderr[-3000:]
    unlocked = run_trains(4, [cora_jobs(parts, tmp_path / "off", "off")], tmp_path, env=cliques)
    assert unlocked.returncode == 0, unlocked.stdout[-2000:] + unlocked.stderr[-3000:]
    total = mpi_overlap.read(counts)
    assert total["ranks"] >= 4 and total["calls"] > 1000, total
    assert total["overlaps"] == 0, f"two threads of a rank inside MPI at once: {total['pairs']}"
    on, off = read_logs(tmp_path / "on"), read_logs(tmp_path / "off")
    assert [log["status"] for log in on + off + read_logs(tmp_path / "distributed")] == ["completed"] * 12
    assert {log["run"]["rma_progress"] for log in on} == {"thread"}
    assert sum(log["attrs"]["rma_progress_polls"] for log in on) > 0, "the progress thread never called MPI"
    for a, b in zip(on, off):
        assert a["minibatches"]["loss"].tobytes() == b["minibatches"]["loss"].tobytes()
        assert a["minibatches"]["global_loss"].tobytes() == b["minibatches"]["global_loss"].tobytes()
        assert a["epochs"]["param_digest"].tolist() == b["epochs"]["param_digest"].tolist()


def test_the_stress_harness_runs_and_forces_the_overlap(tmp_path):
    """One short job without the lock: every step's reads issued while the Iallreduce is in flight
    (the shim counts calls overlapping), the reduced buffers compared, the summary written."""
    if mpi_overlap.build(str(tmp_path / "probe")) is None:
        pytest.skip("the overlap shim needs x86-64 Linux, gcc, nm and the mpich wheel's libmpi")
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "replica_stress.py"), "--jobs", "1", "--steps",
                           "8", "--ranks", "2", "--gate", "off", "--count-overlaps", "--json", out, "--timeout", "60"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["jobs"] == 1 and summary["steps"] == 8 and summary["reads"] >= 8
    assert summary["wrong_rows"] == 0 and summary["jobs_diverged"] == 0 and summary["job_bound_95"] == 3.0
    assert summary["mpi_calls_overlapping"] > 0, summary
