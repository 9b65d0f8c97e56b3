"""Bytes moved and epoch time with the features stored compact (the type ``--feature-dtype auto``
picks: bits for Facebook's and Cora's 0/1 rows) against float32 storage, side by side in one
run: Facebook Page-Page at 4 partitions (Cora when ../shared/data lacks it), each rank its own
emulated node (MPIR_CVAR_NUM_CLIQUES = parts), so every remote row crosses RMA: over this
host's unshaped loopback, or with ``--rate`` inside a shaped network (``python -m rudder.netem
--rate RATE --links LINKS``, docs/network.md), where the bytes saved become time.

Configurations, for each policy: float32 rows read as ``--rma-gets auto`` picks for them (18.9 KB
on Facebook: one Get per run of rows), the compact rows as auto picks for them (590 B: one
indexed Get per owner), and the compact rows forced to ``--rma-gets runs``. All are repeated
``--reps`` times, interleaved, so machine noise hits them alike; a figure is the median over
the reps, and a time ratio is the median over reps of the run against the same rep's float32 run
(with their range). The losses of every configuration are checked bit-identical to float32's.

Columns: MiB = feature bytes read by RMA per epoch, all trainers (``bytes_rma``, stored rows);
rows = remote rows fetched per epoch; epoch s = the slowest trainer's, median over the steady epochs
(rudder.logs.metrics); wait = the training thread waiting for its inputs, fetch = feature
assembly (sampling not included), rma = inside Get..Flush (feature rows and the sampler's
adjacency), each per trainer per epoch. The "floor" is computed, not measured: the epoch's
bytes over one shared link of ``--rate`` (1 Gbit/s when unshaped; a ``tbf`` on lo, issue 18),
below which no epoch under that shaping can go (on per-node links each trainer has a link of its
own, so the floor there is lower).

    python bench/feature_bytes.py [--parts 4] [--epochs 3] [--reps 2] [--policies none,lookahead]
    python bench/feature_bytes.py --rate 1gbit [--links shared] --batch-size 256   (shaped)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import FACEBOOK, cached_partition, shaped, train_job  # noqa: E402
from rudder.analysis.summary import summarize  # noqa: E402
from rudder.data.partition_store import PartitionMeta  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402
from rudder.netem.namespaces import NetemError, support_problem  # noqa: E402
from rudder.netem.shaping import format_rate, parse_rate  # noqa: E402

POLICY_FLAGS = {"none": [], "lookahead": ["--policy", "lookahead", "--buffer-fraction", "0.25"],
                "fixed": ["--policy", "fixed", "--buffer-fraction", "0.25"], "static": ["--policy", "static"]}


def dataset() -> tuple[str, str]:
    if os.path.isfile(os.path.join(FACEBOOK, "facebook_edges.csv")):
        return "facebook", f"musae:{FACEBOOK}:facebook"
    print(f"(Facebook Page-Page not at {FACEBOOK}: Cora instead)")
    return "cora", f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"


def one_run(parts: str, run_dir: str, a, policy: str, gets: str, wrapper: list[str]) -> dict:
    train_job(parts, run_dir, a.parts, a.parts, ["--epochs", str(a.epochs), "--rma-gets", gets, *POLICY_FLAGS[policy],
                                                 *(["--batch-size", str(a.batch_size)] if a.batch_size else [])],
              wrapper=wrapper)
    run = load_run(run_dir)
    s = summarize(run)
    t = s["time_breakdown"]
    timed = metrics.run_timed_epochs([r.epochs for r in run.ranks])
    rma = metrics.per_epoch_mean([r.minibatches for r in run.ranks], "t_rma", timed) / len(run.ranks)
    return {"mib": s["traffic"]["rma_bytes_per_epoch"] / 2**20, "rows": s["traffic"]["remote_rows_fetched_per_epoch"],
            "epoch_s": s["epochs"]["median_seconds"], "wait_s": t["t_wait"], "fetch_s": t["t_fetch"], "rma_s": rma,
            "loss": np.concatenate([r.minibatches["loss"] for r in run.ranks])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=0, help="seeds per trainer per minibatch (0: the default)")
    ap.add_argument("--policies", default="none,lookahead", help=f"comma-separated, of {', '.join(POLICY_FLAGS)}")
    ap.add_argument("--rate", default="", help="run every job inside a shaped network of this rate (e.g. 1gbit)")
    ap.add_argument("--links", default="shared", choices=("shared", "per-node"), help="with --rate: the topology")
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-feature-bytes"))
    a = ap.parse_args()
    try:
        floor_rate = parse_rate(a.rate or "1gbit", "--rate")
    except NetemError as e:
        raise SystemExit(f"bench/feature_bytes.py: {e}") from None
    wrapper = []
    if a.rate:
        problem = support_problem()
        if problem is not None:
            print(f"--rate: skipped, no shaped network on this machine: {problem}")
            return 0
        wrapper = shaped(a.rate, a.links, a.parts)
    network = ("unshaped loopback" if not a.rate else f"one shared {a.rate} link" if a.links == "shared"
               else f"a {a.rate} link per node")
    name, spec = dataset()
    stores = {dtype: cached_partition(spec, a.parts, os.path.join(a.work, f"{name}-{a.parts}-{dtype}"), dtype)
              for dtype in ("float32", "auto")}
    compact = PartitionMeta.load(stores["auto"]).feature_encoding
    wide = PartitionMeta.load(stores["float32"]).feature_encoding
    configs = [("float32", "auto"), ("auto", "auto"), ("auto", "runs")]
    print(f"{name} p{a.parts}, {a.parts} emulated nodes ({network}), {a.epochs} epochs, {a.reps} reps interleaved, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start; rows {wide.row_bytes} B as float32, "
          f"{compact.row_bytes} B as {compact.name}")
    results: dict = {}
    for rep in range(a.reps):
        for policy in a.policies.split(","):
            for dtype, gets in configs:
                t = time.time()
                r = one_run(stores[dtype], os.path.join(a.work, f"run-{policy}-{dtype}-{gets}"), a, policy, gets,
                            wrapper)
                results.setdefault((policy, dtype, gets), []).append(r)
                print(f"  rep {rep} {policy} {dtype} gets={gets}: epoch {r['epoch_s']:.3f} s ({time.time() - t:.0f} s wall)",
                      flush=True)
    print(f"\n{'policy':<10} {'storage':<8} {'gets':<8} {'rows/ep':>9} {'MiB/ep':>8} {'x f32':>6} {'epoch s':>8} {'x f32':>6} "
          f"{'range':<11} {'wait s':>7} {'fetch s':>8} {'rma s':>6} {format_rate(floor_rate) + ' floor s (computed)':>28}")
    for policy in a.policies.split(","):
        base = results[(policy, "float32", "auto")]
        for dtype, gets in configs:
            rs = results[(policy, dtype, gets)]
            for r in rs:  # features widened on arrival: the model saw the same inputs
                assert np.array_equal(r["loss"], base[0]["loss"]), f"{policy} {dtype} {gets}: losses differ from float32"
            med = {k: float(np.median([r[k] for r in rs])) for k in ("mib", "rows", "epoch_s", "wait_s", "fetch_s", "rma_s")}
            # time ratio: each rep's run against the float32 run of the same rep, median over reps
            paired = [r["epoch_s"] / b["epoch_s"] for r, b in zip(rs, base)]
            label = wide.name if dtype == "float32" else compact.name
            print(f"{policy:<10} {label:<8} {gets:<8} {med['rows']:>9,.0f} {med['mib']:>8.1f} "
                  f"{med['mib'] / np.median([b['mib'] for b in base]):>6.3f} {med['epoch_s']:>8.3f} "
                  f"{np.median(paired):>6.2f} {min(paired):>5.2f}-{max(paired):<5.2f} {med['wait_s']:>7.3f} "
                  f"{med['fetch_s']:>8.3f} {med['rma_s']:>6.3f} {med['mib'] * 2**20 * 8 / floor_rate:>28.2f}")
    print(f"losses bit-identical across storage types and Get modes: yes; load {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
