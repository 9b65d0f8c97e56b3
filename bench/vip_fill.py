"""Benchmark (not a test): the static buffer filled by vertex-inclusion probability (SALIENT++'s
VIP, ``--buffer-init vip``) against the degree-ranked fill, in remote feature rows fetched, on
every configuration of the grid below, side by side in one run of the simulator (exact rows, no
time model: ``python -m rudder.simulate --validate`` holds these counts to real runs).

Grid: Cora, CiteSeer and Facebook Page-Page (the last two when ../shared/data has them), RMAT-16
and an SBM graph (the specs and batch sizes of bench/grids/full.toml), partitioned with METIS
into 2, 4 and 8 (one trainer each), buffer fractions 0.05 and 0.25, fanouts 10,25 (the default)
and 5,10,15 (3 layers), 3 epochs. Rows = remote feature rows fetched per epoch (misses; a static
buffer refills nothing), all trainers, mean of epochs 2..3 (``rudder.logs.metrics``); fill = the
rows the initial fill read once. vip/deg < 1: VIP fetches fewer.

    python bench/vip_fill.py [--cache DIR] [--workers 2] [--epochs 3] [--parts 2,4,8]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import cached_partition  # noqa: E402
from rudder.sim.simulate import simulate, summarize  # noqa: E402
from rudder.sim.transport import Graph  # noqa: E402
from rudder.train.config import TrainConfig  # noqa: E402

SHARED = os.path.join(REPO, "..", "shared", "data")
DATASETS = {  # name: (input spec, batch size, file that must exist)
    "cora": (f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora", 16, None),
    "citeseer": (f"planetoid:{os.path.join(SHARED, 'planetoid')}:citeseer", 16,
                 os.path.join(SHARED, "planetoid", "ind.citeseer.graph")),
    "facebook": (f"musae:{os.path.join(SHARED, 'musae')}:facebook", 256, os.path.join(SHARED, "musae", "facebook_edges.csv")),
    "rmat16": ("synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1", 256, None),
    "sbm": ("synthetic:sbm:nodes=20000,blocks=8,avg_degree=16,homophily=0.7,feat_dim=128,seed=3", 128, None),
}
FANOUTS = {"10,25": [10, 25], "5,10,15": [5, 10, 15]}
FRACTIONS = (0.05, 0.25)


def rows(parts: str, batch: int, fanouts: list[int], epochs: int, workers: int) -> dict:
    """{(fraction, init): summary row} for static buffers, and none's, from one simulation."""
    cfg = TrainConfig.from_flat({"data": parts, "run_dir": "(simulated)", "epochs": epochs, "batch_size": batch,
                                 "fanouts": fanouts})
    policies = {"none": {"policy": "none"}}
    for f in FRACTIONS:
        for init in ("degree", "vip"):
            policies[f"{init}@{f}"] = {"policy": "static", "buffer_fraction": f, "buffer_init": init}
    result = simulate(cfg, policies, None, workers=workers, graph=Graph(parts))
    return summarize(result, epochs, None)["policies"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="/tmp/rudder-bench-vip", help="where the partitions are kept between runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--parts", default="2,4,8")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    a = ap.parse_args()
    print(f"{'dataset':<9} {'p':>2} {'fanouts':<8} {'f':>5} {'none rows':>10} {'degree rows':>12} {'vip rows':>10} "
          f"{'vip/deg':>8} {'deg/none':>9} {'vip/none':>9} {'deg fill':>9} {'vip fill':>9}", flush=True)
    wins = []
    for name in a.datasets.split(","):
        spec, batch, needed = DATASETS[name]
        if needed and not os.path.isfile(needed):
            print(f"({name}: {needed} missing, skipped)")
            continue
        for p in (int(x) for x in a.parts.split(",")):
            parts = cached_partition(spec, p, os.path.join(a.cache, f"{name}-{p}"))
            for label, fanouts in FANOUTS.items():
                t = time.time()
                pol = rows(parts, batch, fanouts, a.epochs, a.workers)
                none = pol["none"]["rows_per_epoch"]
                for f in FRACTIONS:
                    deg, vip = pol[f"degree@{f}"], pol[f"vip@{f}"]
                    d, v = deg["rows_per_epoch"], vip["rows_per_epoch"]
                    wins.append(v / d if d else 1.0)
                    print(f"{name:<9} {p:>2} {label:<8} {f:>5} {none:>10,.0f} {d:>12,.0f} {v:>10,.0f} "
                          f"{v / d if d else float('nan'):>8.3f} {d / none:>9.3f} {v / none:>9.3f} "
                          f"{deg['fill_rows']:>9,} {vip['fill_rows']:>9,}   ({time.time() - t:.0f} s)", flush=True)
    better = sum(r < 1 for r in wins)
    print(f"{len(wins)} configurations: vip fetches fewer rows than degree on {better}, more on "
          f"{sum(r > 1 for r in wins)}; vip/deg from {min(wins):.3f} to {max(wins):.3f}")


if __name__ == "__main__":
    main()
