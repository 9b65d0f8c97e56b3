"""Checkpoint and resume with real MPI jobs on Cora: a run killed with SIGKILL after a periodic
checkpoint, then resumed with --resume, ends bit-identical to the uninterrupted run (every
minibatch row, every epoch's parameter digest and accuracy) with no row lost or repeated; the
checkpoint holds the buffer's node IDs and scores, not its rows, which the resumed run reads
again (and a format-4 checkpoint, rows in it, resumes the same); a SIGTERM (Slurm's warning
before the time limit) takes a checkpoint and stops cleanly; agent contexts and the tuner's arms
survive; bad --resume input is one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
from conftest import BUNDLED_CORA, as_older_log, rank_pids, read_logs, run_train, run_trains, signal_all, train_command

from rudder.logs import checkpoints

COLUMNS = ("epoch", "step", "seeds", "input_nodes", "hits", "misses", "refills", "replaced", "refetched", "loss",
           "global_loss")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("ckpt") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return out


LONG = 200  # epochs of an interrupted run: it must still be running when the signal comes (it is
# resumed with --epochs 20, and compared with the uninterrupted 20-epoch run)


def flags(parts, policy, epochs=20):
    return ["--data", parts, "--policy", policy, "--delta", "3", "--batch-size", "8", "--epochs", str(epochs),
            "--eval-every", "10", "--progress", "none"]


def start(ranks, args, env=None):
    return subprocess.Popen(train_command(ranks, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))


def assert_same_run(a_run, b_run):
    for a, b in zip(read_logs(a_run), read_logs(b_run), strict=True):
        assert b["status"] == "completed" and b["attrs"]["resumed"]
        for column in COLUMNS:
            np.testing.assert_array_equal(a["minibatches"][column], b["minibatches"][column], err_msg=column)
        for column in ("epoch", "complete", "param_digest", "val_acc", "test_acc", "steps", "eval_inference",
                       "eval_rows_shared", "eval_rows_rma"):
            np.testing.assert_array_equal(a["epochs"][column], b["epochs"][column], err_msg=column)


SHIFT = "12:fanouts=3,3;seeds=0.5"  # counter 108 on: far past the first checkpoint the run is killed after


@pytest.fixture(scope="module")
def uninterrupted(parts, tmp_path_factory):
    """The runs the resumed ones must equal, in one launch: fixed, lookahead, and lookahead with a shift."""
    base = tmp_path_factory.mktemp("base")
    runs = {name: str(base / name) for name in ("fixed", "lookahead", "shift")}
    jobs = [[*flags(parts, "fixed"), "--run-dir", runs["fixed"]], [*flags(parts, "lookahead"), "--run-dir", runs["lookahead"]],
            [*flags(parts, "lookahead"), "--shift", SHIFT, "--run-dir", runs["shift"]]]
    proc = run_trains(2, jobs, base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return runs


def kill_after_checkpoint(job, run: str, counter: int, ready=lambda checkpoint_counter: True):
    """SIGKILL rank 0 of ``job`` once ``run``'s latest checkpoint is at minibatch ``counter`` or
    later and ``ready(its counter)`` holds (for properties that only grow with the run). The ranks
    are stopped while that is checked again and rank 0 killed: a newer checkpoint committed in
    between (an agent writes its file only after the trainers commit) would be the one a resume
    reads, unchecked."""
    try:
        deadline = time.monotonic() + 120
        killed = False
        while not killed and job.poll() is None and time.monotonic() < deadline:
            latest = checkpoints.committed_counter(run)
            if latest >= counter and ready(latest):
                pids = rank_pids(run)
                signal_all(pids, signal.SIGSTOP)
                try:
                    if ready(checkpoints.committed_counter(run)):  # still so, with nothing running
                        os.kill(pids[0], signal.SIGKILL)
                        killed = True
                finally:
                    signal_all(pids, signal.SIGCONT)
            time.sleep(0.05)
        assert killed, "the run ended before it could be killed"
        job.communicate(timeout=60)
    finally:
        job.kill()
    return job


def test_a_killed_run_resumes_exactly_where_its_checkpoint_was(parts, uninterrupted, tmp_path):
    run = str(tmp_path / "run")
    # SIGKILL gives no warning: the logs hold rows past the checkpoint
    job = kill_after_checkpoint(start(2, flags(parts, "fixed", LONG) + ["--run-dir", run, "--checkpoint-every", "7"]),
                                run, 41)
    assert job.returncode != 0
    killed_at = checkpoints.committed_counter(run)
    assert (killed_at + 1) % 7 == 0
    held = no_feature_rows(parts, run, killed_at)
    # rank 0's log as a version before the CPU columns wrote it, and the checkpoint as format 4 wrote
    # it (rank 0's buffer rows in it, here zeros): the resumed run goes on all the same, its rows read again
    as_older_log(os.path.join(run, "rank-00000.h5"))
    as_format_4(parts, run, killed_at)
    proc = run_train(2, "--resume", run, "--epochs", "20", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(uninterrupted["fixed"], run)
    logs = read_logs(run)
    assert logs[0]["attrs"]["resumed"][0]["rows"]["minibatches"] == killed_at + 1
    assert [log["run"]["buffer_fill_rows"] for log in logs] == held  # the resumed buffers' rows, read again
    assert np.isnan(logs[0]["minibatches"]["cpu_sample"]).all() and (logs[1]["minibatches"]["cpu_sample"] > 0).all()


def rank_states(run: str, counter: int) -> list[dict]:
    where = os.path.join(run, "checkpoint", f"minibatch-{counter:09d}")
    return [torch.load(os.path.join(where, f"rank-{r:05d}.pt"), weights_only=False) for r in range(2)]


def no_feature_rows(parts: str, run: str, counter: int) -> list[int]:
    """Asserts that no array in the trainers' checkpoint files is as wide as a feature row, and
    returns the real rows each buffer held (what a resumed trainer must read again: some)."""
    from rudder.data.partition_store import PartitionMeta

    meta = PartitionMeta.load(parts)

    def arrays(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from arrays(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from arrays(v)
        elif isinstance(value, (np.ndarray, torch.Tensor)):
            yield value

    held = []
    for state in rank_states(run, counter):
        assert not [a.shape for a in arrays(state) if a.ndim == 2 and a.shape[0] > 1 and a.shape[1] == meta.feat_dim]
        ids = state["assembly"]["buffer"]["ids"]
        held.append(int(np.count_nonzero(ids < meta.num_nodes)))
    assert min(held) > 0
    return held


def as_format_4(parts: str, run: str, counter: int) -> None:
    """Rewrite the checkpoint as format 4 wrote it: ``latest.json``'s version, and rank 0's buffer
    with its rows (zeros here: a resumed run must read the rows again, not take them)."""
    from rudder.data.partition_store import PartitionMeta

    path = os.path.join(run, "checkpoint", "latest.json")
    with open(path) as f:
        record = json.load(f)
    with open(path, "w") as f:
        json.dump({**record, "format_version": 4}, f)
    file = os.path.join(run, "checkpoint", f"minibatch-{counter:09d}", "rank-00000.pt")
    state = torch.load(file, weights_only=False)
    buffer = state["assembly"]["buffer"]
    buffer["features"] = np.zeros((buffer["ids"].size, PartitionMeta.load(parts).feat_dim), dtype=np.float32)
    torch.save(state, file)


def test_a_killed_run_resumes_across_a_shift(parts, uninterrupted, tmp_path):
    """Killed in the first phase, resumed: the run shifts at the same epoch (its phases rebuilt from
    the checkpointed config), with the shifted steps per epoch and counters, bit for bit."""
    base = uninterrupted["shift"]
    run = str(tmp_path / "run")
    kill_after_checkpoint(start(2, flags(parts, "lookahead", LONG) + ["--shift", SHIFT, "--run-dir", run,
                                                                      "--checkpoint-every", "7"]), run, 6)
    killed_at = checkpoints.committed_counter(run)
    assert 0 <= killed_at < 108 and (killed_at + 1) % 7 == 0  # before the shift: the resumed part crosses it
    proc = run_train(2, "--resume", run, "--epochs", "20", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(base, run)
    for log in read_logs(run):
        np.testing.assert_array_equal(log["minibatches"]["phase"], log["minibatches"]["epoch"] >= 12)
        assert log["epochs"]["steps"][12] < log["epochs"]["steps"][11]


def test_sigterm_checkpoints_then_stops_and_the_run_resumes(parts, uninterrupted, tmp_path):
    run = str(tmp_path / "run")
    job = start(2, flags(parts, "lookahead", LONG) + ["--run-dir", run, "--checkpoint-every", "3600s",
                                                      "--log-flush-seconds", "0.2"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:  # wait for training to be under way
            time.sleep(0.1)
            try:
                logs = read_logs(run) if os.path.isdir(run) else []
            except (OSError, KeyError):  # a live log met mid-flush
                continue
            if len(logs) == 2 and min(r["minibatches"].size for r in logs) >= 10:
                break
        os.kill(rank_pids(run)[1], signal.SIGTERM)  # one rank, as a node's first signal may be
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 143, (out[-2000:], err[-2000:])
    logs = read_logs(run)
    assert all(r["status"] == "interrupted" for r in logs)
    counter = checkpoints.committed_counter(run)
    # the checkpoint was set after the signal (10 minibatches in), and the run stopped right after it
    assert counter >= 10 and all(r["minibatches"].size == counter + 1 for r in logs)
    proc = run_train(2, "--resume", run, "--epochs", "20", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(uninterrupted["lookahead"], run)


SHARED = ["--partition-mode", "node", "--buffer-sharing", "node", "--buffer-split", "quota", "--buffer-init", "empty"]
TWO_NODES = {"MPIR_CVAR_NUM_CLIQUES": "2"}  # 4 trainers: 2 emulated nodes of 2, each node a partition


def test_a_node_shared_buffer_resumes_from_its_first_trainers_file(parts, tmp_path):
    """--buffer-sharing node (split in quotas): killed after a checkpoint and resumed, the losses
    and every epoch's parameters are the uninterrupted run's, and the buffer is the one the
    checkpoint kept, not a new one: every trainer's first resumed minibatch finds rows in it,
    where a new empty buffer holds none until four lookups on its node have made its slots
    eviction candidates. (Hits and rows of a shared buffer depend on how its trainers
    interleave, so they are not compared.)"""
    base, run = str(tmp_path / "base"), str(tmp_path / "run")
    kill_after_checkpoint(start(4, flags(parts, "fixed", LONG) + SHARED + ["--run-dir", run, "--checkpoint-every", "7"],
                                env=TWO_NODES), run, 41)
    killed_at = checkpoints.committed_counter(run)
    where = os.path.join(run, "checkpoint", f"minibatch-{killed_at:09d}")
    kept = [torch.load(os.path.join(where, f"rank-{r:05d}.pt"), weights_only=False)["assembly"]["buffer"] for r in range(4)]
    # ranks 0, 2 form node 0 and 1, 3 node 1 (round robin): each node's first trainer keeps its buffer
    assert ["owner" in k for k in kept] == [True, True, False, False]
    # the resume, then the uninterrupted run it must equal, in one launch
    proc = run_trains(4, [["--resume", run, "--epochs", "20", "--progress", "none"],
                          [*flags(parts, "fixed"), *SHARED, "--run-dir", base]], tmp_path, env=TWO_NODES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for a, b in zip(read_logs(base), read_logs(run), strict=True):
        assert b["status"] == "completed" and b["attrs"]["resumed"]
        for column in ("epoch", "step", "seeds", "input_nodes", "loss", "global_loss"):
            np.testing.assert_array_equal(a["minibatches"][column], b["minibatches"][column], err_msg=column)
        for column in ("param_digest", "val_acc", "test_acc"):
            np.testing.assert_array_equal(a["epochs"][column], b["epochs"][column], err_msg=column)
        assert b["minibatches"]["occupancy"][killed_at + 1] > 0


def saved_agent(run: str, counter: int) -> dict:
    return torch.load(os.path.join(run, "checkpoint", f"minibatch-{counter:09d}", "agent-00002.pt"), weights_only=False)


def agent_has_full_contexts_and_tried_arms(run: str, counter: int) -> bool:
    """The agent's checkpoint at ``counter`` holds two full contexts (5 outcomes each) and a tuner
    that has tried every arm for both trainers. How many decisions the agent has answered by a
    given minibatch depends on the machine's load (the trainers do not wait for it), so the test
    waits for this instead of assuming it of a counter."""
    try:
        saved = saved_agent(run, counter)
    except (OSError, RuntimeError, EOFError):  # replaced by a newer checkpoint while reading
        return False
    contexts, arms = saved["contexts"], saved["decider"]["arms"]
    return (len(contexts) == 2 and all(len(c["history"]) == 5 for c in contexts.values())
            and sorted(arms) == [0, 1] and all(min(a["pulls"]) >= 1 for a in arms.values()))


def test_agent_contexts_and_the_tuners_arms_survive_a_resume(parts, tmp_path):
    run = str(tmp_path / "run")
    kill_after_checkpoint(start(3, flags(parts, "tuner", LONG) + ["--run-dir", run, "--checkpoint-every", "20",
                                                                   "--agent-action", "structured",
                                                                   "--agent-delay", "0.02"]), run, 59,
                          ready=lambda counter: agent_has_full_contexts_and_tried_arms(run, counter))
    counter = checkpoints.committed_counter(run)
    assert agent_has_full_contexts_and_tried_arms(run, counter), "no checkpoint with full contexts before the kill"
    saved = saved_agent(run, counter)
    # a loaded machine may reach full contexts only after epoch 20: resume to a later end then
    with open(os.path.join(run, "checkpoint", "latest.json")) as f:
        epochs = max(20, json.load(f)["epoch"] + 2)
    proc = run_train(3, "--resume", run, "--epochs", str(epochs), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = read_logs(run)
    assert all(r["status"] == "completed" for r in logs)
    for r in logs[:2]:  # every minibatch once
        mb = r["minibatches"]
        assert sorted((mb["epoch"] * 9 + mb["step"]).tolist()) == list(range(9 * epochs))
    agent = logs[2]
    kept = saved["log_rows"]["decisions"]
    assert agent["attrs"]["resumed"][0]["rows"]["decisions"] == kept
    assert agent["decisions"]["minibatch"][kept:].min() > counter  # decided after it
    # the resumed tuner went on from its saved arms: its first answer to each trainer already
    # knows every arm's mean (a fresh one would know none: "means": [None, ...])
    for trainer in (0, 1):
        first = kept + int(np.flatnonzero(agent["decisions"]["trainer"][kept:] == trainer)[0])
        assert "None" not in agent["answer"][first], agent["answer"][first]
    # A checkpoint notice behind a request is not a goodbye: only the resumed run's last
    # requests (one per trainer at most) may be cut off.
    assert agent["decisions"]["fallback"].sum() <= 2


def test_bad_resume_input_is_one_line(parts, uninterrupted, tmp_path):
    from rudder.logs.checkpoints import FORMAT_VERSION
    from rudder.train.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="no checkpoint there"):
        parse_config(["--resume", str(tmp_path)])
    ck = tmp_path / "run" / "checkpoint"
    ck.mkdir(parents=True)
    record = {"format_version": FORMAT_VERSION, "counter": 5, "epoch": 0, "step": 5, "world_size": 3,
              "config": read_logs(uninterrupted["fixed"])[0]["attrs"]["config"]}
    (ck / "latest.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="--fanouts .* differs from the checkpointed run"):
        parse_config(["--resume", str(tmp_path / "run"), "--fanouts", "5,5"])
    assert parse_config(["--resume", str(tmp_path / "run"), "--epochs", "50"]).training.epochs == 50
    (tmp_path / "old" / "checkpoint").mkdir(parents=True)  # written by an earlier version: refused, one line
    (tmp_path / "old" / "checkpoint" / "latest.json").write_text(json.dumps({**record, "format_version": 1}))
    with pytest.raises(ConfigError, match=r"old/checkpoint/latest.json is of checkpoint format 1, which is not "
                                          r"supported \(expected format 4 or 5"):
        parse_config(["--resume", str(tmp_path / "old")])
    proc = run_train(2, "--resume", tmp_path / "run")  # a 3-rank checkpoint, 2 ranks launched
    assert proc.returncode == 2 and "3-rank job" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_late_agent_file_of_a_superseded_checkpoint_is_dropped(tmp_path):
    """An agent writes its part of a checkpoint when its node's trainers have all reached it, and
    they do not wait for it: if they have committed a newer checkpoint (and dropped this one's
    folder) by then, the file is not written and no folder is made again; otherwise it is."""
    run = str(tmp_path)
    assert checkpoints.save_late(run, 19, "agent-00002.pt", {"counter": 19})  # nothing committed yet
    checkpoints.commit(run, {"counter": 39})
    assert not checkpoints.save_late(run, 19, "agent-00002.pt", {"counter": 19})
    assert not os.path.exists(checkpoints.folder(run, 19))
    assert checkpoints.save_late(run, 39, "agent-00002.pt", {"counter": 39})
    assert checkpoints.load(os.path.join(checkpoints.folder(run, 39), "agent-00002.pt")) == {"counter": 39}
