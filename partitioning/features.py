"""Feature matrices too large to hold, read in blocks of rows.

A loader's features are a float32 ``[N, D]`` array in memory, or a read-only ``np.memmap`` (the
synthetic generator's scratch file, a member of an OGB archive): scans and the rows of a part are
read a block at a time (``partitioning.ondisk``), so neither holds all features.
"""
from __future__ import annotations

import numpy as np

from partitioning.ondisk import ScratchArray, chunks_of, release
from rudder.data.feature_encoding import AUTO_ORDER, FeatureEncoding

BLOCK_BYTES = 1 << 24  # rows read at once: 16 MiB (a scan's temporaries are a few blocks)


def rows_per_block(row_bytes: int) -> int:
    return max(1, BLOCK_BYTES // max(1, row_bytes))


def blocks(features: np.ndarray):
    """(first row, block) over all rows, one block of ~BLOCK_BYTES in memory at a time."""
    return chunks_of(features, rows_per_block(features.shape[1] * features.dtype.itemsize))


def gather_rows(features: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``features[rows]`` for ascending ``rows``, read block by block; into ``out`` when given."""
    if not isinstance(features, np.memmap):
        return np.take(features, rows, axis=0, out=out)
    out = np.empty((rows.shape[0], features.shape[1]), dtype=features.dtype) if out is None else out
    step = rows_per_block(features.shape[1] * features.dtype.itemsize)
    bounds = np.searchsorted(rows, np.arange(0, features.shape[0] + step, step))
    for b in range(bounds.shape[0] - 1):
        a, z = int(bounds[b]), int(bounds[b + 1])
        if a < z:
            np.take(features, rows[a:z], axis=0, out=out[a:z])
            release(features[int(rows[a]):int(rows[z - 1]) + 1])
    return out


def first_nonfinite_row(features: np.ndarray) -> int | None:
    """Index of the first row holding NaN/inf, scanning block by block."""
    for lo, block in blocks(features):
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            return lo + int(np.flatnonzero(bad)[0])
    return None


def exact_in(name: str, block: np.ndarray) -> bool:
    """Whether storing ``block`` (finite float32) as ``name`` gives back every bit: the verdict of
    ``FeatureEncoding.compare``, in numpy (the half types' check then needs no torch)."""
    if name == "float16":  # representable halves convert back exactly; anything else differs (or overflows)
        with np.errstate(over="ignore"):
            return bool(np.array_equal(block.astype(np.float16).astype(np.float32).view(np.uint32), block.view(np.uint32)))
    if name == "bfloat16":  # the upper half of the float32, the lower one zero
        return not (block.view(np.uint32) & 0xFFFF).any()
    return FeatureEncoding(name, block.shape[1]).compare(block, stop_early=True)[0]


def choose_encoding(features: np.ndarray, requested: str) -> tuple[FeatureEncoding, bool, float]:
    """(encoding, lossless, largest absolute error), decided as
    ``rudder.data.feature_encoding.choose_encoding`` decides it, over blocks: ``auto`` takes the
    smallest type exact for every row (a type stops at its first inexact block), any other name
    is taken as asked."""
    dim = int(features.shape[1])
    if requested == "auto":
        for name in AUTO_ORDER:
            if name == "float32" or all(exact_in(name, block) for _, block in blocks(features)):
                return FeatureEncoding(name, dim), True, 0.0
    encoding = FeatureEncoding(requested, dim)
    if requested == "float32":
        return encoding, True, 0.0
    exact, error = True, 0.0
    for _, block in blocks(features):
        block_exact, block_error = encoding.compare(block)
        exact, error = exact and block_exact, max(error, block_error)
    return encoding, exact, error


def array_reference(features: np.ndarray) -> dict | None:
    """What another rank needs to open the same file-backed features itself, or None."""
    if isinstance(features, np.memmap) and features.filename and features.flags.c_contiguous:
        return {"path": features.filename, "offset": int(features.offset), "shape": tuple(features.shape),
                "dtype": features.dtype.str}
    return None


def open_reference(ref: dict) -> np.memmap:
    return np.memmap(ref["path"], dtype=np.dtype(ref["dtype"]), mode="r", offset=ref["offset"], shape=ref["shape"])


def as_float32(features: np.ndarray, what: str) -> np.ndarray:
    """Float32 C-ordered rows: a float32 memmap as it is; another file-backed type converted
    block by block into a scratch file; an array in memory converted in memory."""
    if features.dtype == np.float32 and features.flags.c_contiguous:
        return features
    if not isinstance(features, np.memmap) or features.ndim != 2:
        return np.ascontiguousarray(features, dtype=np.float32)
    out = ScratchArray(features.shape, np.float32, f"{what} as float32")
    try:
        for _, block in blocks(features):
            out.append(block.astype(np.float32))
        return out.finish()
    except BaseException:
        out.abandon()
        raise
