"""The evaluation harness: every policy side by side over a grid of configurations, classifiers
tested on configurations they were not trained on, DistDGL itself as a peer, the simulator
checked against every run, and the simulator pushed to partition counts this machine cannot run.

    python bench/evaluate.py --grid bench/grids/tiny.toml --seed 0 --out runs/eval-tiny
    python bench/evaluate.py --grid bench/grids/full.toml --seed 0 --out runs/eval --publish docs/results.md

A grid is a TOML file (``bench/grids/``): datasets (partition-tool specs; ``shared:facebook``,
``shared:cora``, ``shared:citeseer`` read ``../shared/data`` and are skipped with a reason when
it is absent; ``bundled:cora`` is ``data/cora``), and the cartesian grid of ranks, batch sizes,
fanouts, shifts (``--shift`` values, "" steady) and buffer fractions every policy runs on. The
seed (``--seed``) seeds partitioning, model, sampling and shuffling, so anyone can run configurations and seeds we never tuned on.

Per configuration (dataset, ranks, batch size, fanouts) the policies ``none-serial`` (no overlap)
and ``none`` run once; per buffer fraction ``static``, ``fixed``, ``lookahead`` and the agent
policies. Each trainer is an emulated node of its own (``MPIR_CVAR_NUM_CLIQUES``), so every remote
row crosses RMA as between cluster nodes; agent policies add an agent rank per node. A grid's
``[network]`` table runs each configuration under ``python -m rudder.netem`` and each such run
once more unshaped on one node, for its floor (docs/evaluation.md, "A shaped network"). The fixed
runs also collect the classifiers' traces (``--collect-traces``): the classifiers train on the
``classifier.seen`` datasets' traces and are scored on the other datasets' (unseen) traces too.

Everything lands under ``--out``: ``parts/``, ``runs/``, ``classifiers/``, ``distdgl/``,
``simulator/``, ``plots/``, ``results.json`` and ``results.md``; a rerun reuses every finished
run with the same flags. ``--budget-minutes`` stops starting runs once spent (the rest is listed
as not run).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, for bench.evaluation

from bench.evaluation.grid import GridError, load_grid, resolve_datasets  # noqa: E402
from bench.evaluation.harness import Harness, commit_text, machine_text, run_all  # noqa: E402
from bench.evaluation.report import plots, rebuild_report, write_results  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", required=True, help="a grid file (bench/grids/tiny.toml, full.toml, or your own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="directory for everything the harness makes")
    ap.add_argument("--budget-minutes", type=float, default=120.0)
    ap.add_argument("--publish", metavar="FILE", help="also copy results.md here (e.g. docs/results.md)")
    ap.add_argument("--no-validate", action="store_true", help="skip the simulator check of every run")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild results.md from --out's results.json and the runs' logs, running nothing")
    a = ap.parse_args(argv)
    command = "python bench/evaluate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        grid = load_grid(a.grid)
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    h = Harness(grid, a.out, a.seed, a.budget_minutes)
    if a.report_only:
        return rebuild_report(h, a.publish)
    datasets, skipped = resolve_datasets(grid)
    for s in skipped:
        h.say(f"dataset skipped: {s}")
    json.dump({"grid": grid, "seed": a.seed, "command": command}, open(os.path.join(h.out, "grid.json"), "w"), indent=1)
    t, load = time.time(), os.getloadavg()[0]
    results = {"seed": a.seed, "grid_file": os.path.abspath(a.grid), "skipped_datasets": skipped, "command": command,
               "budget_minutes": a.budget_minutes, "commit": commit_text()}
    results.update(run_all(h, datasets, validate=not a.no_validate))  # grid, distdgl, simulator, scale
    results["plots"] = plots(h, results["grid"]["configs"])
    results["not_run"], results["failed"] = h.not_run, h.failed
    results["seconds"] = time.time() - t
    results["machine"] = machine_text(load)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_results(h, results, command, a.publish)
    h.say(f"done in {time.time() - t:.0f} s: {os.path.join(h.out, 'results.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
