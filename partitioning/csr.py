"""The canonical in-edge CSR, built from edge chunks without holding the edge list twice.

Input: a re-iterable source of ``(src, dst)`` chunks (``edges()`` is called twice). Pass 1
counts each row's edges (both directions when symmetrising, self-loops dropped); pass 2 puts
every source into its row's slot of one buffer, 4 bytes an edge while the node count fits int32
(8 above); then each block of rows is sorted and deduplicated in place, and the buffer shrinks
to the edges kept (a realloc, no copy). Peak: the buffer, one chunk's temporaries and three
arrays per node, against the 8-byte key per edge, its sort and its copies that one global sort
of ``dst * N + src`` keys needed (bench/partition_memory.py measures both).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from partitioning.graph import InputError, check_ids_in_range
from partitioning.ondisk import need_memory, release

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
CHUNK_EDGES = 1 << 22
MAX_NODES = 3_000_000_000  # dst * N + src keys of a row block stay below 2^63


def index_dtype(num_nodes: int) -> np.dtype:
    """The narrowest type of a node ID: int32 below 2^31 nodes."""
    return np.dtype(np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64)


def array_chunks(src: np.ndarray, dst: np.ndarray, chunk: int = CHUNK_EDGES) -> EdgeChunks:
    """Edge chunks of two in-memory or memory-mapped arrays (a memmap's pages are released after
    each chunk)."""
    def edges():
        for lo in range(0, src.shape[0], chunk):
            s, d = src[lo:lo + chunk], dst[lo:lo + chunk]
            yield s, d
            release(s)
            release(d)
    return edges


def _add_counts(counts: np.ndarray, ids: np.ndarray) -> None:
    if ids.shape[0] * 8 >= counts.shape[0]:
        counts += np.bincount(ids, minlength=counts.shape[0])
    else:  # few ids, many nodes: avoid a node-sized temporary a chunk
        u, c = np.unique(ids, return_counts=True)
        counts[u] += c


def _directions(src, dst, symmetric):
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return ((src, dst), (dst, src)) if symmetric else ((src, dst),)


def build_csr(edges: EdgeChunks, num_nodes: int, symmetric: bool, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64 [N + 1], indices [E] of ``index_dtype(N)``): in-edges of each node, sources
    sorted, no self-loops or duplicates, every reverse edge added when ``symmetric``."""
    n = num_nodes
    if n > MAX_NODES:
        raise InputError(where, f"{n} nodes exceed the {MAX_NODES:.0e} the edge CSR supports")
    counts = np.zeros(n, dtype=np.int64)
    for src, dst in edges():  # pass 1: row lengths, and the ids checked
        src, dst = np.asarray(src), np.asarray(dst)
        if src.shape != dst.shape:
            raise InputError(where, "edge source and destination arrays differ in length")
        check_ids_in_range(src, n, where, "edge source")
        check_ids_in_range(dst, n, where, "edge destination")
        for _, d in _directions(src, dst, symmetric):
            _add_counts(counts, d)
    idx = index_dtype(n)
    total = int(counts.sum())
    need_memory(total * idx.itemsize, where, f"the edge buffer of {total} directed edges")
    buffer = np.empty(total, dtype=idx)
    cursor = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=cursor[1:])
    for src, dst in edges():  # pass 2: each source into its row
        for s, d in _directions(np.asarray(src), np.asarray(dst), symmetric):
            order = np.argsort(d, kind="stable")
            d, s = d[order], s[order]
            del order
            starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
            lengths = np.diff(np.append(starts, d.shape[0]))
            rows = d[starts]
            rank = np.arange(d.shape[0], dtype=np.int64) - np.repeat(starts, lengths)
            buffer[cursor[rows].repeat(lengths) + rank] = s
            cursor[rows] += lengths
    del cursor
    return _sort_rows(buffer, counts, n)


def _sort_rows(buffer: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort and deduplicate each row in place, blocks of rows of ~CHUNK_EDGES edges at a time;
    ``counts`` (the raw row lengths) become the kept ones."""
    raw_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=raw_ptr[1:])
    write, row = 0, 0
    while row < n:
        end = int(np.searchsorted(raw_ptr, raw_ptr[row] + CHUNK_EDGES, side="right")) - 1
        end = min(max(end, row + 1), n)
        lo, hi = int(raw_ptr[row]), int(raw_ptr[end])
        key = np.repeat(np.arange(end - row, dtype=np.int64), counts[row:end])
        key *= n
        key += buffer[lo:hi]
        key.sort()
        if key.size:
            distinct = np.empty(key.size, dtype=bool)
            distinct[0] = True
            np.not_equal(key[1:], key[:-1], out=distinct[1:])
            key = key[distinct]
        counts[row:end] = np.bincount(key // n, minlength=end - row)
        buffer[write:write + key.size] = key % n  # write <= lo: never ahead of what is still unread
        write += key.size
        row = end
    del raw_ptr
    buffer.resize(write, refcheck=False)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, buffer
