"""Arrays larger than memory: memory-mapped files read without keeping their pages, scratch
files, and ``.npz`` members opened without loading them.

Reading a memmap maps its pages into the process, and the kernel counts them in its resident
memory until they are unmapped; so readers go chunk by chunk and ``release`` each chunk's pages
afterwards (``MADV_DONTNEED``: the data stays in the page cache, the process stops holding it).
A scan then costs one chunk of memory whatever the file's size.
"""
from __future__ import annotations

import mmap
import os
import shutil
import struct
import tempfile
import weakref
import zipfile

import numpy as np
from numpy.lib.array_utils import byte_bounds

from partitioning.graph import InputError

COPY_BYTES = 1 << 26
_SCRATCH = {"dir": None}


def set_scratch_dir(path: str | None) -> None:
    """Where scratch files go (default: $TMPDIR). The CLI points it next to --out: under mpiexec
    every rank reads the scratch files, so they must lie on a disk all ranks see."""
    _SCRATCH["dir"] = path


def scratch_dir() -> str:
    return _SCRATCH["dir"] or tempfile.gettempdir()


def release(view: np.ndarray) -> None:
    """Unmap the pages under ``view`` (a slice of a memmap) from this process; a no-op for
    arrays in memory."""
    root, base = None, view
    while isinstance(base, np.ndarray):
        root, base = base, base.base
    if not isinstance(base, mmap.mmap) or view.size == 0:
        return
    start = root.ctypes.data - (root.offset % mmap.ALLOCATIONGRANULARITY if isinstance(root, np.memmap) else 0)
    low, high = byte_bounds(view)
    lo = low - start
    first = lo - lo % mmap.PAGESIZE
    length = min(high - low + (lo - first), len(base) - first)
    if 0 <= first < len(base) and length > 0:
        base.madvise(mmap.MADV_DONTNEED, first, length)


def need_disk(directory: str, nbytes: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if nbytes > free:
        raise InputError(directory, f"needs {nbytes / 2**30:.1f} GiB of disk for {what}, {free / 2**30:.1f} GiB free "
                                    "(point --scratch or TMPDIR at a larger disk)")


def need_memory(nbytes: int, where: str, what: str) -> None:
    """One line naming ``where`` when the host's available memory cannot hold ``nbytes`` more."""
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
    except (OSError, ValueError, IndexError):
        return
    available = info.get("MemAvailable")
    if available is not None and nbytes > available:
        raise InputError(where, f"needs {nbytes / 2**30:.1f} GiB of memory for {what}, {available / 2**30:.1f} GiB "
                                "available")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ScratchArray:
    """A ``.npy`` file in the scratch directory written block by block with plain writes (nothing
    stays resident), then opened as a read-only memmap; the file is removed when that memmap is
    garbage-collected or the process exits. ``shape[0]`` None: rows not known in advance (a raw
    file, its length counted)."""

    def __init__(self, shape: tuple, dtype, what: str):
        self.shape, self.dtype, self.what = tuple(shape), np.dtype(dtype), what
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.nbytes = None if self.shape[0] is None else int(self.shape[0]) * self.row_bytes
        directory = scratch_dir()
        need_disk(directory, self.nbytes or 0, what)
        fd, self.path = tempfile.mkstemp(prefix="rudder-scratch-", suffix=".npy" if self.nbytes is not None else ".bin",
                                         dir=directory)
        self.file = os.fdopen(fd, "wb")
        if self.nbytes is not None:
            np.lib.format.write_array_header_2_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                             "fortran_order": False, "shape": self.shape})
        self.written = 0

    def append(self, block) -> None:
        data = memoryview(np.ascontiguousarray(block, dtype=self.dtype)).cast("B") if isinstance(block, np.ndarray) \
            else memoryview(block)
        try:
            self.file.write(data)
        except OSError as e:
            need = f"{self.nbytes / 2**30:.1f} GiB" if self.nbytes is not None else f"more than {self.written / 2**30:.1f} GiB"
            raise InputError(self.path, f"cannot write {self.what} ({e.strerror}): needs {need} of scratch disk "
                                        "(point --scratch or TMPDIR at a larger disk)") from None
        self.written += data.nbytes

    def finish(self) -> np.ndarray:
        self.file.close()
        if self.nbytes is None:
            rows = self.written // self.row_bytes
            if rows == 0:
                _remove(self.path)
                return np.empty((0, *self.shape[1:]), dtype=self.dtype)
            array = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(rows, *self.shape[1:]))
            weakref.finalize(array, _remove, self.path)
            return array
        if self.written != self.nbytes:
            raise ValueError(f"{self.path}: {self.written} bytes written, {self.nbytes} declared")
        array = np.load(self.path, mmap_mode="r")
        weakref.finalize(array, _remove, self.path)
        return array

    def abandon(self) -> None:
        self.file.close()
        _remove(self.path)


def npz_member(path: str, key: str) -> np.ndarray:
    """Member ``key`` of an ``.npz`` archive as a read-only memmap: of the archive itself when the
    member is stored, else of a scratch ``.npy`` it is decompressed into (streamed, 64 MiB at a time)."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise InputError(path, f"not a readable .npz archive ({e})") from None
    with zf:
        try:
            info = zf.getinfo(f"{key}.npy")
        except KeyError:
            names = ", ".join(n.removesuffix(".npy") for n in zf.namelist())
            raise InputError(path, f"has no array '{key}' (has: {names})") from None
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                     else np.lib.format.read_array_header_2_0)(f)
            header = f.tell()
            if dtype.hasobject:
                raise InputError(path, f"array '{key}' holds Python objects, expected numbers")
            if info.compress_type == zipfile.ZIP_STORED:
                with open(path, "rb") as raw:
                    raw.seek(info.header_offset)
                    local = raw.read(30)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                offset = info.header_offset + 30 + name_len + extra_len + header
                return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
            # a Fortran-ordered member is the C-ordered bytes of its transpose
            out = ScratchArray(shape[::-1] if fortran else shape, dtype, f"'{key}' of {path} decompressed")
            try:
                while chunk := f.read(COPY_BYTES):
                    out.append(chunk)
                array = out.finish()
            except BaseException:
                out.abandon()
                raise
    return array.T if fortran else array


def chunks_of(array: np.ndarray, rows: int):
    """(first row, rows as an in-memory copy) over ``array``'s first axis, its pages released after each."""
    for lo in range(0, array.shape[0], rows):
        view = array[lo:lo + rows]
        block = np.array(view)
        release(view)
        yield lo, block
