"""Calibrating a machine profile for this host (bench/calibrate_machine.py; docs/simulator.md):
the CPU costs of a step fitted on local unshaped runs, and the link's figures from the Get
microbenchmark (``bench/feature_gather.py --calibrate``) under the shaping. Nothing here reads a
shaped training run: a profile never sees the runs it predicts."""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from rudder.logs import metrics
from rudder.logs.reader import load_run
from rudder.sim.machine import pooled_key
from rudder.sim.simulate import buffer_work, simulate
from rudder.sim.validate import background_load
from rudder.train.config import ConfigError, TrainConfig

# (profile fields, per-minibatch logged CPU seconds, the wall seconds logs before those had, what
# they scale with); each a fit with intercept
CPU_FITS = (
    (("sample_step", "sample_edge"), ("cpu_sample",), ("t_sample",), "edges"),
    (("assemble_step", "assemble_byte"), ("cpu_fetch",), ("t_fetch",), "input_bytes"),
    (("stage_step", "stage_edge"), ("cpu_copy",), ("t_copy",), "edges"),
    (("step_overhead", "flops"), ("cpu_compute",), ("t_forward_backward", "t_update"), "flops"),
)


def run_counts(run_dir: str) -> tuple[dict, list[np.ndarray], int, str]:
    """A local run's per-minibatch counts (simulated: they equal the run's) and its minibatch rows,
    both over its timed epochs, trainer after trainer; its pipeline depth and its buffer's work
    (``buffer_work``: its policy, then the settings)."""
    run = load_run(run_dir)
    cfg = TrainConfig.from_flat(run.config, f"--compute-runs {run_dir}", strict=False)
    layout = run.ranks[0].layout
    if layout["num_nodes"] != 1 or layout["num_trainers"] != len(run.ranks):
        raise ConfigError(f"--compute-runs {run_dir}: expected an unshaped run with every trainer on one node "
                          f"(MPIR_CVAR_NUM_CLIQUES=1) and no agent (this one: {layout['num_trainers']} trainers on "
                          f"{layout['num_nodes']} nodes, {len(run.ranks)} ranks)")
    result = simulate(cfg, {cfg.buffer.policy: {}}, None)
    timed = metrics.run_timed_epochs([r.epochs for r in run.ranks])
    counts: dict[str, list] = {"edges": [], "input_nodes": [], "input_bytes": [], "flops": []}
    rows = []
    for r in run.ranks:
        s = result["sampled"][r.layout["partition_id"]]
        mb = r.minibatches
        keep = np.isin(mb["epoch"], timed)
        counts["edges"].append(s.edges[:len(mb)][keep])
        counts["input_nodes"].append(s.input_nodes[:len(mb)][keep])
        counts["input_bytes"].append(s.input_nodes[:len(mb)][keep] * result["feat_dim"] * 4.0)
        counts["flops"].append(s.flops[:len(mb)][keep])
        rows.append(mb[keep])
    return ({k: np.concatenate(v).astype(np.float64) for k, v in counts.items()}, rows, cfg.sampling.prefetch_depth,
            buffer_work(cfg))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y ~ a + b x with a, b >= 0 (least squares)."""
    (a, b), _ = nnls(np.stack([np.ones_like(x), x], axis=1), y)
    return float(a), float(b)


def fit_cpu(run_dirs: list[str], cores: int) -> dict:
    """The profile's CPU figures, for one core, from local runs without overlap: each phase's CPU
    seconds as its thread logged them (``cpu_*``), the work itself whatever the contention. Logs
    from before those columns (NaN there) hold wall seconds only: each trainer of such a run is
    taken to have had ``cores / (trainers + background)`` of a core (at most one) beside the
    other jobs' runnable threads (RUN/host_load.json, else none), and its timers are scaled by
    that (``rudder.sim.timing.contention`` undoes it). That guess is off both ways: the trainers
    do not all compute at every moment, and a phase waits for more than a core (docs/simulator.md).
    ``background``: the runs' mean, which the profile keeps. The runs without a buffer give those
    figures; a run with one (``buffer_fits``) gives what its policy's buffer adds to the assembly."""
    xs: dict[str, list] = {}
    ys: dict[str, list] = {}
    loads, sources, buffered = [], set(), []
    for d in run_dirs:
        counts, rows, depth, work = run_counts(d)
        policy = pooled_key(work)
        if depth:
            raise ConfigError(f"--compute-runs {d}: expected a run with --no-overlap (each timer its own work)")
        loads.append(background_load(d) or 0.0)
        share = min(1.0, cores / (len(rows) + loads[-1]))
        table = np.concatenate(rows)
        logged_cpu = not any(np.isnan(table[t]).any() for _, cpu, _, _ in CPU_FITS for t in cpu)
        sources.add("cpu" if logged_cpu else "wall")
        if policy != "none":
            if not logged_cpu:
                raise ConfigError(f"--compute-runs {d}: a run with a buffer ({policy}) needs its threads' CPU seconds "
                                  "(cpu_fetch), which its log, from an older version, lacks")
            buffered.append((d, work, counts, table))
            continue
        for names, cpu, wall, scale in CPU_FITS:
            xs.setdefault(names[0], []).append(counts[scale])
            ys.setdefault(names[0], []).append(sum(table[t] for t in cpu) if logged_cpu else
                                               sum(table[t] for t in wall) * share)
    if not xs:
        raise ConfigError(f"--compute-runs {' '.join(run_dirs)}: expected at least one run without a buffer "
                          "(--policy none)")
    out, used = {"cores": cores, "background": float(np.mean(loads))}, {}
    for names, cpu, wall, scale in CPU_FITS:
        timers = cpu if sources == {"cpu"} else wall
        x, y = np.concatenate(xs[names[0]]), np.concatenate(ys[names[0]])
        a, b = fit_line(x, y)
        if names[1] == "flops":
            out[names[0]], out["flops"] = a, (1.0 / b if b > 0 else 1e30)
        else:
            out[names[0]], out[names[1]] = a, b
        used[names[0]] = {"timers": list(timers), "per": scale, "minibatches": int(x.size),
                          "mean_seconds_one_core": float(y.mean())}
    out["buffer_cpu"], used["buffer_cpu"] = buffer_fits(buffered, out)
    out["calibration"] = {"compute_runs": list(run_dirs), "fits": used, "seconds": sorted(sources)}
    return out


def buffer_fits(buffered: list, base: dict) -> tuple[dict, dict]:
    """The CPU a buffer adds to a minibatch's assembly, one core's, per buffer work (policy and
    settings: ``buffer_work``) and, pooled over the settings its runs had, per policy: the runs'
    ``cpu_fetch`` less what the assembly costs without a buffer (``base``'s fit), fitted on the
    minibatch's input nodes (the lookups; the replacement and settling scale with them too)."""
    xs: dict[str, list] = {}
    ys: dict[str, list] = {}
    runs: dict[str, list] = {}
    for d, work, counts, table in buffered:
        plain = base["assemble_step"] + base["assemble_byte"] * counts["input_bytes"]
        for key in dict.fromkeys([work, pooled_key(work)]):  # the settings', then the policy's pool
            xs.setdefault(key, []).append(counts["input_nodes"])
            ys.setdefault(key, []).append(table["cpu_fetch"] - plain)
            runs.setdefault(key, []).append(d)
    fits, used = {}, {}
    for key in xs:
        x, y = np.concatenate(xs[key]), np.concatenate(ys[key])
        fits[key] = list(fit_line(x, y))
        used[key] = {"runs": runs[key], "minibatches": int(x.size), "mean_seconds_one_core": float(y.mean())}
    return fits, used


def link_figures(probe: dict) -> dict:
    """The profile's link figures from one ``feature_gather.py --calibrate`` result."""
    latency = probe["small_get_s"]
    bandwidth = probe["bulk_bytes"] / max(1e-9, probe["bulk_s"] - latency)
    (n_few, t_few), (n_many, t_many) = probe["runs"]
    get_call = max(0.0, (t_many - t_few - (n_many - n_few) * probe["runs_row_bytes"] / bandwidth) / (n_many - n_few))
    return {"latency": latency, "loaded_latency": probe.get("loaded_small_get_s") or latency, "bandwidth": bandwidth,
            "get_call": get_call, "byte_cpu": probe.get("byte_cpu_s", 0.0), "wait_cpu": probe.get("yield_wait_cores", 0.0)}
