"""The partition tool under ``mpiexec -n K``: the ranks share the parts.

Rank 0 loads the graph, chooses the storage type, assigns and relabels (``assign_and_layout``:
the input's CSR and METIS are on one rank); every rank then gets the arrays per node that a
part's writer needs (new IDs, in-degrees), and part p goes to rank p mod K: rank 0 sends it the
part's CSR rows, and the rank relabels them, reads the part's features from the source itself
(file-backed features; others come with the rows), writes the file and hashes it. The bytes are
those of the serial tool (the same ``write_part``), so the metadata's checksums are too.

A rank that fails keeps draining its messages, so no rank waits forever; the error of the
lowest part is raised on every rank, and rank 0 removes the temporary directory.
"""
from __future__ import annotations

import os
import shutil
import time

import numpy as np

from partitioning.features import open_reference
from partitioning.graph import InputError
from partitioning.partition import (
    Layout,
    assign_and_layout,
    check_request,
    make_temp_dir,
    part_rows,
    partition_meta,
    publish,
    write_part,
)
from rudder.comm.mpi_env import prepare_mpi_environment

MPI_ENV = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
BCAST_ITEMS = 1 << 27  # elements a Bcast call: well below MPI's int count


def mpi_world():
    """MPI.COMM_WORLD when this process is one of several ranks started by mpiexec/srun, else None
    (a plain run does not initialise MPI)."""
    sizes = [os.environ.get(name) for name in MPI_ENV]
    if not any(s and s.isdigit() and int(s) > 1 for s in sizes):
        return None
    prepare_mpi_environment()
    from mpi4py import MPI  # only under mpiexec: serial runs need no MPI library

    return MPI.COMM_WORLD if MPI.COMM_WORLD.size > 1 else None


# ----------------------------------------------------------------------------- errors across ranks
def error_record(part: int, e: BaseException) -> tuple:
    """A picklable record of an exception (InputError's constructor takes two arguments)."""
    if isinstance(e, InputError):
        return (part, "input", (e.where, e.what))
    if isinstance(e, OSError):
        return (part, "OSError", (str(e),))
    if isinstance(e, MemoryError):
        return (part, "MemoryError", (str(e),))
    return (part, "other", (f"{type(e).__name__}: {e}",))


def raise_record(record: tuple) -> None:
    _, kind, args = record
    if kind == "input":
        raise InputError(*args)
    if kind == "MemoryError":
        raise MemoryError(*args)
    if kind == "OSError":
        raise OSError(*args)
    raise RuntimeError(*args)


def first_error(comm, record: tuple | None) -> None:
    """Raise, on every rank, the error of the lowest part any rank recorded."""
    records = [r for r in comm.allgather(record) if r is not None]
    if records:
        raise_record(min(records, key=lambda r: r[0]))


def bcast_array(comm, array: np.ndarray | None, root: int = 0) -> np.ndarray:
    shape, dtype = comm.bcast(None if array is None else (array.shape, array.dtype.str), root=root)
    out = array if comm.rank == root else np.empty(shape, dtype=np.dtype(dtype))
    flat = out.reshape(-1)
    for lo in range(0, flat.shape[0], BCAST_ITEMS):
        comm.Bcast(flat[lo:lo + BCAST_ITEMS], root=root)
    return out


# ----------------------------------------------------------------------------- partition
def partition_parallel(comm, load, num_parts: int, out: str, method: str = "metis", seed: int = 0,
                       force: bool = False, source: str = "", feature_dtype: str = "auto", metis_levels: str = "disk"):
    """``load()`` (called on rank 0 only) gives the GraphData. Returns (meta, timings) on every rank."""
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    graph = layout = orig_of_new = tmp = None
    timings, choice, record = {}, None, None
    if rank == 0:
        try:
            graph = load()
            out = check_request(graph, num_parts, out, force, feature_dtype)
            layout, orig_of_new, choice = assign_and_layout(graph, num_parts, method, seed, feature_dtype, timings,
                                                            metis_levels)
            tmp = make_temp_dir(out)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            record = error_record(-1, e)
    first_error(comm, record)
    t0 = time.perf_counter()
    head = comm.bcast(None if rank else (tmp, layout.num_nodes, layout.num_parts, layout.offsets, layout.encoding,
                                         layout.features), root=0)
    new_of_orig = bcast_array(comm, None if rank else layout.new_of_orig)
    in_degree = bcast_array(comm, None if rank else layout.in_degree)
    if rank:
        tmp = head[0]
        layout = Layout(*head[1:4], new_of_orig, in_degree, *head[4:])
    features = graph.features if rank == 0 else (open_reference(layout.features) if layout.features else None)
    infos, record = {}, None
    for start in range(0, num_parts, size):
        batch = range(start, min(start + size, num_parts))
        if rank == 0:
            requests = []
            for p in batch[1:]:
                try:
                    rows = part_rows(graph, layout, orig_of_new, p)
                except Exception as e:  # noqa: BLE001
                    record, rows = record or error_record(p, e), None
                requests.append(comm.isend(rows, dest=p % size, tag=p))
            if record is None:
                try:
                    infos[start] = write_part(part_rows(graph, layout, orig_of_new, start), layout, tmp, features)
                except Exception as e:  # noqa: BLE001
                    record = error_record(start, e)
            MPI.Request.waitall(requests)
        elif rank < len(batch):
            p = start + rank
            rows = comm.recv(source=0, tag=p)
            if rows is not None and record is None:
                try:
                    infos[p] = write_part(rows, layout, tmp, features)
                except Exception as e:  # noqa: BLE001
                    record = error_record(p, e)
            del rows
    gathered = comm.gather((infos, record), root=0)
    meta = None
    if rank == 0:
        records = [r for _, r in gathered if r is not None]
        record = min(records, key=lambda r: r[0]) if records else None
        if record is None:
            try:
                all_infos = {p: info for part_infos, _ in gathered for p, info in part_infos.items()}
                meta = partition_meta(graph, layout, [all_infos[p] for p in range(num_parts)], seed, source, choice)
                meta.write(tmp)
                timings["write_s"] = time.perf_counter() - t0
                publish(tmp, out)
            except Exception as e:  # noqa: BLE001
                record = error_record(num_parts, e)
        if record is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    record, meta, timings = comm.bcast((record, meta, timings), root=0)
    if record is not None:
        raise_record(record)
    return meta, timings
