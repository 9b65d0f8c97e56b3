"""The trace-driven simulator (rudder.simulate): it reproduces real runs exactly (here at 8 ranks;
test_train_policies checks 2 and 4 ranks under every buffer policy, test_evaluate every policy
of the tiny grid), its validator catches a log that differs, and its CLI reports rows and
modelled times for any partition count."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, as_older_log, read_logs, run_train, run_trains, train_command


@pytest.fixture(scope="module")
def cora8(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = str(tmp_path_factory.mktemp("cora8") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 8, parts, method="metis", seed=0)
    return parts


def simulate(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "rudder.simulate", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_eight_real_ranks_are_reproduced_exactly_and_a_changed_log_is_caught(cora8, tmp_path):
    run = str(tmp_path / "run")
    proc = run_train(8, "--data", cora8, "--run-dir", run, "--policy", "fixed", "--delta", "3", "--buffer-init", "random",
                     "--epochs", "3", "--batch-size", "8", "--seed", "5", "--eval-every", "0", "--progress", "none",
                     env={"MPIR_CVAR_NUM_CLIQUES": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = simulate("--validate", run, "--workers", "2")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ", match " in ok.stdout
    compared = int(ok.stdout.split(": ")[-1].split()[0])
    with h5py.File(f"{run}/rank-00000.h5", "r") as f:
        assert compared == 8 * len(f["minibatches"])

    changed = str(tmp_path / "changed")  # one refill count off on trainer 5: the validator names it
    shutil.copytree(run, changed)
    with h5py.File(f"{changed}/rank-00005.h5", "r+") as f:
        rows = f["minibatches"][()]
        i = int(np.flatnonzero(rows["refills"] > 0)[0])
        rows["refills"][i] += 1
        f["minibatches"][i] = rows[i]
    bad = simulate("--validate", changed, "--workers", "1")
    assert bad.returncode == 1
    assert f"trainer 5 epoch {rows['epoch'][i]} step {rows['step'][i]}: refills {rows['refills'][i]} logged" in bad.stdout
    assert "MISMATCH" in bad.stdout


def test_the_cli_reports_every_policy_with_modelled_times(cora8, tmp_path):
    out = tmp_path / "sim.json"
    proc = simulate("--data", cora8, "--epochs", "4", "--batch-size", "8", "--policies",
                    "none,static,fixed,lookahead,heuristic,f1=fixed:delta=1,slow=heuristic:agent_latency=4",
                    "--feat-dim", "512", "--out", out, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    pol = s["policies"]
    assert list(pol) == ["none", "static", "fixed", "lookahead", "heuristic", "f1", "slow"]
    assert s["parts"] == 8 and s["feat_dim"] == 512 and s["epochs_counted"] == "2..3"
    none = pol["none"]
    assert none["hit_percent"] == 0 and none["fill_rows"] == 0 and none["replacements"] == 0
    for label in ("static", "fixed", "lookahead"):  # any buffer fetches less than none on Cora
        assert 0 < pol[label]["rows_per_epoch"] < none["rows_per_epoch"], label
    assert pol["static"]["fill_rows"] > 0 and pol["static"]["replacements"] == 0
    assert pol["f1"]["replacements"] > pol["fixed"]["replacements"] > 0
    assert pol["heuristic"]["decisions"] > 0 and pol["slow"]["decisions"] < pol["heuristic"]["decisions"]
    for r in pol.values():  # the time model: overlap never slower; comm a share of the step
        assert 0 < r["epoch_seconds_overlap"] <= r["epoch_seconds"]
        assert 0 < r["comm_share"] < 1
    assert "rows/epoch" in proc.stdout and "heuristic" in proc.stdout

    # the same partitions and seed give the same rows with or without worker processes
    again = simulate("--data", cora8, "--epochs", "4", "--batch-size", "8", "--policies", "none,fixed", "--machine",
                     "none", "--workers", "1", "--out", tmp_path / "one.json")
    assert again.returncode == 0, again.stderr
    one = json.loads((tmp_path / "one.json").read_text())["policies"]
    assert one["none"]["rows_per_epoch"] == none["rows_per_epoch"]
    assert one["fixed"]["rows_per_epoch"] == pol["fixed"]["rows_per_epoch"]
    assert "epoch_seconds" not in one["none"]


def test_a_global_vip_fill_applies_where_a_buffer_fills_once(cora8, tmp_path):
    """--buffer-init vip for a list of policies: static and fixed fill by VIP (not as by degree),
    none and lookahead keep theirs; asking vip of lookahead itself is an error."""
    runs = {}
    for init in ("degree", "vip"):
        proc = simulate("--data", cora8, "--epochs", "4", "--batch-size", "8", "--policies", "none,static,fixed,lookahead",
                        "--buffer-init", init, "--machine", "none", "--workers", "1", "--out", tmp_path / f"{init}.json")
        assert proc.returncode == 0, proc.stderr
        runs[init] = json.loads((tmp_path / f"{init}.json").read_text())["policies"]
    for label in ("none", "lookahead"):
        assert runs["vip"][label] == runs["degree"][label]
    assert runs["vip"]["static"]["rows_per_epoch"] != runs["degree"]["static"]["rows_per_epoch"]
    bad = simulate("--data", cora8, "--policies", "lookahead:buffer_init=vip")
    assert bad.returncode == 2 and "fills on demand" in bad.stderr


@pytest.mark.parametrize("args, expected", [
    (["--data", "/nonexistent"], "/nonexistent"),
    (["--policies", "none,bogus"], "'bogus' is not one of"),
    (["--policies", "fixed:delta"], "is not FLAG=VALUE"),
    (["--buffer-fraction", "2"], "--buffer-fraction 2.0: expected a fraction"),
    (["--agent-latency", "0"], "--agent-latency 0"),
    (["--epochs", "3"], "--epochs 3: too short for an epoch time: 3 complete epochs, the steady state needs at least 4"),
])
def test_bad_input_is_one_line(cora8, args, expected):
    proc = simulate("--data", cora8, *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def cora2(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = str(tmp_path_factory.mktemp("cora2") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, parts, method="metis", seed=0)
    return parts


def test_validate_with_a_calibrated_profile_compares_epoch_time(cora2, tmp_path):
    """A local run without overlap gives the CPU figures (rudder.sim.calibration); with a link
    from the shaping (here written by hand: the shaped one below picks by its netem.json),
    --validate prints the predicted against the measured epoch time, rows still exact."""
    from rudder.data.partition_store import PartitionMeta
    from rudder.netem.namespaces import support_problem
    from rudder.sim.calibration import fit_cpu
    from rudder.sim.machine import Machine, save_profile
    from rudder.sim.validate import validate_run
    from rudder.train.config import ConfigError

    # without overlap no epoch is shortened by run-ahead: epochs 2..3 are steady (rudder.logs.metrics)
    flags = ("--epochs", "3", "--batch-size", "16", "--seed", "1", "--eval-every", "0", "--progress", "none")
    # the run without a buffer, then local runs with one (two deltas of fixed), in one launch
    local = str(tmp_path / "local")
    buffered = {delta: str(tmp_path / f"buffered-d{delta}") for delta in (2, 5)}
    proc = run_trains(2, [["--data", cora2, "--run-dir", local, "--no-overlap", *flags]]
                      + [["--data", cora2, "--run-dir", run, "--no-overlap", "--policy", "fixed", "--delta", delta, *flags]
                         for delta, run in buffered.items()], tmp_path, env={"MPIR_CVAR_NUM_CLIQUES": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = fit_cpu([local], cores=2)
    figures = {k: v for k, v in cpu.items() if k not in ("calibration", "buffer_cpu")}
    assert cpu["cores"] == 2 and cpu["flops"] > 0 and all(v >= 0 for v in figures.values())
    assert cpu["calibration"]["fits"]["step_overhead"]["minibatches"] > 0
    # the figures are the threads' own CPU seconds as logged, over the timed epochs
    timed = np.concatenate([log["minibatches"][log["minibatches"]["epoch"] >= 1] for log in read_logs(local)])
    assert cpu["calibration"]["seconds"] == ["cpu"]
    assert cpu["calibration"]["fits"]["sample_step"]["mean_seconds_one_core"] == pytest.approx(timed["cpu_sample"].mean())
    # a log from before those columns: its wall seconds, scaled by the share of a core each trainer had
    older = tmp_path / "older"
    shutil.copytree(local, older)
    for path in older.glob("rank-*.h5"):
        as_older_log(path)
    walled = fit_cpu([str(older)], cores=1)  # 2 trainers on 1 core: half of it each
    assert walled["calibration"]["seconds"] == ["wall"]
    assert walled["calibration"]["fits"]["sample_step"]["mean_seconds_one_core"] == pytest.approx(
        timed["t_sample"].mean() / 2)
    # the runs with a buffer: what their buffer adds to the assembly over the run without one, per
    # policy and settings, and pooled per policy
    both = fit_cpu([local, *buffered.values()], cores=2)
    assert {k: v for k, v in both.items() if k not in ("calibration", "buffer_cpu")} == \
        {k: v for k, v in cpu.items() if k not in ("calibration", "buffer_cpu")}  # the step's figures: the run without
    work = {delta: f"fixed buffer_fraction=0.25 buffer_scope=halo buffer_sharing=trainer buffer_split=pool "
                   f"delta={delta} refill_budget=1.0" for delta in buffered}
    assert sorted(both["buffer_cpu"]) == sorted(["fixed", *work.values()])
    assert all(min(v) >= 0 for v in both["buffer_cpu"].values())
    fits, added = both["calibration"]["fits"]["buffer_cpu"], {}
    for delta, run in buffered.items():
        steps = np.concatenate([log["minibatches"][log["minibatches"]["epoch"] >= 1] for log in read_logs(run)])
        plain = cpu["assemble_step"] + cpu["assemble_byte"] * steps["input_nodes"] * PartitionMeta.load(cora2).feat_dim * 4
        added[delta] = steps["cpu_fetch"] - plain
        assert fits[work[delta]]["runs"] == [run]
        assert fits[work[delta]]["mean_seconds_one_core"] == pytest.approx(float(added[delta].mean()))
    assert fits["fixed"]["runs"] == list(buffered.values())
    assert fits["fixed"]["mean_seconds_one_core"] == pytest.approx(float(np.concatenate(list(added.values())).mean()))
    with pytest.raises(ConfigError, match="at least one run without a buffer"):
        fit_cpu([buffered[2]], cores=2)
    assert cpu["buffer_cpu"] == {}
    cpu.pop("calibration")
    link = dict(latency=1e-4, loaded_latency=2e-4, get_call=5e-6, node_bandwidth=5e9, ranks_per_node=1)
    machines = [Machine(name="host-local", bandwidth=1e9, links="per-trainer", **link, **cpu)]
    machines += [Machine(name=f"host-{r}", bandwidth=b / 8, links="shared", rate=r, rate_bit=b, **link, **cpu)
                 for r, b in (("1gbit", 1e9), ("250mbit", 2.5e8))]
    profile = str(tmp_path / "profile.json")
    save_profile(profile, machines)
    out = tmp_path / "validate.json"
    ok = simulate("--validate", local, "--machine", profile, "--workers", "1", "--out", out)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ", match " in ok.stdout and "predicted/measured" in ok.stdout and "on host-local" in ok.stdout, ok.stdout
    e = json.loads(out.read_text())["epoch_time"]
    assert e["epochs"] == [1, 2] and e["predicted"] > 0 and e["ratio"] == pytest.approx(e["predicted"] / e["measured"])
    assert e["measured"] == pytest.approx(float(np.median(e["measured_per_epoch"])))
    compute = timed[["t_forward_backward", "t_update"]]
    assert e["measured_train_slowdown"] == pytest.approx(
        (compute["t_forward_backward"].sum() + compute["t_update"].sum()) / timed["cpu_compute"].sum())
    # wall over the thread's own CPU time: at least 1, but the two clocks are accounted apart (the
    # thread's CPU at the scheduler's switches, steal time on a VM): a clean-clone CI saw 0.9988
    assert e["measured_train_slowdown"] >= 0.99 and "training threads' compute" in ok.stdout

    # a buffered run is predicted with its own settings' buffer CPU where the profile has it, else
    # with its policy's pooled figures, and never with another setting's
    def predicted(buffer_cpu: dict) -> float:
        path = str(tmp_path / "buffered-profile.json")
        save_profile(path, [dataclasses.replace(machines[0], buffer_cpu=buffer_cpu)])
        return validate_run(buffered[5], machine_name=path)["epoch_time"]["predicted"]

    extra = [0.05, 0.0]  # seconds a minibatch, none an input node
    bare = predicted({})
    own = predicted({work[5]: extra, "fixed": [0.0, 0.0]})
    assert own > bare + 0.5 * extra[0] * len(timed) / 2 / 2  # its minibatches an epoch, most of them on its path
    assert predicted({work[2]: [0.0, 0.0], "fixed": extra}) == pytest.approx(own)
    assert predicted({work[2]: extra, "fixed": [0.0, 0.0]}) == pytest.approx(bare)

    if support_problem() is not None:
        pytest.skip(f"no shaped network on this machine: {support_problem()}")
    shaped = str(tmp_path / "shaped")
    os.makedirs(shaped)
    proc = subprocess.run([sys.executable, "-m", "rudder.netem", "--rate", "250mbit", "--stats", f"{shaped}/netem.json",
                           "--", *train_command(2, "--data", cora2, "--run-dir", shaped, "--overwrite", *flags,
                                                "--epochs", "4")],  # overlapped: the last epoch is not steady
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ok = simulate("--validate", shaped, "--machine", profile, "--workers", "1")
    assert ok.returncode == 0 and ", match " in ok.stdout and "on host-250mbit" in ok.stdout, ok.stdout + ok.stderr


def test_plan_figures_follow_the_partition_metadata(cora8):
    """python -m rudder.plan on 8 partitions, 4 trainers a node: each trainer's own rows, halo,
    part-file reads and buffer as its metadata counts them, the node's first trainer reading the
    replicated CSR, remote rows from the simulator's sampling, and the job script's lines."""
    from rudder.data.partition_store import PartitionMeta
    from rudder.plan.cli import plan

    meta = PartitionMeta.load(cora8)
    p = plan(["--data", cora8, "--policy", "heuristic", "--buffer-fraction", "0.5", "--trainers-per-node", "4"])
    assert p["minibatches"] == "simulated" and p["topology"] == "replicated"
    assert p["layout"]["nodes"] == 2 and p["layout"]["tasks"] == 10  # an agent a node for heuristic
    csr = 8 * sum(info.num_owned + 1 + info.num_in_edges for info in meta.parts)
    for r, info in zip(p["ranks"], meta.parts):
        assert (r["owned"], r["halo"]) == (info.num_owned, info.num_halo)
        assert r["memory"]["features"] == info.num_owned * meta.feature_encoding.row_bytes
        assert r["memory"]["graph"] >= csr // 4
        assert r["startup_io"]["checksum"] == os.path.getsize(os.path.join(cora8, info.file))
        assert r["startup_io"]["CSR"] == (csr if r["trainer"] % 4 == 0 else 0)
        assert r["memory"]["buffer"] >= (info.num_halo // 2) * meta.feat_dim * 4  # float32 rows of B = f x halo
        assert 0 < r["remote_rows_per_epoch"] and r["checkpoint"]["a trainer"] > 0
    assert "--ntasks=10 --ntasks-per-node=5" in p["launch"]["srun"]
    assert "sbatch -N 2 jobscripts/cpu.sbatch" in p["launch"]["sbatch"]


def test_plan_evaluation_term_is_what_a_layerwise_batch_holds(cora8):
    """rudder.plan's evaluation term for ``layerwise`` (one batch of every own node) counts the
    rows and in-edges that the evaluation's reader holds for that batch, as it reads them here
    from the partitions: its sources are the part and its halo, its in-edges the part's, a chunk
    of them read at once."""
    from rudder.plan import estimate
    from rudder.plan.graphs import from_partitions
    from rudder.sampling.neighbors import EVAL_CHUNK_EDGES, full_neighbourhood
    from rudder.sim.transport import Graph, SimulatedAdjacency
    from rudder.train.config import TrainConfig

    graph, shape = Graph(cora8), from_partitions(cora8)
    cfg = TrainConfig.from_flat({"data": cora8, "run_dir": "(planned)", "eval_inference": "layerwise"})
    for pid, part in enumerate(shape.parts):
        own = np.arange(graph.offsets[pid], graph.offsets[pid + 1])
        read = full_neighbourhood(SimulatedAdjacency(graph, pid, None, 0, replicated=True), own, 1, EVAL_CHUNK_EDGES)
        held = (4 * part.owned * cfg.model.hidden + read.input_nodes.size * (4 * shape.feat_dim + estimate.EVAL_NODE_BYTES)
                + 4 * read.num_edges + min(EVAL_CHUNK_EDGES, read.num_edges) * estimate.EVAL_EDGE_BYTES)
        assert estimate.evaluation_bytes(shape, part, cfg) == held, pid


def test_plan_from_published_statistics_prints(capsys):
    from rudder.plan.cli import main

    assert main(["--like", "papers100M", "--ranks", "256", "--policy", "none", "--fanouts", "5,10"]) == 0
    out = capsys.readouterr().out
    assert "papers100M: 111,059,956 nodes" in out and "256 trainers on 64 nodes (256 tasks)" in out
    assert "srun --ntasks=256 --ntasks-per-node=4" in out and "--fanouts 5,10" in out
    assert "jobscripts/cpu.sbatch" in out and "--device cpu" in out and "--gpus-per-node" not in out
    # GPU nodes: their job script, a GPU a trainer, the device said once
    assert main(["--like", "papers100M", "--ranks", "256", "--policy", "heuristic", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "sbatch -N 64 jobscripts/gpu.sbatch" in out and "--ntasks=320 --ntasks-per-node=5" in out
    assert "--gpus-per-node=4" in out and out.count("--device") == 1


@pytest.mark.parametrize("args, expected", [
    (["--like", "papers100M"], "--ranks 0: expected the trainer ranks"),
    (["--like", "products", "--ranks", "4", "--edge-cut", "2"], "--edge-cut 2.0: expected a share in [0, 1]"),
    (["--data", "MISSING"], "MISSING: not a directory"),
    (["--like", "products", "--ranks", "4", "--policy", "nope"], "--policy 'nope'"),
])
def test_plan_bad_input_is_one_line(capsys, args, expected):
    from rudder.plan.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
