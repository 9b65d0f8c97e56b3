"""A cluster's shape in CI (issue 40): 16 trainers and 4 agent ranks on 4 emulated nodes, one
launch of 20 ranks running a policy of each family: ``none`` and ``lookahead`` on the 16
trainer slots, ``heuristic`` with its agent a node. Every job completes, the losses agree across
the policies (caching is exact and sampling policy-free), and every run's logs analyse and are
reproduced minibatch by minibatch by the simulator."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest
from conftest import read_logs, run_cli, run_trains

from rudder.analysis.cli import main as analyze
from rudder.sim.validate import validate

TRAINERS, NODES = 16, 4
POLICIES = {"none": [], "lookahead": ["--buffer-fraction", "0.25"], "heuristic": ["--buffer-fraction", "0.25"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("many")
    parts = base / "parts"
    made = run_cli("--input", "synthetic:rmat:scale=11,edge_factor=8,feat_dim=16,classes=4,seed=2",
                   "--num-parts", TRAINERS, "--out", parts)
    assert made.returncode == 0, made.stderr
    common = ["--data", parts, "--epochs", "4", "--batch-size", "8", "--eval-every", "0", "--progress", "none",
              "--seed", "3"]
    jobs = [{"argv": [*common, "--run-dir", base / name, "--policy", name, *flags], "trainers_only": name != "heuristic"}
            for name, flags in POLICIES.items()]
    proc = run_trains(TRAINERS + NODES, jobs, base, timeout=900, env={"MPIR_CVAR_NUM_CLIQUES": str(NODES)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return {name: base / name for name in POLICIES}


def test_every_policy_family_completes_with_the_same_losses(runs):
    logs = {name: read_logs(run) for name, run in runs.items()}
    assert [len(x) for x in logs.values()] == [TRAINERS, TRAINERS, TRAINERS + NODES]
    agents = [x for x in logs["heuristic"] if x["role"] == "agent"]
    assert len(agents) == NODES and len({a["layout"]["node_id"] for a in agents}) == NODES
    trainers = {name: [x for x in ranks if x["role"] == "trainer"] for name, ranks in logs.items()}
    for name, ranks in logs.items():
        assert all(x["status"] == "completed" for x in ranks), name
    for t in range(TRAINERS):
        for name in ("lookahead", "heuristic"):
            np.testing.assert_array_equal(trainers[name][t]["minibatches"]["loss"],
                                          trainers["none"][t]["minibatches"]["loss"], err_msg=f"{name} trainer {t}")
    for name in ("lookahead", "heuristic"):  # the buffers served some remote inputs
        assert sum(int(x["minibatches"]["hits"].sum()) for x in trainers[name]) > 0, name


def test_every_run_analyses_and_the_simulator_reproduces_it(runs):
    out = io.StringIO()
    with redirect_stdout(out):
        assert analyze([*map(str, runs.values()), "--json"]) == 0
    shown = {name: s for name, s in zip(runs, json.loads(out.getvalue())["runs"])}
    for name, s in shown.items():
        assert s["status"] == "completed" and s["ranks_read"] == TRAINERS and s["epochs"]["timed"] == [1, 2], name
        assert s["layout"]["num_nodes"] == NODES and s["divergences"]["caught"] == 0, name
    none_rows = shown["none"]["traffic"]["remote_rows_fetched_per_epoch"]
    for name in ("lookahead", "heuristic"):  # a buffer moves fewer remote rows an epoch than none
        assert 0 < shown[name]["traffic"]["remote_rows_fetched_per_epoch"] < none_rows, name
    assert shown["heuristic"]["decisions"]["count"] > 0
    for name, run in runs.items():
        compared, mismatches = validate(str(run))
        assert not mismatches, (name, mismatches[:5])
        assert compared > 0, name
