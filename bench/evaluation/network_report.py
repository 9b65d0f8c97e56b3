"""The report's sections for shaped networks: every shaped run against its floor (bench/evaluation/floor.py),
none-serial and DistDGL, side by side; the grid's ``[targets]`` checked against those ratios; what
the grid says it does not measure."""
from __future__ import annotations

from bench.evaluation.grid import FRACTION_FREE

MIB = 1 << 20


def ratio(a, b) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def floor_table(r: dict, distdgl: dict | None) -> list[str]:
    """One shaped configuration: each run's epoch, its floor's two parts, and its ratios."""
    serial = r["runs"].get("none-serial", {}).get("epoch_seconds")
    peer = (distdgl or {}).get("epoch_seconds")
    lines = ["| policy | f | epoch s | compute-only s | RMA MiB/epoch | MiB / rate s | floor s | x floor | x none-serial "
             "| x DistDGL | counted / logged bytes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, fig in r["runs"].items():
        policy, _, f = label.rpartition("-f") if label not in FRACTION_FREE else (label, "", "")  # last: sweep-fixed-...
        fl = fig.get("floor") or {}
        lines.append(f"| {policy} | {f or '-'} | {fmt(fig['epoch_seconds'], '.2f')} | {fmt(fl.get('compute_seconds'), '.2f')} "
                     f"| {fmt((fl.get('wire_bytes_per_epoch') or 0) / MIB if fl else None, ',.0f')} "
                     f"| {fmt(fl.get('bandwidth_seconds'), '.2f')} | {fmt(fl.get('seconds'), '.2f')} "
                     f"| {fmt(ratio(fig['epoch_seconds'], fl.get('seconds')), '.2f')} "
                     f"| {fmt(ratio(fig['epoch_seconds'], serial), '.2f')} | {fmt(ratio(fig['epoch_seconds'], peer), '.2f')} "
                     f"| {fmt(fl.get('counted_over_logged'), '.3f')} |")
    return lines


def best_run(runs: dict, fraction) -> tuple[str, dict] | None:
    """The fastest run at buffer fraction ``fraction`` (the buffer-free runs count at every fraction)."""
    at = [(k, v) for k, v in runs.items() if v["epoch_seconds"] and (k in FRACTION_FREE or k.endswith(f"-f{fraction}"))]
    return min(at, key=lambda kv: kv[1]["epoch_seconds"]) if at else None


def verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "not measured"
    return f"{'met' if value <= limit else 'NOT met'}: {value:.2f}x (target <= {limit}x)"


def targets(grid: dict, configs: dict, distdgl: dict) -> list[str]:
    """The grid's ``[targets]``, each with its measured figure: ``over_floor`` (every shaped run),
    ``none_over_distdgl`` (every configuration with a peer run) and ``[targets.best]`` (per
    configuration key: the best run at ``fraction`` over DistDGL and over none-serial)."""
    t = grid.get("targets", {})
    out = []
    shaped = [(key, label, fig) for key, r in configs.items() for label, fig in r["runs"].items() if fig.get("floor")]
    if "over_floor" in t:
        worst = max(shaped, key=lambda s: ratio(s[2]["epoch_seconds"], s[2]["floor"]["seconds"]) or 0, default=None)
        within = sum(1 for *_, fig in shaped if (ratio(fig["epoch_seconds"], fig["floor"]["seconds"]) or 0) <= t["over_floor"])
        value = ratio(worst[2]["epoch_seconds"], worst[2]["floor"]["seconds"]) if worst else None
        out.append(f"- every policy's epoch <= {t['over_floor']}x its floor: {verdict(value, t['over_floor'])}"
                   + (f", the worst being {worst[1]} on {worst[0]}; {within} of {len(shaped)} runs within" if worst else ""))
    if "none_over_distdgl" in t:
        pairs = [(key, ratio(configs[key]["runs"].get("none", {}).get("epoch_seconds"), p.get("epoch_seconds")))
                 for key, p in distdgl.items() if isinstance(p, dict) and key in configs and "epoch_seconds" in p]
        pairs = [(k, v) for k, v in pairs if v is not None]
        worst = max(pairs, key=lambda kv: kv[1], default=None)
        out.append(f"- our none <= {t['none_over_distdgl']}x DistDGL everywhere: "
                   f"{verdict(worst[1] if worst else None, t['none_over_distdgl'])}"
                   + (f", the worst on {worst[0]} ({len(pairs)} configurations with a peer run)" if worst else ""))
    for key, want in t.get("best", {}).items():
        best = best_run(configs[key]["runs"], want["fraction"]) if key in configs else None
        if best is None:
            out.append(f"- {key}, f={want['fraction']}: not measured")
            continue
        label, fig = best
        serial = configs[key]["runs"].get("none-serial", {}).get("epoch_seconds")
        peer = (distdgl.get(key) or {}).get("epoch_seconds") if isinstance(distdgl, dict) else None
        if "over_distdgl" in want:
            out.append(f"- {key}, f={want['fraction']}: best policy ({label}) over DistDGL "
                       f"{verdict(ratio(fig['epoch_seconds'], peer), want['over_distdgl'])}")
        if "over_serial" in want:
            out.append(f"- {key}, f={want['fraction']}: best policy ({label}) over none-serial "
                       f"{verdict(ratio(fig['epoch_seconds'], serial), want['over_serial'])}")
    return out


def pass_cell(d: dict, metric: str) -> str:
    """A Pass@1 as "share [low, high]" (its 95% interval); results of older harnesses hold the share alone."""
    scored = (d.get("pass_at_1") or {}).get(metric)
    if not scored:
        return fmt(d.get(f"pass_at_1_{metric}"), ".3f")
    if scored["value"] is None:
        return "-"
    return f"{scored['value']:.3f} [{scored['low']:.2f}, {scored['high']:.2f}]"
