"""What an evaluation costs a trainer, by ``--eval-inference``, against an epoch: Cora, RMAT-16
(float32, 128 features; ``rmat16-few``: the same graph with 3% of its nodes scored instead of
40%, its CSR distributed) and Facebook Page-Page (when ../shared/data has it) in 4 partitions, features stored as
float32, each rank its own emulated node (MPIR_CVAR_NUM_CLIQUES = parts), so every remote row
crosses RMA.

Each configuration trains ``--epochs`` epochs with no buffer (``--policy none``), evaluating after
every epoch, once per inference (``--inferences``: layerwise, khop, sampled, auto), ``--reps`` times
in alternating order (forward, then backward), so host noise hits them alike. The training is
the same in every run, so the models evaluated are the same: the val/test accuracies of every
evaluation are checked equal between khop, auto and layerwise (sampled's are reported); auto's
row says which it took.

Columns, per trainer and evaluation (the mean over trainers; "most": the busiest trainer): rows =
rows read from other partitions (``eval_rows_shared + eval_rows_rma``: features, and layerwise's
hidden rows), MiB by RMA, CSR entries by RMA (the neighbourhoods; 0 where the CSR is replicated),
eval s = the slowest trainer's evaluation, the median over evaluations and reps; epoch rows =
remote feature rows a trainer fetched per epoch, epoch MiB their bytes by RMA; epoch s = the run's epoch time
(rudder.logs.metrics), median over reps.

    python bench/eval_cost.py [--parts 4] [--epochs 4] [--reps 2] [--datasets cora,rmat16,rmat16-few,facebook]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import FACEBOOK, cached_partition, train_job  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402
from rudder.logs.schema import EVAL_INFERENCES  # noqa: E402

INFERENCES = ("layerwise", "khop", "sampled", "auto")
SPECS = {"cora": (f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora", []),
         "rmat16": ("synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1", ["--batch-size", "256"]),
         # 3% of the nodes scored (1% val, 2% test), as in papers100M's regime (0.3%), not 40% as by default;
         # its CSR distributed, as papers100M's would be (over 2 GiB), so the neighbourhoods' reads show
         "rmat16-few": ("synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1,split=0.6/0.01/0.02",
                        ["--batch-size", "256", "--topology", "distributed"]),
         "facebook": (f"musae:{FACEBOOK}:facebook", ["--batch-size", "256"])}


def one_run(parts: str, run_dir: str, a, inference: str, flags: list[str]) -> dict:
    train_job(parts, run_dir, a.parts, a.parts, ["--epochs", str(a.epochs), "--eval-every", "1",
                                                 "--eval-inference", inference, *flags])
    return figures(run_dir)


def figures(run_dir: str) -> dict:
    ranks = load_run(run_dir).ranks
    ep = [r.epochs for r in ranks]
    rows = np.array([t["eval_rows_shared"] + t["eval_rows_rma"] for t in ep], dtype=np.float64)  # trainer x evaluation
    epochs = metrics.run_timed_epochs(ep)
    return {"rows": rows.mean(), "rows_most": rows.max(axis=0).mean(),
            "mib": np.mean([t["eval_bytes_rma"] for t in ep]) / 2**20,
            "csr": np.mean([t["eval_adjacency_rows_rma"] for t in ep]),
            "eval_s": np.max([t["eval_seconds"] for t in ep], axis=0),  # per evaluation: the slowest trainer
            "epoch_s": metrics.run_epoch_time(ep),
            "epoch_rows": metrics.remote_rows_per_epoch([r.minibatches for r in ranks], epochs) / len(ranks),
            "epoch_mib": metrics.per_epoch_mean([r.minibatches for r in ranks], "bytes_rma", epochs) / len(ranks) / 2**20,
            "acc": np.stack([ep[0]["val_acc"], ep[0]["test_acc"]]),
            "inference": {int(i) for t in ep for i in t["eval_inference"]},
            "loss": np.concatenate([r.minibatches["loss"] for r in ranks])}


def elsewhere(nodes: np.ndarray, part) -> int:
    """How many of ``nodes`` other partitions than ``part`` own."""
    return int(np.count_nonzero((nodes < part.node_start) | (nodes >= part.node_end)))


def crossover(parts: str, shares: list[float], hidden: int = 16, seed: int = 0) -> None:
    """Counted from the partition files, no run: per trainer, the bytes a 2-layer evaluation reads
    from other partitions when a random ``share`` of each partition's nodes is scored, khop (its
    scored nodes' 2-hop in-neighbourhood, feature rows) against layerwise (the halo's feature rows,
    then the scored nodes' remote in-neighbours' hidden rows, float32 x ``hidden``): where khop
    starts to win. The mean over trainers; the rows as stored."""
    from rudder.data.partition_store import PartitionMeta, global_csr, read_partition

    meta = PartitionMeta.load(parts)
    ps = [read_partition(parts, p, meta) for p in range(meta.num_parts)]
    indptr, indices = global_csr(ps)
    row, rng = meta.feature_encoding.row_bytes, np.random.default_rng(seed)

    def in_neighbours(nodes):
        counts = indptr[nodes + 1] - indptr[nodes]
        first = indptr[nodes] - (np.cumsum(counts) - counts)  # each node's CSR start less its place in the output
        return np.unique(indices[np.repeat(first, counts) + np.arange(counts.sum())])

    print(f"| scored share | scored a trainer | khop MiB | layerwise MiB | khop / layerwise |  ({parts}, counted)")
    print("|---|---|---|---|---|")
    for share in shares:
        khop, layerwise, scored = [], [], []
        for p in ps:
            owned = np.arange(p.node_start, p.node_end)
            seeds = np.sort(rng.choice(owned, size=max(1, round(share * owned.size)), replace=False))
            one = np.union1d(seeds, in_neighbours(seeds))
            two = np.union1d(one, in_neighbours(one))
            khop.append(elsewhere(two, p) * row)
            layerwise.append(p.halo_nodes.size * row + elsewhere(one, p) * 4 * hidden)
            scored.append(seeds.size)
        print(f"| {share:.2%} | {np.mean(scored):,.0f} | {np.mean(khop) / 2**20:.2f} | {np.mean(layerwise) / 2**20:.2f} | "
              f"{np.mean(khop) / np.mean(layerwise):.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--datasets", default="cora,rmat16,rmat16-few,facebook")
    ap.add_argument("--inferences", default=",".join(INFERENCES))
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-eval-cost"))
    ap.add_argument("--crossover", default="", metavar="SHARES", help="no runs: count, from the datasets' "
                    "partitions, khop's and layerwise's bytes at these shares of the nodes scored (e.g. 0.4,0.03,0.001)")
    a = ap.parse_args()
    if a.crossover:
        for name in a.datasets.split(","):
            parts = cached_partition(SPECS[name][0], a.parts, os.path.join(a.work, f"{name}-p{a.parts}"), "float32")
            crossover(parts, [float(x) for x in a.crossover.split(",")])
        return 0
    print(f"# bench/eval_cost.py, {time.strftime('%Y-%m-%d %H:%M %Z')}, load {os.getloadavg()[0]:.2f}, "
          f"{a.parts} parts, {a.epochs} epochs, {a.reps} reps")
    print("| dataset | inference | rows a trainer (most) | MiB RMA | CSR entries RMA | eval s | epoch rows | epoch MiB | "
          "epoch s | rows / epoch's | MiB / epoch's | eval s / epoch s | val, test acc (last) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.datasets.split(","):
        spec, flags = SPECS[name]
        if name == "facebook" and not os.path.isfile(os.path.join(FACEBOOK, "facebook_edges.csv")):
            print(f"(Facebook Page-Page not at {FACEBOOK}: skipped)")
            continue
        parts = cached_partition(spec, a.parts, os.path.join(a.work, f"{name}-p{a.parts}"), "float32")
        inferences = a.inferences.split(",")
        runs = {i: [] for i in inferences}
        for rep in range(a.reps):
            for inference in inferences if rep % 2 == 0 else inferences[::-1]:
                runs[inference].append(one_run(parts, os.path.join(a.work, f"{name}-{inference}-{rep}"), a, inference,
                                               flags))
        first = next(iter(runs.values()))[0]
        for r in sum(runs.values(), []):  # the same training in every run
            assert np.array_equal(r["loss"], first["loss"], equal_nan=True), name
        exact = [r for i in ("layerwise", "khop", "auto") for r in runs.get(i, [])]
        for r in exact:
            assert np.array_equal(r["acc"], exact[0]["acc"]), (name, r["acc"], exact[0]["acc"])
        for inference, rs in runs.items():
            r, eval_s, epoch_s = rs[0], float(np.median(np.concatenate([x["eval_s"] for x in rs]))), \
                float(np.median([x["epoch_s"] for x in rs]))
            acc = ", ".join(f"{v:.4f}" for v in r["acc"][:, -1])
            took = "/".join(EVAL_INFERENCES[i] for i in sorted(r["inference"]))
            label = inference if inference != "auto" else f"auto: {took}"
            print(f"| {name} | {label} | {r['rows']:,.0f} ({r['rows_most']:,.0f}) | {r['mib']:.1f} | {r['csr']:,.0f} | "
                  f"{eval_s:.3f} | {r['epoch_rows']:,.0f} | {r['epoch_mib']:.1f} | {epoch_s:.3f} | "
                  f"{r['rows'] / r['epoch_rows']:.2f} | {r['mib'] / r['epoch_mib']:.2f} | {eval_s / epoch_s:.2f} | {acc} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
