"""Benchmark (not a test): a minibatch's read from owners that compute outside MPI, against the
same read from idle owners, as the job grows (issue 40, ``--rma-progress``; docs/cluster.md).

    python bench/busy_owner.py [--ranks 4,8,16] [--ranks-per-node 4,1] [--progress off,thread]
                               [--gets indexed,runs] [--rows 10000] [--dim 128] [--busy 0.3] [--reps 5]
                               [--owner-work sleep|matmul] [--interval 0.001]

For each rank count P and each emulated-node size (P / ranks-per-node nodes), P-rank jobs over
OFI/TCP (``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp MPIR_CVAR_NUM_CLIQUES=nodes``; MPICH puts rank
r on node r % nodes). Every rank exposes a partition of a random graph in the trainer's feature
store; rank 0 reads ``--rows`` random rows of the other nodes' partitions (a minibatch's remote
inputs, spread over every off-node owner), by ``--gets``, while the other ranks either wait idle
inside MPI (a test loop, as a trainer waits) or compute ``--busy`` seconds without entering MPI,
interleaved rep by rep in alternating order. The owners' compute is a sleep by default: 16 ranks
share 2 cores here, and a sleep stands for compute on cores of their own, as on a cluster, so the
read measures the wait for the owners' progress, not the sharing of cores (``--owner-work
matmul`` computes for real).

Progress modes: ``off`` and ``thread`` (``rudder.comm.progress``, under the MPI lock), measured
side by side in one job (the thread started and stopped between reps); and, each in a job of its
own with the thread off, ``mpich`` (MPICH's own thread, ``MPIR_CVAR_ASYNC_PROGRESS=1``, which
breaks the lock's discipline: for comparison only), ``provider`` (libfabric's auto progress,
``MPIR_CVAR_CH4_OFI_ENABLE_{DATA,CONTROL}_AUTO_PROGRESS=1``), ``iov`` (an indexed Get issued as RMA
of its rows' IOVs instead of an active message, ``MPIR_CVAR_CH4_IOV_DENSITY_MIN=64``; by default
only datatypes of 16 KiB or more a contiguous block go that way) and ``provider-iov`` (both).
Prints the median read times, busy / idle, and busy over the idle read without the thread (the
same job's ``off``). Target (issue 40): busy / idle <= 1.5 at P = 16.

    python bench/busy_owner.py --cost DATA [--ranks 4] [--pairs 3] [--epochs 6] [--policy none]
                               [--batch-size 0]

The thread's cost and gain in training: epoch time with ``--rma-progress thread`` over ``off``,
pairs of runs back to back in alternating order, every rank its own node over OFI/TCP.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from mpi_job import add_worker_flags, run_worker_job, sbm_parts_on_rank0, train_job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFI_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
AUTO_PROGRESS = {"MPIR_CVAR_CH4_OFI_ENABLE_DATA_AUTO_PROGRESS": "1", "MPIR_CVAR_CH4_OFI_ENABLE_CONTROL_AUTO_PROGRESS": "1"}
IOV = {"MPIR_CVAR_CH4_IOV_DENSITY_MIN": "64"}  # indexed Gets of rows >= 64 B as RMA of IOVs, not active messages
IN_JOB = ("off", "thread")  # progress modes the worker switches itself (side by side in one job)
MODE_ENV = {"off": {}, "thread": {}, "mpich": {"MPIR_CVAR_ASYNC_PROGRESS": "1"}, "provider": AUTO_PROGRESS,
            "iov": IOV, "provider-iov": {**AUTO_PROGRESS, **IOV}}


def worker(a) -> None:
    import numpy as np
    from mpi4py import MPI

    sys.path.insert(0, REPO)
    from rudder.comm import gate, waiting
    from rudder.comm.layout import build_layout
    from rudder.comm.progress import ProgressThread, wake_interval
    from rudder.data.feature_store import FeatureStore

    comm = MPI.COMM_WORLD
    out, meta = sbm_parts_on_rank0(comm, a.workdir, a.nodes, a.dim, "float32")
    layout = build_layout(meta.num_parts)
    stores = {gets: FeatureStore(layout, meta, out, gets=gets) for gets in a.gets.split(",")}
    remote = [p for p in range(meta.num_parts) if p not in stores[a.gets.split(",")[0]].views]
    remote_ids = np.concatenate([np.arange(meta.offsets[p], meta.offsets[p + 1]) for p in remote])
    work = None
    if a.owner_work == "matmul":
        import torch

        torch.set_num_threads(1)
        work = torch.rand(256, 256)

    def meet() -> None:  # a barrier through the MPI lock, waiting inside MPI by tests (an idle trainer's wait)
        with gate.held():
            barrier = comm.Ibarrier()
        waiting.wait_all([barrier], "yield")

    modes = a.progress.split(",")  # off and thread, side by side in this job
    interval = a.interval or wake_interval(layout.ranks_per_core)  # the trainer's, by default
    rng = np.random.default_rng(1)
    took = {(mode, gets, state): [] for mode in modes for gets in stores for state in ("idle", "busy")}
    polls = dict.fromkeys(modes, 0)
    owners = []
    for rep in range(a.reps):
        for mode in (modes if rep % 2 == 0 else modes[::-1]):
            progress = ProgressThread(layout.trainers, interval) if mode == "thread" else None
            for gets, store in stores.items():
                for state in (("idle", "busy") if rep % 2 == 0 else ("busy", "idle")):
                    ids = rng.choice(remote_ids, size=min(a.rows, remote_ids.size), replace=False)
                    meet()
                    t0 = time.perf_counter()
                    if comm.rank == 0:
                        _, stats = store.gather(ids)
                        took[mode, gets, state].append(time.perf_counter() - t0)
                        owners.append(stats.owners_touched)
                    elif state == "busy":  # compute without entering MPI
                        while time.perf_counter() - t0 < a.busy:
                            if work is None:
                                time.sleep(a.busy - (time.perf_counter() - t0))
                            else:
                                work = (work @ work).clamp_(0, 1)
                    meet()
            if progress is not None:
                progress.close()
                polls[mode] += progress.polls
    polls = comm.gather(polls, root=0)
    for store in stores.values():
        store.close()
    if comm.rank == 0:
        print(json.dumps({"nodes": layout.num_nodes, "owners": max(owners), "remote_rows": int(min(a.rows, remote_ids.size)),
                          "reads": {f"{m}:{g}:{s}": float(np.median(t)) for (m, g, s), t in took.items()},
                          "owner_polls": {m: int(sum(p[m] for p in polls[1:])) for m in modes},
                          "interval": interval}))


def series(a) -> None:
    print(f"{a.rows} random rows x {a.dim} float32 from every off-node owner, owners busy {a.busy} s "
          f"({a.owner_work}), median of {a.reps}, OFI/TCP, {os.cpu_count()} cores")
    print(f"{'P':>3} {'nodes':>5} {'owners':>6} {'progress':<12} {'gets':<8} {'idle ms':>8} {'busy ms':>8} "
          f"{'busy/idle':>9} {'/idle off':>9} {'polls':>7} {'int ms':>6}")
    modes = a.progress.split(",")
    in_job = [m for m in modes if m in IN_JOB]
    # (the worker's --progress, the environment, the modes it measures): off and thread side by side in
    # one job; each mode of the library's environment in a job of its own, the worker's progress off
    jobs = ([(",".join(in_job), {}, in_job)] if in_job else []) + [("off", MODE_ENV[m], [m]) for m in modes
                                                                  if m not in IN_JOB]
    for ranks in [int(r) for r in a.ranks.split(",")]:
        for per_node in [int(k) for k in a.ranks_per_node.split(",")]:
            nodes = max(2, ranks // per_node)
            for worker_modes, env, labels in jobs:
                argv = ["--rows", str(a.rows), "--dim", str(a.dim), "--reps", str(a.reps), "--nodes", str(a.nodes),
                        "--busy", str(a.busy), "--gets", a.gets, "--progress", worker_modes,
                        "--owner-work", a.owner_work, "--interval", str(a.interval)]
                r = run_worker_job(__file__, argv, ranks, env={**OFI_TCP, "MPIR_CVAR_NUM_CLIQUES": str(nodes), **env},
                                   timeout=900)
                for label in labels:
                    key = label if label in IN_JOB else "off"
                    for gets in a.gets.split(","):
                        idle, busy = r["reads"][f"{key}:{gets}:idle"], r["reads"][f"{key}:{gets}:busy"]
                        base = r["reads"][f"off:{gets}:idle"] if "off" in worker_modes.split(",") else idle
                        print(f"{ranks:>3} {r['nodes']:>5} {r['owners']:>6} {label:<12} {gets:<8} {idle * 1e3:>8.1f} "
                              f"{busy * 1e3:>8.1f} {busy / idle:>8.2f}x {busy / base:>8.2f}x "
                              f"{r['owner_polls'].get(key, 0):>7} {r['interval'] * 1e3:>6.1f}", flush=True)


def cost(a) -> None:
    """Epoch time with the progress thread over without, side by side (module docstring)."""
    import numpy as np

    sys.path.insert(0, REPO)
    from rudder.logs import metrics
    from rudder.logs.reader import read_rank

    os.environ.update(OFI_TCP)  # the jobs' transport (train_job passes the environment on)
    ranks = int(a.ranks.split(",")[0])
    flags = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), *a.policy_flags]
    ratios = []
    with tempfile.TemporaryDirectory() as work:
        for pair in range(a.pairs):
            order = ("off", "thread") if pair % 2 == 0 else ("thread", "off")
            seconds = {}
            for mode in order:
                paths = train_job(a.cost, os.path.join(work, f"{pair}-{mode}"), ranks, ranks,
                                  [*flags, "--rma-progress", mode])
                logs = [read_rank(p) for p in paths]
                assert {log.attrs["run"]["rma_progress"] for log in logs} == {mode}, "not run as asked"
                seconds[mode] = metrics.run_epoch_time([log.tables["epochs"] for log in logs])
            ratios.append(seconds["thread"] / seconds["off"])
            print(json.dumps({"pair": pair, "order": order, "epoch_s": seconds, "thread/off": ratios[-1]}), flush=True)
    print(json.dumps({"median thread/off": float(np.median(ratios)), "ratios": ratios}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="4,8,16", help="rank counts P (--cost: the first)")
    ap.add_argument("--ranks-per-node", default="4,1", help="ranks a node: the series runs P / K nodes for each K")
    ap.add_argument("--progress", default="off,thread", help="progress modes, of " + ", ".join(MODE_ENV))
    ap.add_argument("--gets", default="indexed,runs", help="how the reader's Gets go (--rma-gets)")
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=200000)
    ap.add_argument("--busy", type=float, default=0.3, help="seconds the owners compute without MPI")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--owner-work", choices=("sleep", "matmul"), default="sleep")
    ap.add_argument("--interval", type=float, default=0.0, help="the thread's wake-up interval in seconds (default: "
                    "the trainer's, rudder.comm.progress.wake_interval)")
    ap.add_argument("--cost", metavar="DATA", help="a partition directory: measure epoch time instead (above)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=0)
    ap.add_argument("--policy", default="none")
    add_worker_flags(ap)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if a.cost:
        a.policy_flags = ["--policy", a.policy]
        return cost(a)
    series(a)


if __name__ == "__main__":
    main()
