"""Benchmark (not a test): distributed sampler throughput vs DGL's single-process sampler.

    python bench/sampler.py [--spec SPEC] [--ranks 2] [--batch 1000] [--fanouts 10,25] [--reps 20]

Launches an MPI job; on every rank, our sampler draws 2-hop minibatches from the rank's own
training seeds, and rank 0 also runs DGL's NeighborSampler.sample_blocks on the whole graph
(in one process) for minibatches of the same seeds, interleaved rep by rep so machine noise
hits both alike. Prints seeds/s of each and the ratio (target, issue 3: >= 0.5x).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mpi_job import add_worker_flags, run_worker_job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(a) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    sys.path.insert(0, REPO)
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.comm.layout import build_layout, exposer_table
    from rudder.data.adjacency import Adjacency
    from rudder.data.dgl_bridge import load_dgl
    from rudder.data.partition_store import PartitionMeta, global_csr, read_partition
    from rudder.sampling.neighbors import NeighborSampler

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    out = os.path.join(a.workdir, "parts")
    if comm.rank == 0:
        partition_graph(load_spec(a.spec), comm.size, out, method="metis", force=True)
    comm.Barrier()
    meta = PartitionMeta.load(out)
    layout = build_layout(meta.num_parts)
    parts = [read_partition(out, p, meta) for p in range(meta.num_parts)] if comm.rank == 0 else None
    own = parts[0] if parts else read_partition(out, layout.partition_id, meta)
    adjacency = Adjacency(layout, meta, own, exposer_table(layout, meta.num_parts))
    fanouts = [int(x) for x in a.fanouts.split(",")]
    sampler = NeighborSampler(adjacency, fanouts, seed=comm.rank)
    train = own.node_start + np.flatnonzero(own.train_mask)
    rng = np.random.default_rng(comm.rank)
    if comm.rank == 0:
        dgl = load_dgl()
        indptr, indices = global_csr(parts)
        g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.tensor([], dtype=torch.int64))),
                      num_nodes=meta.num_nodes)
        dgl_sampler = dgl.dataloading.NeighborSampler(fanouts)
    t_ours = t_dgl = 0.0
    for _ in range(a.reps):
        seeds = np.sort(rng.choice(train, size=min(a.batch, train.size), replace=False))
        t0 = time.perf_counter()
        sampler.sample(seeds)
        t1 = time.perf_counter()
        t_ours += t1 - t0
        if comm.rank == 0:
            dgl_sampler.sample_blocks(g, torch.from_numpy(seeds))
            t_dgl += time.perf_counter() - t1
    comm.Barrier()
    adjacency.close()
    per_rank = comm.gather(a.reps * min(a.batch, train.size) / t_ours, root=0)
    if comm.rank == 0:
        print(json.dumps({"ours": per_rank, "dgl": a.reps * min(a.batch, train.size) / t_dgl,
                          "nodes": meta.num_nodes, "edges": meta.num_edges}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="synthetic:rmat:scale=16,edge_factor=16,feat_dim=4,classes=8,seed=0")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--reps", type=int, default=20)
    add_worker_flags(ap)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    r = run_worker_job(__file__, ["--spec", a.spec, "--batch", str(a.batch), "--fanouts", a.fanouts, "--reps", str(a.reps)],
                       a.ranks)
    print(f"{a.spec}: {r['nodes']} nodes, {r['edges']} edges; {a.ranks} ranks on {os.cpu_count()} cores; "
          f"batch {a.batch}, fanouts {a.fanouts}, {a.reps} minibatches per rank")
    print(f"DGL single process: {r['dgl']:,.0f} seeds/s")
    for rank, s in enumerate(r["ours"]):
        print(f"ours, rank {rank}:     {s:,.0f} seeds/s  ({s / r['dgl']:.2f}x DGL)")


if __name__ == "__main__":
    main()
