"""Benchmark (not a test): the GraphSAGE layer's row sums on a GPU (why ``rudder.train.sage`` sums
rows by a segmented reduction there): for each size, whether repeated calls on the same inputs give
the same bits, whether they match the CPU's CSR product bit for bit, and the milliseconds per call,
for cuSPARSE's CSR product and for the gather and segmented reduction.

    python bench/gpu_row_sums.py [--reps 20]

Random row groups (destinations) over random sources, sorted by destination as a block's are.
Needs a CUDA device; it is part of what a GPU session runs (docs/training.md).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rudder.train.sage import _csr_product, _indptr, _segment_sum  # noqa: E402

SIZES = ((2000, 8000, 40_000, 16), (20_000, 200_000, 500_000, 16), (50_000, 200_000, 1_000_000, 256))  # rows, cols, edges, width


def milliseconds(call, reps: int) -> float:
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_row_sums.py: torch.cuda.is_available() is False: this benchmark needs a GPU")
    device, generator = torch.device("cuda"), torch.Generator().manual_seed(0)
    for rows, cols, edges, width in SIZES:
        dst = torch.sort(torch.randint(0, rows, (edges,), generator=generator)).values
        src = torch.randint(0, cols, (edges,), generator=generator)
        indptr = _indptr(dst, rows)
        h = torch.randn(cols, width, generator=generator)
        on_cpu = _csr_product(indptr, src, rows, h)
        ip, ix, hd = indptr.to(device), src.to(device), h.to(device)
        for name, kernel in (("cusparse csr", _csr_product), ("segment", _segment_sum)):
            call = functools.partial(kernel, ip, ix, rows, hd)
            first = call()
            stable = all(torch.equal(first, call()) for _ in range(5))
            print(f"{rows}x{cols}, {edges} edges, width {width}, {name}: same bits over 6 calls {stable}, "
                  f"bit-equal to the CPU's CSR product {torch.equal(first.cpu(), on_cpu)}, "
                  f"{milliseconds(call, args.reps):.3f} ms a call")


if __name__ == "__main__":
    main()
