"""The classifier baselines end to end on Cora with real MPI jobs: a collection-mode run logs
trace rows that agree with its own minibatch log; the five models train from those traces and
are saved; each runs as the agent's decision maker; and the features the agent computes at
runtime are those the collection logged (no train/serve skew)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from classifier_checks import held_out_accuracy
from conftest import BUNDLED_CORA, REPO, read_logs, run_train, run_trains

pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[test]')")
pytest.importorskip("xgboost", reason="xgboost-cpu is not installed")

from rudder.agent.deciders.classifier import MODELS  # noqa: E402
from rudder.agent.features import FEATURES, features  # noqa: E402


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("cls") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return out


COMMON = ("--batch-size", "8", "--eval-every", "0", "--progress", "none")


@pytest.fixture(scope="module")
def traces(parts, tmp_path_factory):
    """Two collection runs (different buffer sizes and periods), as the README says to collect."""
    root = tmp_path_factory.mktemp("traces")
    runs = []
    for name, fraction, delta, window in (("a", "0.25", "2", "2"), ("b", "0.05", "3", "1")):
        run = str(root / name)
        proc = run_train(2, "--data", parts, "--run-dir", run, "--policy", "fixed", "--collect-traces", "--delta", delta,
                         "--buffer-fraction", fraction, "--agent-window", window, "--epochs", "8", *COMMON)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((run, int(delta), int(window)))
    return runs


def test_collection_rows_agree_with_the_minibatch_log(traces):
    for run, delta, window in traces:
        for r in read_logs(run):
            mb, trace, facts = r["minibatches"], r["classifier_trace"], trace_facts(r)
            replaced = np.flatnonzero(mb["replaced"] == 1)
            assert (replaced % delta == 0).all() and trace.size == replaced.size - 1  # the last interval is open
            for k, row in enumerate(trace):
                t, nxt = replaced[k], replaced[k + 1]
                prev = replaced[k - 1] if k else -1
                assert row["minibatch"] == t and row["evicted"] == mb["refills"][t]
                for name, column in (("hitrate", "hit_percent"), ("comm_volume", "comm_volume"), ("refetched", "refetched")):
                    assert row[f"pre_{name}"] == pytest.approx(mb[column][prev + 1:t + 1].mean())
                    assert row[f"post_{name}"] == pytest.approx(mb[column][t + 1:nxt + 1].mean())
                expected = features(facts, window_from_log(mb, t, window), last_refill(mb, t))
                assert np.allclose([row[f] for f in FEATURES], expected)
            assert trace["post_refetched"].max() > 0  # the regret is measured, not always zero


def trace_facts(r):
    run, data = r["run"], r["attrs"]["data"]
    cfg = r["attrs"]["config"]
    return {"num_nodes": data["num_nodes"], "num_edges": data["num_edges"], "num_parts": data["num_parts"],
            "batch_size": run["batch_size"], "halo": run["halo_nodes"], "capacity": run["buffer_capacity"],
            "total_minibatches": run["steps_per_epoch"] * cfg["epochs"]}


def window_from_log(mb, t, window):
    w = mb[max(0, t - window + 1):t + 1]
    return {"counter": t, "hitrate": w["hit_percent"].mean(), "comm_volume": w["comm_volume"].mean(),
            "candidates": w["candidates"].mean(), "refetched": w["refetched"].mean()}


def last_refill(mb, t):
    """Rows evicted by the most recent replacement before minibatch t that evicted any (what the
    agent knows when it decides after minibatch t - 1)."""
    before = np.flatnonzero(mb["refills"][:t] > 0)
    return int(mb["refills"][before[-1]]) if before.size else 0


@pytest.fixture(scope="module")
def models(traces, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("models"))
    proc = subprocess.run([sys.executable, "-m", "rudder.classifier", "train", *[r for r, _, _ in traces], "--out", out],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_training_writes_all_five_models_and_a_report(models):
    out, stdout = models
    for kind, name in MODELS.items():
        assert os.path.getsize(os.path.join(out, name)) > 0
        assert kind in stdout
    with open(os.path.join(out, "preprocessor.json")) as f:
        meta = json.load(f)
    assert meta["features"] == list(FEATURES) and meta["train_rows"] + meta["test_rows"] == meta["rows"] > 50
    for kind, m in meta["models"].items():  # held-out accuracy, as the report states it, from its own predictions
        assert m["test_accuracy"] == pytest.approx(held_out_accuracy(out, kind, meta)), kind
    proc = subprocess.run([sys.executable, "-m", "rudder.classifier", "train", out, "--out", out],
                          capture_output=True, text=True, cwd=REPO)  # not a run directory: one line, exit 2
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def steered(models, parts, tmp_path_factory):
    """A run steered by each model, the five in one launch (one job after another): {kind: run directory}."""
    out, _ = models
    base = tmp_path_factory.mktemp("steered")
    runs = {kind: str(base / kind) for kind in MODELS}
    proc = run_trains(3, [["--data", parts, "--run-dir", runs[kind], "--policy", "classifier", "--classifier-model",
                           os.path.join(out, MODELS[kind]), "--epochs", "3", "--agent-latency", "1", *COMMON]
                          for kind in MODELS], base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return runs


@pytest.mark.parametrize("kind", list(MODELS))
def test_each_model_steers_a_run_with_the_features_it_was_trained_on(kind, models, steered):
    out, _ = models
    logs = read_logs(steered[kind])
    agent = next(r for r in logs if r["role"] == "agent")
    d = agent["decisions"]
    # every request answered by the model (with --agent-latency the trainer waits for it)
    assert d.size >= 4 and (d["fallback"] == 0).all(), agent["fallback_reason"]
    with open(os.path.join(out, "preprocessor.json")) as f:
        meta = json.load(f)
    trainers = {r["layout"]["world_rank"]: r for r in logs if r["role"] == "trainer"}
    for i in range(d.size):  # the agent's inputs, recomputed from the trainer's own log
        r = trainers[int(d["trainer"][i])]
        mb, t = r["minibatches"], int(d["minibatch"][i])
        x = features(trace_facts(r), window_from_log(mb, t, 1), last_refill(mb, t + 1))
        expected = (x - meta["mean"]) / np.array(meta["std"])
        logged = json.loads(agent["prompt"][i])["features"]
        assert json.loads(agent["answer"][i])["decision"] == ("evict" if d["decision"][i] else "keep")
        assert np.allclose([logged[f] for f in FEATURES], expected, atol=1e-3), (i, logged, expected)
    for r in trainers.values():
        assert set(r["minibatches"]["asked_by"][r["minibatches"]["replaced"] == 1]) <= {3}  # the classifier asked
