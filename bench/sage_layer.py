"""Benchmark (not a test): the torch GraphSAGE layer (``rudder.train.sage``) vs DGL's ``SAGEConv``,
forward and backward of the whole model per minibatch, on CPU.

    python bench/sage_layer.py [--specs SPEC;SPEC] [--batch 1000] [--fanouts 10,25] [--hidden 16]
                               [--minibatches 8] [--reps 5] [--threads 1]

For each graph, minibatches are sampled once with our sampler over the whole graph in memory
(real blocks, DGL's semantics); the two models hold the same parameters. Each repetition runs
every minibatch through both, alternating which goes first, so machine noise hits both alike,
and times two things: the step (blocks built from the sampled layers, forward, loss, backward)
and the model alone (forward, loss and backward on blocks built beforehand). Prints milliseconds
per minibatch and the ratio torch / DGL (target, issue 20: <= 1.0x).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_FACEBOOK = os.path.join(REPO, "..", "shared", "data", "musae")
RMAT16 = "synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1"


class InMemoryAdjacency:
    """A whole graph's in-edge CSR behind the sampler's adjacency interface (one partition, no MPI)."""

    def __init__(self, graph):
        order = np.argsort(graph.dst, kind="stable")
        self.indices = graph.src[order]
        self.indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(graph.dst, minlength=graph.num_nodes), out=self.indptr[1:])

    def rows(self, gids, stats):
        start = self.indptr[gids]
        return np.zeros(gids.size, dtype=np.int64), start, self.indptr[gids + 1] - start

    def neighbours(self, parts, positions, stats):
        return self.indices[positions]


def sampled_minibatches(graph, batch: int, fanouts: list[int], count: int, seed: int = 0) -> list:
    """``count`` minibatches of ``batch`` training seeds, sampled as a trainer samples them."""
    from rudder.sampling.neighbors import NeighborSampler

    sampler = NeighborSampler(InMemoryAdjacency(graph), fanouts, seed=seed)
    train = np.flatnonzero(graph.train_mask)
    rng = np.random.default_rng(seed)
    return [sampler.sample(np.sort(rng.choice(train, size=min(batch, train.size), replace=False)))
            for _ in range(count)]


def twin_models(graph, hidden: int, num_layers: int):
    """The torch and the DGL GraphSAGE with the same parameters."""
    import torch

    from rudder.train.model import GraphSAGE

    models = {}
    for impl in ("torch", "dgl"):
        torch.manual_seed(0)
        models[impl] = GraphSAGE(graph.feat_dim, hidden, graph.num_classes, num_layers, dropout=0.5, impl=impl)
    models["dgl"].load_state_dict(models["torch"].state_dict())
    return models


def bench_graph(spec: str, a) -> dict:
    import torch
    import torch.nn.functional as F

    from partitioning.sources import load_spec

    graph = load_spec(spec)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    minibatches = sampled_minibatches(graph, a.batch, fanouts, a.minibatches)
    models = twin_models(graph, a.hidden, len(fanouts))
    features, labels = torch.from_numpy(np.ascontiguousarray(graph.features)), torch.from_numpy(graph.labels)
    inputs = [(features[mb.input_nodes], labels[mb.seeds]) for mb in minibatches]
    built = {impl: [m.blocks(mb.layers) for mb in minibatches] for impl, m in models.items()}

    def run(impl: str, i: int, build: bool) -> float:
        model, (x, y) = models[impl], inputs[i]
        start = time.perf_counter()
        blocks = model.blocks(minibatches[i].layers) if build else built[impl][i]
        loss = F.cross_entropy(model(blocks, x), y, reduction="sum")
        model.zero_grad(set_to_none=False)
        loss.backward()
        return time.perf_counter() - start

    totals = {(impl, build): 0.0 for impl in models for build in (True, False)}
    for i in range(len(minibatches)):  # warm-up: first calls allocate and load kernels
        for impl in models:
            run(impl, i, True)
    for rep in range(a.reps):
        for i in range(len(minibatches)):
            order = ("torch", "dgl") if (rep + i) % 2 == 0 else ("dgl", "torch")
            for build in (True, False):
                for impl in order:
                    totals[impl, build] += run(impl, i, build)
    n = a.reps * len(minibatches)
    last = minibatches[0].layers
    return {"spec": spec, "nodes": graph.num_nodes, "edges": graph.num_edges, "feat_dim": graph.feat_dim,
            "layers": [(layer.num_src, layer.num_dst, int(layer.src.size)) for layer in last],
            **{f"{impl}_{'step' if build else 'model'}_ms": 1e3 * t / n for (impl, build), t in totals.items()}}


def default_specs() -> list[str]:
    specs = [RMAT16]
    if os.path.isfile(os.path.join(SHARED_FACEBOOK, "facebook_edges.csv")):
        specs.insert(0, f"musae:{os.path.abspath(SHARED_FACEBOOK)}:facebook")
    return specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=None, help="';'-separated input specs (default: Facebook from ../shared/data "
                    "when present, and RMAT-16 with 128 features)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--minibatches", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch and DGL threads (OMP_NUM_THREADS)")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # before torch and DGL start their thread pools
    sys.path.insert(0, REPO)
    import torch

    torch.set_num_threads(a.threads)
    print(f"forward+backward per minibatch, CPU, {a.threads} thread(s); batch {a.batch}, fanouts {a.fanouts}, "
          f"hidden {a.hidden}; {a.minibatches} minibatches x {a.reps} interleaved repetitions")
    for spec in (a.specs.split(";") if a.specs else default_specs()):
        r = bench_graph(spec, a)
        print(f"\n{r['spec']}: {r['nodes']:,} nodes, {r['edges']:,} edges, {r['feat_dim']} features; "
              f"blocks (src, dst, edges) input side first: {r['layers']}")
        for what, label in (("step", "blocks built + model"), ("model", "model on built blocks")):
            ours, theirs = r[f"torch_{what}_ms"], r[f"dgl_{what}_ms"]
            print(f"  {label:22s} torch {ours:8.2f} ms   DGL {theirs:8.2f} ms   torch/DGL {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
