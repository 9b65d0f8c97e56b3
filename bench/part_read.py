"""Benchmark (not a test): what a rank that exposes a partition reads from its part file at
start-up, the checksum (``rudder.train.job.verify_own_partition``: sha256 of the whole file) and
then the partition itself (``read_partition`` with its CSR and ``read_stored_features``), against
the partition read alone.

    python bench/part_read.py [--scale 18] [--feat-dim 256] [--parts 2] [--out DIR]

Makes (or reuses, in --out) a synthetic RMAT graph in --parts random parts, then for part 0,
each time with the file first dropped from the page cache (``posix_fadvise(DONTNEED)``, the
state of a fresh job on a node that has not read it): checksum then read, and read alone. Prints
the bytes read from storage (``/proc/self/io`` ``read_bytes``) and through read calls (``rchar``),
and CPU and wall seconds, for each. Storage bytes show whether the read after the checksum costs
a second pass over the storage, or is served from the page cache the checksum filled.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rudder.data.partition_store import (  # noqa: E402
    PartitionMeta,
    read_partition,
    read_stored_features,
    sha256_file,
)


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measured(fn) -> dict[str, float]:
    before, cpu, wall = io_counters(), time.process_time(), time.perf_counter()
    fn()
    after = io_counters()
    return {"storage_MB": (after["read_bytes"] - before["read_bytes"]) / 1e6,
            "read_calls_MB": (after["rchar"] - before["rchar"]) / 1e6,
            "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=18)
    ap.add_argument("--feat-dim", type=int, default=256)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    out = args.out or os.path.join(tempfile.gettempdir(), f"rudder-part-read-{args.scale}-{args.feat_dim}")
    if not os.path.exists(os.path.join(out, "metadata.json")):
        from partitioning.partition import partition_graph
        from partitioning.sources import load_spec

        spec = f"synthetic:rmat:scale={args.scale},edge_factor=16,feat_dim={args.feat_dim},classes=8,seed=0"
        partition_graph(load_spec(spec), args.parts, out, method="random", seed=0, feature_dtype="float32")
    meta = PartitionMeta.load(out)
    path = os.path.join(out, meta.parts[0].file)

    def read():
        read_partition(out, 0, meta, structure=True)
        read_stored_features(out, 0, meta)

    def check_then_read():
        sha256_file(path)
        read()

    print(f"{path}: {os.path.getsize(path) / 1e6:.0f} MB, each case from a cold page cache")
    cases = (("checksum + read (today)", check_then_read), ("read alone", read), ("checksum alone", lambda: sha256_file(path)))
    for name, fn in cases:
        drop_cache(path)
        m = measured(fn)
        print(f"  {name:24s} storage {m['storage_MB']:7.0f} MB  read calls {m['read_calls_MB']:7.0f} MB  "
              f"CPU {m['cpu_s']:6.2f} s  wall {m['wall_s']:6.2f} s")


if __name__ == "__main__":
    main()
