"""Analyse the per-rank HDF5 logs of one or more runs.

    python -m rudder.analyze RUN [RUN ...] [--baseline RUN] [--json] [--plots DIR] [--data PARTS] [--decisions N]

Per run: layout and config, training time and epoch times, the time breakdown, accuracy,
remote traffic, the buffer's hits, refills and evictions, and, for runs recorded with
``--trace``, the optimal bound: Belady's MIN replayed per rank on the recorded remote inputs
with the run's capacity and admissible set, and the infinite-buffer bound. Several runs are
compared side by side, each figure also as a ratio to ``--baseline``. ``--json`` prints one
document instead of the tables (keys: ``rudder.analysis.report.SCHEMA``, docs/logs.md);
``--plots DIR`` writes PNGs. Every figure is computed from the raw per-minibatch and per-epoch rows.

A killed run (missing ranks, a rank still "running", an unreadable file) is summarised with
warnings naming what is missing; a directory without logs or a log of another format is a
one-line error.
"""
from __future__ import annotations

import argparse
import json
import sys

from rudder.analysis.decisions import decision_lines
from rudder.analysis.plots import plots
from rudder.analysis.report import table
from rudder.analysis.summary import summarize
from rudder.logs.reader import LogError, load_run


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
    except LogError as e:
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
