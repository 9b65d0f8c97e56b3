"""python -m rudder.analyze on logs of real small runs (Cora, 4 ranks, none and fixed, traced):
figures equal those recomputed from the raw rows, the Belady bound is never above any run's
traffic, killed runs still summarise, bad input is one line, JSON follows SCHEMA, plots exist."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, as_older_log, run_trains


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    base = tmp_path_factory.mktemp("analyze")
    parts = str(base / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, parts, method="metis", seed=0)
    out = {name: str(base / name) for name in ("none", "fixed", "heuristic", "deep")}
    # One launch of 6 ranks on 2 emulated nodes: the heuristic's agent a node; the other jobs on the
    # 4 trainer slots. The heuristic answers the structured action: it predicts the wait too (Pass@1
    # of all three). A pipeline 3 deep: 4 minibatches of run-ahead over 3 an epoch reach 2 epochs at each end
    common = ["--data", parts, "--progress", "none"]
    jobs = [{"argv": [*common, "--run-dir", out[policy], "--policy", policy, "--delta", "2", "--epochs", "4",
                      "--eval-every", "2", "--trace", *action], "trainers_only": policy != "heuristic"}
            for policy, action in (("none", ()), ("fixed", ()), ("heuristic", ("--agent-action", "structured")))]
    jobs.append({"argv": [*common, "--run-dir", out["deep"], "--prefetch-depth", "3", "--epochs", "6", "--eval-every", "0"],
                 "trainers_only": True})
    proc = run_trains(6, jobs, base, env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


def analyze(*args):
    return subprocess.run([sys.executable, "-m", "rudder.analyze", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def raw(run, role="trainer"):
    tables = []
    for p in sorted(glob.glob(os.path.join(run, "rank-*.h5"))):
        with h5py.File(p, "r", locking=False) as f:
            if f.attrs["role"] == role == "trainer":
                tables.append((f["minibatches"][()], f["epochs"][()]))
            elif f.attrs["role"] == role == "agent":
                tables.append((f["decisions"][()], f["outcomes"][()]))
    return tables


def check_footprint(fp: dict, run) -> None:
    """Start-up and memory: the slowest trainer's start-up, the most CPU, imports aside (the phases
    that load code), and the largest trainer's peak PSS by owner, from the raw rows."""
    startups, peaks = [], []
    for p in sorted(glob.glob(os.path.join(run, "rank-*.h5"))):
        with h5py.File(p, "r", locking=False) as f:
            if f.attrs["role"] == "trainer":
                startups.append(f["startup"][()])
                memory = f["memory"][()]
                peaks.append(memory[int(memory["pss_bytes"].argmax())])
    assert fp["startup_wall_seconds"] == pytest.approx(max(t["seconds"].sum() for t in startups))
    assert fp["startup_cpu_seconds"] == pytest.approx(max(t["cpu_seconds"].sum() for t in startups))
    less = [t["cpu_seconds"][~np.isin(t["phase"], [b"imports", b"trainer imports"])].sum() for t in startups]
    assert fp["startup_cpu_seconds_less_imports"] == pytest.approx(max(less)) and 0 < max(less) < fp["startup_cpu_seconds"]
    largest = max(peaks, key=lambda row: row["pss_bytes"])
    assert fp["peak_pss_bytes"] == largest["pss_bytes"] and fp["peak_features_bytes"] == largest["features_bytes"] > 0
    assert fp["mean_peak_pss_bytes"] == pytest.approx(np.mean([row["pss_bytes"] for row in peaks]))


def test_figures_equal_the_raw_rows(runs):
    from rudder.analysis.summary import summarize
    from rudder.logs.reader import load_run

    for policy, run in runs.items():
        if policy == "deep":
            continue
        s = summarize(load_run(run))
        tables = raw(run)
        mb = np.concatenate([t[0] for t in tables])
        seconds = np.max([t[1]["seconds"] for t in tables], axis=0)
        assert s["epochs"]["count"] == 4 and s["status"] == "completed" and not s["warnings"]
        assert s["epochs"]["train_seconds"] == pytest.approx(seconds.sum())
        # per-epoch figures over the steady epochs, 2..3 (the first warms up, the last starts with
        # minibatches the pipeline prepared in the third: 3 steps an epoch, 2 minibatches of run-ahead)
        assert s["epochs"]["timed"] == [1, 2] and s["epochs"]["steady"] == "2..3"
        assert s["epochs"]["median_seconds"] == pytest.approx(np.median(seconds[1:3]))
        assert s["epochs"]["mean_seconds"] == pytest.approx(np.mean(seconds[1:3]))
        assert (s["epochs"]["min_seconds"], s["epochs"]["max_seconds"]) == (seconds[1:3].min(), seconds[1:3].max())
        later = [t[0][(t[0]["epoch"] >= 1) & (t[0]["epoch"] <= 2)] for t in tables]
        assert s["time_breakdown"]["t_fetch"] == pytest.approx(np.mean([t["t_fetch"].sum() for t in later]) / 2)
        timed = np.concatenate(later)
        # the threads' CPU seconds: per trainer per epoch, and as a share of the same work's wall seconds
        cpu = s["cpu"]
        assert cpu["cpu_compute"] == pytest.approx(timed["cpu_compute"].sum() / 2 / 4)  # 2 timed epochs, 4 trainers
        assert cpu["cpu_sample_of_wall"] == pytest.approx(timed["cpu_sample"].sum() / timed["t_sample"].sum())
        assert cpu["cpu_compute_of_wall"] == pytest.approx(
            timed["cpu_compute"].sum() / (timed["t_forward_backward"] + timed["t_update"]).sum())
        assert all(0 < cpu[f"{c}_of_wall"] <= 1.02 for c in ("cpu_sample", "cpu_fetch", "cpu_copy", "cpu_compute"))
        for minibatches, epochs in tables:  # the epoch rows sum them
            for c in ("cpu_sample", "cpu_fetch", "cpu_copy", "cpu_compute"):
                assert epochs[c] == pytest.approx([minibatches[c][minibatches["epoch"] == e].sum() for e in range(4)])
        assert s["traffic"]["remote_rows_fetched_per_epoch"] == pytest.approx(
            (timed["input_remote"] - timed["hits"] + timed["refills"]).sum() / 2)
        assert s["traffic"]["rma_bytes_per_epoch"] == pytest.approx(timed["bytes_rma"].sum() / 2)
        fetched = (mb["input_remote"] - mb["hits"] + mb["refills"]).sum()
        assert (s["buffer"]["hits"], s["buffer"]["refills"], s["buffer"]["comm_volume"]) == (
            mb["hits"].sum(), mb["refills"].sum(), mb["comm_volume"].sum())
        assert s["accuracy"]["test"] == pytest.approx(float(tables[0][1]["test_acc"][-1]))
        check_footprint(s["footprint"], run)
        bound = s["bound"]
        assert bound["achieved_rows"] == fetched
        assert bound["infinite_rows"] <= bound["min_rows"] <= bound["achieved_rows"]  # MIN never above any policy
        if policy == "fixed":
            assert s["buffer"]["hits"] > 0 and s["buffer"]["refills"] > 0
        if policy != "heuristic":
            assert s["decisions"] is None
            continue
        decisions = np.concatenate([t[0] for t in raw(run, "agent")])
        q = s["decisions"]
        assert (q["count"], q["evict"]) == (decisions.size, int((decisions["decision"] == 1).sum())) and q["count"] > 0
        assert q["latency_mean"] == pytest.approx(decisions["latency"].mean())
        assert s["time_breakdown"]["agent"] == pytest.approx(decisions["latency"].sum() / 4 / 4)  # 4 trainers, 4 epochs
        n = sum(int((decisions["trainer"] == t).sum()) - 1 for t in np.unique(decisions["trainer"]))
        assert q["pass_at_1_hitrate"]["n"] == n and n > 0
        assert q["pass_at_1_hitrate"]["value"] == pytest.approx(pass_at_1(decisions, "hitrate", "hitrate_impact"))
        assert q["pass_at_1_comm"]["value"] == pytest.approx(pass_at_1(decisions, "comm_volume", "comm_impact"))
        assert (decisions["wait_impact"] >= 0).all() and (decisions["wait_seconds"] > 0).any()
        assert q["pass_at_1_wait"]["n"] == n
        assert q["pass_at_1_wait"]["value"] == pytest.approx(pass_at_1(decisions, "wait_seconds", "wait_impact", 0.05))
        for name in ("hitrate", "comm", "wait"):
            p = q[f"pass_at_1_{name}"]
            assert 0 <= p["low"] <= p["value"] <= p["high"] <= 1


def pass_at_1(decisions, metric, impact, flat=0.0) -> float:
    """Pass@1 recomputed here, one decision at a time: a prediction (IMPACTS: 0 stagnant,
    1 increase, 2 decrease) is right when the metric the trainer's next request reports moved
    that way (by more than ``flat`` times its value, else it stagnated)."""
    right = total = 0
    for trainer in np.unique(decisions["trainer"]):
        mine = sorted((r for r in decisions if r["trainer"] == trainer and r["fallback"] == 0), key=lambda r: r["request"])
        for before, after in zip(mine[:-1], mine[1:]):
            moved = float(after[metric]) - float(before[metric])
            still = abs(moved) <= flat * abs(float(before[metric]))
            expected = {0: still, 1: moved > 0 and not still, 2: moved < 0 and not still}[int(before[impact])]
            right, total = right + int(expected), total + 1
    return right / total


def test_pass_at_1_and_its_interval_by_hand():
    """Three decisions of one trainer and two of another (one fallen back, not scored): the wait
    predictions scored against the next window's mean, flat within 5%; the Wilson interval of 2
    of 3 worked out by hand: centre (2/3 + 1.96^2/6) / (1 + 1.96^2/3), half-width
    1.96 / (1 + 1.96^2/3) sqrt(2/27 + 1.96^2/36)."""
    from rudder.analysis.decisions import accuracy, pass_at_1
    from rudder.logs.schema import DECISION_ROW

    rows = np.zeros(5, DECISION_ROW)
    rows["trainer"], rows["request"] = [0, 0, 0, 1, 1], [0, 1, 2, 0, 1]
    rows["wait_seconds"] = [0.010, 0.0104, 0.020, 0.5, 0.1]  # +4% (flat), then up; down
    rows["wait_impact"] = [0, 2, -1, 2, 1]  # stagnant: right; decrease: wrong; (last: not scored); decrease: right
    assert pass_at_1(rows[:3], "wait_seconds", "wait_impact", 0.05) == (1, 2)
    assert pass_at_1(rows[3:], "wait_seconds", "wait_impact", 0.05) == (1, 1)
    assert pass_at_1(rows[:3], "wait_seconds", "wait_impact", 0.0) == (0, 2)  # +4% is a rise when nothing is flat
    rows["wait_impact"][0] = -1  # not predicted (the paper's action): not scored
    assert pass_at_1(rows[:3], "wait_seconds", "wait_impact", 0.05) == (0, 1)
    a = accuracy(2, 3)
    z = 1.96
    centre, half = (2 / 3 + z * z / 6) / (1 + z * z / 3), z / (1 + z * z / 3) * np.sqrt(2 / 27 + z * z / 36)
    assert a["value"] == pytest.approx(2 / 3) and a["n"] == 3
    assert (a["low"], a["high"]) == pytest.approx((centre - half, centre + half))
    assert (a["low"], a["high"]) == pytest.approx((0.2077, 0.9385), abs=1e-4)
    assert accuracy(0, 0) == {"value": None, "low": None, "high": None, "n": 0}
    full = accuracy(5, 5)
    assert full["high"] == 1.0 and 0.5 < full["low"] < 1.0  # not empty at all correct, as p +- 1.96 sqrt(p(1-p)/n) is


def test_the_epoch_time_by_hand():
    """The median of the timed epochs; with phases (--shift), the median within each phase weighted
    by its epochs, so a short phase counts as it ran instead of the longest phase alone."""
    from rudder.logs.metrics import epoch_phases, epoch_time

    seconds = [10.0, 9.0, 30.0, 2.0, 2.2, 2.1, 2.0]
    assert epoch_time(seconds) == 2.2
    assert epoch_time(seconds, [0, 0, 0, 1, 1, 1, 1]) == pytest.approx((3 * 10.0 + 4 * 2.05) / 7)  # not the mean, 8.19
    assert epoch_time(seconds, [0] * 7) == epoch_time(seconds) and epoch_time([]) is None
    assert epoch_time([], epoch_phases([], [])) is None  # a run stopped before its first epoch has no rows
    with pytest.raises(ValueError, match="7 epochs' seconds against 6 phases"):
        epoch_time(seconds, [0] * 6)


def test_the_steady_epochs_by_hand():
    """The first and the last epoch are not steady (warm-up; the run-ahead's credit), more where the
    pipeline runs ahead further than an epoch; a run without enough steady epochs has no figure."""
    from rudder.logs.metrics import epochs_needed, pipeline_reach, run_ahead, timed_epochs, too_short

    assert run_ahead(1, 0) == 2 and run_ahead(1, 4) == 6 and run_ahead(0, 0) == 0 and run_ahead(0, 4) == 4
    assert [pipeline_reach(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3] and pipeline_reach(-1, 4) == 1
    assert timed_epochs(list(range(5))) == [1, 2, 3] and timed_epochs(list(range(6)), reach=2) == [2, 3]
    assert timed_epochs(list(range(4)), reach=0) == [1, 2, 3]  # no run-ahead: the last is steady
    assert timed_epochs(list(range(3))) == [] and epochs_needed(1) == 4 and epochs_needed(2) == 6
    assert too_short(list(range(4))) is None
    assert too_short(list(range(3))) == ("too short for an epoch time: 3 complete epochs, the steady state needs at "
                                         "least 4 (the first 1 and the last 1 are not steady)")


def test_a_last_epoch_shortened_by_run_ahead_is_not_the_figure():
    """A log written for the test: the last epoch starts with minibatches the pipeline fetched in the
    epoch before (the issue's lookahead run: 11.36, 9.66, 8.57 s, then steady epochs around 9.6 s)."""
    from rudder.logs.metrics import run_epoch_time, run_steady_text, run_timed_epochs, run_too_short
    from rudder.logs.schema import EPOCH_ROW

    def trainer(seconds, run_ahead=2, steps=14):
        rows = np.zeros(len(seconds), EPOCH_ROW)
        rows["epoch"], rows["seconds"], rows["complete"], rows["steps"] = range(len(seconds)), seconds, 1, steps
        rows["run_ahead"] = run_ahead
        return rows

    slow, fast = [11.36, 9.66, 9.58, 9.71, 8.57], [11.0, 9.5, 9.6, 9.5, 8.4]
    tables = [trainer(slow), trainer(fast)]
    assert run_timed_epochs(tables) == [1, 2, 3] and run_epoch_time(tables) == 9.66  # not 9.62 with the last
    assert run_steady_text(tables) == "2..4"
    deep = [trainer(slow, run_ahead=16), trainer(fast, run_ahead=16)]  # 16 minibatches ahead: 2 epochs at each end
    assert run_timed_epochs(deep) == [] and run_epoch_time(deep) is None and "needs at least 6" in run_too_short(deep)
    older = [trainer(slow, run_ahead=-1)]  # a log from before the column: one epoch at each end
    assert run_timed_epochs(older) == [1, 2, 3]
    assert run_epoch_time([t[:3] for t in tables]) is None and "3 complete epochs" in run_too_short([t[:3] for t in tables])


def test_a_deep_pipeline_times_its_steady_epochs_and_a_short_run_says_so(runs, tmp_path):
    """A real run whose pipeline runs ahead more than an epoch: its epoch time is over the epochs
    neither end's run-ahead touches. Cut to its first 5 epochs it is too short, and the table says so."""
    from rudder.analysis.summary import summarize
    from rudder.logs.reader import load_run

    s = summarize(load_run(runs["deep"]))
    tables = raw(runs["deep"])
    assert all((t[1]["steps"] == 3).all() and (t[1]["run_ahead"] == 4).all() for t in tables)
    seconds = np.max([t[1]["seconds"] for t in tables], axis=0)
    assert s["epochs"]["timed"] == [2, 3] and s["epochs"]["median_seconds"] == pytest.approx(np.median(seconds[2:4]))
    short = tmp_path / "short"
    shutil.copytree(runs["deep"], short)
    for path in glob.glob(str(short / "rank-*.h5")):
        with h5py.File(path, "r+") as f:
            kept = f["epochs"][()][:5]
            del f["epochs"]
            f.create_dataset("epochs", data=kept, maxshape=(None,), chunks=True)
    s = summarize(load_run(str(short)))
    assert s["epochs"]["median_seconds"] is None and s["epochs"]["timed"] == []
    assert s["epochs"]["steady"].startswith("too short for an epoch time: 5 complete epochs, the steady state needs at least 6")
    proc = analyze(short)
    assert proc.returncode == 0, proc.stderr
    steady = next(line for line in proc.stdout.splitlines() if line.startswith("steady epochs"))
    assert "too short for an epoch time" in steady
    assert next(line for line in proc.stdout.splitlines() if line.startswith("epoch time s")).split()[-1] == "-"


def test_the_median_interval_by_hand():
    """The sign test's interval of a median: x(k) and x(n+1-k), k the largest whose coverage
    1 - 2 P(Binomial(n, 1/2) < k) is at least the level (bench/agent.py prints it for paired runs)."""
    from rudder.logs.metrics import median_interval

    # n = 8: k = 2 covers 1 - 2 (1 + 8) / 256 = 0.930; k = 3 only 1 - 2 (1 + 8 + 28) / 256 = 0.711
    assert median_interval([5, 1, 7, 3, 8, 2, 6, 4]) == (2.0, 7.0, pytest.approx(1 - 18 / 256))
    assert median_interval([5, 1, 7, 3, 8, 2, 6, 4], level=0.7) == (3.0, 6.0, pytest.approx(1 - 74 / 256))
    assert median_interval(range(1, 6)) == (1.0, 5.0, pytest.approx(1 - 2 / 32))  # n = 5: the extremes, 0.9375
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None  # n = 4: even the extremes cover only 0.875


def test_table_json_and_plots(runs, tmp_path):
    from rudder.analysis.report import SCHEMA

    proc = analyze(runs["none"], runs["fixed"], runs["heuristic"], "--baseline", runs["none"], "--plots", tmp_path / "plots")
    assert proc.returncode == 0, proc.stderr
    assert "Belady MIN rows" in proc.stdout and "fixed" in proc.stdout and "x)" in proc.stdout and "Pass@1" in proc.stdout
    for name in ("hits_and_traffic.png", "time_breakdown.png", "decisions.png"):
        path = tmp_path / "plots" / name
        assert path.stat().st_size > 5000 and path.read_bytes()[:4] == b"\x89PNG"
    proc = analyze(runs["none"], runs["fixed"], runs["heuristic"], "--json")
    doc = json.loads(proc.stdout)
    assert set(doc) == {"runs", "baseline"} and len(doc["runs"]) == 3 and doc["runs"][2]["decisions"]
    for summary in doc["runs"]:
        validate(summary, SCHEMA, "summary")


def validate(value, schema, where):
    if isinstance(schema, dict):
        assert isinstance(value, dict) and set(value) == set(schema), (where, sorted(value), sorted(schema))
        for key, sub in schema.items():
            validate(value[key], sub, f"{where}.{key}")
        return
    options = schema if isinstance(schema, tuple) else (schema,)
    for option in options:
        if option is None and value is None:
            return
        if isinstance(option, dict) and isinstance(value, dict):
            return validate(value, option, where)
        if isinstance(option, type) and isinstance(value, option if option is not float else (int, float)):
            return
    raise AssertionError(f"{where}: {value!r} is not {schema}")


def test_a_log_from_before_the_cpu_columns(runs, tmp_path):
    """Logs an older version wrote have no CPU seconds: their CPU figures are absent, not NaN or 0,
    and every other figure is what it was."""
    from rudder.analysis.summary import summarize
    from rudder.logs.reader import load_run

    run = tmp_path / "older"
    shutil.copytree(runs["fixed"], run)
    for path in run.glob("rank-*.h5"):
        as_older_log(path)
    older, now = summarize(load_run(str(run))), summarize(load_run(runs["fixed"]))
    assert set(older["cpu"]) == set(now["cpu"]) and all(v is None for v in older["cpu"].values())
    assert all(v is not None for v in now["cpu"].values())
    assert {k: v for k, v in older.items() if k not in ("cpu", "run")} == {k: v for k, v in now.items()
                                                                           if k not in ("cpu", "run")}
    proc = analyze(run)
    assert proc.returncode == 0, proc.stderr
    threads = [line for line in proc.stdout.splitlines() if "CPU s/epoch" in line or "CPU / wall" in line]
    assert [line.split()[-1] for line in threads] == ["-"] * 8


def test_killed_run_still_summarises(runs, tmp_path):
    run = tmp_path / "killed"
    shutil.copytree(runs["fixed"], run)
    os.remove(run / "rank-00003.h5")
    with open(run / "rank-00002.h5", "r+b") as f:  # a file cut short mid-write
        f.truncate(os.path.getsize(run / "rank-00002.h5") // 3)
    with h5py.File(run / "rank-00001.h5", "a") as f:
        f.attrs["status"] = "running"
    proc = analyze(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "ranks 2, 3 of 4 missing" in proc.stdout and "rank-00002.h5: unreadable" in proc.stdout
    assert "rank 1: status running" in proc.stdout and "incomplete" in proc.stdout


def test_bad_input_is_one_line(runs, tmp_path):
    for args, needle in (([tmp_path / "nope"], "not a directory"), ([tmp_path], "no rank-NNNNN.h5 logs")):
        proc = analyze(*args)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    run = tmp_path / "future"
    shutil.copytree(runs["none"], run)
    with h5py.File(run / "rank-00000.h5", "a") as f:
        f.attrs["format_version"] = 9
    proc = analyze(run)
    assert proc.returncode == 2 and "version 9 is not supported" in proc.stderr and "Traceback" not in proc.stderr
