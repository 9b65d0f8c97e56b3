"""Every buffer policy end to end under mpiexec, on Cora, on Facebook Page-Page and on an RMAT
graph: the loss trajectory is bit-identical to the no-buffer run (caching static features is
exact, and the sampling stream does not depend on the policy or the pipelining), while remote
traffic falls; and the simulator (rudder.simulate) reproduces every run's per-minibatch counts
exactly. The partitions store their features in the type ``--feature-dtype auto`` picks (bits
for Cora's and Facebook's 0/1 rows, float16 for the RMAT graph's rounded ones), and every run is
also bit-identical to the no-buffer run on float32 storage, each feature row logged at its
stored size."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import BUNDLED_CORA, assert_trained_alike, read_logs, run_trains, shared_dataset

RUNS = [("none", ["--no-overlap", "--mpi-wait", "yield"]), ("none", []), ("static", []), ("fixed", ["--delta", "2"]),
        ("fixed", ["--delta", "1", "--compat", "massivegnn", "--buffer-init", "empty"]),
        ("lookahead", ["--lookahead", "4"]),
        ("fixed", ["--delta", "4", "--buffer-scope", "remote", "--prefetch-depth", "2", "--mpi-wait", "spin"]),
        ("static", ["--buffer-init", "vip"]), ("fixed", ["--delta", "2", "--buffer-init", "vip"]),
        ("lookahead", ["--topology", "distributed"])]  # the others sample a replicated CSR (auto, small graphs)


def minibatch_tables(run_dir):
    logs = read_logs(run_dir)
    assert all(log["status"] == "completed" for log in logs)
    return [log["minibatches"] for log in logs]


def job_args(parts, run, policy, flags, extra):
    return ["--data", parts, "--run-dir", run, "--policy", policy, *flags, *extra, "--progress", "none", "--eval-every", "0"]


def train_all(ranks, jobs, extra, workdir):
    """``jobs``: (parts, run, policy, flags), trained one after another in one launch: {run: minibatch tables}."""
    proc = run_trains(ranks, [job_args(parts, run, policy, flags, extra) for parts, run, policy, flags in jobs], workdir,
                      env={"MPIR_CVAR_NUM_CLIQUES": str(ranks)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = {}
    for _, run, _, flags in jobs:
        check_repairs(run, flags)
        out[run] = minibatch_tables(run)
    return out


def check_repairs(run, flags):
    """The per-step replica check raises no false alarm; a replica diverged on purpose
    (``--inject-divergence STEP:TRAINER,...``, the trainer never 0 with 2 trainers: no majority) is
    found at minibatch STEP + 1, by the step's check or, after an epoch's last update, the epoch's,
    and repaired from the majority, once, in every trainer's log (the losses then stay bit-identical
    to the no-buffer run's: checked with every run's)."""
    from rudder.logs.schema import DIVERGENCE_ACTIONS, DIVERGENCE_CHECKS

    injected = flags[flags.index("--inject-divergence") + 1] if "--inject-divergence" in flags else ""
    logs = read_logs(run)
    for log in logs:
        repairs, steps = log["repairs"], log["run"]["steps_per_epoch"]
        expected = [(int(step) + 1, trainer) for step, trainer in (pair.split(":") for pair in injected.split(",") if pair)]
        assert [(int(r["minibatch"]), r["diverged"].decode()) for r in repairs] == expected, run
        for r, (found, trainer) in zip(repairs, expected):
            assert DIVERGENCE_ACTIONS[r["action"]] == "repaired" and r["diverged_count"] == 1
            assert r["majority"] == (len(logs) > 2)  # 1 of 2 trainers is no majority: trainer 0 is the source
            assert r["source"] == (1 if trainer == "0" else 0) and r["tensors"]
            assert DIVERGENCE_CHECKS[r["check"]] == ("epoch" if found % steps == 0 else "step")


def check_policies(spec, ranks, tmp_path, extra, runs=RUNS, stored_as="float32", float32=True, beside=()):
    """``stored_as``: the storage type auto must pick for ``spec``'s features; ``float32``: where
    that is not float32, also train without a buffer on float32 storage (the same losses);
    ``beside``: (name, flags) jobs trained in the same launch and not compared here. Returns
    {run index: minibatch tables}, and {name: logs} of the ``beside`` jobs."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.data.partition_store import PartitionMeta
    from rudder.sim.validate import validate

    graph = load_spec(spec)
    parts = str(tmp_path / "parts")
    partition_graph(graph, ranks, parts, method="metis", seed=0)
    meta = PartitionMeta.load(parts)
    assert meta.feature_dtype == stored_as and meta.feature_lossless
    jobs = [(parts, str(tmp_path / f"run{i}"), policy, flags) for i, (policy, flags) in enumerate(runs)]
    if stored_as != "float32" and float32:  # the same graph with float32 storage, no buffer: the same losses (below)
        partition_graph(graph, ranks, str(tmp_path / "float32"), method="metis", seed=0, feature_dtype="float32")
        jobs.append((str(tmp_path / "float32"), str(tmp_path / "run-float32"), "none", ["--no-overlap"]))
    jobs += [(parts, str(tmp_path / name), "none", flags) for name, flags in beside]
    trained = train_all(ranks, jobs, extra, tmp_path)
    results = {}
    for i, (_, flags) in enumerate(runs):
        run = str(tmp_path / f"run{i}")
        results[i] = trained[run]
        if "--mpi-wait" in flags:  # waiting by spinning or by sleeping changes no loss (checked below)
            assert {log["layout"]["mpi_wait"] for log in read_logs(run)} == {flags[flags.index("--mpi-wait") + 1]}
        compared, mismatches = validate(run)  # the simulator reproduces every minibatch's counts exactly
        assert not mismatches and compared == sum(len(t) for t in results[i]), mismatches[:3]
        for t in results[i]:
            assert (t["bytes_rma"] == t["rows_rma"] * meta.feature_encoding.row_bytes).all()
        assert sum(int(t["rows_rma"].sum()) for t in results[i]) > 0
    base = results[0]
    if stored_as != "float32" and float32:
        results["float32"] = trained[str(tmp_path / "run-float32")]
        for t in results["float32"]:
            assert (t["bytes_rma"] == t["rows_rma"] * 4 * meta.feat_dim).all()
    for i, tables in results.items():
        for ours, theirs in zip(tables, base):
            np.testing.assert_array_equal(ours["loss"], theirs["loss"], err_msg=f"run {i}")
            np.testing.assert_array_equal(ours["input_nodes"], theirs["input_nodes"])
    results.pop("float32", None)
    fetched = {i: sum(int(t["rows_rma"].sum()) for t in tables) for i, tables in results.items()}
    for i, (policy, _) in enumerate(runs):
        tables = results[i]
        if policy == "none":
            assert all(t["hits"].sum() == 0 for t in tables)
            continue
        assert sum(int(t["hits"].sum()) for t in tables) > 0, runs[i]
        asked = np.concatenate([t["asked_by"][t["replaced"] == 1] for t in tables])
        assert (asked == (1 if policy == "fixed" else 0)).all() and (policy != "fixed" or asked.size)
        misses = sum(int((t["rows_rma"] - t["refills"]).sum()) for t in tables)
        assert misses < fetched[0], runs[i]  # demand traffic below no buffer
    return results, {name: read_logs(tmp_path / name) for name, _ in beside}


def test_every_policy_on_cora(tmp_path):
    """(Overlap alone changing no traffic is checked on the evaluation harness's runs.) One run has
    replicas diverge on purpose, 3 minibatches an epoch: trainer 1 after epoch 0's last update (the
    epoch's check finds it), trainer 2 mid-epoch, trainer 0 (the majority wins), each repaired."""
    runs = [r for i, r in enumerate(RUNS) if i != 1]
    runs[2] = ("fixed", [*runs[2][1], "--inject-divergence", "2:1,4:2,7:0"])
    check_policies(f"planetoid:{BUNDLED_CORA}:cora", 4, tmp_path, ["--epochs", "4", "--batch-size", "16"],
                   runs=runs, stored_as="bits")


def test_no_buffer_fixed_and_dgls_layer_on_facebook(tmp_path):
    """Real data, one partitioning and one launch: none and one buffer policy (every policy runs on
    Cora and RMAT above and below), and the no-buffer run again with DGL's SAGEConv in place of
    ours, trained alike (tests/test_train.py compares the two layers on Cora too)."""
    spec = shared_dataset("musae", "facebook")
    _, beside = check_policies(spec, 2, tmp_path, ["--epochs", "2", "--batch-size", "1000"], runs=[RUNS[i] for i in (0, 3)],
                               stored_as="bits", float32=False, beside=[("dgl", [*RUNS[0][1], "--model-impl", "dgl"])])
    runs = {"torch": read_logs(tmp_path / "run0"), "dgl": beside["dgl"]}
    assert {log["run"]["model_impl"] for log in runs["dgl"]} == {"dgl"}
    accuracy = assert_trained_alike(runs, first_steps=runs["torch"][0]["run"]["steps_per_epoch"])
    assert accuracy["torch"] > 0.5, accuracy  # four classes: trained, not guessing


def test_every_policy_on_rmat_float16(tmp_path):
    """Features rounded to halves (feat_round=float16): auto stores them as float16, exactly."""
    runs = [RUNS[i] for i in (0, 2, 3, 5, 6, 7, 9)]
    runs[2] = ("fixed", [*runs[2][1], "--inject-divergence", "1:1"])  # trainer 1 repaired from trainer 0, exactly
    check_policies("synthetic:rmat:scale=11,edge_factor=8,feat_dim=24,classes=4,seed=3,feat_round=float16", 2, tmp_path,
                   ["--epochs", "2", "--batch-size", "64"], runs=runs, stored_as="float16")


def test_vip_fill_on_two_ranks(tmp_path):
    """--buffer-init vip on 2 ranks (4 run on Cora above), 3 layers: the losses of no buffer, the
    simulator's counts exactly, and the start-up cost logged."""
    runs = [RUNS[0], ("static", ["--buffer-init", "vip", "--topology", "distributed"]),
            ("fixed", ["--delta", "1", "--buffer-init", "vip", "--buffer-scope", "remote"])]
    check_policies(f"planetoid:{BUNDLED_CORA}:cora", 2, tmp_path, ["--epochs", "2", "--batch-size", "16", "--fanouts",
                                                                   "5,10,15"], runs=runs, stored_as="bits")
    for log in read_logs(tmp_path / "run1"):
        assert log["run"]["buffer_vip_seconds"] > 0 and log["run"]["buffer_fill_rows"] > 0
        assert log["run"]["buffer_vip_adjacency_rows_rma"] > 0  # the other partition's lists came by RMA
    for log in read_logs(tmp_path / "run2"):  # --topology auto: a replicated CSR, read locally
        assert log["run"]["buffer_vip_adjacency_rows_rma"] == 0 and log["run"]["buffer_fill_rows"] > 0


def test_vip_fill_on_one_rank(tmp_path):
    """One rank, one partition: nothing is remote, the buffer is empty, and vip changes nothing."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.sim.validate import validate

    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 1, parts, method="metis", seed=0)
    trained = train_all(1, [(parts, str(tmp_path / "none"), "none", []),
                            (parts, str(tmp_path / "vip"), "static", ["--buffer-init", "vip"])],
                        ["--epochs", "2", "--batch-size", "16"], tmp_path)
    tables = {}
    for name in ("none", "vip"):
        tables[name] = trained[str(tmp_path / name)]
        compared, mismatches = validate(str(tmp_path / name))
        assert not mismatches and compared == len(tables[name][0])
    np.testing.assert_array_equal(tables["vip"][0]["loss"], tables["none"][0]["loss"])
    assert read_logs(tmp_path / "vip")[0]["run"]["buffer_vip_seconds"] > 0


def test_node_shared_buffer(tmp_path):
    """--buffer-sharing node: the two trainers of each (emulated) node share one buffer in shared
    memory, filled once by one of them; training stays bit-identical to no buffer. Split in
    quotas and steered (the heuristic's claims), slots move between a node's trainers, and
    training stays bit-identical all the same."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, parts, method="metis", seed=0)
    tables, fills, logs = {}, {}, {}
    # answers applied exactly 2 minibatches after their request: whether slots change hands must not
    # hang on how fast an oversubscribed agent rank answers
    steered = ["--policy", "heuristic", "--agent-action", "structured", "--agent-window", "2", "--agent-latency", "2"]
    runs = {"none": [], "shared": ["--policy", "fixed", "--delta", "1", "--buffer-sharing", "node"],
            "compat": ["--policy", "fixed", "--delta", "2", "--buffer-sharing", "node", "--compat", "massivegnn",
                       "--buffer-init", "random"],
            "vip": ["--policy", "fixed", "--delta", "3", "--buffer-sharing", "node", "--buffer-init", "vip"],
            "quota": [*steered, "--delta", "2", "--buffer-sharing", "node", "--buffer-split", "quota"]}
    # batches of 4 seeds: about 45 minibatches a trainer, so the steered run makes about 25 decisions a
    # trainer, and a slot changing hands does not hang on which of a few replacements lands first
    common = ["--data", parts, "--partition-mode", "node", "--epochs", "5", "--batch-size", "4", "--eval-every", "0",
              "--progress", "none"]
    env = {"MPIR_CVAR_NUM_CLIQUES": "2"}
    # one launch: the steered run adds an agent rank per node (world ranks 4 and 5), the others run
    # on the 4 trainer slots
    proc = run_trains(6, [{"argv": [*common, "--run-dir", tmp_path / name, *flags], "trainers_only": name != "quota"}
                          for name, flags in runs.items()], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in runs:
        logs[name] = [log for log in read_logs(tmp_path / name) if log["role"] == "trainer"]
        assert all(log["status"] == "completed" for log in logs[name])
        tables[name] = [log["minibatches"] for log in logs[name]]
        fills[name] = [log["run"]["buffer_fill_rows"] for log in logs[name]]
    for name in ("shared", "compat", "vip", "quota"):
        for ours, theirs in zip(tables[name], tables["none"], strict=True):
            np.testing.assert_array_equal(ours["loss"], theirs["loss"])
        assert all(t["hits"].sum() > 0 for t in tables[name])
        assert sum(t["refills"].sum() for t in tables[name]) > 0
        # ranks 0, 2 form node 0 and 1, 3 node 1 (round robin): one trainer per node filled it
        assert fills[name][0] > 0 and fills[name][1] > 0 and fills[name][2] == 0 and fills[name][3] == 0
        assert (name == "quota") == all((t["slots_held"] >= 0).all() for t in tables[name])
    agent = [log for log in read_logs(tmp_path / "quota") if log["role"] == "agent"]
    assert all((a["decisions"]["fallback_code"] == 0).all() for a in agent)
    assert len({int(v) for a in agent for v in a["decisions"]["share"]}) > 1  # the trainers claimed unequally
    for node in ((0, 2), (1, 3)):
        held = [tables["quota"][t]["slots_held"] for t in node]
        capacity = logs["quota"][node[0]]["run"]["buffer_capacity"]
        assert all(((h >= 0) & (h <= capacity)).all() for h in held)
    # slots changed hands: some trainer's holding moved away from its first value
    assert any(len(set(t["slots_held"].tolist())) > 1 for t in tables["quota"])


def test_a_node_pool_over_the_trainers_own_partitions(tmp_path):
    """--buffer-sharing node with a partition per trainer: the two trainers of each emulated node
    share one pool over their halos, less the rows of the node's own partitions, with the slots
    their own buffers would have had together; filled once by one of them (degree, or vip ranked
    by the node's trainers together), split or not, training stays bit-identical to no buffer."""
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.data.partition_store import read_partition
    from rudder.prefetch.buffers import capacity_of

    parts = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, parts, method="metis", seed=0)
    logs = {}
    runs = {"none": ["--policy", "none"], "pool": ["--policy", "fixed", "--delta", "2", "--buffer-sharing", "node"],
            "quota": ["--policy", "fixed", "--delta", "2", "--buffer-sharing", "node", "--buffer-split", "quota",
                      "--buffer-init", "vip"]}
    proc = run_trains(4, [["--data", parts, "--run-dir", tmp_path / name, "--epochs", "4", "--batch-size", "16",
                           "--eval-every", "0", "--progress", "none", *flags] for name, flags in runs.items()], tmp_path,
                      env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in runs:
        logs[name] = read_logs(tmp_path / name)
        assert all(log["status"] == "completed" for log in logs[name])
    halos = {p.part_id: p for p in (read_partition(parts, k) for k in range(4))}
    for name in ("pool", "quota"):
        for ours, theirs in zip(logs[name], logs["none"], strict=True):
            np.testing.assert_array_equal(ours["minibatches"]["loss"], theirs["minibatches"]["loss"])
        assert all(log["minibatches"]["hits"].sum() > 0 for log in logs[name])
    for name in ("pool", "quota"):
        fills = [log["run"]["buffer_fill_rows"] for log in logs[name]]
        assert fills[0] > 0 and fills[1] > 0 and fills[2] == fills[3] == 0  # ranks 0, 2 form node 0 and 1, 3 node 1
        for node in ((0, 2), (1, 3)):
            owned = np.concatenate([np.arange(halos[k].node_start, halos[k].node_end) for k in node])
            pool = np.setdiff1d(np.union1d(halos[node[0]].halo_nodes, halos[node[1]].halo_nodes), owned)
            capacity = min(pool.size, sum(capacity_of(0.25, halos[k].halo_nodes.size) for k in node))
            assert [logs[name][k]["run"]["buffer_capacity"] for k in node] == [capacity, capacity]
    assert all((log["minibatches"]["slots_held"] >= 0).all() for log in logs["quota"])
    assert all((log["minibatches"]["slots_held"] == -1).all() for log in logs["pool"])


SHIFT = "2:fanouts=3,3;seeds=0.5"


def test_a_shift_mid_run_on_cora(tmp_path):
    """--shift: from epoch 2 on, 3 neighbours a layer and half of each partition's training nodes.
    The losses stay bit-identical to no buffer under each policy (the lookahead policy's window
    reaches across the shift in schedule order), the simulator replays every minibatch exactly,
    the logged phase and steps per epoch follow the shift, and it changes what is sampled."""
    runs = [RUNS[0], RUNS[2], RUNS[3], RUNS[5]]
    check_policies(f"planetoid:{BUNDLED_CORA}:cora", 4, tmp_path, ["--epochs", "4", "--batch-size", "8", "--shift", SHIFT],
                   runs=runs, stored_as="bits")
    logs = read_logs(tmp_path / "run0")
    steps = []
    for log in logs:
        mb, ep, phases = log["minibatches"], log["epochs"], log["run"]["phases"]
        assert [(p["first_epoch"], p["fanouts"], p["seeds"]) for p in phases] == [(0, [10, 25], 1.0), (2, [3, 3], 0.5)]
        np.testing.assert_array_equal(mb["phase"], (mb["epoch"] >= 2).astype(int))
        np.testing.assert_array_equal(ep["phase"], [0, 0, 1, 1])
        np.testing.assert_array_equal(ep["steps"], [phases[p]["steps_per_epoch"] for p in ep["phase"]])
        seeds = {e: int(mb["seeds"][mb["epoch"] == e].sum()) for e in range(4)}
        assert seeds[0] == seeds[1] == log["run"]["train_seeds"]
        assert seeds[2] == seeds[3] == round(0.5 * log["run"]["train_seeds"])  # the phase's seeds, each once an epoch
        before, after = (mb["input_nodes"][mb["phase"] == p] / mb["seeds"][mb["phase"] == p] for p in (0, 1))
        assert after.mean() < 0.8 * before.mean()  # 3,3 neighbours reach fewer nodes than 10,25
        steps.append(ep["steps"].tolist())
    assert all(s == steps[0] for s in steps) and steps[0][2] < steps[0][0]  # equal on all; half the seeds, fewer steps
    # the epoch time: the median within each phase, weighted by the phase's timed epochs (1; 2 and 3)
    from rudder.analysis.report import table
    from rudder.analysis.summary import summarize
    from rudder.logs.reader import load_run

    slowest = np.max([log["epochs"]["seconds"] for log in logs if log["role"] == "trainer"], axis=0)
    by_hand = (slowest[1] + 2 * np.median(slowest[2:])) / 3
    epochs = summarize(load_run(str(tmp_path / "run0")))["epochs"]
    assert epochs["median_seconds"] == pytest.approx(by_hand)
    fetched = [sum(int((t["input_remote"] - t["hits"] + t["refills"])[t["epoch"] == e].sum())
                   for t in (log["minibatches"] for log in logs)) for e in range(4)]
    assert epochs["by_phase"] == [
        {"phase": 0, "epochs": [1], "median_seconds": pytest.approx(slowest[1]), "remote_rows_fetched_per_epoch": fetched[1]},
        {"phase": 1, "epochs": [2, 3], "median_seconds": pytest.approx(np.median(slowest[2:])),
         "remote_rows_fetched_per_epoch": pytest.approx(np.mean(fetched[2:]))}]
    shown = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)  # the figure, then its value
                 for line in table([summarize(load_run(str(tmp_path / "run0")))], None).splitlines())
    assert shown["phase 1 epoch time s"] == f"{np.median(slowest[2:]):.3f}", shown
    assert shown["phase 0 remote rows fetched/epoch"] == f"{fetched[1]:,}", shown
