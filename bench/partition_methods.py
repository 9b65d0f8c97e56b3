"""Benchmark (not a test): METIS against the multilevel path that takes graphs beyond its 2^31
directed edges, side by side on graphs both can take.

    python bench/partition_methods.py [--graphs rmat20,rmat22,sbm,facebook] [--parts 8]
                                      [--limit-fraction 0.5] [--repeat 1]

Each graph is loaded once; each method then runs in a forked child on the same CSR and weights
the partition tool gives METIS (`partitioning.multilevel.assign`): `metis`, and `auto` with the
edge limit at --limit-fraction of the graph's directed edges, so that auto takes the multilevel
path as it would beyond 2^31. Per method: the edge cut, halo per part (the distinct remote
in-neighbours of a part's nodes: metadata.json's num_halo), each constraint's heaviest part over
the mean (other nodes, training nodes, degree), the child's wall and CPU seconds, and its peak RSS
above the parent's at the fork (the partitioner's own memory; the graph is the parent's). The
synthetic graphs are built with one feature column: features do not change the graph, labels or
split, so the partition is the one of the 128-feature spec. Repeats alternate the order.
Results: docs/partitioning.md, "Graphs beyond 2^31 edges".
"""
from __future__ import annotations

import argparse
import os
import pickle
import resource
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from partitioning import multilevel  # noqa: E402
from partitioning.sources import load_spec  # noqa: E402

DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
GRAPHS = {
    "rmat20": "synthetic:rmat:scale=20,edge_factor=16,feat_dim=1,classes=16,seed=1",
    "rmat22": "synthetic:rmat:scale=22,edge_factor=16,feat_dim=1,classes=16,seed=1",
    # ogbn-products' degree (50), classes (47) and edge homophily (0.8), at 1M nodes
    "sbm": "synthetic:sbm:nodes=1000000,blocks=47,avg_degree=50,homophily=0.8,feat_dim=1,seed=1",
    "facebook": f"musae:{DATA}/musae:facebook",
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def quality(xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray, parts: np.ndarray, nparts: int) -> dict:
    """Edge cut, halo per part and balance, a chunk of rows at a time."""
    n, cut, halo_keys = xadj.shape[0] - 1, 0, []
    graph = multilevel.Graph(xadj, adjncy, None, vweights.reshape(n, 3))
    for lo, hi in graph.row_chunks():
        rows, nbr, _ = graph.edges(lo, hi)
        owner = parts[rows + lo]
        remote = parts[nbr] != owner
        cut += int(remote.sum())
        halo_keys.append(np.unique(owner[remote] * n + nbr[remote]))
    halo = np.bincount(np.unique(np.concatenate(halo_keys)) // n, minlength=nparts)
    weights = multilevel.label_weights(graph, parts, nparts)
    return {"cut": cut // 2, "halo_mean": float(halo.mean()), "halo_max": int(halo.max()),
            "imbalance": weights.max(axis=0) / weights.mean(axis=0)}


def run_method(method: str, limit: int | None, xadj, adjncy, vweights, nparts: int, seed: int) -> dict:
    """One method in a forked child: its own CPU time and peak memory, and the partition's quality."""
    base_rss = rss_bytes()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: partition, measure, report through the pipe
        os.close(read)
        if limit is not None:
            os.environ[multilevel.EDGE_LIMIT_ENV] = str(limit)
        t0 = time.perf_counter()
        result = multilevel.assign(method, xadj, adjncy, vweights, 3, nparts, seed)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out = {"method": result.method, "wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime,
               "extra_gib": (usage.ru_maxrss * 1024 - base_rss) / 2**30, "levels": result.levels,
               **quality(xadj, adjncy, vweights, result.parts, nparts)}
        with os.fdopen(write, "wb") as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise SystemExit(f"{method} failed (exit {os.waitstatus_to_exitcode(status)})")
    return pickle.loads(data)


def row(graph: str, r: dict, base: dict | None) -> str:
    ratio = (lambda k: f"{r[k] / base[k]:.3f}") if base else (lambda k: "")
    bal = "/".join(f"{x:.3f}" for x in r["imbalance"])
    return (f"{graph:>9} {r['method']:>10} {r['levels'][0][1]:>11} {r['levels'][-1][1]:>11} {r['cut']:>10} "
            f"{ratio('cut'):>6} {r['halo_mean']:>10.0f} {ratio('halo_mean'):>6} {r['halo_max']:>9} {bal:>19} "
            f"{r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} {ratio('cpu_s'):>6} {r['extra_gib']:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="rmat20,rmat22,sbm,facebook", help=f"comma-separated, of {', '.join(GRAPHS)}")
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--limit-fraction", type=float, default=0.5, help="auto's edge limit, a fraction of the graph's")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(f"{a.parts} parts; auto's limit at {a.limit_fraction} of each graph's directed edges; {os.cpu_count()} cores")
    print(f"{'graph':>9} {'method':>10} {'dir. edges':>11} {'METIS saw':>11} {'edge cut':>10} {'x':>6} {'halo/part':>10} "
          f"{'x':>6} {'halo max':>9} {'max/mean o/t/deg':>19} {'wall s':>7} {'CPU s':>7} {'x':>6} {'+GiB':>8}",
          flush=True)
    for graph in a.graphs.split(","):
        g = load_spec(GRAPHS[graph])
        n = g.num_nodes
        xadj = np.concatenate([[0], np.cumsum(np.bincount(g.dst, minlength=n))]).astype(np.int64)
        adjncy = g.src
        train = g.train_mask.astype(np.int64)
        vweights = np.stack([1 - train, train, np.diff(xadj)], axis=1).reshape(-1)  # as the partition tool's
        del g, train
        limit = int(adjncy.shape[0] * a.limit_fraction)
        results = {}
        for rep in range(a.repeat):
            for method in ("metis", "auto") if rep % 2 == 0 else ("auto", "metis"):
                results[method] = run_method(method, None if method == "metis" else limit, xadj, adjncy, vweights,
                                             a.parts, a.seed)
                print(row(graph, results[method], results.get("metis") if method == "auto" else None), flush=True)


if __name__ == "__main__":
    main()
