"""What a trainer rank costs to start and to hold, measured where it happens (issue 40), for the
rank's log (``startup`` and ``memory``, rudder.logs.schema) and bench/scale.py:

* start-up by phase, from the process's start (the launcher's fork) to the first minibatch's
  inputs in the training thread's hands: wall seconds, CPU seconds of the whole process (all its
  threads: what a rank costs a shared core) and the proportional set size at each phase's end;
* memory samples: PSS (anonymous, file-backed and shared-memory parts), the peak resident set,
  and the bytes of the arrays each owner holds (graph, own features, buffer, model), so the rest
  of the PSS is the runtime's (interpreter, torch, MPI) and the transient work's;
* with the MPI counting shim preloaded (bench/scale.py builds it; ``RUDDER_MPI_COUNTS``), its
  per-function call and byte counts at each phase and sample, so a benchmark can difference them.

Reading /proc/self/smaps_rollup walks the process's mappings (about a millisecond for a rank with
torch loaded), so a rank samples a few times a run: at each start-up phase and after each epoch,
evaluation and checkpoint, never per minibatch.
"""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np

COUNTS_ENV = "RUDDER_MPI_COUNTS"  # set (to the shim's log prefix) where the counting shim is preloaded
PSS_FIELDS = {"Pss": "pss_bytes", "Pss_Anon": "pss_anon_bytes", "Pss_File": "pss_file_bytes",
              "Pss_Shmem": "pss_shmem_bytes"}


def pss() -> dict[str, int]:
    """This process's PSS and its parts in bytes (zeros where /proc/self/smaps_rollup is missing)."""
    out = dict.fromkeys(PSS_FIELDS.values(), 0)
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in PSS_FIELDS:
                    out[PSS_FIELDS[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def peak_rss() -> int:
    """VmHWM: the peak resident set so far, in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def seconds_since_start() -> float:
    """Wall seconds since this process started (its fork by the launcher), from /proc, else 0."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0


def process_cpu() -> float:
    """CPU seconds of the whole process (every thread), user and system."""
    t = os.times()
    return t.user + t.system


def mpi_counts_mark(tag: str) -> None:
    """Ask the counting shim, where it is preloaded, to write its counts so far under ``tag``."""
    if not os.environ.get(COUNTS_ENV):
        return
    try:
        mark = ctypes.CDLL(None).rudder_mpi_counts_mark
    except AttributeError:  # the variable set, the shim not loaded
        return
    mark.argtypes, mark.restype = [ctypes.c_char_p], None
    mark(tag.encode())


class StartupClock:
    """The start-up phases of one rank: ``mark(phase)`` ends a phase (the first, ``imports``, ends
    when the clock is made: the job's main); the rows go into the log once it exists."""

    def __init__(self):
        now, cpu = time.monotonic(), process_cpu()
        self.last, self.last_cpu, self.rows = now, cpu, []
        self._row("imports", seconds_since_start(), cpu)

    def _row(self, phase: str, seconds: float, cpu: float) -> None:
        self.rows.append({"phase": phase, "seconds": seconds, "cpu_seconds": cpu, **pss()})
        mpi_counts_mark(f"startup:{phase}")

    def mark(self, phase: str) -> None:
        now, cpu = time.monotonic(), process_cpu()
        self._row(phase, now - self.last, cpu - self.last_cpu)
        self.last, self.last_cpu = now, cpu

    def write(self, log) -> None:
        """Append the phases to the log's ``startup`` table (once)."""
        for row in self.rows:
            log.append("startup", row)
        self.rows = []


def array_bytes(*objects) -> int:
    """Bytes of the numpy arrays and torch tensors among ``objects`` and their attributes (three
    levels down: an optimiser's state per parameter), each underlying buffer counted once (views
    of one array: once)."""
    seen, total = set(), 0

    def visit(obj, depth: int) -> None:
        nonlocal total
        if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            return
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
            return
        nbytes = getattr(obj, "untyped_storage", None)  # a torch tensor
        if nbytes is not None and callable(nbytes):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
            return
        if depth == 0:
            return
        if isinstance(obj, dict):
            items = obj.values()
        elif isinstance(obj, (list, tuple)):
            items = obj
        else:
            items = getattr(obj, "__dict__", {}).values()
        for item in items:
            visit(item, depth - 1)

    for obj in objects:
        visit(obj, 3)
    return total


def owner_bytes(trainer) -> dict[str, int]:
    """The arrays each owner of a trainer holds: the graph (its partition's arrays, its sorted halo
    and training nodes, and the CSR it exposes or its share of the node's replicated one), its own
    feature segment, the buffer (its share of a node-shared one) and the model (parameters,
    gradients, optimiser state)."""
    node_trainers = max(1, trainer.layout.node_trainers.size)
    adjacency = trainer.adjacency
    shared_csr = hasattr(adjacency, "indices_base")  # the node's replicated CSR (rudder.data.adjacency)
    graph = array_bytes(trainer.partition, trainer.halo, trainer.train_nodes) + (
        (adjacency.indptr.nbytes + adjacency.indices.nbytes) // node_trainers if shared_csr
        else array_bytes(adjacency.indptr.own, adjacency.indices.own))
    buffer = trainer.features.buffer if hasattr(trainer.features, "buffer") else None
    buffered = array_bytes(buffer) if buffer is not None else 0
    if buffered and trainer.shared is not None:
        buffered //= node_trainers
    params = list(trainer.model.parameters())
    model = array_bytes(params, [p.grad for p in params if p.grad is not None], trainer.optimizer)
    return {"graph_bytes": graph, "features_bytes": trainer.store.own.nbytes, "buffer_bytes": buffered,
            "model_bytes": model}


def sample(log, point: str, epoch: int, owners: dict[str, int]) -> None:
    """One row of the log's ``memory`` table (and the shim's counts under the same tag)."""
    log.append("memory", {"point": point, "epoch": epoch, **pss(), "peak_rss_bytes": peak_rss(), **owners})
    mpi_counts_mark(f"{point}:{epoch}")
