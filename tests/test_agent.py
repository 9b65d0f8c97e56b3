"""The agent rank per node (rudder.agent) under mpiexec with two simulated nodes: each trainer
talks only to its own node's agent, decisions are applied exactly where the logs say, a slow
agent never blocks training, and training stays bit-identical to no buffer. Plus the
heuristic's rules."""
from __future__ import annotations

import os
from collections import deque

import numpy as np
import pytest
from conftest import BUNDLED_CORA, read_logs, run_train, run_trains

from rudder.agent.deciders.base import TrainerContext
from rudder.agent.deciders.heuristic import Heuristic
from rudder.agent.protocol import EVICT, KEEP, window_counters


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("agent") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, out, method="metis", seed=0)
    return out


def logs_by_rank(run):
    return {log["layout"]["world_rank"]: log for log in read_logs(run)}


COMMON = ["--batch-size", "8", "--eval-every", "0", "--progress", "none", "--delta", "1"]


def train(parts, run, ranks, *flags, epochs=4):
    proc = run_train(ranks, "--data", parts, "--run-dir", run, "--epochs", str(epochs), *COMMON, *flags,
                     env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logs_by_rank(run)


@pytest.fixture(scope="module")
def launched(parts, tmp_path_factory):
    """One launch of 4 trainers and an agent rank per node on 2 emulated nodes, four jobs: the
    heuristic (which two tests read), the same training without a buffer on the trainer slots,
    and the heuristic at a fixed latency over each transport. {name: run directory}."""
    base = tmp_path_factory.mktemp("launched")
    runs = {name: base / name for name in ("heuristic", "none", "p2p", "collective")}
    common = [*COMMON, "--epochs", "4", "--data", parts]
    jobs = [[*common, "--run-dir", runs["heuristic"], "--policy", "heuristic"],
            {"argv": [*common, "--run-dir", runs["none"], "--policy", "none"], "trainers_only": True}]
    # windows of one minibatch: a trainer is due at the same minibatches over both transports
    jobs += [[*common, "--run-dir", runs[t], "--policy", "heuristic", "--agent-transport", t, "--agent-latency", "3"]
             for t in ("p2p", "collective")]
    proc = run_trains(6, jobs, base, env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return runs


@pytest.fixture(scope="module")
def heuristic(launched):
    """The heuristic run: (its directory, its logs by rank)."""
    return str(launched["heuristic"]), logs_by_rank(launched["heuristic"])


def test_agents_serve_their_own_node_and_decisions_apply_where_logged(launched, heuristic):
    logs = heuristic[1]
    base = logs_by_rank(launched["none"])
    agents = {r: e for r, e in logs.items() if e["role"] == "agent"}
    trainers = {r: e for r, e in logs.items() if e["role"] == "trainer"}
    assert sorted(agents) == [4, 5] and sorted(trainers) == [0, 1, 2, 3]  # round-robin nodes: agents 4 and 5
    assert all(e["status"] == "completed" for e in logs.values())
    assert all(e["layout"]["shares_cores"] for e in logs.values())  # no --agent-cores: one set of cores for all
    for agent in agents.values():
        node = agent["layout"]["node_id"]
        mine = {r for r, e in trainers.items() if e["layout"]["node_id"] == node}
        assert set(agent["decisions"]["trainer"].tolist()) == mine  # served both its trainers, and no other
    for rank, t in trainers.items():
        agent = next(a for a in agents.values() if a["layout"]["node_id"] == t["layout"]["node_id"])
        d, o = agent["decisions"], agent["outcomes"]
        evict_requests = set(d["request"][(d["trainer"] == rank) & (d["decision"] == EVICT)].tolist())
        mine = o[o["trainer"] == rank]
        logged = {int(m) for m, r in zip(mine["applied_minibatch"], mine["request"]) if r in evict_requests}
        mb = t["minibatches"]
        steps = int(mb["step"].max()) + 1
        replaced = set((mb["epoch"] * steps + mb["step"])[mb["replaced"] == 1].tolist())
        assert (mb["asked_by"][mb["replaced"] == 1] == 2).all()
        assert logged <= replaced and len(replaced - logged) <= 1  # the last one may be unreported
        np.testing.assert_array_equal(mb["loss"], base[rank]["minibatches"]["loss"])  # exact: same training


def test_a_slow_agent_never_blocks_training(parts, tmp_path):
    # 100 minibatches per trainer, a quarter second per decision: several decisions land mid-run;
    # the agents keep a core of their own (two agents share the last core, the trainers the rest)
    logs = train(parts, str(tmp_path / "slow"), 6, "--policy", "heuristic", "--agent-delay", "0.25", "--agent-cores", "1",
                 epochs=20)
    cores = sorted(os.sched_getaffinity(0))
    for e in logs.values():
        if len(cores) >= 2:
            assert e["layout"]["cpus"] == (cores[-1:] if e["role"] == "agent" else cores[:-1])
            assert not e["layout"]["shares_cores"]  # so the agents look for requests often (IdlePoll)
    for agent in (e for e in logs.values() if e["role"] == "agent"):
        d, o = agent["decisions"], agent["outcomes"]
        assert d.size >= 1 and (d["latency"] >= 0.25).all()
        per_trainer = np.unique(d["trainer"], return_counts=True)[1]
        # Oldest request first: neither trainer starves (equal counts are not promised: a trainer
        # descheduled on a loaded machine asks later and its peer may be served once more meanwhile).
        assert per_trainer.size == 2 and per_trainer.min() >= max(1, per_trainer.max() // 2), per_trainer
        requested = {(int(t), int(r)): int(m) for t, r, m in zip(d["trainer"], d["request"], d["minibatch"])}
        gaps = [int(a) - requested[(int(t), int(r))] for t, r, a in zip(o["trainer"], o["request"], o["applied_minibatch"])]
        # The trainers went on training while the agent thought: answers land minibatches later.
        assert gaps and max(gaps) > 1
    trained = [e["minibatches"].size for e in logs.values() if e["role"] == "trainer"]
    assert len(set(trained)) == 1 and trained[0] > sum(e["decisions"].size for e in logs.values() if e["role"] == "agent")


def test_the_collective_transport_answers_a_node_at_agreed_windows_without_blocking(parts, tmp_path):
    # 100 minibatches per trainer, windows every 2, a tenth of a second per pass over a node's
    # windows, at most 2 windows gathered ahead: the agent falls behind and decides several
    # windows' requests in one pass while the trainers go on
    logs = train(parts, str(tmp_path / "collective"), 6, "--policy", "heuristic", "--agent-transport", "collective",
                 "--agent-window", "2", "--agent-windows-in-flight", "2", "--agent-delay", "0.1", "--agent-cores", "1",
                 epochs=20)
    assert all(e["status"] == "completed" for e in logs.values())
    trained = [e["minibatches"].size for e in logs.values() if e["role"] == "trainer"]
    assert trained == [100] * 4  # every trainer took every step: none waited for its agent
    for agent in (e for e in logs.values() if e["role"] == "agent"):
        d, o = agent["decisions"], agent["outcomes"]
        node = agent["layout"]["node_id"]
        mine = {r for r, e in logs.items() if e["role"] == "trainer" and e["layout"]["node_id"] == node}
        assert set(d["trainer"].tolist()) == mine
        assert ((d["minibatch"] + 1) % 2 == 0).all()  # requests only at the agreed windows
        assert (d["latency"] >= 0.1).all()
        # a pass over the windows gathered (its decisions share one latency) spans at most 2 windows
        # and has one request per trainer at most (a trainer has one in flight at most)
        for latency in np.unique(d["latency"]):
            in_pass = d[d["latency"] == latency]
            assert np.unique(in_pass["minibatch"]).size <= 2
            assert np.unique(in_pass["trainer"]).size == in_pass.size
        requested = {(int(t), int(r)): int(m) for t, r, m in zip(d["trainer"], d["request"], d["minibatch"])}
        gaps = [int(a) - requested[(int(t), int(r))] for t, r, a in zip(o["trainer"], o["request"], o["applied_minibatch"])]
        assert gaps and min(gaps) >= 1 and max(gaps) > 1  # answers land minibatches later: the trainers went on
        assert (o["age"] == gaps).all()  # each outcome logged with its age


def test_p2p_and_collective_make_the_same_decisions_under_a_fixed_latency(launched):
    runs = {t: logs_by_rank(launched[t]) for t in ("p2p", "collective")}

    def by_request(table, columns):  # the agents log in the order they decide: p2p one at a time, collective by pass
        return table[np.lexsort((table["request"], table["trainer"]))][list(columns)]

    for rank, e in runs["p2p"].items():
        other = runs["collective"][rank]
        if e["role"] == "agent":
            assert e["decisions"].size > 4 and (e["decisions"]["decision"] == EVICT).any()
            columns = ("trainer", "request", "minibatch", "decision")
            np.testing.assert_array_equal(by_request(e["decisions"], columns), by_request(other["decisions"], columns))
            columns = ("trainer", "request", "applied_minibatch", "evicted", "age")
            np.testing.assert_array_equal(by_request(e["outcomes"], columns), by_request(other["outcomes"], columns))
        else:
            for c in ("replaced", "loss", "asked_by"):
                np.testing.assert_array_equal(e["minibatches"][c], other["minibatches"][c])


def test_windows_are_counted_from_the_run_start():
    assert list(window_counters(0, 10, 3)) == [2, 5, 8]
    assert list(window_counters(5, 10, 3)) == [5, 8]  # resumed after minibatch 4: the same schedule
    assert list(window_counters(6, 10, 3)) == [8]
    assert list(window_counters(0, 3, 1)) == [0, 1, 2]
    assert list(window_counters(0, 2, 3)) == []


def context(history, hitrate=10.0, remaining=100):
    facts = {"total_minibatches": 200}
    return TrainerContext(facts, {"hitrate": hitrate, "comm_volume": 5.0, "remaining": remaining}, deque(history, maxlen=5))


def record(status, evicted=0, hit=0.0, comm=0.0):
    return {"status": status, "evicted": evicted, "hitrate_delta": hit, "comm_delta": comm}


def test_heuristic_rules():
    h = Heuristic(None)
    assert h.decide(context([], hitrate=0)).decision == EVICT  # nothing hits yet
    assert h.decide(context([], hitrate=0, remaining=5)).decision == KEEP  # under 5% left
    assert h.decide(context([record("skipped")], hitrate=0)).decision == KEEP  # no candidates last time
    assert h.decide(context([record("decision_no_evict", hit=-2)])).decision == EVICT  # hit rate fell
    assert h.decide(context([record("decision_no_evict", comm=3)])).decision == EVICT  # traffic rose
    assert h.decide(context([record("decision_no_evict", hit=2)])).decision == KEEP  # rising on its own
    flat = [record("triggered", 5, hit=0.1), record("triggered", 0)]
    assert h.decide(context(flat, hitrate=0)).decision == KEEP  # evictions changed nothing


def test_replay_repeats_a_runs_replacements_without_an_agent(parts, heuristic, tmp_path):
    original = heuristic[1]
    replay = train(parts, str(tmp_path / "replay"), 4, "--policy", "replay", "--replay", heuristic[0])
    assert sorted(replay) == [0, 1, 2, 3]  # no agent ranks
    for rank, t in replay.items():
        a, b = original[rank]["minibatches"], t["minibatches"]
        assert a["replaced"].sum() > 0
        for column in ("replaced", "hits", "misses", "refills", "candidates", "refetched", "loss"):
            np.testing.assert_array_equal(a[column], b[column])  # the same buffer work, the same training
        assert set(b["asked_by"][b["replaced"] == 1]) == {4}  # ASKERS["replay"]
    proc = run_train(4, "--data", parts, "--run-dir", tmp_path / "r", "--policy", "replay", "--replay", tmp_path / "nothing",
                     env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 2 and "--replay" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
