"""The evaluation harness end to end on the tiny grid (bench/grids/tiny.toml): every policy runs
on every configuration, the figures are the runs' own, every run is reproduced exactly by the
simulator, the classifiers are scored on seen and unseen configurations, DistDGL runs beside
(or is skipped with its reason), and a rerun reuses what is done."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from classifier_checks import held_out_accuracy, unseen_accuracy
from conftest import REPO, read_logs

from bench import distdgl_peer

GRID = os.path.join(REPO, "bench", "grids", "tiny.toml")
POLICIES = ["none", "static-f0.25", "fixed-f0.25", "lookahead-f0.25", "heuristic-f0.25", "llm-f0.25",
            "classifier-f0.25"]


def evaluate(*args, timeout=1500):
    return subprocess.run([sys.executable, os.path.join(REPO, "bench", "evaluate.py"), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def evaluate_grid(tmp_path, text: str):
    """``text`` as a grid file, evaluated with seed 0 and no simulator check, which must succeed:
    (the grid file, the output directory, the finished process)."""
    grid, out = tmp_path / "grid.toml", tmp_path / "out"
    grid.write_text(text)
    proc = evaluate("--grid", grid, "--seed", "0", "--out", out, "--no-validate")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return grid, out, proc


@pytest.fixture(scope="module")
def tiny_grid(tmp_path_factory) -> str:
    """bench/grids/tiny.toml with its llm runs on a tiny random-weight GGUF (rudder.agent.tiny_gguf,
    under grammar like any model): these runs check the harness, and take a quarter of the CPU the
    default model's do. The default model's own answers are tests/test_agent_action.py's (in
    process: no MPI job of the suite loads it)."""
    from rudder.agent.tiny_gguf import write_tiny_gguf

    where = tmp_path_factory.mktemp("tiny-grid")
    model = write_tiny_gguf(str(where / "tiny.gguf"))
    text = open(GRID).read()
    assert text.count('llm = ["--llm-threads"') == 1
    path = where / "tiny.toml"
    path.write_text(text.replace('llm = ["--llm-threads"', f'llm = ["--llm-model", "{model}", "--llm-threads"'))
    return str(path)


@pytest.fixture(scope="module")
def tiny(tiny_grid, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "tiny"
    proc = evaluate("--grid", tiny_grid, "--seed", "0", "--out", out, "--publish", out / "published.md")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), proc.stdout


def test_every_policy_runs_on_every_configuration_with_exact_caching(tiny):
    from rudder.logs.metrics import run_timed_epochs

    out, results, _ = tiny
    configs = results["grid"]["configs"]
    assert sorted(configs) == ["cora-p2-b8-f10_25", "sbm-p2-b32-f10_25"]
    assert not results["failed"] and not results["not_run"]
    for key, r in configs.items():
        assert list(r["runs"]) == POLICIES, key
        logs = {label: read_logs(fig["run"]) for label, fig in r["runs"].items()}
        none = [x for x in logs["none"] if x["role"] == "trainer"]
        for label, ranks in logs.items():
            trainers = [x for x in ranks if x["role"] == "trainer"]
            assert len(trainers) == 2 and all(x["status"] == "completed" for x in ranks), (key, label)
            for ours, theirs in zip(trainers, none):  # caching is exact and sampling policy-free: same losses
                np.testing.assert_array_equal(ours["minibatches"]["loss"], theirs["minibatches"]["loss"])
            # remote inputs the buffer missed, plus refills, over the steady epochs: 2..3 of 4 (none-serial,
            # whose last epoch is steady too, runs in the network grid below)
            steady = [1, 2]
            assert run_timed_epochs([x["epochs"] for x in trainers]) == steady, (key, label)
            fetched = 0
            for x in trainers:
                mb = x["minibatches"][np.isin(x["minibatches"]["epoch"], steady)]
                fetched += int((mb["input_remote"] - mb["hits"] + mb["refills"]).sum())
            assert r["runs"][label]["rows_per_epoch"] == pytest.approx(fetched / len(steady)), (key, label)
        runs = r["runs"]
        for label in ("static-f0.25", "lookahead-f0.25", "heuristic-f0.25"):
            assert runs[label]["rows_per_epoch"] < runs["none"]["rows_per_epoch"], (key, label)
            assert runs[label]["hit_percent"] > 0
        assert runs["lookahead-f0.25"]["rows_per_epoch"] < runs["static-f0.25"]["rows_per_epoch"]
        # Belady MIN on the traced lookahead run's inputs bounds every policy's rows over the run
        least = runs["lookahead-f0.25"]["min_rows"]
        assert least == min(fig["min_rows"] for fig in runs.values() if fig["min_rows"] is not None) > 0
        assert all(least <= fig["rows_all_epochs"] for fig in runs.values()), key
        assert runs["lookahead-f0.25"]["rows_all_epochs"] > runs["lookahead-f0.25"]["rows_per_epoch"]  # epoch 1 too


def test_every_run_is_reproduced_by_the_simulator(tiny):
    _, results, _ = tiny
    s = results["simulator"]
    assert s["runs"] == 14 and s["mismatches"] == []
    logged = sum(len(x["minibatches"]) for r in results["grid"]["configs"].values() for fig in r["runs"].values()
                 for x in read_logs(fig["run"]) if x["role"] == "trainer")
    assert s["minibatches"] == logged > 0
    scale = results["scale"]["16"]
    pol = scale["policies"]
    assert scale["parts"] == 16 and set(pol) == {"none", "static", "fixed", "lookahead", "heuristic"}
    assert pol["static"]["rows_per_epoch"] < pol["none"]["rows_per_epoch"]


def test_agents_classifiers_and_the_peer_are_reported(tiny):
    out, results, stdout = tiny
    configs = results["grid"]["configs"]
    for r in configs.values():
        d = r["runs"]["heuristic-f0.25"]["decisions"]
        assert d["count"] > 0 and d["invalid_rate"] == 0 and d["pass_at_1_hitrate"] is not None
        llm = r["runs"]["llm-f0.25"]["decisions"]  # the tiny grid's llm runs apply answers 1 minibatch on: all answered
        answered = sum(int((x["decisions"]["fallback"] == 0).sum()) for x in read_logs(r["runs"]["llm-f0.25"]["run"])
                       if x["role"] == "agent")
        assert llm["count"] >= 1 and llm["invalid_rate"] == 0 and llm["answered"] == answered == llm["count"]
        assert r["runs"]["classifier-f0.25"]["decisions"]["count"] > 0
    c = results["grid"]["classifiers"]
    assert c["seen_datasets"] == ["cora"] and c["kind"] == "xgb" and os.path.isfile(c["model"])
    assert set(c["seen"]) == set(c["unseen"]) == {"lr", "svm", "rf", "xgb", "mlp"}
    assert c["seen_rows"] > 0 and c["unseen_rows"] > 0
    with open(os.path.join(os.path.dirname(c["model"]), "preprocessor.json")) as f:
        meta = json.load(f)
    unseen_runs = [fig["run"] for r in configs.values() for label, fig in r["runs"].items()
                   if label.startswith("fixed-") and r["config"]["dataset"] not in c["seen_datasets"]]
    for kind in c["seen"]:  # the report's accuracies are the saved models' own, recomputed from the raw traces
        assert c["seen"][kind] == pytest.approx(held_out_accuracy(os.path.dirname(c["model"]), kind, meta)), kind
        assert c["unseen"][kind] == pytest.approx(unseen_accuracy(os.path.dirname(c["model"]), kind, meta, unseen_runs))
    peer = results["distdgl"]
    why = distdgl_peer.unavailable()
    assert ("skipped" in peer) == (why is not None)  # skipped exactly when the peer cannot run here, saying why
    if why is not None:
        assert peer["skipped"] == why
    else:
        p = peer["cora-p2-b8-f10_25"]
        assert p["epoch_seconds"] > 0 and p["rows_per_epoch"] > 0 and 0 < p["test_acc"] <= 1 and p["batch_size"] == 8
    md = (out / "results.md").read_text()
    assert md == (out / "published.md").read_text()
    assert "python bench/evaluate.py --grid" in md and "## cora-p2-b8-f10_25" in md and "## Classifiers" in md
    assert "## Where the llm policy does not win" in md and "## Simulator" in md
    assert os.path.isfile(out / "plots" / "cora-p2-b8-f10_25.png")


def test_the_report_rebuilds_from_the_logs(tiny, tiny_grid):
    out, results, _ = tiny
    before = (out / "results.md").read_text()
    proc = evaluate("--grid", tiny_grid, "--out", out, "--report-only")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "results.md").read_text() == before


def test_a_rerun_reuses_every_finished_run_and_reruns_one_made_by_other_code(tiny, tiny_grid):
    """One rerun of the harness over the tiny grid's output, one of whose runs is stamped as made by
    other code (as if the library changed since): that run alone runs again, every other finished
    run and partition is reused, and the figures are the same."""
    out, results, _ = tiny
    stamps = sorted(out.glob("runs/*/none/harness.json"))
    record = json.loads(stamps[0].read_text())
    assert record["code"] != "stale"
    stamps[0].write_text(json.dumps({**record, "code": "stale"}))
    proc = evaluate("--grid", tiny_grid, "--seed", "0", "--out", out, "--no-validate")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = [line for line in proc.stdout.splitlines() if "ran runs/" in line]
    assert len(ran) == 1 and f"ran runs/{stamps[0].parent.parent.name}/none (" in ran[0], proc.stdout
    assert "partitioned cora" not in proc.stdout
    assert json.loads(stamps[0].read_text()) == record
    again = json.loads((out / "results.json").read_text())
    for key, r in again["grid"]["configs"].items():
        for label, fig in r["runs"].items():
            assert fig["rows_per_epoch"] == results["grid"]["configs"][key]["runs"][label]["rows_per_epoch"]


def test_the_report_shows_each_epoch_times_spread_or_that_the_run_was_too_short():
    """The tables' epoch cell: the epoch time and its steady epochs' least and most; a run too short
    for an epoch time says so (rudder.logs.metrics), one whose time is missing otherwise a dash."""
    from bench.evaluation.report import epoch_cell

    assert epoch_cell({"epoch_seconds": 9.66, "epoch_spread": [9.58, 9.71], "steady_epochs": "2..4"}) == "9.660 (9.580-9.710)"
    short = "too short for an epoch time: 3 complete epochs, the steady state needs at least 4 (...)"
    assert epoch_cell({"epoch_seconds": None, "epoch_spread": [None, None], "steady_epochs": short}) == "too short"
    assert epoch_cell({"epoch_seconds": None}) == "-"


@pytest.mark.parametrize("text, expected", [
    ("[grid]\nranks = [2]\n", "no [datasets] table"),
    ("[datasets]\na = 'bundled:cora'\n[grid]\nranks = [2]\nfractions = [0.25]\npolicies = ['nope']\n", "policy 'nope'"),
    ("[datasets]\na = { spec = 'bundled:cora', rank = [2] }\n[grid]\nranks = [2]\nfractions = [0.25]\npolicies = ['none']\n",
     "unknown key 'rank'"),
    ("not toml [", "not valid TOML"),
    ("[datasets]\na = { spec = 'bundled:cora', feature_dtype = 'float8' }\n[grid]\nranks = [2]\nfractions = [0.25]\n"
     "policies = ['none']\n", "feature_dtype must be one of auto"),
    ("[datasets]\na = { spec = 'bundled:cora', rates = ['1gbit'] }\n[grid]\nranks = [2]\nfractions = [0.25]\n"
     "policies = ['none']\n", "has rates but the grid no [network] table"),
    ("repeats = 0\n[datasets]\na = 'bundled:cora'\n[grid]\nranks = [2]\nfractions = [0.25]\npolicies = ['none']\n",
     "repeats must be a whole number of runs >= 1, not 0"),
])
def test_a_bad_grid_is_one_line(tmp_path, text, expected):
    grid = tmp_path / "grid.toml"
    grid.write_text(text)
    proc = evaluate("--grid", grid, "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr and str(grid) in proc.stderr


def test_a_repeated_grid_reports_each_settings_median_run(tmp_path):
    """``repeats = 3``: every policy and sweep setting runs three times, in rounds over the grid (each
    a run of its own, the same rows: caching and sampling are exact); its row is the run with the median epoch time,
    every run's time is kept, and the report states the spread; a rebuilt report agrees."""
    grid, out, proc = evaluate_grid(
        tmp_path, 'name = "repeated"\nepochs = 4\nhidden = 8\nrepeats = 3\nshare_launches = true\n[datasets]\n'
        'cora = { spec = "bundled:cora", batch_sizes = [16] }\n[grid]\nranks = [2]\nfractions = [0.25]\n'
        'policies = ["none"]\n[oracle]\nlookahead = [2]\n')
    results = json.loads((out / "results.json").read_text())
    (runs,) = [r["runs"] for r in results["grid"]["configs"].values()]
    assert sorted(runs) == ["none", "sweep-lookahead-w2-halo-f0.25"]
    # in rounds over the whole grid, not each setting's repetitions back to back
    order = [line.split("runs/", 1)[1].split("/", 1)[1].split(" ")[0] for line in proc.stdout.splitlines()
             if " ran runs/" in line]
    assert order == ["none", "sweep-lookahead-w2-halo-f0.25"] + [f"{label}.rep{k}" for k in (2, 3)
                                                                for label in ("none", "sweep-lookahead-w2-halo-f0.25")]
    for label, fig in runs.items():
        rep = fig["repeats"]
        assert [os.path.basename(r) for r in rep["runs"]] == [label, f"{label}.rep2", f"{label}.rep3"]
        assert rep["rounds"] == [1, 2, 3]
        assert fig["epoch_seconds"] == sorted(rep["epoch_seconds"])[1] and fig["run"] in rep["runs"]
        rows = {int(sum((x["minibatches"]["input_remote"] - x["minibatches"]["hits"]).sum()
                        for x in read_logs(r) if x["role"] == "trainer")) for r in rep["runs"]}
        assert len(rows) == 1, (label, rows)  # three runs, the same remote rows
    md = (out / "results.md").read_text()
    assert "Every policy and setting ran 3 times" in md
    assert "- cora-p2-b16-f10_25, f=0.25: sweep-lookahead-w2-halo run 1 " in md
    proc = evaluate("--grid", grid, "--out", out, "--report-only")
    assert proc.returncode == 0 and (out / "results.md").read_text().split("\n", 3)[3] == md.split("\n", 3)[3]


def test_a_shared_launch_that_fails_leaves_the_failure_to_its_run(tmp_path):
    """``share_launches``: a grid's runs of one layout share a launch; when one of them fails, the
    runs before it are kept, it runs again alone for its own error, and the runs after it run
    alone, so the results name the failing run and every other run finished."""
    _, out, proc = evaluate_grid(
        tmp_path, 'epochs = 2\nshare_launches = true\n[datasets]\ncora = { spec = "bundled:cora", batch_sizes = [32] }\n'
        '[grid]\nranks = [2]\nfractions = [0.25]\npolicies = ["none", "fixed", "lookahead"]\n'
        '[policy_flags]\nfixed = ["--delta", "0"]\n')
    assert "ran runs/cora-p2-b32-f10_25/none (in a launch of 3 runs" in proc.stdout
    assert "a shared launch stopped after 1 runs; the other 2 run one launch each" in proc.stdout
    assert "ran runs/cora-p2-b32-f10_25/lookahead-f0.25 (" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    (failed,) = results["failed"]
    assert failed.startswith("runs/cora-p2-b32-f10_25/fixed-f0.25: ") and "--delta 0: expected a positive" in failed
    assert sorted(next(iter(results["grid"]["configs"].values()))["runs"]) == ["lookahead-f0.25", "none"]


NETWORK_GRID = """
name = "network"
epochs = 5
hidden = 16
share_launches = true  # the floors' compute-only runs (shaped runs have a launch each)

[datasets]
cora = { spec = "bundled:cora", batch_sizes = [16], feature_dtype = "float32" }

[grid]
ranks = [2]
fractions = [0.25]
policies = ["none-serial", "none"]  # a buffer policy under shaping: tests/test_netem.py
shifts = ["2:seeds=0.5"]  # steady epochs 2..4: one before the shift, two after

[network]
rates = ["none", "250mbit"]
links = ["shared"]

[targets]
over_floor = 0.01
"""


def test_a_network_grid_runs_every_policy_under_the_same_shaping(tmp_path):
    """[network]: each configuration again under rudder.netem; its traffic crossed the shaping, its
    rows are the unshaped runs' exactly, and the report says the network and the wait share."""
    from rudder.netem.namespaces import support_problem

    if support_problem():
        pytest.skip(f"no shaped network on this machine: {support_problem()}")
    _, out, proc = evaluate_grid(tmp_path, NETWORK_GRID)
    results = json.loads((out / "results.json").read_text())
    configs = results["grid"]["configs"]
    plain_key = "cora-p2-b16-f10_25-s2-seeds0.5"
    assert sorted(configs) == [plain_key, f"{plain_key}-r250mbit-shared"]
    plain, shaped = configs[plain_key], configs[f"{plain_key}-r250mbit-shared"]
    # overlap changes no traffic, epoch by epoch
    rows = {label: [sum(int(x["minibatches"]["input_remote"][x["minibatches"]["epoch"] == e].sum())
                        for x in read_logs(plain["runs"][label]["run"]) if x["role"] == "trainer") for e in range(5)]
            for label in ("none-serial", "none")}
    assert rows["none-serial"] == rows["none"] and min(rows["none"]) > 0
    for label, fig in shaped["runs"].items():
        assert fig["rows_per_epoch"] == plain["runs"][label]["rows_per_epoch"]  # shaping changes time, not rows
        stats = json.loads(open(os.path.join(fig["run"], "netem.json")).read())
        logged = sum(int(x["minibatches"]["bytes_rma"].sum()) for x in read_logs(fig["run"]))
        assert stats["returncode"] == 0 and stats["crossed_bytes"] >= logged > 0
    md = (out / "results.md").read_text()
    assert "Network: 250mbit, one link shared by every rank. `none-serial` waits for remote data" in md
    assert "Network: unshaped (loopback)" in md and "inside `python -m rudder.netem`" in md
    assert shaped["runs"]["none-serial"]["wait_share"] > 0
    check_floors(shaped, md)


def check_floors(shaped: dict, md: str) -> None:
    """Every shaped run's floor: its compute-only run is the same run on one node (every remote row
    through shared memory, the same losses), and the floor is, per steady epoch (2..4), the larger of
    that run's epoch and the logged RMA bytes (every trainer: one shared link) over the rate, then
    over the epochs as the epoch time is (the median within each phase of the shift, weighted)."""
    from rudder.logs.metrics import epoch_time

    for label, fig in shaped["runs"].items():
        fl = fig["floor"]
        alone = read_logs(fl["compute_only_run"])
        assert fl["compute_only_run"].endswith(f"cora-p2-b16-f10_25-s2-seeds0.5-1node/{label}")
        assert {x["layout"]["num_nodes"] for x in alone} == {1}, label
        shaped_logs = [x for x in read_logs(fig["run"]) if x["role"] == "trainer"]
        for ours, theirs in zip([x for x in alone if x["role"] == "trainer"], shaped_logs, strict=True):
            mb = ours["minibatches"]
            assert mb["rows_rma"].sum() == 0 and mb["rows_shared"].sum() > 0, label
            np.testing.assert_array_equal(mb["loss"], theirs["minibatches"]["loss"])
        # the steady epochs of 5: 2..4, and 2..5 where nothing runs ahead (none-serial)
        timed = [1, 2, 3, 4] if label == "none-serial" else [1, 2, 3]
        phases = [0] + [1] * (len(timed) - 1)
        mbs = [x["minibatches"] for x in shaped_logs]
        assert all((mb["bytes_rma"] == 4 * 1433 * mb["rows_rma"]).all() for mb in mbs)  # feature_dtype = "float32"
        wire = np.array([sum(int(mb["bytes_rma"][mb["epoch"] == e].sum() + mb["adjacency_bytes_rma"][mb["epoch"] == e].sum())
                             for mb in mbs) for e in timed])
        compute = np.array([max(float(x["epochs"]["seconds"][x["epochs"]["epoch"] == e][0])
                                for x in alone if x["role"] == "trainer") for e in timed])
        assert fl["epochs"] == timed and fl["rate_bit"] == 250 * 10**6 and (wire > 0).all() and (compute > 0).all()
        assert fl["wire_bytes_per_epoch"] == pytest.approx(epoch_time(wire, phases))
        assert fl["bandwidth_seconds"] == pytest.approx(epoch_time(8 * wire / 250e6, phases))
        assert fl["compute_seconds"] == pytest.approx(epoch_time(compute, phases))
        assert fl["seconds"] == pytest.approx(epoch_time(np.maximum(compute, 8 * wire / 250e6), phases))
        # no steady epoch ran below its bandwidth floor: the link cannot carry more than its rate.
        # An epoch moves the rows of its minibatches shifted by the run-ahead, so one whose next
        # epoch is in another phase (fewer seeds) is left out; 0.9: the token bucket's burst and
        # the minibatches' own spread within a phase
        slowest = np.array([max(float(x["epochs"]["seconds"][x["epochs"]["epoch"] == e][0]) for x in shaped_logs)
                            for e in timed])
        steady = [i for i, e in enumerate(timed) if phases[i] == (phases + [phases[-1]])[i + 1]]
        assert (slowest[steady] >= 0.9 * 8 * wire[steady] / 250e6).all(), (label, slowest, 8 * wire / 250e6)
        assert f"| {label.partition('-f')[0]} | " in md.split("Each run against its floor")[1]
    worst = max(fig["epoch_seconds"] / fig["floor"]["seconds"] for fig in shaped["runs"].values())
    assert f"every policy's epoch <= 0.01x its floor: NOT met: {worst:.2f}x (target <= 0.01x)" in md


def test_a_grid_shift_is_a_configuration_axis(tmp_path):
    """[grid] or a dataset's ``shifts``: each configuration once per --shift value ("" steady), its
    name showing the shift, its runs given the flag; a bad shift is one line naming the grid."""
    from bench.evaluation.grid import GridError, configurations, load_grid, shift_flags

    grid = load_grid(os.path.join(REPO, "bench", "grids", "shift.toml"))
    configs = configurations(grid, {"facebook": "spec"})
    assert [c.key for c in configs] == ["facebook-p4-b256-f10_25", "facebook-p4-b256-f10_25-s2-fanouts5_5-seeds0.5"]
    assert shift_flags(configs[1].shift) == ["--shift", "2:fanouts=5,5;seeds=0.5"] and shift_flags(configs[0].shift) == []
    assert "tuner" in grid["grid"]["policies"]
    text = "epochs = 3\n[datasets]\na = { spec = 'bundled:cora', shifts = [%s] }\n[grid]\nranks = [2]\nfractions = [0.25]\n" \
           "policies = ['none']\n"
    for shifts, expected in (("'2:fanout=5,5'", "KEY one of fanouts"), ("'3:batch=8'", "past the grid's 3 epochs"),
                             ("2", "non-empty list of --shift strings")):
        (tmp_path / "g.toml").write_text(text % shifts)
        with pytest.raises(GridError) as e:
            load_grid(str(tmp_path / "g.toml"))
        assert expected in str(e.value) and "\n" not in str(e.value) and "g.toml: dataset 'a'" in str(e.value), str(e.value)
