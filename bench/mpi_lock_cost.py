"""The MPI lock's cost (issue 38, rudder.comm.gate): epoch time with ``--mpi-lock on`` over
``off``, side by side, unshaped and inside a 1 Gbit/s shaped network.

    python bench/mpi_lock_cost.py --data runs/cora4 [--ranks 4] [--pairs 3] [--epochs 6] [--batch-size 4]
        [--rate 1gbit] [--mpi-wait auto] [--policy fixed]

Each pair runs both settings back to back in alternating order (a host that drifts slows neither
side more than the other), every rank its own emulated node (``MPIR_CVAR_NUM_CLIQUES``), shaped
runs behind ``python -m rudder.netem --rate RATE --links shared``. Epoch time is
``rudder.logs.metrics.run_epoch_time`` (the steady state: give at least 5 epochs). Prints each
pair's ratio and, per network, the median.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import shaped, train_job  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import read_rank  # noqa: E402


def epoch_seconds(args, run_dir: str, lock: str, wrapper: list[str]) -> float:
    flags = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--policy", args.policy,
             "--mpi-wait", args.mpi_wait, "--mpi-lock", lock]
    paths = train_job(args.data, run_dir, args.ranks, args.ranks, flags, wrapper)
    seconds = metrics.run_epoch_time([read_rank(p).tables["epochs"] for p in paths])
    if seconds is None:
        raise SystemExit(f"mpi_lock_cost.py: --epochs {args.epochs}: too few for a steady-state epoch time")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--policy", default="fixed")
    ap.add_argument("--mpi-wait", default="auto")
    ap.add_argument("--rate", default="1gbit", help="the shaped runs' rate (rudder.netem --rate); none: unshaped only")
    args = ap.parse_args()
    networks = {"unshaped": []}
    if args.rate != "none":
        networks[f"shaped {args.rate}"] = shaped(args.rate, "shared", args.ranks)
    ratios: dict[str, list[float]] = {name: [] for name in networks}
    with tempfile.TemporaryDirectory() as work:
        for pair in range(args.pairs):
            for name, wrapper in networks.items():
                order = ("off", "on") if pair % 2 == 0 else ("on", "off")
                seconds = {lock: epoch_seconds(args, os.path.join(work, f"{pair}-{lock}"), lock, wrapper) for lock in order}
                ratios[name].append(seconds["on"] / seconds["off"])
                print(json.dumps({"pair": pair, "network": name, "order": order, "epoch_s": seconds,
                                  "ratio": ratios[name][-1]}), flush=True)
    print(json.dumps({name: {"median_ratio": float(np.median(r)), "ratios": r} for name, r in ratios.items()}))


if __name__ == "__main__":
    main()
