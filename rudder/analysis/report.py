"""The analysis tool's output: the side-by-side table (each figure also as a ratio to a
baseline run) and the JSON document's schema."""
from __future__ import annotations

import os

from rudder.analysis.summary import CPU_OF_WALL, TIMERS

FIGURES = [  # (label, path into the summary, format[, scale]); text figures get no ratio
    ("status", ("status",), "{}"),
    ("ranks read", ("ranks_read",), "{} "),
    ("divergences caught", ("divergences", "caught"), "{} "),
    ("divergences repaired", ("divergences", "repaired"), "{} "),
    ("policy", ("buffer", "policy"), "{}"),
    ("epochs", ("epochs", "count"), "{} "),
    ("training time s", ("epochs", "train_seconds"), "{:.3f}"),
    ("epoch mean s", ("epochs", "mean_seconds"), "{:.3f}"),
    ("epoch time s", ("epochs", "median_seconds"), "{:.3f}"),
    ("steady epochs", ("epochs", "steady"), "{}"),
    ("steady epoch min s", ("epochs", "min_seconds"), "{:.3f}"),
    ("steady epoch max s", ("epochs", "max_seconds"), "{:.3f}"),
    ("sample s/epoch", ("time_breakdown", "t_sample"), "{:.3f}"),
    ("fetch s/epoch", ("time_breakdown", "t_fetch"), "{:.3f}"),
    ("copy s/epoch", ("time_breakdown", "t_copy"), "{:.3f}"),
    ("wait s/epoch", ("time_breakdown", "t_wait"), "{:.3f}"),
    ("compute s/epoch", ("time_breakdown", "t_forward_backward"), "{:.3f}"),
    ("allreduce s/epoch", ("time_breakdown", "t_allreduce"), "{:.3f}"),
    ("gradient copies s/epoch", ("time_breakdown", "t_grad_copy"), "{:.3f}"),
    ("agent s/epoch/trainer", ("time_breakdown", "agent"), "{:.3f}"),
    ("sample CPU s/epoch", ("cpu", "cpu_sample"), "{:.3f}"),
    ("fetch CPU s/epoch", ("cpu", "cpu_fetch"), "{:.3f}"),
    ("copy CPU s/epoch", ("cpu", "cpu_copy"), "{:.3f}"),
    ("compute CPU s/epoch", ("cpu", "cpu_compute"), "{:.3f}"),
    ("sample CPU / wall", ("cpu", "cpu_sample_of_wall"), "{:.2f}"),
    ("fetch CPU / wall", ("cpu", "cpu_fetch_of_wall"), "{:.2f}"),
    ("copy CPU / wall", ("cpu", "cpu_copy_of_wall"), "{:.2f}"),
    ("compute CPU / wall", ("cpu", "cpu_compute_of_wall"), "{:.2f}"),
    ("start-up wall s (slowest trainer)", ("footprint", "startup_wall_seconds"), "{:.2f}"),
    ("start-up CPU s (most)", ("footprint", "startup_cpu_seconds"), "{:.2f}"),
    ("start-up CPU s, imports aside", ("footprint", "startup_cpu_seconds_less_imports"), "{:.2f}"),
    ("peak PSS MiB (largest trainer)", ("footprint", "peak_pss_bytes"), "{:.1f}", 2**-20),
    ("peak PSS MiB (mean)", ("footprint", "mean_peak_pss_bytes"), "{:.1f}", 2**-20),
    ("  graph MiB", ("footprint", "peak_graph_bytes"), "{:.2f}", 2**-20),
    ("  features MiB", ("footprint", "peak_features_bytes"), "{:.2f}", 2**-20),
    ("  buffer MiB", ("footprint", "peak_buffer_bytes"), "{:.2f}", 2**-20),
    ("  model MiB", ("footprint", "peak_model_bytes"), "{:.2f}", 2**-20),
    ("val accuracy", ("accuracy", "val"), "{:.4f}"),
    ("test accuracy", ("accuracy", "test"), "{:.4f}"),
    ("remote inputs/epoch", ("traffic", "remote_inputs_per_epoch"), "{:,.0f}"),
    ("remote rows fetched/epoch", ("traffic", "remote_rows_fetched_per_epoch"), "{:,.0f}"),
    ("RMA MiB/epoch", ("traffic", "rma_bytes_per_epoch"), "{:.2f}", 2**-20),
    ("hit %", ("buffer", "hit_percent"), "{:.1f}"),
    ("refills (all)", ("buffer", "refills"), "{:,}"),
    ("evictions (all)", ("buffer", "evictions"), "{:,}"),
    ("communication volume (all)", ("buffer", "comm_volume"), "{:,}"),
    ("rows fetched (all)", ("bound", "achieved_rows"), "{:,}"),
    ("Belady MIN rows", ("bound", "min_rows"), "{:,}"),
    ("infinite-buffer rows", ("bound", "infinite_rows"), "{:,}"),
    ("fetched / MIN", ("bound", "achieved_over_min"), "{:.3f}"),
    ("decisions", ("decisions", "count"), "{} "),
    ("evict decisions", ("decisions", "evict"), "{} "),
    ("fallback rate", ("decisions", "fallback_rate"), "{:.3f}"),
    ("decision latency s", ("decisions", "latency_mean"), "{:.4f}"),
    ("latency p50 s", ("decisions", "latency_p50"), "{:.4f}"),
    ("latency p95 s", ("decisions", "latency_p95"), "{:.4f}"),
    ("request-to-apply gap", ("decisions", "gap_mean"), "{:.2f}"),
    ("gap p50 minibatches", ("decisions", "gap_p50"), "{:.1f}"),
    ("gap p95 minibatches", ("decisions", "gap_p95"), "{:.1f}"),
    ("answers not applied", ("decisions", "not_applied"), "{} "),
    ("stale answers", ("decisions", "stale"), "{} "),
    ("mean refill budget", ("decisions", "refill_mean"), "{:.1f}"),
    ("Pass@1 hit rate", ("decisions", "pass_at_1_hitrate", "value"), "{:.3f}"),
    ("Pass@1 hit rate 95% low", ("decisions", "pass_at_1_hitrate", "low"), "{:.3f}"),
    ("Pass@1 hit rate 95% high", ("decisions", "pass_at_1_hitrate", "high"), "{:.3f}"),
    ("Pass@1 comm", ("decisions", "pass_at_1_comm", "value"), "{:.3f}"),
    ("Pass@1 comm 95% low", ("decisions", "pass_at_1_comm", "low"), "{:.3f}"),
    ("Pass@1 comm 95% high", ("decisions", "pass_at_1_comm", "high"), "{:.3f}"),
    ("Pass@1 wait", ("decisions", "pass_at_1_wait", "value"), "{:.3f}"),
    ("Pass@1 wait 95% low", ("decisions", "pass_at_1_wait", "low"), "{:.3f}"),
    ("Pass@1 wait 95% high", ("decisions", "pass_at_1_wait", "high"), "{:.3f}"),
]


def get(summary: dict, path):
    for key in path:
        if isinstance(summary, list):  # ``by_phase``: the entry of phase ``key``
            summary = next((entry for entry in summary if entry["phase"] == key), None)
        elif isinstance(summary, dict):
            summary = summary.get(key)
        else:
            return None
    return summary


def figures(summaries: list[dict]) -> list:
    """FIGURES, and after the epoch time each phase's epoch time and rows where a run has phases (``--shift``)."""
    phases = sorted({entry["phase"] for s in summaries for entry in get(s, ("epochs", "by_phase")) or []})
    if len(phases) < 2:
        return FIGURES
    at = 1 + [path for _, path, *_ in FIGURES].index(("epochs", "median_seconds"))
    per_phase = [figure for p in phases for figure in (
        (f"phase {p} epoch time s", ("epochs", "by_phase", p, "median_seconds"), "{:.3f}"),
        (f"phase {p} remote rows fetched/epoch", ("epochs", "by_phase", p, "remote_rows_fetched_per_epoch"), "{:,.0f}"))]
    return FIGURES[:at] + per_phase + FIGURES[at:]


def table(summaries: list[dict], baseline: dict | None) -> str:
    names = [os.path.basename(s["run"].rstrip("/")) or s["run"] for s in summaries]
    rows = [["figure", *names]]
    for label, path, fmt, *scale in figures(summaries):
        cells = []
        for s in summaries:
            v = get(s, path)
            if v is None:
                cells.append("-")
                continue
            shown = v * scale[0] if scale and isinstance(v, (int, float)) else v
            cell = fmt.format(shown)
            base = get(baseline, path) if baseline is not None else None
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


# The JSON document: {"runs": [summary, ...], "baseline": RUN or null}; a summary's keys:
SCHEMA = {
    "run": str, "status": str, "warnings": list, "config": dict, "layout": dict, "ranks_read": int,
    "epochs": {"count": int, "train_seconds": float, "mean_seconds": (float, None), "median_seconds": (float, None),
               "timed": list, "steady": str, "min_seconds": (float, None), "max_seconds": (float, None),
               "by_phase": list},
    "time_breakdown": {**{t: (float, None) for t in TIMERS}, "agent": (float, None)},
    "cpu": {**{c: (float, None) for c in CPU_OF_WALL}, **{f"{c}_of_wall": (float, None) for c in CPU_OF_WALL}},
    "accuracy": {"val": (float, None), "test": (float, None)},
    "traffic": {"input_rows_per_epoch": (float, None), "remote_inputs_per_epoch": (float, None),
                "remote_rows_fetched_per_epoch": (float, None), "rma_bytes_per_epoch": (float, None)},
    "buffer": {"policy": str, "capacity": int, "hits": int, "misses": int, "hit_percent": float, "refills": int,
               "evictions": int, "replacements": int, "comm_volume": int, "hit_percent_by_epoch": list},
    "bound": ({"achieved_rows": int, "min_rows": int, "infinite_rows": int, "achieved_over_min": (float, None)}, None),
    "decisions": ({"decider": str, "count": int, "evict": int, "keep": int, "fallback_rate": float,
                   "latency_mean": (float, None), "latency_p50": (float, None), "latency_p95": (float, None),
                   "gap_mean": (float, None), "gap_p50": (float, None), "gap_p95": (float, None), "stale": int,
                   "not_applied": int, "refill_mean": (float, None), "interval_mean": (float, None),
                   **{f"pass_at_1_{name}": {"value": (float, None), "low": (float, None), "high": (float, None),
                                            "n": int} for name in ("hitrate", "comm", "wait")}}, None),
    "divergences": {"caught": int, "repaired": int, "recomputed": int, "aborted": int},
    "footprint": ({"startup_wall_seconds": float, "startup_cpu_seconds": float, "startup_cpu_seconds_less_imports": float,
                   "peak_pss_bytes": int, "mean_peak_pss_bytes": float, "peak_graph_bytes": int, "peak_features_bytes": int,
                   "peak_buffer_bytes": int, "peak_model_bytes": int}, None),
}
