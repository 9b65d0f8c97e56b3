"""A job never hangs silently: a rank that stops making progress (here: another rank frozen with
SIGSTOP, as a dead link or a hung node would leave it) ends the whole job after --stall-timeout
seconds with one line per rank naming it and what it was waiting for, its log closed and
readable; a pause shorter than the timeout costs nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import BUNDLED_CORA, rank_pids, read_logs, signal_all, train_command


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("watchdog") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return out


def start_and_freeze(parts, run, pause: float, epochs: int):
    """Start a 2-rank job, wait until it trains, freeze rank 1 for ``pause`` seconds."""
    job = subprocess.Popen(train_command(2, "--data", parts, "--run-dir", run, "--epochs", str(epochs), "--batch-size", "8",
                                         "--eval-every", "0", "--progress", "none", "--log-flush-seconds", "0.2",
                                         "--stall-timeout", "8"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
        try:
            logs = read_logs(run) if os.path.isdir(run) else []
        except (OSError, KeyError):  # a live log met mid-flush
            continue
        if len(logs) == 2 and min(r["minibatches"].size for r in logs) >= 10:
            break
    assert job.poll() is None, "the run ended before it could be frozen; give it more epochs"
    frozen = rank_pids(run)[1]
    os.kill(frozen, signal.SIGSTOP)
    try:  # the pause, or less where the job ends first (the watchdog's doing)
        job.wait(timeout=pause)
    except subprocess.TimeoutExpired:
        pass
    signal_all([frozen], signal.SIGCONT)  # unless the job ended meanwhile (the watchdog's doing), the rank with it
    return job


def test_a_stalled_job_ends_with_one_line_naming_the_rank(parts, tmp_path):
    run = str(tmp_path / "stalled")
    job = start_and_freeze(parts, run, 25, epochs=2000)
    try:
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode != 0
    lines = [line for line in err.splitlines() if "no progress for 8 s" in line]
    assert 1 <= len(lines) <= 2, err[-3000:]  # one per rank that saw it
    # rank 0 blocks in the next collective with the frozen rank: a minibatch's gradient Allreduce,
    # or an epoch end's (where rank 1 froze decides which; both are named)
    waits = ("training thread: in the gradient Allreduce of minibatch", "training thread: after epoch")
    assert "rank 0" in lines[0] and any(w in lines[0] for w in waits), lines[0]
    logs = read_logs(run)  # closed, readable, saying why
    assert logs[0]["status"] == "failed" and "no progress" in logs[0]["attrs"]["error"]


def test_a_pause_shorter_than_the_timeout_costs_nothing(parts, tmp_path):
    run = str(tmp_path / "paused")
    job = start_and_freeze(parts, run, 2, epochs=20)
    try:
        _, err = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode == 0, err[-3000:]
    assert all(r["status"] == "completed" for r in read_logs(run))
