"""Benchmark (not a test): the static buffer filled by vertex-inclusion probability (SALIENT++'s
VIP, ``--buffer-init vip``) against the degree-ranked fill, in remote feature rows fetched, on
every configuration of the grid below, side by side in one run of the simulator (exact rows, no
time model: ``python -m rudder.simulate --validate`` holds these counts to real runs).

Grid: Cora, CiteSeer and Facebook Page-Page (the last two when ../shared/data has them), RMAT-16
and an SBM graph (the specs and batch sizes of bench/grids/full.toml), partitioned with METIS
into 2, 4 and 8 (one trainer each), buffer fractions 0.05 and 0.25, fanouts 10,25 (the default)
and 5,10,15 (3 layers), 3 epochs. Rows = remote feature rows fetched per epoch (misses; a static
buffer refills nothing), all trainers, mean of the steady epochs (``rudder.logs.metrics``); fill = the
rows the initial fill read once. vip/deg < 1: VIP fetches fewer. "vip remote": VIP with
``--buffer-scope remote`` (the same B slots, chosen among all remote nodes, where in-degree is
known for the halo only: a static degree fill is the same whatever the scope).

    python bench/vip_fill.py [--cache DIR] [--workers 2] [--epochs 3] [--parts 2,4,8]
    python bench/vip_fill.py --cost [--parts 2,4] [--datasets rmat16,facebook]

``--cost``: what computing VIP costs a real run at start-up. ``mpiexec drivers/train.py
--policy static --buffer-init vip`` (2 epochs, each rank its own emulated node so every other
partition's lists come by RMA), per fanouts: the slowest trainer's VIP seconds and the RMA bytes
of adjacency it read, beside the run's epoch time and the adjacency bytes its sampler read by RMA
in an epoch (all trainers, epoch 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import cached_partition, train_job  # noqa: E402
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
        policies[f"vip-remote@{f}"] = {"policy": "static", "buffer_fraction": f, "buffer_init": "vip",
                                       "buffer_scope": "remote"}
    result = simulate(cfg, policies, None, workers=workers, graph=Graph(parts))
    return summarize(result, epochs, None)["policies"]


def cost(name: str, parts: str, ranks: int, batch: int, label: str, workdir: str) -> None:
    import json

    import h5py

    from rudder.logs.metrics import run_epoch_time

    run = os.path.join(workdir, f"cost-{name}-{ranks}-{label.replace(',', '-')}")
    paths = train_job(parts, run, ranks, ranks, ["--policy", "static", "--buffer-init", "vip", "--epochs", "4",
                                                 "--batch-size", str(batch), "--fanouts", label])
    logs = [h5py.File(path, "r", locking=False) for path in paths]
    info = [json.loads(f.attrs["run"]) for f in logs]
    vip_s = max(i["buffer_vip_seconds"] for i in info)
    vip_bytes = sum(i["buffer_vip_adjacency_bytes_rma"] for i in info)
    epoch_s = run_epoch_time([f["epochs"][()] for f in logs])
    mb = [f["minibatches"][()] for f in logs]
    sampler_bytes = sum(int(t["adjacency_bytes_rma"][t["epoch"] == 1].sum()) for t in mb)
    print(f"{name:<9} {ranks:>2} {label:<8} {vip_s:>8.3f} {vip_s / epoch_s:>9.3f} {vip_bytes / 1e6:>10.2f} "
          f"{sampler_bytes / 1e6:>12.2f} {vip_bytes / max(sampler_bytes, 1):>9.2f} {epoch_s:>8.3f}", flush=True)
    for f in logs:
        f.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="/tmp/rudder-bench-vip", help="where the partitions are kept between runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--parts", default="2,4,8")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--cost", action="store_true", help="measure the start-up cost of VIP in real runs instead")
    a = ap.parse_args()
    if a.cost:
        print(f"{'dataset':<9} {'p':>2} {'fanouts':<8} {'vip s':>8} {'x epoch':>9} {'vip MB':>10} {'sampler MB':>12} "
              f"{'x epoch':>9} {'epoch s':>8}   (vip MB: adjacency by RMA, once; sampler MB: by RMA, one epoch)")
        for name in a.datasets.split(","):
            spec, batch, needed = DATASETS[name]
            if needed and not os.path.isfile(needed):
                continue
            for p in (int(x) for x in a.parts.split(",")):
                parts = cached_partition(spec, p, os.path.join(a.cache, f"{name}-{p}"))
                for label in FANOUTS:
                    cost(name, parts, p, batch, label, a.cache)
        return
    print(f"{'dataset':<9} {'p':>2} {'fanouts':<8} {'f':>5} {'none rows':>10} {'degree rows':>12} {'vip rows':>10} "
          f"{'vip/deg':>8} {'deg/none':>9} {'vip/none':>9} {'deg fill':>9} {'vip fill':>9} {'vip remote':>11} "
          f"{'/deg':>6}", flush=True)
    wins, remote_wins = [], []
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
                    d, v, r = deg["rows_per_epoch"], vip["rows_per_epoch"], pol[f"vip-remote@{f}"]["rows_per_epoch"]
                    wins.append(v / d if d else 1.0)
                    remote_wins.append(r / d if d else 1.0)
                    print(f"{name:<9} {p:>2} {label:<8} {f:>5} {none:>10,.0f} {d:>12,.0f} {v:>10,.0f} "
                          f"{v / d if d else float('nan'):>8.3f} {d / none:>9.3f} {v / none:>9.3f} "
                          f"{deg['fill_rows']:>9,} {vip['fill_rows']:>9,} {r:>11,.0f} {r / d if d else float('nan'):>6.3f}"
                          f"   ({time.time() - t:.0f} s)", flush=True)
    better = sum(r < 1 for r in wins)
    print(f"{len(wins)} configurations: vip fetches fewer rows than degree on {better}, more on "
          f"{sum(r > 1 for r in wins)}; vip/deg from {min(wins):.3f} to {max(wins):.3f}; vip remote/deg from "
          f"{min(remote_wins):.3f} to {max(remote_wins):.3f}, fewer on {sum(r < 1 for r in remote_wins)}")


if __name__ == "__main__":
    main()
