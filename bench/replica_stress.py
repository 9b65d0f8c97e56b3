"""Stress harness for issue 38 (replicas that diverged): many short MPI jobs in which every
gradient-sized ``Iallreduce`` has the pipeline's RMA reads issued while it is in flight, and every
step's reduced buffer compared across the ranks.

    python bench/replica_stress.py --jobs 30 --steps 300 [--ranks 4] [--rma-gets auto|runs|indexed]
        [--netmod default|ucx|ofi] [--mpi-wait spin|yield] [--threads 2] [--iallreduce-algorithm auto]
        [--gate on|off] [--count-overlaps] [--json FILE]

Each job is ``mpiexec -n RANKS`` with every rank its own emulated node (``MPIR_CVAR_NUM_CLIQUES``,
so the reads go through the netmod, as between nodes). Each rank exposes a window of Cora-sized
rows (180 bytes: by default one indexed Get per owner, as Cora's bit-packed features go) through
``rudder.comm.dist_array.DistributedArray``, the class the trainer reads with. The reducing thread,
each step: a fresh float32 buffer of ``--floats`` values spanning six orders of magnitude (so the
order of the additions shows in the bits), its ``Iallreduce`` started as the trainer starts it,
then the reading threads released, and the wait (``rudder.comm.waiting.wait_all``, ``--mpi-wait``)
entered only once every reader has begun a read: the reads are issued while the reduction is in
flight, every step. Readers read 600 random remote rows a read (checked against their known
contents: a wrong row is counted) and go on reading until the step's reduction completes.

At the end every rank's digests of every step's reduced buffer, per segment (16 segments), are
gathered: a step whose digests differ is reported with the ranks apart from the majority and the
segments that differ. ``--gate off`` runs without the MPI lock (``rudder.comm.gate``, the
trainer's ``--mpi-lock``), as the code ran before it; ``--count-overlaps`` preloads
``bench/mpi_overlap.py``'s shim into every rank and reports how many MPI calls were entered while
another thread of the rank was inside MPI (the overlap the harness forces: many with the gate off,
none with it on). The bisection flags: ``--rma-gets``, ``--netmod`` (``MPIR_CVAR_CH4_NETMOD``),
``--mpi-wait``, ``--threads`` (threads of a rank inside MPI: the reducing one and THREADS-1
readers), ``--iallreduce-algorithm`` (``MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM``). The summary
gives, with no divergence in N jobs, the rule of three's 95% upper bound 3/N on the chance that a
job diverges (and 3/steps a step).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_overlap  # noqa: E402
from mpi_job import MPIEXEC  # noqa: E402

from rudder.comm.mpi_env import prepare_mpi_environment  # noqa: E402

ROW_BYTES = 180  # Cora's bit-packed rows (docs/partitioning.md)
ROWS = 1_000  # rows a rank exposes
ROWS_A_READ = 600
SEGMENTS = 16


def row_contents(part: int, rows: np.ndarray) -> np.ndarray:
    """What row ``rows[i]`` of partition ``part`` holds (so a reader can check every row it got)."""
    return ((part * 131 + rows[:, None] * 7 + np.arange(ROW_BYTES)[None, :]) % 251).astype(np.uint8)


class Readers:
    """THREADS-1 threads reading remote rows while the reducing thread's Iallreduce is in flight."""

    def __init__(self, array, comm, count: int):
        self.array, self.comm = array, comm
        self.go = [threading.Event() for _ in range(count)]
        self.begun = [threading.Event() for _ in range(count)]
        self.in_flight = threading.Event()
        self.stop = False
        self.reads = self.wrong_rows = 0
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._read, args=(i,), name=f"reader-{i}", daemon=True)
                        for i in range(count)]
        for t in self.threads:
            t.start()

    def _read(self, i: int) -> None:
        rng = np.random.default_rng([self.comm.rank, i])
        others = np.array([p for p in range(self.comm.size) if p != self.comm.rank])
        try:
            while True:
                self.go[i].wait()
                self.go[i].clear()
                if self.stop:
                    return
                first = True
                while first or self.in_flight.is_set():
                    parts = rng.choice(others, ROWS_A_READ)
                    index = rng.integers(0, ROWS, ROWS_A_READ)
                    self.begun[i].set()  # a read is about to issue its Gets (the step's first, or one still in the loop)
                    first = False
                    out, _ = self.array.read(parts, index)
                    expected = np.concatenate([row_contents(int(p), index[parts == p]) for p in np.unique(parts)])
                    got = np.concatenate([out[parts == p] for p in np.unique(parts)])
                    self.wrong_rows += int((got != expected).any(axis=1).sum())
                    self.reads += 1
        except BaseException as e:  # the reducing thread reports it
            self.error = e
            self.begun[i].set()

    def release(self) -> None:
        for i, go in enumerate(self.go):
            self.begun[i].clear()
            go.set()

    def await_begun(self) -> None:
        for begun in self.begun:
            begun.wait()

    def close(self) -> None:
        self.stop = True
        for go in self.go:
            go.set()
        for t in self.threads:
            t.join()


def worker(args) -> None:
    import mpi4py

    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    from rudder.comm import gate, waiting
    from rudder.comm.dist_array import DistributedArray

    gate.enable(args.gate == "on")
    comm = MPI.COMM_WORLD
    array = DistributedArray(comm, [ROWS] * comm.size, list(range(comm.size)), comm.rank, np.uint8, (ROW_BYTES,),
                             fill=lambda own: own.__setitem__(slice(None), row_contents(comm.rank, np.arange(ROWS))),
                             gets=args.rma_gets, wait=args.mpi_wait)
    readers = Readers(array, comm, args.threads - 1)
    rng = np.random.default_rng([comm.rank, 38])
    digests = np.zeros((args.steps, SEGMENTS), dtype=np.uint64)
    bounds = np.linspace(0, args.floats, SEGMENTS + 1).astype(int)
    start = time.perf_counter()
    for step in range(args.steps):
        buf = (rng.standard_normal(args.floats) * 10.0 ** rng.uniform(-3, 3, args.floats)).astype(np.float32)
        readers.in_flight.set()
        with gate.held():  # as rudder.train.data_parallel starts it
            request = comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        readers.release()
        readers.await_begun()  # every reader is issuing its Gets: now the wait, with the reduction in flight
        waiting.wait_all([request], args.mpi_wait)
        readers.in_flight.clear()
        if readers.error is not None:
            raise readers.error
        for s in range(SEGMENTS):
            piece = buf[bounds[s]:bounds[s + 1]].tobytes()
            digests[step, s] = int.from_bytes(hashlib.blake2b(piece, digest_size=8).digest(), "little")
    seconds = time.perf_counter() - start
    readers.close()
    if readers.error is not None:
        raise readers.error
    table = comm.gather(digests, root=0)
    counts = comm.gather((readers.reads, readers.wrong_rows), root=0)
    array.close()
    if comm.rank:
        return
    table = np.stack(table)  # ranks x steps x segments
    mismatches = []
    for step in range(args.steps):
        whole = [tuple(table[r, step]) for r in range(comm.size)]
        if len(set(whole)) == 1:
            continue
        majority = max(set(whole), key=whole.count)
        apart = [r for r in range(comm.size) if whole[r] != majority]
        segments = sorted({int(s) for r in apart for s in np.flatnonzero(np.array(whole[r]) != np.array(majority))})
        mismatches.append({"step": step, "ranks": apart, "segments": segments,
                           "floats": [[int(bounds[s]), int(bounds[s + 1])] for s in segments]})
    print(json.dumps({"steps": args.steps, "reads": sum(c[0] for c in counts), "wrong_rows": sum(c[1] for c in counts),
                      "mismatches": mismatches, "seconds": seconds}))


def job_env(args, overlap_log: str | None, shim: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIR_CVAR_NUM_CLIQUES=str(args.ranks))
    if args.netmod != "default":
        env["MPIR_CVAR_CH4_NETMOD"] = args.netmod
    prepare_mpi_environment(env)  # as the entry points do: with OFI, no libfabric sockets provider
    if args.iallreduce_algorithm != "auto":
        env["MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM"] = args.iallreduce_algorithm
    if shim is not None:
        env.update(mpi_overlap.env(shim, overlap_log))
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10, help="MPI jobs, each launched on its own")
    ap.add_argument("--steps", type=int, default=300, help="Iallreduces a job")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--floats", type=int, default=46_109, help="the reduced buffer (Cora's 46,103 parameters and extras)")
    ap.add_argument("--rma-gets", choices=("auto", "runs", "indexed"), default="auto")
    ap.add_argument("--netmod", choices=("default", "ucx", "ofi"), default="default", help="MPIR_CVAR_CH4_NETMOD")
    ap.add_argument("--mpi-wait", choices=("spin", "yield"), default="spin")
    ap.add_argument("--threads", type=int, default=2, help="threads of a rank inside MPI: the reducing one and THREADS-1 readers")
    ap.add_argument("--iallreduce-algorithm", default="auto", help="MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM")
    ap.add_argument("--gate", choices=("on", "off"), default="on",
                    help="the MPI lock (rudder.comm.gate; the trainer's --mpi-lock)")
    ap.add_argument("--count-overlaps", action="store_true", help="preload bench/mpi_overlap.py's shim and count overlaps")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a job may take")
    ap.add_argument("--json", help="write the summary here too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads < 2:
        ap.error(f"--threads {args.threads}: at least 2 (the reducing thread and one reader)")
    if args.worker:
        worker(args)
        return
    mpiexec = MPIEXEC
    argv = [a for a in sys.argv[1:] if a != "--count-overlaps"]
    results, failed, start = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        shim = mpi_overlap.build(work) if args.count_overlaps else None
        if args.count_overlaps and shim is None:
            raise SystemExit("replica_stress.py: --count-overlaps: the shim cannot be built here (x86-64 Linux, gcc, nm "
                             "and the mpich wheel's libmpi needed)")
        for job in range(args.jobs):
            log = os.path.join(work, f"overlap-{job}")
            cmd = [mpiexec, "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), "--worker", *argv]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                      env=job_env(args, log, shim))
            except subprocess.TimeoutExpired:
                failed.append({"job": job, "error": f"no end in {args.timeout:g} s"})
                continue
            if proc.returncode:
                failed.append({"job": job, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            if shim is not None:
                result["overlap"] = mpi_overlap.read(log)
            results.append(result)
            for m in result["mismatches"]:
                print(f"replica_stress.py: job {job}: step {m['step']}: ranks {m['ranks']} apart from the majority "
                      f"in segments {m['segments']} (floats {m['floats']})", file=sys.stderr)
    steps = sum(r["steps"] for r in results)
    diverged = sum(1 for r in results if r["mismatches"])
    summary = {"settings": {k: v for k, v in vars(args).items() if k not in ("worker", "json", "timeout")},
               "jobs": len(results), "jobs_failed": failed, "jobs_diverged": diverged,
               "steps": steps, "steps_diverged": sum(len(r["mismatches"]) for r in results),
               "wrong_rows": sum(r["wrong_rows"] for r in results), "reads": sum(r["reads"] for r in results),
               "job_bound_95": 3 / len(results) if results and not diverged else None,
               "step_bound_95": 3 / steps if steps and not diverged else None,
               "seconds": time.perf_counter() - start}
    if args.count_overlaps:
        summary["mpi_calls"] = sum(r["overlap"]["calls"] for r in results)
        summary["mpi_calls_overlapping"] = sum(r["overlap"]["overlaps"] for r in results)
        pairs: dict = {}
        for r in results:
            for pair, n in r["overlap"]["pairs"].items():
                pairs[pair] = pairs.get(pair, 0) + n
        summary["overlapping_pairs"] = dict(sorted(pairs.items(), key=lambda kv: -kv[1])[:8])
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
