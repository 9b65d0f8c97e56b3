"""The hindsight oracle of a grid's ``[oracle]`` table: a sweep of fixed settings (fixed's replacement
period x refill budget x buffer scope, and lookahead's window x buffer scope), run on every
configuration and buffer fraction beside the grid's policies; after the fact, per configuration and
fraction, the best of them (by epoch time, and by remote rows separately), and every steered policy
stated against it and against the better of the two static buffers (degree and VIP); the grid's
``[targets.oracle]`` checked on those ratios (docs/evaluation.md, "The hindsight oracle")."""
from __future__ import annotations

import statistics

from bench.evaluation.grid import steered
from bench.evaluation.network_report import fmt, pass_cell, ratio, verdict
from bench.evaluation.sweep import STATICS, SWEEP


def steady(config: dict) -> bool:
    """Whether a configuration runs without time-varying congestion and without a mid-run shift
    (the ``shift`` field a configuration gets from the grid's shifts: "" for the steady run, as
    absent, None or "none")."""
    net = config.get("network") or {}
    return net.get("congestion", "none") == "none" and config.get("shift") in (None, "", "none")


def at_fraction(runs: dict, fraction) -> dict:
    """The runs of one buffer fraction, by policy label (the sweep's by their setting's name)."""
    suffix = f"-f{fraction}"
    return {label[:-len(suffix)]: fig for label, fig in runs.items() if label.endswith(suffix)}


def best(candidates: dict, figure: str) -> tuple[str, dict] | None:
    """The candidate with the least ``figure`` (epoch_seconds or rows_per_epoch); ties: the first."""
    have = [(k, v) for k, v in candidates.items() if isinstance(v.get(figure), (int, float))]
    return min(have, key=lambda kv: kv[1][figure]) if have else None


def repeats(candidates: dict) -> list[dict]:
    """Fixed settings that ran more than once (the grid's own fixed or lookahead run and the sweep's
    run of the same setting, and a grid's ``repeats``): their labels, epoch times and spread
    (slowest over fastest), the noise of a single run, which picking the best of many single runs
    favours. A label stands for its median run where the grid repeats every run."""
    def spread(seconds):
        return {"epoch_seconds": seconds, "spread": ratio(max(seconds), min(seconds))}

    by_setting, out = {}, []
    for label, fig in candidates.items():
        if fig.get("setting") and isinstance(fig.get("epoch_seconds"), (int, float)):
            by_setting.setdefault(fig["setting"], []).append(label)
        times = [t for t in (fig.get("repeats") or {}).get("epoch_seconds", []) if isinstance(t, (int, float))]
        if len(times) > 1:
            out.append({"labels": [f"{label} run {i + 1}" for i in range(len(times))], **spread(times)})
    return [{"labels": labels, **spread([candidates[k]["epoch_seconds"] for k in labels])}
            for labels in by_setting.values() if len(labels) > 1] + out


def by_round(fig: dict) -> dict:
    """A repeated run's epoch time per round of the grid ({round: seconds}; empty when it ran once)."""
    rep = fig.get("repeats") or {}
    return {k: sec for k, sec in zip(rep.get("rounds", []), rep.get("epoch_seconds", []))
            if isinstance(sec, (int, float))}


def paired(fig: dict, other: dict | None) -> dict | None:
    """``fig``'s epoch time over ``other``'s, round by round (both ran in the same round, minutes
    apart, so a drift of the host between rounds cancels), and the median of those ratios; None
    where fewer than two rounds have both."""
    mine, theirs = by_round(fig), by_round(other or {})
    common = sorted(set(mine) & set(theirs))
    if len(common) < 2:
        return None
    ratios = [mine[k] / theirs[k] for k in common if theirs[k]]
    return {"rounds": common, "ratios": ratios, "median": statistics.median(ratios)} if ratios else None


def hindsight(grid: dict, runs: dict, fraction) -> dict | None:
    """One configuration at one fraction: the hindsight-best fixed setting by epoch time and by rows
    (of the sweep and the grid's own fixed and lookahead runs), the better static by epoch time, and
    each steered policy's figures against them; None where nothing of the sweep ran."""
    at = at_fraction(runs, fraction)
    fixed = {k: v for k, v in at.items() if k.startswith(SWEEP) or k in ("fixed", "lookahead")}
    if not any(k.startswith(SWEEP) for k in fixed):
        return None
    by_time, by_rows = best(fixed, "epoch_seconds"), best(fixed, "rows_per_epoch")
    statics = {k: at[k] for k in STATICS if k in at}
    static = best(statics, "epoch_seconds")
    steered_runs = {}
    for policy in (p for p in at if steered(grid, p)):
        fig = at[policy]
        d = fig.get("decisions") or {}
        steered_runs[policy] = {
            "epoch_seconds": fig["epoch_seconds"], "rows_per_epoch": fig["rows_per_epoch"],
            "over_oracle": ratio(fig["epoch_seconds"], by_time[1]["epoch_seconds"] if by_time else None),
            "rows_over_oracle": ratio(fig["rows_per_epoch"], by_rows[1]["rows_per_epoch"] if by_rows else None),
            "over_static": ratio(fig["epoch_seconds"], static[1]["epoch_seconds"] if static else None),
            # with repeats: against the same two settings round by round (the median run's figures
            # above compare runs of different rounds)
            "paired_over_oracle": paired(fig, by_time and by_time[1]),
            "paired_over_static": paired(fig, static and static[1]),
            "invalid_rate": d.get("invalid_rate"), "latency_p50": d.get("latency_p50"),
            "pass_at_1": d.get("pass_at_1") or {}}
    strongest = min(steered_runs, key=lambda p: steered_runs[p]["epoch_seconds"] or float("inf"), default=None)
    # Belady MIN over the whole run, on the traced runs' inputs (lookahead's): they do not depend on
    # the policy, so the least (the widest scope's) bounds every setting and steered policy here
    bounds = [v["min_rows"] for v in at.values() if isinstance(v.get("min_rows"), (int, float))]
    least = min(bounds, default=None)
    return {"settings": len(fixed), "repeats": repeats(fixed),
            "by_time": by_time and {"setting": by_time[0], "epoch_seconds": by_time[1]["epoch_seconds"],
                                    "rows_over_min": ratio(by_time[1].get("rows_all_epochs"), least)},
            "min_rows": least,
            "by_rows": by_rows and {"setting": by_rows[0], "rows_per_epoch": by_rows[1]["rows_per_epoch"]},
            "static": {k: {"epoch_seconds": v["epoch_seconds"], "rows_per_epoch": v["rows_per_epoch"]}
                       for k, v in statics.items()},
            "better_static": static and static[0],
            "vip_over_degree_rows": ratio((statics.get("static-vip") or {}).get("rows_per_epoch"),
                                          (statics.get("static") or {}).get("rows_per_epoch")),
            "steered": steered_runs, "strongest": strongest}


def oracle_results(grid: dict, configs: dict) -> dict:
    """{configuration key: {fraction: hindsight(...)}} of every configuration the sweep ran on."""
    out = {}
    for key, r in configs.items():
        at = {str(f): h for f in grid["grid"]["fractions"] if (h := hindsight(grid, r["runs"], f)) is not None}
        if at:
            out[key] = at
    return out


def oracle_section(grid: dict, configs: dict) -> list[str]:
    """The report's lines: the oracle and the statics per configuration and fraction, then every
    steered policy against them (none without an [oracle] table)."""
    found = oracle_results(grid, configs)
    if not found:
        return []
    lines = ["| configuration | f | steady | settings | best fixed by time | epoch s | best fixed by rows | rows/epoch "
             "| static degree s | static vip s | static degree rows | static vip rows | vip / degree rows "
             "| MIN rows, all epochs | best by time: rows x MIN |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, at in found.items():
        for f, o in at.items():
            t, r, s = o["by_time"] or {}, o["by_rows"] or {}, o["static"]
            deg, vip = s.get("static", {}), s.get("static-vip", {})
            lines.append(f"| {key} | {f} | {'yes' if steady(configs[key]['config']) else 'no'} | {o['settings']} "
                         f"| {t.get('setting', '-')} | {fmt(t.get('epoch_seconds'), '.3f')} | {r.get('setting', '-')} "
                         f"| {fmt(r.get('rows_per_epoch'), ',.0f')} | {fmt(deg.get('epoch_seconds'), '.3f')} "
                         f"| {fmt(vip.get('epoch_seconds'), '.3f')} | {fmt(deg.get('rows_per_epoch'), ',.0f')} "
                         f"| {fmt(vip.get('rows_per_epoch'), ',.0f')} | {fmt(o['vip_over_degree_rows'], '.3f')} "
                         f"| {fmt(o['min_rows'], ',.0f')} | {fmt(t.get('rows_over_min'), '.3f')} |")
    def stated(r):
        times = ", ".join(f"{label} {fmt(sec, '.3f')} s" for label, sec in zip(r["labels"], r["epoch_seconds"]))
        return f"{times} ({fmt(r['spread'], '.3f')}x)"

    twice = [f"- {key}, f={f}: " + "; ".join(stated(r) for r in o["repeats"])
             for key, at in found.items() for f, o in at.items() if o["repeats"]]
    if twice:
        lines += ["", "One setting run more than once (identical options), the spread of single runs:", "", *twice]
    lines += ["", "| configuration | f | policy | epoch s | x best fixed (time) | x better static | rows/epoch "
              "| x best fixed (rows) | invalid rate | latency p50 s | Pass@1 rows | Pass@1 wait |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, at in found.items():
        for f, o in at.items():
            for policy, p in o["steered"].items():
                pass_at_1 = " | ".join(pass_cell(p, m) for m in ("comm", "wait"))
                lines.append(f"| {key} | {f} | {policy} | {fmt(p['epoch_seconds'], '.3f')} | {fmt(p['over_oracle'], '.3f')} "
                             f"| {fmt(p['over_static'], '.3f')} ({o['better_static'] or '-'}) "
                             f"| {fmt(p['rows_per_epoch'], ',.0f')} | {fmt(p['rows_over_oracle'], '.3f')} "
                             f"| {fmt(p['invalid_rate'], '.3f')} | {fmt(p['latency_p50'], '.3f')} | {pass_at_1} |")
    pairs = [(key, f, policy, p) for key, at in found.items() for f, o in at.items() for policy, p in o["steered"].items()
             if p["paired_over_oracle"] or p["paired_over_static"]]
    if pairs:
        lines += ["", "Paired by round (each steered run over the hindsight-best fixed setting's and the better static's "
                  "run of the same round; the median of the rounds, then each round):", "",
                  "| configuration | f | policy | x best fixed, median | each round | x better static, median | each round |",
                  "|---|---|---|---|---|---|---|"]
        for key, f, policy, p in pairs:
            cells = [cell for name in ("paired_over_oracle", "paired_over_static") for cell in rounds_cells(p[name])]
            lines.append(f"| {key} | {f} | {policy} | {' | '.join(cells)} |")
    return lines


def rounds_cells(pair: dict | None) -> list[str]:
    """A paired comparison's median and its rounds' ratios, as two table cells."""
    if not pair:
        return ["-", "-"]
    return [fmt(pair["median"], ".3f"), ", ".join(f"{k}: {r:.3f}" for k, r in zip(pair["rounds"], pair["ratios"]))]


def oracle_targets(grid: dict, configs: dict) -> list[str]:
    """``[targets.oracle]``, per configuration and fraction, for the strongest steered policy there:
    ``over_oracle`` and ``over_static`` where the configuration is not steady (congestion or a
    shift), ``steady_over_oracle`` where it is."""
    want = grid.get("targets", {}).get("oracle", {})
    out = []
    for key, at in oracle_results(grid, configs).items():
        calm = steady(configs[key]["config"])
        for f, o in at.items():
            p = o["steered"].get(o["strongest"]) if o["strongest"] else None
            checks = [("steady_over_oracle", "the hindsight-best fixed setting", o["by_time"] and o["by_time"]["setting"],
                       "over_oracle")] if calm else [
                ("over_oracle", "the hindsight-best fixed setting", o["by_time"] and o["by_time"]["setting"], "over_oracle"),
                ("over_static", "the better static", o["better_static"], "over_static")]
            spread = max((r["spread"] for r in o["repeats"] if r["spread"]), default=None)
            noise = f"; identical runs differed by up to {spread:.2f}x" if spread else ""
            for target, what, which, figure in checks:
                if target in want:
                    pair = p and p[f"paired_{figure}"]
                    value = pair["median"] if pair else (p[figure] if p else None)
                    how = (f" (paired by round, the median of {len(pair['ratios'])}: "
                           f"{', '.join(f'{r:.2f}' for r in pair['ratios'])})") if pair else ""
                    out.append(f"- {key}, f={f}{' (steady)' if calm else ''}: the strongest steered policy "
                               f"({o['strongest'] or 'none ran'}) over {what} ({which or '-'}) "
                               f"{verdict(value, want[target])}{how}{noise}")
    return out
