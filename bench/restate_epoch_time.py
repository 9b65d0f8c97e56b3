"""The headline ratios of a harness run (bench/evaluate.py) under the epoch time's two definitions,
side by side: the steady state (``rudder.logs.metrics``, since 6 December 2026) and the one
before it, the median over epochs 2..E, whose last epoch starts with minibatches the pipeline
prepared in the epoch before (docs/logs.md, "Epoch time").

    python bench/restate_epoch_time.py OUT [--fraction 0.25]

OUT is a harness directory (its results.json, the runs' logs, their compute-only runs and the
DistDGL peer's summaries). Per configuration it prints every run's per-epoch seconds (slowest
trainer), its epoch time both ways and its floor both ways, then the ratios of docs/targets.md:
the best run over DistDGL and over none-serial, our none over DistDGL, every run over its floor.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.evaluation.floor import floor  # noqa: E402
from bench.evaluation.grid import FRACTION_FREE  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402


def before(seconds: list[float]) -> float | None:
    """The definition before 6 December: the median of epochs 2..E (the only epoch of a 1-epoch run)."""
    later = seconds[1:] if len(seconds) > 1 else seconds
    return float(np.median(later)) if later else None


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(v, spec=".3f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def restate(out: str, fraction: float) -> list[str]:
    results = json.load(open(os.path.join(out, "results.json")))
    lines = []
    for key, r in results["grid"]["configs"].items():
        times, floors = {}, {}
        lines += [f"## {key}", "", "| run | slowest trainer s, epoch by epoch | epoch s before | epoch s now "
                  "(steady epochs) | floor s before | floor s now |", "|---|---|---|---|---|---|"]
        for label, fig in r["runs"].items():
            tables = [t.epochs for t in load_run(fig["run"]).ranks]
            done = metrics.complete_epochs(tables)
            seconds = metrics.slowest_seconds(tables, done).tolist()
            times[label] = (before(seconds), metrics.run_epoch_time(tables))
            fl = fig.get("floor")
            if fl:
                old = floor(fig["run"], fl["compute_only_run"], r["config"].get("network", {}).get("links", "shared"),
                            epochs=done[1:])
                floors[label] = (old["seconds"], fl["seconds"])
            lines.append(f"| {label} | {', '.join(f'{s:.2f}' for s in seconds)} | {fmt(times[label][0])} "
                         f"| {fmt(times[label][1])} ({metrics.run_steady_text(tables)}) "
                         f"| {fmt(floors.get(label, (None, None))[0])} | {fmt(floors.get(label, (None, None))[1])} |")
        peer = (results.get("distdgl") or {}).get(key) or {}
        if "run" in peer:
            per_epoch = json.load(open(os.path.join(peer["run"], "summary.json")))["per_epoch"]
            seconds = [e["time_max"] for e in per_epoch]
            times["DistDGL"] = (before(seconds), metrics.epoch_time([e["time_max"] for e in metrics.timed_epochs(per_epoch)]))
            lines.append(f"| DistDGL | {', '.join(f'{s:.2f}' for s in seconds)} | {fmt(times['DistDGL'][0])} "
                         f"| {fmt(times['DistDGL'][1])} | - | - |")
        lines += ["", "| ratio | before | now |", "|---|---|---|"]
        at = {k: v for k, v in times.items() if k != "DistDGL" and (k in FRACTION_FREE or k.endswith(f"-f{fraction}"))}
        best = [min((k for k in at if at[k][i] is not None), key=lambda k, i=i: at[k][i], default=None) for i in (0, 1)]
        peer, serial, none = (times.get(k, (None, None)) for k in ("DistDGL", "none-serial", "none"))
        figures = [("best over DistDGL", [ratio(at[best[i]][i], peer[i]) if best[i] else None for i in (0, 1)]),
                   ("best over none-serial", [ratio(at[best[i]][i], serial[i]) if best[i] else None for i in (0, 1)]),
                   ("our none over DistDGL", [ratio(none[i], peer[i]) for i in (0, 1)])]
        figures += [(f"{label} over its floor", [ratio(at[label][i], floors[label][i]) for i in (0, 1)])
                    for label in floors if label in at]
        lines.append(f"| best run | {best[0]} | {best[1]} |")
        lines += [f"| {name} | {fmt(old)} | {fmt(now)} |" for name, (old, now) in figures]
        lines.append("")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="a bench/evaluate.py output directory")
    ap.add_argument("--fraction", type=float, default=0.25, help="the buffer fraction whose runs are compared")
    a = ap.parse_args()
    print("\n".join(restate(a.out, a.fraction)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
