"""Benchmark (not a test): ways to compute GraphSAGE's mean aggregation in plain torch, forward and
backward, against DGL's ``update_all(copy_u, mean)``, on real sampled blocks (why
``rudder.train.sage`` uses a CSR product both ways).

    python bench/sage_aggregation.py [--spec SPEC] [--batch 1000] [--fanouts 10,25] [--width 16] [--reps 6]

Every variant gets its index structures built beforehand (the block's cost is the other
benchmark's, bench/sage_layer.py), is checked against DGL's result and gradient, and runs
interleaved with the others minibatch by minibatch. Prints each one's time over DGL's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def variants():
    import torch

    from rudder.train.sage import mean_aggregate

    def index_add(b, h):
        out = h.new_zeros(b.num_dst, h.shape[1]).index_add_(0, b.dst, h[b.src])
        return out / b.degree

    def segment_reduce(b, h):
        return torch.segment_reduce(h[b.src], "sum", lengths=b.in_degree) / b.degree

    def csr_autograd(b, h):  # torch's own backward of a CSR product
        return b.csr @ h / b.degree

    def coo_sparse_mm(b, h):
        return torch.sparse.mm(b.coo, h) / b.degree

    def csr_both_ways(b, h):  # rudder.train.sage
        return mean_aggregate(b.block, h)

    return {f.__name__: f for f in (index_add, segment_reduce, csr_autograd, coo_sparse_mm, csr_both_ways)}


class Structures:
    """One layer's edges in every form the variants take."""

    def __init__(self, layer, dgl):
        import torch

        from rudder.data.dgl_bridge import to_blocks
        from rudder.train.sage import Block

        self.block = Block.of(layer)
        self.num_dst = layer.num_dst
        self.src = self.block.indices
        self.in_degree = self.block.indptr[1:] - self.block.indptr[:-1]
        self.dst = torch.repeat_interleave(torch.arange(layer.num_dst), self.in_degree)
        self.degree = self.block.degree
        ones = torch.ones(self.src.numel())
        self.csr = torch.sparse_csr_tensor(self.block.indptr, self.src, ones, (layer.num_dst, layer.num_src))
        self.coo = torch.sparse_coo_tensor(torch.stack([self.dst, self.src]), ones, (layer.num_dst, layer.num_src)).coalesce()
        self.dgl_block = to_blocks([layer])[0]
        self.fn = dgl.function


def dgl_mean(s: Structures, h):
    with s.dgl_block.local_scope():
        s.dgl_block.srcdata["h"] = h
        s.dgl_block.update_all(s.fn.copy_u("h", "m"), s.fn.mean("m", "n"))
        return s.dgl_block.dstdata["n"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--width", type=int, default=16, help="columns aggregated (hidden width; lin_before_mp narrows to it)")
    ap.add_argument("--minibatches", type=int, default=5)
    ap.add_argument("--reps", type=int, default=6)
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, REPO)
    import torch

    from bench.sage_layer import sampled_minibatches
    from partitioning.sources import load_spec
    from rudder.data.dgl_bridge import load_dgl

    torch.set_num_threads(1)
    dgl = load_dgl()
    graph = load_spec(a.spec)
    layers = [layer for mb in sampled_minibatches(graph, a.batch, [int(f) for f in a.fanouts.split(",")], a.minibatches)
              for layer in mb.layers]
    structures = [Structures(layer, dgl) for layer in layers]
    runs = {"dgl": dgl_mean, **variants()}
    totals = dict.fromkeys(runs, 0.0)
    for rep in range(a.reps + 1):  # the first repetition warms up and checks
        for layer, s in zip(layers, structures):
            h0 = torch.randn(layer.num_src, a.width)
            upstream = torch.randn(layer.num_dst, a.width)
            for name, run in runs.items():
                h = h0.clone().requires_grad_()
                start = time.perf_counter()
                out = run(s, h)
                out.backward(upstream)
                if rep:
                    totals[name] += time.perf_counter() - start
                elif name == "dgl":
                    reference = (out.detach(), h.grad)
                else:
                    torch.testing.assert_close((out.detach(), h.grad), reference, rtol=1e-5, atol=1e-5, msg=name)
    print(f"{a.spec}: mean aggregation forward+backward of {a.width} columns over {len(layers)} sampled blocks "
          f"(batch {a.batch}, fanouts {a.fanouts}), 1 thread, {a.reps} repetitions")
    for name, seconds in totals.items():
        print(f"  {name:16s} {1e3 * seconds / a.reps:8.2f} ms   {seconds / totals['dgl']:.2f}x DGL")


if __name__ == "__main__":
    main()
