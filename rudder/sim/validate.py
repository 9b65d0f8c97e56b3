"""``python -m rudder.simulate --validate RUN``: re-simulate a run of drivers/train.py from its
logs and compare every minibatch's counts, which must be equal exactly (the RMA rows and bytes
too when every trainer was a node of its own, as the simulation without a machine is)."""
from __future__ import annotations

import numpy as np

from rudder.logs.reader import load_run
from rudder.prefetch.policies import POLICIES
from rudder.sim.simulate import simulate
from rudder.train.config import ConfigError, TrainConfig

COMPARED = ("input_nodes", "input_remote", "input_halo", "hits", "misses", "refills", "replaced", "candidates")


def validate(run_dir: str, workers: int = 1) -> tuple[int, list[str]]:
    """(minibatches compared, mismatches)."""
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
    result = simulate(cfg, {cfg.buffer.policy: overrides}, None, workers=workers)
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
    return compared, bad
