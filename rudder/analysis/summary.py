"""Every figure of one run, from the raw per-minibatch and per-epoch rows of its logs, as
``rudder.logs.metrics`` defines them: per-epoch figures are over the steady (timed) epochs;
epoch time is the slowest trainer's, and the run's is their median, shown with their spread."""
from __future__ import annotations

import os

import numpy as np

from rudder.analysis.bound import optimal_bound
from rudder.analysis.decisions import decision_quality
from rudder.logs import metrics
from rudder.logs.reader import Run
from rudder.logs.schema import DIVERGENCE_ACTIONS

TIMERS = ("t_sample", "t_fetch", "t_copy", "t_wait", "t_forward_backward", "t_allreduce", "t_grad_copy", "t_update")
# Each thread's CPU seconds (CPU_TIMERS) against the wall seconds of the same work: the share of it
# the thread ran. Below 1 it waited, for a core (more threads than cores), a lock or MPI.
CPU_OF_WALL = {"cpu_sample": ("t_sample",), "cpu_fetch": ("t_fetch",), "cpu_copy": ("t_copy",),
               "cpu_compute": ("t_forward_backward", "t_update")}


def agent_seconds(run: Run, epochs: int) -> float | None:
    """Decision time per trainer per epoch, spent on the agent ranks (not on the trainers' clock)."""
    if not run.agents or not epochs:
        return None
    total = sum(float(a.decisions["latency"].sum()) for a in run.agents)
    return total / len(run.ranks) / epochs


def divergences(run: Run) -> dict:
    """Replicas found unequal and what was done (every trainer logs each event: the most rows any
    trainer's ``repairs`` table holds; logs from before the table count none)."""
    tables = [r.tables["repairs"] for r in run.ranks if "repairs" in r.tables]
    events = max(tables, key=len) if tables else None
    if events is None or not events.size:
        return {"caught": 0, "repaired": 0, "recomputed": 0, "aborted": 0}
    counts = {action: int((events["action"] == code).sum()) for code, action in enumerate(DIVERGENCE_ACTIONS)}
    return {"caught": int(events.size), **counts}


def cpu_figures(tables: list[np.ndarray], epochs: list[int], trainers: int) -> dict:
    """Per timer: CPU seconds per trainer per epoch, and their share of the wall seconds (None
    for logs from before the CPU columns, whose NaN would otherwise read as a figure)."""
    out = {}
    for cpu, walls in CPU_OF_WALL.items():
        seconds = metrics.per_epoch_mean(tables, cpu, epochs)
        wall = sum(metrics.per_epoch_mean(tables, w, epochs) or 0.0 for w in walls)
        measured = seconds is not None and np.isfinite(seconds)
        out[cpu] = seconds / trainers if measured else None
        out[f"{cpu}_of_wall"] = seconds / wall if measured and wall > 0 else None
    return out


def footprint(run: Run) -> dict | None:
    """The trainers' start-up and memory (their ``startup`` and ``memory`` tables; None for logs
    from before them): start-up to the first minibatch, the slowest trainer's wall seconds and
    the most CPU seconds any spent, all of it and imports aside (``metrics.startup_cpu``); peak PSS,
    the largest trainer's and the mean, and what the largest one held by owner at its peak."""
    logs = [r for r in run.ranks if r.tables.get("startup") is not None and r.tables["startup"].size
            and r.tables.get("memory") is not None and r.tables["memory"].size]
    if not logs:
        return None
    peaks = [log.tables["memory"][int(log.tables["memory"]["pss_bytes"].argmax())] for log in logs]
    largest = peaks[int(np.argmax([p["pss_bytes"] for p in peaks]))]
    return {"startup_wall_seconds": max(float(log.tables["startup"]["seconds"].sum()) for log in logs),
            "startup_cpu_seconds": max(metrics.startup_cpu(log.tables["startup"]) for log in logs),
            "startup_cpu_seconds_less_imports": max(metrics.startup_cpu(log.tables["startup"], imports=False) for log in logs),
            "peak_pss_bytes": int(largest["pss_bytes"]), "mean_peak_pss_bytes": float(np.mean([p["pss_bytes"] for p in peaks])),
            **{f"peak_{owner}_bytes": int(largest[f"{owner}_bytes"]) for owner in ("graph", "features", "buffer", "model")}}


def phase_figures(minibatch_tables: list[np.ndarray], phase: int, epochs: list[int], seconds: np.ndarray) -> dict:
    """One phase of a run (``--shift``) over its timed ``epochs``: its epoch time and remote rows fetched per epoch."""
    return {"phase": phase, "epochs": epochs, "median_seconds": metrics.epoch_time(seconds),
            "remote_rows_fetched_per_epoch": metrics.per_epoch_mean(minibatch_tables, metrics.remote_rows_fetched, epochs)}


def summarize(run: Run, data_dir: str | None = None) -> dict:
    """One run's figures (one dict, JSON-ready; its keys: ``rudder.analysis.report.SCHEMA``)."""
    cfg, ranks = run.config, run.ranks
    epoch_tables = [r.epochs for r in ranks]
    minibatch_tables = [r.minibatches for r in ranks]
    complete = metrics.complete_epochs(epoch_tables)
    timed = metrics.run_timed_epochs(epoch_tables)
    all_seconds = metrics.slowest_seconds(epoch_tables, complete)
    seconds = metrics.slowest_seconds(epoch_tables, timed)
    phases = metrics.epoch_phases(epoch_tables, timed)
    spread = metrics.spread(seconds) or (None, None)

    def per_epoch(column) -> float | None:
        return metrics.per_epoch_mean(minibatch_tables, column, timed)

    mb = np.concatenate(minibatch_tables)
    hits, misses = int(mb["hits"].sum()), int(mb["misses"].sum())
    evaluated = [e for e in (r.epochs[~np.isnan(r.epochs["test_acc"])] for r in ranks) if e.size]
    by_epoch = [metrics.hit_percent(int(h), int(m)) for h, m in zip(metrics.per_epoch(minibatch_tables, "hits", complete),
                                                                      metrics.per_epoch(minibatch_tables, "misses", complete))]
    return {
        "run": os.path.abspath(run.path),
        "status": "completed" if all(r.status == "completed" for r in ranks) and not run.warnings else "incomplete",
        "warnings": list(run.warnings),
        "config": cfg,
        "layout": {k: ranks[0].layout[k] for k in ("world_size", "num_nodes", "num_trainers", "partition_mode",
                                                   "threads_per_rank")},
        "ranks_read": len(ranks),
        "epochs": {"count": len(complete), "train_seconds": float(all_seconds.sum()),
                   "mean_seconds": float(seconds.mean()) if seconds.size else None,
                   "median_seconds": metrics.epoch_time(seconds, phases),
                   "timed": timed, "steady": metrics.run_steady_text(epoch_tables),
                   "min_seconds": spread[0], "max_seconds": spread[1],
                   "by_phase": [phase_figures(minibatch_tables, int(p), [e for e, q in zip(timed, phases) if q == p],
                                              seconds[phases == p]) for p in np.unique(phases)]},
        "time_breakdown": {**{t: (lambda v: None if v is None else v / len(ranks))(per_epoch(t)) for t in TIMERS},
                           "agent": agent_seconds(run, len(complete))},
        "cpu": cpu_figures(minibatch_tables, timed, len(ranks)),
        "accuracy": {"val": float(evaluated[0]["val_acc"][-1]) if evaluated else None,
                     "test": float(evaluated[0]["test_acc"][-1]) if evaluated else None},
        "traffic": {"input_rows_per_epoch": per_epoch("input_nodes"),
                    "remote_inputs_per_epoch": per_epoch("input_remote"),
                    "remote_rows_fetched_per_epoch": per_epoch(metrics.remote_rows_fetched),
                    "rma_bytes_per_epoch": per_epoch("bytes_rma")},
        "buffer": {"policy": cfg.get("policy", "none"), "capacity": int(sum(r.run.get("buffer_capacity", 0) for r in ranks)),
                   "hits": hits, "misses": misses, "hit_percent": metrics.hit_percent(hits, misses),
                   "refills": int(mb["refills"].sum()), "evictions": int(mb["evictions"].sum()),
                   "replacements": int(((mb["replaced"] == 1) & (mb["refills"] > 0)).sum()),
                   "comm_volume": int(mb["comm_volume"].sum()), "hit_percent_by_epoch": by_epoch},
        "bound": optimal_bound(run, data_dir, int(metrics.remote_rows_fetched(mb).sum())),
        "decisions": decision_quality(run) if run.agents else None,
        "divergences": divergences(run),
        "footprint": footprint(run),
    }
