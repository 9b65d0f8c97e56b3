"""``python -m rudder.simulate --validate RUN [--machine PROFILE]``: re-simulate a run of
drivers/train.py from its logs and compare every minibatch's counts, which must be equal exactly
(the RMA rows and bytes too when every trainer was a node of its own, as the simulation without
a machine is); with a machine, also the predicted epoch time against the measured one (both as
``rudder.logs.metrics`` defines it). A run made behind ``python -m rudder.netem`` has its
shaping in RUN/netem.json (the tool's --stats, as bench/evaluate.py and bench/simulator_time.py
write it): it picks the profile's machine for that rate and topology."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from rudder.logs import metrics
from rudder.logs.reader import load_run
from rudder.prefetch.policies import POLICIES
from rudder.sim import timing
from rudder.sim.machine import resolve
from rudder.sim.simulate import simulate
from rudder.train.config import ConfigError, TrainConfig

COMPARED = ("input_nodes", "input_remote", "input_halo", "hits", "misses", "refills", "replaced", "candidates")
NETEM_STATS = "netem.json"
HOST_LOAD = "host_load.json"  # other jobs' runnable threads when the run started (bench/simulator_time.py)


def background_load(run_dir: str) -> float | None:
    """Other jobs' runnable threads on the host when the run started, if RUN/host_load.json says."""
    path = os.path.join(run_dir, HOST_LOAD)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return float(json.load(f)["background_runnable"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--validate {run_dir}: {path} holds no background_runnable number ({e})") from None


def shaping(run_dir: str) -> tuple[float, str | None, int | None]:
    """(rate in bit/s, 0 for an unshaped run; topology; emulated nodes) from RUN/netem.json."""
    path = os.path.join(run_dir, NETEM_STATS)
    if not os.path.exists(path):
        return 0.0, None, None
    try:
        with open(path) as f:
            stats = json.load(f)
        return float(stats["rate_bit"]), stats["topology"], int(stats["nodes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--validate {run_dir}: {path} is not python -m rudder.netem's --stats ({e})") from None


def validate(run_dir: str, workers: int = 1) -> tuple[int, list[str]]:
    """(minibatches compared, mismatches)."""
    report = validate_run(run_dir, workers)
    return report["compared"], report["mismatches"]


def validate_run(run_dir: str, workers: int = 1, machine_name: str | None = None) -> dict:
    """{"compared": minibatches compared, "mismatches": [...], "epoch_time": {...} with a machine
    (or "epoch_time_skipped": why not)}."""
    run = load_run(run_dir)
    cfg = TrainConfig.from_flat(run.config, f"--validate {run_dir}", strict=False)
    if cfg.data.partition_mode != "trainer" or cfg.buffer.sharing != "trainer":
        raise ConfigError(f"--validate {run_dir}: simulates --partition-mode trainer runs only "
                          f"(this one: {cfg.data.partition_mode})")
    overrides = {}
    if POLICIES[cfg.buffer.policy].needs_agent:  # its decisions arrived at wall-clock times: replay them
        overrides = {"policy": "replay", "replay": run_dir, "classifier_model": "", "collect_traces": False}
    if cfg.buffer.collect_traces:
        overrides["collect_traces"] = False
    layout = run.ranks[0].layout
    trainers, nodes = layout["num_trainers"], layout["num_nodes"]
    machine, report = None, {}
    if machine_name:
        rate_bit, links, _ = shaping(run_dir)
        machine = resolve(machine_name, rate_bit, links)
        if nodes in (1, trainers):  # rank r is on node r % nodes: the simulator's consecutive nodes then agree
            machine = dataclasses.replace(machine, ranks_per_node=trainers // nodes)
        else:
            report["epoch_time_skipped"] = (f"{trainers} trainers on {nodes} nodes (rank r on node r % {nodes}): the "
                                            "simulator puts consecutive partitions on a node")
            machine = None
    result = simulate(cfg, {cfg.buffer.policy: overrides}, machine, workers=workers)
    per_part = result["policies"][cfg.buffer.policy]
    compared, bad = 0, []
    for r in run.ranks:
        part = r.layout["partition_id"]
        mb, sim, s = r.minibatches, per_part[part], result["sampled"][part]
        n = len(mb)
        if n > s.epoch.size:
            bad.append(f"trainer {part}: {n} minibatches logged, {s.epoch.size} simulated")
            continue
        ours = {"input_nodes": s.input_nodes[:n], "input_remote": s.input_remote[:n], "input_halo": s.input_halo[:n],
                **{c: sim[c][:n] for c in ("hits", "misses", "refills", "replaced", "candidates")}}
        theirs = {c: mb[c] for c in COMPARED}
        ours["rows_fetched"], theirs["rows_fetched"] = sim["rows_fetched"][:n], mb["rows_shared"] + mb["rows_rma"]
        compared_here = (*COMPARED, "rows_fetched")
        if r.layout["num_nodes"] == r.layout["num_trainers"]:  # every trainer a node of its own, as simulated:
            for c in ("rows_rma", "bytes_rma"):  # every other partition's rows came by RMA, at their stored size
                ours[c], theirs[c] = sim[c][:n], mb[c]
            compared_here += ("rows_rma", "bytes_rma")
        for c in compared_here:
            diff = np.flatnonzero(np.asarray(ours[c]) != np.asarray(theirs[c]))
            if diff.size:
                i = diff[0]
                bad.append(f"trainer {part} epoch {mb['epoch'][i]} step {mb['step'][i]}: {c} {theirs[c][i]} logged, "
                           f"{ours[c][i]} simulated ({diff.size} minibatches differ)")
        compared += n
    report.update(compared=compared, mismatches=bad)
    if machine is not None:
        report["epoch_time"] = compare_epoch_time(run, cfg, result, machine)
    return report


def compare_epoch_time(run, cfg: TrainConfig, result: dict, machine) -> dict:
    """Predicted and measured epoch time over the epochs every trainer completed, and the
    measured share of the epoch the training thread waited for its inputs."""
    tables = [r.epochs for r in run.ranks]
    timed = metrics.run_timed_epochs(tables)
    parts = result["parts"]
    sampled = [result["sampled"][p] for p in range(parts)]
    fetched = [result["policies"][cfg.buffer.policy][p] for p in range(parts)]
    background = background_load(run.path)
    sync = timing.allreduce_seconds(result["params"], parts, machine)
    waiting = run.ranks[0].layout.get("mpi_wait", "spin")  # runs before --mpi-wait spun
    predicted = timing.modelled_epoch(machine, sampled, fetched, result["feat_dim"], cfg.sampling.prefetch_depth, sync,
                                      sampled[0].epoch, cfg.training.epochs, background, waiting,
                                      result["buffer_work"][cfg.buffer.policy], result["epoch_phases"])
    measured = metrics.run_epoch_time(tables)
    guess = metrics.epoch_time([predicted["per_epoch"][e] for e in timed], metrics.epoch_phases(tables, timed))
    slowest = metrics.slowest_seconds(tables, timed)
    waited = max(metrics.per_epoch([r.minibatches], "t_wait", timed).sum() for r in run.ranks)
    # the training threads' compute: wall over CPU seconds, what the model's train slowdown stands for
    steps = np.concatenate([r.minibatches[np.isin(r.minibatches["epoch"], timed)] for r in run.ranks])
    cpu = float(steps["cpu_compute"].sum())
    train_slowdown = float((steps["t_forward_backward"] + steps["t_update"]).sum() / cpu) if cpu > 0 else None
    return {"measured": measured, "predicted": guess, "ratio": guess / measured if measured else None,
            "epochs": timed, "measured_per_epoch": slowest.tolist(),
            "predicted_per_epoch": [predicted["per_epoch"][e] for e in timed],
            "wait_share": float(waited / slowest.sum()) if slowest.sum() else None,
            "predicted_comm_share": predicted["comm_share"], "machine": machine.name, "rate": machine.rate,
            "links": machine.links, "depth": cfg.sampling.prefetch_depth,
            "background": machine.background if background is None else background, "mpi_wait": waiting,
            "slowdown": dataclasses.asdict(predicted["slowdown"]), "measured_train_slowdown": train_slowdown}
