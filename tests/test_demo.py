"""`make demo` (drivers/demo.py) with its own configuration and a small GGUF model of random
weights standing in for the default one: every decision the agent is asked for is answered by
the model and applied, at the agreed minibatch (a test of the configuration, not of the host's
speed: with --agent-latency the trainers wait for a slow model), and the report says what they did."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from conftest import REPO, read_logs


def test_the_demo_applies_every_decision_its_agent_is_asked_for(tmp_path):
    from rudder.agent.tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "drivers", "demo.py"), "--out", out, "--epochs", "4",
                           "--llm-model", model, "--no-compare"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    logs = read_logs(out / "runs" / "llm")
    agent = next(log for log in logs if log["role"] == "agent")
    decisions, outcomes = agent["decisions"], agent["outcomes"]
    assert decisions.size >= 8 and (decisions["fallback_code"] == 0).all(), agent["fallback_reason"]
    assert (outcomes["action_fallback"] == 0).all()  # none stale, none refused (the agent hears of all but the last)
    applied = 0
    for log in (log for log in logs if log["role"] == "trainer"):
        mb = log["minibatches"]
        arrived = mb["decision_request"] >= 0
        assert (mb["decision_age"][arrived] == 2).all() and (mb["action_fallback"] == 0).all()  # 2 after each request
        mine = decisions["request"][decisions["trainer"] == log["layout"]["world_rank"]]
        assert sorted(mb["decision_request"][arrived].tolist()) == sorted(mine.tolist())  # each of its decisions arrived
        applied += int(arrived.sum())
    assert applied == decisions.size
    assert f"{decisions.size} requested, {decisions.size} answered by the model, {decisions.size} applied (100%)" in proc.stdout
    assert "decisions: over the 4 minibatches before and from each, hit %" in proc.stdout
    assert os.path.isfile(out / "plots" / "decisions.png") and "\r" not in proc.stdout + proc.stderr
    assert np.isfinite([float(log["minibatches"]["loss"][-1]) for log in logs if log["role"] == "trainer"]).all()
