"""Replicas that diverge (--on-divergence, --inject-divergence; rudder.train.replicas). The
repairs themselves, exact and found at the next step, ride in tests/test_train_policies.py's
runs (4 trainers on Cora, 2 on RMAT), which also check that no other run raises a false alarm.
Here: the digest slots' arithmetic, two trainers without a majority, and the job ended by
``abort`` with one line, its logs readable."""
from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import BUNDLED_CORA, read_logs, run_train

from rudder.logs.schema import DIVERGENCE_ACTIONS, DIVERGENCE_CHECKS
from rudder.train.data_parallel import ReplicaCheck


def reduced(check: ReplicaCheck, digests: list[int]) -> np.ndarray:
    """What the Iallreduce's float32 sum leaves in the digest slots."""
    return np.sum([check.encode(d) for d in digests], axis=0, dtype=np.float32)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8, 256, 4096])
def test_replica_check_verdicts_agree(ranks):
    """Exact float32 sums at any rank count, and every rank reaches the same verdict, even where one
    rank's chunk is the mean of the others' (a sum alone would pass that rank)."""
    check = ReplicaCheck(ranks)
    assert check.chunk_bits * check.slots >= ReplicaCheck.DIGEST_BITS
    assert (1 << check.chunk_bits) ** 2 * ranks <= 1 << 24  # squares summed exactly
    top = (1 << 32) - 1
    equal = [top] * ranks
    assert check.agrees(reduced(check, equal), check.encode(top))
    if ranks == 1:
        return
    rng = np.random.default_rng(ranks)
    mean_case = [top - 2, top, top - 1] + [top - 1] * (ranks - 3) if ranks >= 3 else [top - 2, top]
    for digests in (mean_case, [top] * (ranks - 1) + [top ^ 1], list(rng.integers(0, top, ranks))):
        sums = reduced(check, [int(d) for d in digests])
        assert not any(check.agrees(sums, check.encode(int(d))) for d in digests), digests


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("replicas") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return out


FLAGS = ["--policy", "fixed", "--delta", "2", "--epochs", "2", "--batch-size", "16", "--eval-every", "0",
         "--progress", "none"]


def test_two_trainers_have_no_majority(parts, tmp_path):
    """Trainer 0 diverges with 2 trainers: no majority, so trainer 0's state is taken, trainer 1
    is named as the one that differed, and the job goes on with replicas equal (not the training
    of a run without the divergence: trainer 0's flipped bit stays)."""
    run = tmp_path / "run"
    proc = run_train(2, "--data", parts, "--run-dir", run, *FLAGS, "--inject-divergence", "1:0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trainer 1 differed from trainer 0 (1 of 2 agreeing, no majority: trainer 0 taken)" in proc.stderr
    for log in read_logs(run):
        assert log["status"] == "completed"
        (r,) = log["repairs"]
        assert (r["minibatch"], DIVERGENCE_CHECKS[r["check"]], DIVERGENCE_ACTIONS[r["action"]]) == (2, "step", "repaired")
        assert (r["source"], r["majority"], r["diverged"].decode()) == (0, 0, "1")
    digests = [log["epochs"]["param_digest"] for log in read_logs(run)]
    assert all(np.array_equal(d, digests[0]) for d in digests)


def test_abort_ends_the_job_with_one_line(parts, tmp_path):
    """--on-divergence abort: one line naming the minibatch and the trainer, exit status 1, every
    trainer's log closed (failed) with the minibatches before and the event in ``repairs``. The
    timeout bounds how long it may take (a job that waited for a stalled collective would hit it)."""
    run = tmp_path / "run"
    proc = run_train(2, "--data", parts, "--run-dir", run, *FLAGS, "--inject-divergence", "1:1", "--on-divergence",
                     "abort", timeout=60)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "replicas diverged" in line]
    assert len(lines) == 1 and "minibatch 2" in lines[0] and "trainer 1 differed" in lines[0], proc.stderr[-3000:]
    for log in read_logs(run):
        assert log["status"] == "failed" and "minibatch 2" in log["attrs"]["error"]
        assert len(log["minibatches"]) == 2
        (r,) = log["repairs"]
        assert (r["minibatch"], DIVERGENCE_ACTIONS[r["action"]], r["diverged"].decode()) == (2, "aborted", "1")


def test_inject_divergence_is_checked():
    """A trainer the job does not have, or a malformed flag, is one line before any work."""
    from rudder.train.config import ConfigError, parse_config
    from rudder.train.job import check_injection

    with pytest.raises(ConfigError, match="--inject-divergence"):
        parse_config(["--data", "d", "--run-dir", "r", "--inject-divergence", "5"])
    cfg = parse_config(["--data", "d", "--run-dir", "r", "--inject-divergence", "5:1,7:2"])
    with pytest.raises(ConfigError, match="--inject-divergence 5:1,7:2: expected a trainer below 2"):
        check_injection(cfg, types.SimpleNamespace(num_trainers=2))
    assert parse_config(["--data", "d", "--run-dir", "r", "--inject-divergence", "5:2,7:0"]).testing.divergences == \
        [(5, 2), (7, 0)]

