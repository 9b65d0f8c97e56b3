"""Analyse the per-rank HDF5 logs of one or more runs.

    python -m rudder.analyze RUN [RUN ...] [--baseline RUN] [--json] [--plots DIR]

Per run: layout and config, training time and epoch times, the time breakdown, accuracy,
remote traffic, the buffer's hits, refills and evictions, and, for runs recorded with
``--trace``, the optimal bound: Belady's MIN replayed per rank on the recorded remote inputs
with the run's capacity and admissible set, and the infinite-buffer bound. Several runs are
compared side by side, each figure also as a ratio to ``--baseline``. ``--json`` prints one
document instead of the tables (keys: ``SCHEMA`` below, listed in the README); ``--plots DIR``
writes PNGs. Every figure is computed from the raw per-minibatch and per-epoch rows.

A killed run (missing ranks, a rank still "running", an unreadable file) is summarised with
warnings naming what is missing; a directory without logs or a log of another format is a
one-line error.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from rudder.run_log import FORMAT_NAME, FORMAT_VERSION

TIMERS = ("t_sample", "t_fetch", "t_wait", "t_forward_backward", "t_allreduce", "t_update")


class AnalysisError(Exception):
    """A path that is not a run directory, or a log this version cannot read (one line)."""


@dataclass
class RankLog:
    rank: int
    path: str
    status: str
    error: str
    config: dict
    layout: dict
    run: dict
    minibatches: np.ndarray | None  # trainers
    epochs: np.ndarray | None
    trace: list[np.ndarray] | None
    role: str = "trainer"
    decisions: np.ndarray | None = None  # agents
    outcomes: np.ndarray | None = None
    classifier_trace: np.ndarray | None = None  # trainers of a collection run (fixed --collect-traces)
    answers: list[str] | None = None  # agents: each decision's raw answer (or a classifier's features)
    fallback_reasons: list[str] | None = None  # agents: why a decision fell back ("" when it did not)


@dataclass
class Run:
    path: str
    ranks: list[RankLog]  # trainers
    warnings: list[str] = field(default_factory=list)
    agents: list[RankLog] = field(default_factory=list)

    @property
    def config(self) -> dict:
        return self.ranks[0].config


def read_rank(path: str) -> RankLog:
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        a = f.attrs
        if a.get("format") != FORMAT_NAME:
            raise AnalysisError(f"{path}: not a Rudder run log (format {a.get('format')!r})")
        if int(a.get("format_version", -1)) != FORMAT_VERSION:
            raise AnalysisError(f"{path}: run log version {a.get('format_version')} is not supported "
                                f"(this tool reads version {FORMAT_VERSION})")
        layout = json.loads(a["layout"])
        if a.get("role", "trainer") == "agent":
            return RankLog(layout["world_rank"], path, str(a["status"]), str(a["error"]), json.loads(a["config"]), layout,
                           json.loads(a["run"]), None, None, None, "agent", f["decisions"][()], f["outcomes"][()],
                           answers=_texts(f, "answer"), fallback_reasons=_texts(f, "fallback_reason"))
        trace = None
        if "trace_remote_inputs" in f:
            offsets, values = f["trace_remote_inputs/offsets"][()], f["trace_remote_inputs/values"][()]
            trace = [values[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)]
        layout = json.loads(a["layout"])
        return RankLog(layout["world_rank"], path, str(a["status"]), str(a["error"]), json.loads(a["config"]), layout,
                       json.loads(a["run"]), f["minibatches"][()], f["epochs"][()], trace,
                       classifier_trace=f["classifier_trace"][()] if "classifier_trace" in f else None)


def _texts(f, name: str) -> list[str]:
    offsets, text = f[f"{name}/offsets"][()], f[f"{name}/values"][()].tobytes()
    return [text[i:j].decode(errors="replace") for i, j in zip(offsets[:-1], offsets[1:])]


def load_run(path: str) -> Run:
    if not os.path.isdir(path):
        raise AnalysisError(f"{path}: not a directory")
    files = sorted(glob.glob(os.path.join(path, "rank-*.h5")))
    if not files:
        raise AnalysisError(f"{path}: no rank-NNNNN.h5 logs here (not a run directory of drivers/train.py)")
    ranks, warnings = [], []
    for p in files:
        try:
            ranks.append(read_rank(p))
        except AnalysisError:
            raise
        except (OSError, KeyError, ValueError) as e:
            warnings.append(f"{os.path.basename(p)}: unreadable, left out ({str(e).splitlines()[0][:120]})")
    agents = [r for r in ranks if r.role == "agent"]
    ranks = [r for r in ranks if r.role != "agent"]
    if not ranks:
        raise AnalysisError(f"{path}: none of the {len(files)} rank logs is a readable trainer log")
    world = ranks[0].layout["world_size"]
    missing = sorted(set(range(world)) - {r.rank for r in ranks + agents})
    if missing:
        warnings.append(f"ranks {', '.join(map(str, missing))} of {world} missing: figures cover {len(ranks)} ranks")
    for r in sorted(ranks + agents, key=lambda r: r.rank):
        if r.status != "completed":
            warnings.append(f"rank {r.rank}: status {r.status}" + (f" ({r.error})" if r.error else
                            " (the job was killed or is still running)"))
    return Run(path, ranks, warnings, agents)


def trainer_table(path: str, trainer_rank: int) -> tuple[dict, np.ndarray]:
    """One trainer's run record and minibatch table, without reading the rest of the run (what
    ``--policy replay`` needs on every trainer)."""
    import h5py

    if not os.path.isdir(path):
        raise AnalysisError(f"{path}: not a directory")
    files = sorted(glob.glob(os.path.join(path, "rank-*.h5")))
    if not files:
        raise AnalysisError(f"{path}: no rank-NNNNN.h5 logs here (not a run directory of drivers/train.py)")
    for name in files:
        try:
            with h5py.File(name, "r", locking=False) as f:
                if f.attrs.get("format") != FORMAT_NAME or f.attrs.get("role", "trainer") == "agent":
                    continue
                if json.loads(f.attrs["layout"])["trainer_rank"] == trainer_rank:
                    return json.loads(f.attrs["run"]), f["minibatches"][()]
        except (OSError, KeyError, ValueError) as e:
            raise AnalysisError(f"{name}: unreadable ({str(e).splitlines()[0][:120]})") from None
    raise AnalysisError(f"{path}: no log of trainer {trainer_rank}")


def remote_rows_fetched(minibatches: np.ndarray) -> np.ndarray:
    """Remote feature rows each minibatch fetched: remote inputs the buffer missed, plus refills."""
    return minibatches["input_remote"] - minibatches["hits"] + minibatches["refills"]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else None


def summarize(run: Run, data_dir: str | None = None) -> dict:
    """Every figure of one run, from the raw rows (one dict, JSON-ready)."""
    cfg, ranks = run.config, run.ranks
    # Epochs every rank completed; epoch time = the slowest rank's.
    complete = set.intersection(*(set(r.epochs["epoch"][r.epochs["complete"] == 1].tolist()) for r in ranks))
    epochs = sorted(complete)
    seconds = [max(float(r.epochs["seconds"][r.epochs["epoch"] == e][0]) for r in ranks) for e in epochs]

    def per_epoch(column, ranks_op=np.sum):
        """Per epoch: the column (a name, or a function of the rows) summed over each rank's
        minibatches, combined over ranks."""
        values = column if callable(column) else (lambda rows: rows[column])
        return [float(ranks_op([values(r.minibatches)[r.minibatches["epoch"] == e].sum() for r in ranks])) for e in epochs]

    mb = np.concatenate([r.minibatches for r in ranks]) if ranks else None
    hits, misses = int(mb["hits"].sum()), int(mb["misses"].sum())
    last_eval = [r.epochs[~np.isnan(r.epochs["test_acc"])] for r in ranks]
    evaluated = [e for e in last_eval if e.size]
    hits_by_epoch, misses_by_epoch = per_epoch("hits"), per_epoch("misses")
    summary = {
        "run": os.path.abspath(run.path),
        "status": "completed" if all(r.status == "completed" for r in ranks) and not run.warnings else "incomplete",
        "warnings": list(run.warnings),
        "config": cfg,
        "layout": {k: ranks[0].layout[k] for k in ("world_size", "num_nodes", "num_trainers", "partition_mode",
                                                   "threads_per_rank")},
        "ranks_read": len(ranks),
        "epochs": {"count": len(epochs), "train_seconds": float(sum(seconds)),
                   "mean_seconds": _mean(seconds), "median_seconds": float(np.median(seconds)) if seconds else None},
        "time_breakdown": {**{t: _mean(per_epoch(t, np.mean)) for t in TIMERS},
                           "agent": _agent_seconds(run, len(epochs))},
        "accuracy": {"val": float(evaluated[0]["val_acc"][-1]) if evaluated else None,
                     "test": float(evaluated[0]["test_acc"][-1]) if evaluated else None},
        "traffic": {"input_rows_per_epoch": _mean(per_epoch("input_nodes")),
                    "remote_inputs_per_epoch": _mean(per_epoch("input_remote")),
                    "remote_rows_fetched_per_epoch": _mean(per_epoch(remote_rows_fetched)),
                    "rma_bytes_per_epoch": _mean(per_epoch("bytes_rma"))},
        "buffer": {"policy": cfg.get("policy", "none"), "capacity": int(sum(r.run.get("buffer_capacity", 0) for r in ranks)),
                   "hits": hits, "misses": misses, "hit_percent": 100.0 * hits / (hits + misses) if hits + misses else 0.0,
                   "refills": int(mb["refills"].sum()), "evictions": int(mb["evictions"].sum()),
                   "replacements": int(((mb["replaced"] == 1) & (mb["refills"] > 0)).sum()),
                   "comm_volume": int(mb["comm_volume"].sum()),
                   "hit_percent_by_epoch": [100.0 * h / (h + m) if h + m else 0.0
                                            for h, m in zip(hits_by_epoch, misses_by_epoch)]},
        "bound": optimal_bound(run, data_dir, int(remote_rows_fetched(mb).sum())),
        "decisions": decision_quality(run) if run.agents else None,
    }
    return summary


def _agent_seconds(run: Run, epochs: int) -> float | None:
    """Decision time per trainer per epoch, spent on the agent ranks (not on the trainers' clock)."""
    if not run.agents or not epochs:
        return None
    total = sum(float(a.decisions["latency"].sum()) for a in run.agents)
    return total / len(run.ranks) / epochs


def _accuracy(correct: int, n: int) -> dict:
    """Share correct with the evaluation scripts' 95% binomial interval, p +- 1.96 sqrt(p(1-p)/n)."""
    if not n:
        return {"value": None, "ci95": None, "n": 0}
    p = correct / n
    return {"value": p, "ci95": 1.96 * math.sqrt(p * (1 - p) / n), "n": n}


def decision_quality(run: Run) -> dict:
    """The agents' decisions (spec 2.9): counts, fallbacks, latency, gaps, and Pass@1: whether
    each predicted direction of hit rate (and comm volume) matches the sign of its change by the
    trainer's next decision."""
    d = np.concatenate([a.decisions for a in run.agents])
    o = np.concatenate([a.outcomes for a in run.agents])
    valid = d[d["fallback"] == 0]
    sign = {1: 1, 2: -1, 0: 0}  # IMPACTS: stagnant, increase, decrease
    scores = {"hitrate": [0, 0], "comm_volume": [0, 0]}
    intervals = []
    for trainer in np.unique(valid["trainer"]):
        mine = np.sort(valid[valid["trainer"] == trainer], order="request")
        intervals += np.diff(mine["minibatch"]).tolist()
        for metric, impact in (("hitrate", "hitrate_impact"), ("comm_volume", "comm_impact")):
            realised = np.sign(np.diff(mine[metric].astype(np.float64)))
            predicted = np.array([sign[int(i)] for i in mine[impact][:-1]])
            scores[metric][0] += int((predicted == realised).sum())
            scores[metric][1] += int(realised.size)
    requested = {(int(t), int(r)): int(m) for t, r, m in zip(d["trainer"], d["request"], d["minibatch"])}
    gaps = [int(a) - requested[(int(t), int(r))] for t, r, a in zip(o["trainer"], o["request"], o["applied_minibatch"])
            if (int(t), int(r)) in requested]
    latency = d["latency"].astype(np.float64)
    return {"decider": run.agents[0].run.get("decider", "?"), "count": int(d.size),
            "evict": int((d["decision"] == 1).sum()), "keep": int((d["decision"] == 0).sum()),
            "fallback_rate": float((d["fallback"] == 1).mean()) if d.size else 0.0,
            "latency_mean": float(latency.mean()) if d.size else None,
            "latency_p95": float(np.percentile(latency, 95)) if d.size else None,
            "gap_mean": float(np.mean(gaps)) if gaps else None,
            "interval_mean": float(np.mean(intervals)) if intervals else None,
            "pass_at_1_hitrate": _accuracy(*scores["hitrate"]), "pass_at_1_comm": _accuracy(*scores["comm_volume"])}


def decision_lines(run: Run, last: int = 4, answered_only: bool = False) -> list[str]:
    """The last ``last`` decisions of each agent (or of those not fallen back), one line each:
    who, when, what, how fast, and the answer (or the fallback's reason)."""
    lines = []
    for agent in run.agents:
        d = agent.decisions
        rows = [i for i in range(d.size) if not (answered_only and d["fallback"][i])][-last:]
        for i in rows:
            what = "evict" if d["decision"][i] == 1 else "keep"
            answer = agent.fallback_reasons[i] if d["fallback"][i] else agent.answers[i]
            lines.append(f"agent {agent.rank} -> trainer {d['trainer'][i]} after minibatch {d['minibatch'][i]}: {what:5} "
                         f"({d['latency'][i]:.2f} s{', fallback' if d['fallback'][i] else ''}) {answer[:150]}")
    return lines


def fallback_counts(run: Run) -> dict[str, int]:
    """How many decisions fell back, by reason (the exception's name, or the reason's text)."""
    counts: dict[str, int] = {}
    for agent in run.agents:
        for reason in agent.fallback_reasons or []:
            if reason:
                key = reason.split(":")[0] if ": " in reason[:40] else reason
                counts[key] = counts.get(key, 0) + 1
    return counts


def optimal_bound(run: Run, data_dir: str | None, achieved: int) -> dict | None:
    """Belady MIN and the infinite buffer on the recorded trace, per rank, with the run's
    capacity and admissible set; None without a trace."""
    from rudder.partition_store import PartitionFormatError, PartitionMeta, read_partition
    from rudder.replay import belady_min

    if any(r.trace is None for r in run.ranks):
        return None
    cfg = run.config
    data_dir = data_dir or cfg["data"]
    try:
        meta = PartitionMeta.load(data_dir)
    except PartitionFormatError as e:
        run.warnings.append(f"no optimal bound: the run's partitions are not readable ({e}); pass --data DIR")
        return None
    best = infinite = 0
    for r in run.ranks:
        if len(r.trace) != r.minibatches.size:
            run.warnings.append(f"rank {r.rank}: trace has {len(r.trace)} minibatches, the log {r.minibatches.size}")
        halo = np.sort(read_partition(data_dir, r.layout["partition_id"], meta, structure=False).halo_nodes)
        admissible = None if cfg.get("buffer_scope") == "remote" else halo
        capacity = r.run.get("buffer_capacity") or int(np.floor(cfg.get("buffer_fraction", 0.25) * halo.size))
        best += belady_min(r.trace, admissible, capacity)["rows"]
        infinite += belady_min(r.trace, admissible, 1 << 62)["rows"]
    return {"achieved_rows": achieved, "min_rows": best, "infinite_rows": infinite,
            "achieved_over_min": achieved / best if best else None}


# -- output --------------------------------------------------------------------------------------
FIGURES = [  # (label, path into the summary, format[, scale]); text figures get no ratio
    ("status", ("status",), "{}"),
    ("ranks read", ("ranks_read",), "{} "),
    ("policy", ("buffer", "policy"), "{}"),
    ("epochs", ("epochs", "count"), "{} "),
    ("training time s", ("epochs", "train_seconds"), "{:.3f}"),
    ("epoch mean s", ("epochs", "mean_seconds"), "{:.3f}"),
    ("epoch median s", ("epochs", "median_seconds"), "{:.3f}"),
    ("sample s/epoch", ("time_breakdown", "t_sample"), "{:.3f}"),
    ("fetch s/epoch", ("time_breakdown", "t_fetch"), "{:.3f}"),
    ("wait s/epoch", ("time_breakdown", "t_wait"), "{:.3f}"),
    ("compute s/epoch", ("time_breakdown", "t_forward_backward"), "{:.3f}"),
    ("allreduce s/epoch", ("time_breakdown", "t_allreduce"), "{:.3f}"),
    ("agent s/epoch/trainer", ("time_breakdown", "agent"), "{:.3f}"),
    ("val accuracy", ("accuracy", "val"), "{:.4f}"),
    ("test accuracy", ("accuracy", "test"), "{:.4f}"),
    ("remote inputs/epoch", ("traffic", "remote_inputs_per_epoch"), "{:,.0f}"),
    ("remote rows fetched/epoch", ("traffic", "remote_rows_fetched_per_epoch"), "{:,.0f}"),
    ("RMA MiB/epoch", ("traffic", "rma_bytes_per_epoch"), "{:.2f}", 2**-20),
    ("hit %", ("buffer", "hit_percent"), "{:.1f}"),
    ("refills", ("buffer", "refills"), "{:,}"),
    ("evictions", ("buffer", "evictions"), "{:,}"),
    ("communication volume", ("buffer", "comm_volume"), "{:,}"),
    ("rows fetched (all)", ("bound", "achieved_rows"), "{:,}"),
    ("Belady MIN rows", ("bound", "min_rows"), "{:,}"),
    ("infinite-buffer rows", ("bound", "infinite_rows"), "{:,}"),
    ("fetched / MIN", ("bound", "achieved_over_min"), "{:.3f}"),
    ("decisions", ("decisions", "count"), "{} "),
    ("evict decisions", ("decisions", "evict"), "{} "),
    ("fallback rate", ("decisions", "fallback_rate"), "{:.3f}"),
    ("decision latency s", ("decisions", "latency_mean"), "{:.4f}"),
    ("latency p95 s", ("decisions", "latency_p95"), "{:.4f}"),
    ("request-to-apply gap", ("decisions", "gap_mean"), "{:.2f}"),
    ("Pass@1 hit rate", ("decisions", "pass_at_1_hitrate", "value"), "{:.3f}"),
    ("Pass@1 comm", ("decisions", "pass_at_1_comm", "value"), "{:.3f}"),
]


def _get(summary: dict, path):
    for key in path:
        if not isinstance(summary, dict):
            return None
        summary = summary.get(key)
    return summary


def table(summaries: list[dict], baseline: dict | None) -> str:
    names = [os.path.basename(s["run"].rstrip("/")) or s["run"] for s in summaries]
    rows = [["figure", *names]]
    for label, path, fmt, *scale in FIGURES:
        cells = []
        for s in summaries:
            v = _get(s, path)
            if v is None:
                cells.append("-")
                continue
            shown = v * scale[0] if scale and isinstance(v, (int, float)) else v
            cell = fmt.format(shown)
            base = _get(baseline, path) if baseline is not None else None
            if (isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(base, (int, float)) and base
                    and not fmt.endswith(" ")):  # a trailing space marks counts that need no ratio
                cell += f" ({v / base:.2f}x)"
            cells.append(cell)
        rows.append([label, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    for s in summaries:
        for w in s["warnings"]:
            lines.append(f"warning: {os.path.basename(s['run'].rstrip('/'))}: {w}")
    if baseline is not None:
        lines.append(f"(ratios: to baseline {baseline['run']})")
    return "\n".join(lines)


def _save(fig, directory: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(directory, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(runs: list[Run], summaries: list[dict], directory: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    fig, (ax_hit, ax_comm) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for run, s in zip(runs, summaries):
        name = os.path.basename(s["run"])
        steps = max(r.minibatches.size for r in run.ranks)
        hit = np.nanmean([np.pad(r.minibatches["hit_ratio"].astype(float), (0, steps - r.minibatches.size),
                                 constant_values=np.nan) for r in run.ranks], axis=0)
        comm = np.nansum([np.pad(remote_rows_fetched(r.minibatches).astype(float),
                                 (0, steps - r.minibatches.size), constant_values=np.nan) for r in run.ranks], axis=0)
        ax_hit.plot(100 * hit, label=name)
        ax_comm.plot(comm, label=name)
    ax_hit.set_ylabel("cumulative hit % (rank mean)")
    ax_comm.set_ylabel("remote rows fetched (all ranks)")
    ax_comm.set_xlabel("minibatch")
    ax_hit.legend(fontsize="small")
    written.append(_save(fig, directory, "hits_and_traffic.png"))

    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = np.zeros(len(summaries))
    for t in TIMERS:
        values = np.array([s["time_breakdown"][t] or 0.0 for s in summaries])
        ax.bar([os.path.basename(s["run"]) for s in summaries], values, bottom=bottom, label=t[2:])
        bottom += values
    ax.set_ylabel("seconds per epoch (rank mean; overlapped phases stack)")
    ax.legend(fontsize="small")
    written.append(_save(fig, directory, "time_breakdown.png"))

    agent_runs = [(run, s) for run, s in zip(runs, summaries) if run.agents]
    if agent_runs:  # decision timeline: when each trainer was told what, and the hit rate it then saw
        fig, axes = plt.subplots(len(agent_runs), 1, figsize=(9, 3 * len(agent_runs)), squeeze=False)
        for ax, (run, s) in zip(axes[:, 0], agent_runs):
            d = np.concatenate([a.decisions for a in run.agents])
            for trainer in np.unique(d["trainer"]):
                mine = np.sort(d[d["trainer"] == trainer], order="request")
                ax.plot(mine["minibatch"], mine["hitrate"], lw=0.8, color="0.6")
                # predicted hit-rate direction vs the sign of its change by the next decision
                realised = np.append(np.sign(np.diff(mine["hitrate"].astype(float))), np.nan)
                predicted = np.array([{0: 0, 1: 1, 2: -1}[int(i)] for i in mine["hitrate_impact"]])
                colour = np.where(np.isnan(realised), "0.5", np.where(predicted == realised, "tab:green", "tab:red"))
                for marker, chosen in (("v", mine["decision"] == 1), ("o", mine["decision"] == 0)):
                    ax.scatter(mine["minibatch"][chosen], mine["hitrate"][chosen], marker=marker, c=colour[chosen], s=18)
            ax.set_title(f"{os.path.basename(s['run'])}: decisions (v evict, o keep) on the window hit rate; "
                         "green: predicted hit-rate direction came true, red: it did not", fontsize="small")
            ax.set_ylabel("hit %")
            ax.set_xlabel("minibatch")
        written.append(_save(fig, directory, "decisions.png"))
    return written


# The JSON document: {"runs": [summary, ...], "baseline": RUN or null}; a summary's keys:
SCHEMA = {
    "run": str, "status": str, "warnings": list, "config": dict, "layout": dict, "ranks_read": int,
    "epochs": {"count": int, "train_seconds": float, "mean_seconds": (float, None), "median_seconds": (float, None)},
    "time_breakdown": {**{t: (float, None) for t in TIMERS}, "agent": (float, None)},
    "accuracy": {"val": (float, None), "test": (float, None)},
    "traffic": {"input_rows_per_epoch": (float, None), "remote_inputs_per_epoch": (float, None),
                "remote_rows_fetched_per_epoch": (float, None), "rma_bytes_per_epoch": (float, None)},
    "buffer": {"policy": str, "capacity": int, "hits": int, "misses": int, "hit_percent": float, "refills": int,
               "evictions": int, "replacements": int, "comm_volume": int, "hit_percent_by_epoch": list},
    "bound": ({"achieved_rows": int, "min_rows": int, "infinite_rows": int, "achieved_over_min": (float, None)}, None),
    "decisions": ({"decider": str, "count": int, "evict": int, "keep": int, "fallback_rate": float,
                   "latency_mean": (float, None), "latency_p95": (float, None), "gap_mean": (float, None),
                   "interval_mean": (float, None),
                   "pass_at_1_hitrate": {"value": (float, None), "ci95": (float, None), "n": int},
                   "pass_at_1_comm": {"value": (float, None), "ci95": (float, None), "n": int}}, None),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.analyze", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directories (--run-dir of drivers/train.py)")
    ap.add_argument("--baseline", metavar="RUN", help="run every figure is also given as a ratio to")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    ap.add_argument("--data", metavar="DIR", help="partition directory, if it moved since the runs")
    ap.add_argument("--decisions", type=int, default=0, metavar="N", help="also print each agent's last N decisions")
    a = ap.parse_args(argv)
    try:
        paths = list(dict.fromkeys(a.runs + ([a.baseline] if a.baseline else [])))
        runs = {p: load_run(p) for p in paths}
        summaries = {p: summarize(r, a.data) for p, r in runs.items()}
    except AnalysisError as e:
        print(f"python -m rudder.analyze: error: {e}", file=sys.stderr)
        return 2
    shown = [summaries[p] for p in a.runs]
    baseline = summaries.get(a.baseline) if a.baseline else None
    if a.plots:
        for path in plots([runs[p] for p in a.runs], shown, a.plots):
            print(f"wrote {path}", file=sys.stderr)
    if a.json:
        print(json.dumps({"runs": shown, "baseline": a.baseline and summaries[a.baseline]["run"]}, indent=1))
    else:
        print(table(shown, baseline))
    for p in a.runs if a.decisions else ():
        print("\n".join([f"\nlast decisions of {p}:"] + (decision_lines(runs[p], a.decisions) or ["  (no agent ranks)"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
