"""Multi-constraint METIS k-way through the METIS 5.2 C API (the ``cmeel-metis`` wheel).

Why not the obvious wrappers: pymetis passes a single balance constraint (it reads only the
first of several per-node weights) and its 64-bit METIS 5.1 needs ~110 bytes per directed edge
on RMAT graphs; DGL's METIS fork gives different partitions from run to run and writes temp
files into the working directory. METIS 5.2 with 32-bit indices and METIS_OPTION_DROPEDGES
(the option DGL added upstream) needs ~16 bytes per edge at the same cut, takes a seed, and
returns the same partition every time.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import site
import sys
import tempfile

import numpy as np

from partitioning.graph import InputError
from partitioning.ondisk import need_disk

METIS_OK = 1
# Where METIS keeps its coarse levels while it works (``--metis-levels``): disk, the default, spills
# each level it is done with (of 128 MB or more) into the scratch directory until it refines back
# through it; memory keeps them all, faster, with 2.5-2.8x the memory (docs/partitioning.md).
METIS_LEVELS = ("disk", "memory")


def check_levels(metis_levels: str) -> None:
    """One line naming --metis-levels unless ``metis_levels`` is one of ``METIS_LEVELS``."""
    if metis_levels not in METIS_LEVELS:
        raise InputError("--metis-levels", f"'{metis_levels}' is not one of {', '.join(METIS_LEVELS)}")


METIS_ERRORS = {-2: "input error", -3: "out of memory", -4: "error"}

# METIS spills a level only when its arrays (4 bytes an index: ncon + 1 a node, 2 an edge; what
# it writes) reach 128 MiB, and every spilled level is on disk at once at the coarsest: the first
# coarse level has about half the nodes and 0.72 of the edges, each next 0.9 of the one before
# (fitted on RMAT-20's four spilled levels, 0.61 GiB; RMAT-22's took 5.44 GiB, 0.90 of this).
METIS_SPILL_MIN_BYTES = 128 << 20
METIS_FIRST_LEVEL_EDGES = 0.72
METIS_LEVEL_SHRINK = 0.9


def metis_first_level_bytes(edges: float, nodes: float, ncon: int = 3) -> float:
    """What METIS's spill threshold weighs of its first coarse level: its arrays' indices."""
    return 4 * (nodes / 2 * (ncon + 1) + 2 * METIS_FIRST_LEVEL_EDGES * edges)


def metis_spills(edges: float, nodes: float, metis_levels: str, ncon: int = 3) -> bool:
    """Whether METIS puts any coarse level of this graph on disk (``--metis-levels disk`` and a
    first coarse level of ``METIS_SPILL_MIN_BYTES`` or more)."""
    return metis_levels == "disk" and metis_first_level_bytes(edges, nodes, ncon) >= METIS_SPILL_MIN_BYTES


def metis_spill_bytes(edges: float, nodes: float, metis_levels: str, ncon: int = 3) -> float:
    """Scratch disk METIS's spilled levels take together (none where it spills nothing)."""
    if not metis_spills(edges, nodes, metis_levels, ncon):
        return 0.0
    level, total = metis_first_level_bytes(edges, nodes, ncon), 0.0
    while level >= METIS_SPILL_MIN_BYTES:
        total += level
        level *= METIS_LEVEL_SHRINK
    return total


def _prefix() -> str:
    for base in [*sys.path, *site.getsitepackages()]:
        candidate = os.path.join(base, "cmeel.prefix")
        if os.path.isfile(os.path.join(candidate, "lib", "libmetis.so")):
            return candidate
    raise InputError("--method metis", "METIS library not found (pip install cmeel-metis), or use --method random")


@functools.cache
def _metis():
    """Load libmetis and read its index width and option layout from the shipped metis.h,
    so a different METIS build cannot be called with the wrong struct layout."""
    prefix = _prefix()
    with open(os.path.join(prefix, "include", "metis.h")) as f:
        header = f.read()
    width = int(re.search(r"^#define IDXTYPEWIDTH (\d+)", header, re.M).group(1))
    nopt = int(re.search(r"^#define METIS_NOPTIONS\s+(\d+)", header, re.M).group(1))
    body = re.search(r"typedef enum \{([^}]*)\} moptions_et;", header).group(1)
    names = [ln.strip().rstrip(",") for ln in body.splitlines() if ln.strip().startswith("METIS_OPTION_")]
    option = {name.removeprefix("METIS_OPTION_"): i for i, name in enumerate(names)}
    # libmetis links libGKlib by name; load it first so the dynamic linker finds it.
    ctypes.CDLL(os.path.join(prefix, "lib", "libGKlib.so"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(prefix, "lib", "libmetis.so"))
    lib.METIS_PartGraphKway.restype = ctypes.c_int
    idx = {32: np.int32, 64: np.int64}[width]
    return lib, idx, nopt, option


def index_limit() -> int:
    """The largest index (and weight sum) this METIS build takes: 2^31 - 1 with 32-bit indices."""
    return int(np.iinfo(_metis()[1]).max)


def part_graph_kway(xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray, ncon: int, nparts: int,
                    seed: int, adjwgt: np.ndarray | None = None, spill_dir: str | None = None) -> tuple[int, np.ndarray]:
    """Partition an undirected CSR graph (both directions stored, no self-loops) into ``nparts``
    with ``ncon`` node-major balance weights per vertex and optional edge weights ``adjwgt``
    (None: all 1); returns (edge cut, part of each vertex). ``spill_dir``: METIS writes each coarse
    level it is done with to a file there until it refines back through it (``spilled``)."""
    lib, idx, nopt, option = _metis()
    n = xadj.shape[0] - 1
    limit = np.iinfo(idx).max
    if adjncy.shape[0] > limit or vweights.sum() > limit or (adjwgt is not None and adjwgt.sum() > limit):
        raise InputError("--method metis", f"{adjncy.shape[0]} directed edges exceed this METIS build's "
                         f"{np.dtype(idx).itemsize * 8}-bit indices; use --method auto or multilevel")
    if vweights.shape != (n * ncon,):
        raise ValueError(f"vweights must hold {ncon} weights per vertex")
    xadj, adjncy, vweights = (np.ascontiguousarray(a, dtype=idx) for a in (xadj, adjncy, vweights))
    adjwgt = None if adjwgt is None else np.ascontiguousarray(adjwgt, dtype=idx)
    options = np.full(nopt, -1, dtype=idx)  # -1: METIS default
    options[option["SEED"]] = seed
    options[option["DROPEDGES"]] = 1  # coarsen on a sparsified graph: a third of the memory
    if spill_dir is not None:
        options[option["ONDISK"]] = 1
    part = np.empty(n, dtype=idx)
    c_idx = ctypes.c_int32 if idx is np.int32 else ctypes.c_int64
    nvtxs, ncon_c, nparts_c, objval = c_idx(n), c_idx(ncon), c_idx(nparts), c_idx(0)
    ptr = ctypes.c_void_p
    if spill_dir is not None:  # METIS keeps a level it cannot write in memory, and says so only on stdout
        need_disk(spill_dir, int(metis_spill_bytes(adjncy.shape[0], n, "disk", ncon)),
                  "METIS's coarse levels (--metis-levels memory keeps them in memory, with more memory)")
    with spilled(spill_dir):
        status = lib.METIS_PartGraphKway(
            ctypes.byref(nvtxs), ctypes.byref(ncon_c), ptr(xadj.ctypes.data), ptr(adjncy.ctypes.data),
            ptr(vweights.ctypes.data), None, None if adjwgt is None else ptr(adjwgt.ctypes.data), ctypes.byref(nparts_c),
            None, None, ptr(options.ctypes.data), ctypes.byref(objval), ptr(part.ctypes.data))
    if status != METIS_OK:
        raise InputError("--method metis", f"METIS_PartGraphKway failed: {METIS_ERRORS.get(status, status)}")
    return int(objval.value), part.astype(np.int64)


@contextlib.contextmanager
def spilled(spill_dir: str | None):
    """Where METIS's ``ONDISK`` levels go: it names them ``metis<pid>.<level>`` in the working
    directory, so the call runs in a fresh directory under ``spill_dir`` (removed afterwards, with
    anything a failed call left), and the working directory is restored. METIS keeps every coarse
    level until it refines back through it, 29-50 bytes a directed edge in all on RMAT graphs
    depending on how fast they coarsen (docs/partitioning.md); spilled, it holds the level it works
    on. It spills only levels of 128 MB or more, so small graphs never touch the disk."""
    if spill_dir is None:
        yield
        return
    home = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=".rudder-metis-", dir=spill_dir) as levels:
        os.chdir(levels)  # the partition tool calls METIS from one thread: nothing else resolves relative paths meanwhile
        try:
            yield
        finally:
            os.chdir(home)
