"""Multi-constraint METIS k-way through the METIS C API.

pymetis bundles METIS 5 but its Python wrapper passes a single balance constraint (it reads
only the first of several per-node weights), and DGL's METIS fork gives different partitions
from run to run. We call ``METIS_PartGraphKway`` from pymetis' own library directly: the
documented C API, all constraints, a fixed seed, and the same result every time.
"""
from __future__ import annotations

import ctypes

import numpy as np

from partitioning.graph import InputError

METIS_NOPTIONS = 40
METIS_OPTION_SEED = 8  # METIS 5.1 option order (pymetis.OptionKey.SEED)
METIS_OK = 1
METIS_ERRORS = {-2: "input error", -3: "out of memory", -4: "error"}


def _library():
    import pymetis
    from pymetis import _internal

    if _internal._idx_type_width() != 64 or int(pymetis.OptionKey.SEED) != METIS_OPTION_SEED:
        raise InputError("pymetis", "its METIS build has an unexpected index width or option layout")
    lib = ctypes.CDLL(_internal.__file__)
    lib.METIS_PartGraphKway.restype = ctypes.c_int
    return lib


def part_graph_kway(xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray, ncon: int, nparts: int,
                    seed: int) -> tuple[int, np.ndarray]:
    """Partition an undirected CSR graph (both directions stored, no self-loops) into ``nparts``
    with ``ncon`` node-major balance weights per vertex; returns (edge cut, part of each vertex)."""
    n = xadj.shape[0] - 1
    xadj = np.ascontiguousarray(xadj, dtype=np.int64)
    adjncy = np.ascontiguousarray(adjncy, dtype=np.int64)
    vweights = np.ascontiguousarray(vweights, dtype=np.int64)
    if vweights.shape != (n * ncon,):
        raise ValueError(f"vweights must hold {ncon} weights per vertex")
    options = np.full(METIS_NOPTIONS, -1, dtype=np.int64)  # -1: METIS default
    options[METIS_OPTION_SEED] = seed
    part = np.empty(n, dtype=np.int64)
    i64 = ctypes.c_int64
    nvtxs, ncon_c, nparts_c, objval = i64(n), i64(ncon), i64(nparts), i64(0)
    ptr = ctypes.c_void_p
    status = _library().METIS_PartGraphKway(
        ctypes.byref(nvtxs), ctypes.byref(ncon_c), ptr(xadj.ctypes.data), ptr(adjncy.ctypes.data),
        ptr(vweights.ctypes.data), None, None, ctypes.byref(nparts_c), None, None,
        ptr(options.ctypes.data), ctypes.byref(objval), ptr(part.ctypes.data))
    if status != METIS_OK:
        raise InputError("--method metis", f"METIS_PartGraphKway failed: {METIS_ERRORS.get(status, status)}")
    return int(objval.value), part
