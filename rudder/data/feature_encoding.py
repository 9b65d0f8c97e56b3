"""The storage types of a feature matrix, part of the partition format
(``rudder.data.partition_store``): how float32 feature rows are stored in a part file and held
in the RMA windows, and how stored rows are widened back to float32 when they arrive.

| type | stored as | items a row | exact for |
|---|---|---|---|
| ``float32`` | float32 | D | anything |
| ``float16`` | float16 (IEEE half) | D | values that are halves: 11 significant bits, magnitude <= 65504 |
| ``bfloat16`` | uint16: the upper half of the float32 | D | values with 8 significant bits (float32's range) |
| ``uint8`` | uint8 | D | integers 0..255 |
| ``bits`` | uint8: ``np.packbits`` of ``x != 0``, first column in the top bit, zero padding | ceil(D / 8) | 0 and 1 |

Exact means bit-exact: widening gives back the very float32 bit patterns (so a -0.0 is no
uint8). A type that is not exact for a matrix still stores it (the nearest value; float16 and
bfloat16 saturate at their largest finite value, uint8 rounds and clips to 0..255, bits keep
``x != 0``), and the partition tool says so in the metadata.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STORAGE_TYPES = ("float32", "float16", "bfloat16", "uint8", "bits")
AUTO_ORDER = ("bits", "uint8", "float16", "bfloat16", "float32")  # smallest row first; float32 always exact
_STORED = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8, "bits": np.uint8}
_FLOAT16_MAX = 65504.0
_BFLOAT16_MAX = float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0])  # 0x7F7F: its largest finite value
_CHECK_BYTES = 1 << 26  # rows compared per chunk when checking exactness: bounds the temporaries
# Bits rows are unpacked a block of rows at a time, about this many bytes of unpacked bits each: the
# block stays in cache and no minibatch-sized temporary is made (docs/results-features.md)
_UNPACK_BYTES = 1 << 20


@dataclass(frozen=True)
class FeatureEncoding:
    """Feature rows ``dim`` wide stored as ``name`` (one of ``STORAGE_TYPES``)."""

    name: str
    dim: int

    def __post_init__(self):
        if self.name not in _STORED:
            raise ValueError(f"feature storage type {self.name!r} is not one of {', '.join(STORAGE_TYPES)}")

    @property
    def stored_dtype(self) -> np.dtype:
        return np.dtype(_STORED[self.name])

    @property
    def width(self) -> int:
        """Stored items a row."""
        return -(-self.dim // 8) if self.name == "bits" else self.dim

    @property
    def row_bytes(self) -> int:
        return self.width * self.stored_dtype.itemsize

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Stored rows of the float32 rows ``x`` [n, dim]."""
        x = np.asarray(x, dtype=np.float32)
        if self.name == "float32":
            return x
        if self.name == "uint8":
            return np.clip(np.rint(x), 0, 255).astype(np.uint8)
        if self.name == "bits":
            return np.packbits(x != 0, axis=1)
        import torch  # the half types only (it converts 10x faster than numpy); the tool need not load it otherwise

        wide = torch.from_numpy(np.ascontiguousarray(x))
        if self.name == "float16":
            return wide.clamp(-_FLOAT16_MAX, _FLOAT16_MAX).half().numpy()
        # bfloat16: torch rounds to nearest even, as a float32 -> bfloat16 cast should
        return wide.clamp(-_BFLOAT16_MAX, _BFLOAT16_MAX).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    def decode(self, stored: np.ndarray, out: np.ndarray | None = None, at: np.ndarray | None = None) -> np.ndarray:
        """Stored rows widened to float32 into ``out`` (new when None): at its rows ``at`` when
        given (distinct), else its first rows. Returns ``out``."""
        n = stored.shape[0]
        if out is None:
            out = np.empty((n, self.dim), dtype=np.float32)
        if at is None or (n and int(at[-1]) - int(at[0]) + 1 == n and bool((np.diff(at) == 1).all())):
            first = 0 if at is None or not n else int(at[0])
            self._widen(stored, out[first:first + n])
        elif n:
            for rows, values in self._value_blocks(stored):
                out[at[rows]] = values
        return out

    def _value_blocks(self, stored: np.ndarray):
        """(a slice of rows, ``_values`` of those rows) over ``stored``: bits a block of about
        ``_UNPACK_BYTES`` unpacked at a time, the other types in one block."""
        n = stored.shape[0]
        step = max(1, _UNPACK_BYTES // self.dim) if self.name == "bits" else max(1, n)
        for first in range(0, n, step):
            yield slice(first, first + step), self._values(stored[first:first + step])

    def _values(self, stored: np.ndarray) -> np.ndarray:
        """The stored rows as an array that assigns exactly into float32 rows (bits unpacked to
        uint8 0/1; no float32 temporary for the byte types)."""
        if self.name == "bits":
            return np.unpackbits(stored, axis=1, count=self.dim)
        if self.name in ("float16", "bfloat16"):
            rows = np.empty((stored.shape[0], self.dim), dtype=np.float32)
            self._widen(stored, rows)
            return rows
        return stored

    def _widen(self, stored: np.ndarray, into: np.ndarray) -> None:
        """``into[:] = float32 of stored``, ``into`` a C-contiguous block of rows."""
        if self.name in ("float16", "bfloat16"):  # torch widens halves 10x faster than numpy
            import torch

            source = torch.from_numpy(np.ascontiguousarray(stored))
            if self.name == "bfloat16":
                source = source.view(torch.int16).view(torch.bfloat16)
            torch.from_numpy(into).copy_(source)
        else:
            for rows, values in self._value_blocks(stored):
                into[rows] = values

    def compare(self, x: np.ndarray, stop_early: bool = False) -> tuple[bool, float]:
        """(whether storing ``x`` in this type is bit-exact, the largest absolute error), over
        chunks of rows; ``stop_early``: return at the first chunk that is not exact."""
        x = np.asarray(x)
        exact, error = True, 0.0
        step = max(1, _CHECK_BYTES // max(1, 4 * self.dim))
        for lo in range(0, x.shape[0], step):
            chunk = np.ascontiguousarray(x[lo:lo + step], dtype=np.float32)
            back = self.decode(self.encode(chunk))
            if not np.array_equal(back.view(np.uint32), chunk.view(np.uint32)):
                exact = False
                error = max(error, float(np.abs(back - chunk).max()))
                if stop_early:
                    break
        return exact, error


def choose_encoding(features: np.ndarray, requested: str) -> tuple[FeatureEncoding, bool, float]:
    """(encoding, lossless, largest absolute error) for storing ``features`` [N, D] float32:
    ``auto`` takes the smallest exact type (``AUTO_ORDER``), any other name is taken as asked."""
    dim = int(features.shape[1])
    if requested == "auto":
        for name in AUTO_ORDER:
            encoding = FeatureEncoding(name, dim)
            if name == "float32" or encoding.compare(features, stop_early=True)[0]:
                return encoding, True, 0.0
    encoding = FeatureEncoding(requested, dim)
    exact, error = (True, 0.0) if requested == "float32" else encoding.compare(features)
    return encoding, exact, error
