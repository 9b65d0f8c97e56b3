"""Benchmark (not a test): gather throughput of the RMA feature store, side by side in one run.

    python bench/feature_gather.py [--rows 10000] [--dim 128] [--reps 30] [--nodes 200000] [--owner-busy 0.3]
                                   [--feature-dtype float32|float16|bfloat16|uint8|bits]

Launches two 2-rank MPI jobs on this host: one as one node (the peer's rows come through
shared memory) and one with MPIR_CVAR_NUM_CLIQUES=2 (the peer looks off-node, so its rows come
through RMA Get). In each, rank 0 times gathering R random rows of the peer's partition against
a local numpy gather of R random rows of its own, interleaved rep by rep so machine noise hits
both alike, and prints the ratio. Target (issue 3): on-node remote gather >= 0.5x local.
``--feature-dtype`` stores the (float) features in that type, lossily for the compact ones: it
measures moving rows of that size, both gathers widening them to float32.

    mpiexec -n 3 python -m mpi4py bench/feature_gather.py --calibrate [--reps 5]

measures, in one 3-rank job, every rank a node (run it behind ``python -m rudder.netem`` for a
shaped link, as bench/calibrate_machine.py does), what the simulator's machine profile needs of a
Get between nodes: rank 0 reads rank 1's rows; the round trip of a one-row read, alone and while
rank 2 reads bulk rows of rank 1 over the link; the bandwidth of large indexed reads; and the
cost of one Get call (many small rows read one Get per row); and the host's CPU that moving bytes
and a yielding wait cost (/proc/stat, every wait asleep). Rank 0 prints one JSON line of medians.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mpi_job import add_worker_flags, cpu_ticks, run_worker_job, sbm_parts_on_rank0

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(a) -> None:
    import numpy as np
    from mpi4py import MPI

    sys.path.insert(0, REPO)
    from rudder.comm.layout import build_layout
    from rudder.data.feature_store import FeatureStore

    comm = MPI.COMM_WORLD
    out, meta = sbm_parts_on_rank0(comm, a.workdir, a.nodes, a.dim, a.feature_dtype)
    store = FeatureStore(build_layout(meta.num_parts), meta, out)
    rng = np.random.default_rng(comm.rank)
    peer = (comm.rank + 1) % comm.size
    lo, hi = meta.offsets[peer], meta.offsets[peer + 1]
    own = store.own
    t_local = t_peer = 0.0
    stats = None
    for _ in range(a.reps):
        ids = rng.integers(lo, hi, size=a.rows)
        local_ids = rng.integers(0, own.shape[0], size=a.rows)
        t0 = time.perf_counter()
        rows = own[local_ids] if store.encoding.name == "float32" else store.encoding.decode(own[local_ids])
        t1 = time.perf_counter()
        rows, stats = store.gather(ids)
        t2 = time.perf_counter()
        t_local += t1 - t0
        t_peer += t2 - t1
    path = "shared memory" if stats.rows_shared else "RMA Get"
    comm.Barrier()
    store.close()
    busy = {}
    if a.owner_busy and path == "RMA Get":
        import torch

        torch.set_num_threads(1)
        m = torch.rand(1024, 1024)
        for gets in ("runs", "indexed"):
            store = FeatureStore(build_layout(meta.num_parts), meta, out, gets=gets)
            took = []
            for _ in range(5):
                ids = rng.integers(lo, hi, size=a.rows)
                comm.Barrier()
                t0 = time.perf_counter()
                if comm.rank == 1:  # the owner computes for owner_busy seconds without entering MPI
                    while time.perf_counter() - t0 < a.owner_busy:
                        m = (m @ m).clamp_(0, 1)
                elif comm.rank == 0:
                    store.gather(ids)
                    took.append(time.perf_counter() - t0)
                comm.Barrier()
            busy[gets] = float(np.median(took)) if took else 0.0
            store.close()
    if comm.rank == 0:
        print(json.dumps({"path": path, "local_rows_s": a.rows * a.reps / t_local, "peer_rows_s": a.rows * a.reps / t_peer,
                          "busy_owner_s": busy}))


def calibrate(a) -> None:
    """The figures a machine profile takes from Gets (bench/calibrate_machine.py): rank 0 reads
    from rank 1 (another node), one measurement at a time, medians of ``reps``."""
    import numpy as np
    from mpi4py import MPI

    sys.path.insert(0, REPO)
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.comm import waiting
    from rudder.comm.layout import build_layout
    from rudder.data.feature_store import FeatureStore
    from rudder.data.partition_store import PartitionMeta

    comm = MPI.COMM_WORLD
    stores = {}
    for name, dim in (("wide", 1024), ("narrow", 16)):  # 4 KiB rows for bandwidth, 64 B rows for calls
        out = os.path.join(a.workdir, name)
        if comm.rank == 0:
            spec = f"synthetic:sbm:nodes=20000,blocks=8,avg_degree=4,feat_dim={dim},seed=0"
            partition_graph(load_spec(spec), comm.size, out, method="random", force=True, feature_dtype="float32")
        comm.Barrier()
        meta = PartitionMeta.load(out)
        for gets in ("indexed", "runs"):
            stores[name, gets] = FeatureStore(build_layout(meta.num_parts), meta, out, gets=gets), meta
    rng = np.random.default_rng(comm.rank)

    def timed(key, rows: int, consecutive: bool = False) -> float:
        """Rank 0 reads ``rows`` of rank 1's rows (distinct and spread, or one run); seconds."""
        store, meta = stores[key]
        lo, hi = meta.offsets[1], meta.offsets[2]
        ids = lo + (np.arange(rows) if consecutive else np.sort(rng.choice(hi - lo, rows, replace=False)))
        if rows > 1 and not consecutive:
            ids = ids[np.flatnonzero(np.diff(ids, prepend=-2) > 1)]  # no two adjacent: one Get per row by runs
        t = time.perf_counter()
        store.gather(ids)
        return time.perf_counter() - t, int(ids.size)

    def median(key, rows, consecutive=False):
        took = []
        for _ in range(a.reps):
            comm.Barrier()
            if comm.rank == 0:
                took.append(timed(key, rows, consecutive))
            # the others wait asleep: rank 0's Gets have a core of their own (a spinning barrier
            # would take it, and get_call would include the contention the model applies itself)
            waiting.wait_all([comm.Ibarrier()], "yield")
        return (float(np.median([t for t, _ in took])), took[0][1]) if took else (0.0, 0)

    small = float(np.median([median(("narrow", "indexed"), 1)[0] for _ in range(4)]))
    big_rows = 6000  # 23 MiB of 4 KiB rows (a third of 20,000 rows are rank 1's)
    big, _ = median(("wide", "indexed"), big_rows, consecutive=True)
    few, n_few = median(("narrow", "runs"), 200)
    many, n_many = median(("narrow", "runs"), 4000)
    # the round trip while rank 2 reads bulk rows of rank 1 over the same link (a queue to wait
    # in, not the bulk read's own connection), during the first half of the bulk read
    loaded = []
    store, meta = stores["wide", "indexed"]
    for _ in range(a.reps):
        comm.Barrier()
        if comm.rank == 2:
            store.gather(meta.offsets[1] + np.arange(big_rows))
        elif comm.rank == 0:
            t0 = time.perf_counter()
            took = []
            while time.perf_counter() - t0 < big / 2:
                took.append(timed(("narrow", "indexed"), 1)[0])
            loaded += took[1:]
        comm.Barrier()
    # the host's CPU that moving bytes costs (the kernel's TCP path, MPI's progress on both ends):
    # the bulk read with every rank's wait asleep (yielding), against as long a time of the same
    # waits with nothing moving, which is itself what a yielding wait costs (the other ranks wait
    # while rank 0 sleeps)
    bulk_cpu, idle_cpu = [], []
    store = FeatureStore(build_layout(meta.num_parts, mpi_wait="yield"), meta, os.path.join(a.workdir, "wide"))
    stores["wide", "yield"] = store, meta
    for _ in range(a.reps):
        for moving, out in ((True, bulk_cpu), (False, idle_cpu)):
            comm.Barrier()
            before, t0 = busy_seconds(), time.perf_counter()
            reads = 0
            while comm.rank == 0 and time.perf_counter() - t0 < CPU_PROBE_S:  # long against /proc/stat's ticks
                if moving:
                    store.gather(meta.offsets[1] + np.arange(big_rows))
                    reads += 1
                else:
                    time.sleep(0.05)
            waiting.wait_all([comm.Ibarrier()], "yield")
            out.append((busy_seconds() - before, time.perf_counter() - t0, reads))
    for store, _ in stores.values():
        store.close()
    if comm.rank == 0:
        cpu_per_byte = max(0.0, float(np.median([(b - i * tb / ti) / (reads * big_rows * 4096) for (b, tb, reads),
                                                 (i, ti, _) in zip(bulk_cpu, idle_cpu)])))
        print(json.dumps({"small_get_s": small, "loaded_small_get_s": float(np.median(loaded)) if loaded else None,
                          "bulk_bytes": big_rows * 4096, "bulk_s": big, "runs": [[n_few, few], [n_many, many]],
                          "runs_row_bytes": 64, "byte_cpu_s": cpu_per_byte,
                          "yield_wait_cores": float(np.median([i / ti for i, ti, _ in idle_cpu])) / (comm.size - 1),
                          "reps": a.reps}))


CPU_PROBE_S = 1.5  # seconds of bulk reads (and of idling) per measurement of the CPU that bytes cost


def busy_seconds() -> float:
    """The host's CPU seconds not idle so far, all cores (all but idle and iowait)."""
    ticks = cpu_ticks()
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=200000)
    ap.add_argument("--feature-dtype", default="float32", help="storage type of the rows (default float32)")
    ap.add_argument("--owner-busy", type=float, default=0.3, help="seconds the owner computes (0: skip that part)")
    ap.add_argument("--calibrate", action="store_true", help="the machine profile's Get figures (above)")
    add_worker_flags(ap)
    a = ap.parse_args()
    if a.calibrate:
        import tempfile

        with tempfile.TemporaryDirectory() as work:  # the same directory on both ranks: one host
            from mpi4py import MPI

            a.workdir = a.workdir or MPI.COMM_WORLD.bcast(work, root=0)
            return calibrate(a)
    if a.worker:
        return worker(a)
    print(f"{a.rows} random rows x {a.dim} stored as {a.feature_dtype} per gather, {a.reps} reps, 2 ranks, "
          f"{os.cpu_count()} cores")
    print(f"{'peer path':<15} {'local rows/s':>14} {'peer rows/s':>14} {'peer/local':>11}")
    for cliques in ("1", "2"):
        r = run_worker_job(__file__, ["--rows", str(a.rows), "--dim", str(a.dim), "--reps", str(a.reps),
                                      "--nodes", str(a.nodes), "--owner-busy", str(a.owner_busy),
                                      "--feature-dtype", a.feature_dtype], 2,
                           env={"MPIR_CVAR_NUM_CLIQUES": cliques}, timeout=600)
        ratio = r["peer_rows_s"] / r["local_rows_s"]
        print(f"{r['path']:<15} {r['local_rows_s']:>14,.0f} {r['peer_rows_s']:>14,.0f} {ratio:>10.2f}x")
        busy = r["busy_owner_s"]
    if busy:
        print(f"off-node gather while the owner computes {a.owner_busy:.2f} s without MPI (median of 5):")
        for gets, s in busy.items():
            print(f"  gets={gets:<8} {s * 1e3:8.1f} ms")
        print(f"  indexed / runs: {busy['indexed'] / busy['runs']:.1f}x")


if __name__ == "__main__":
    main()
