"""`make demo`: the whole pipeline on the embedded default dataset (Cora, bundled in data/cora).

1. partition Cora into 4 parts with METIS (cached: reused while it still verifies),
2. train GraphSAGE on 4 MPI ranks for a few epochs (mpiexec -n 4 python drivers/train.py),
3. print rank 0's summary; the per-rank HDF5 logs stay in OUT/run.

    python drivers/demo.py [--out runs/demo] [--ranks 4] [--epochs 30]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from partitioning.cli import main as partition_main  # noqa: E402
from partitioning.graph import InputError  # noqa: E402
from partitioning.verify import verify  # noqa: E402
from rudder.partition_store import PartitionFormatError, PartitionMeta  # noqa: E402
from rudder.runtime import find_mpiexec  # noqa: E402

DEFAULT_INPUT = f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"


def cached(parts_dir: str, source: str, num_parts: int) -> bool:
    """A partition directory made earlier from the same input that still verifies."""
    try:
        meta = PartitionMeta.load(parts_dir)
        if meta.source != source or meta.num_parts != num_parts:
            return False
        verify(parts_dir)
        return True
    except (PartitionFormatError, InputError, OSError, ValueError):
        return False


def mpiexec() -> str:
    found = find_mpiexec()
    if not found:
        sys.exit("demo: no mpiexec found (make venv installs one; on a cluster use srun, see README)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "demo"), help="demo output directory")
    ap.add_argument("--ranks", type=int, default=4, help="MPI ranks = partitions (default 4)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--input", default=DEFAULT_INPUT, help="input spec (default: the bundled Cora)")
    a = ap.parse_args()
    parts_dir = os.path.join(a.out, f"parts-{a.ranks}")
    if cached(parts_dir, a.input, a.ranks):
        print(f"== reusing the partitions in {parts_dir}", flush=True)
    else:
        print(f"== partitioning {a.input} into {a.ranks} parts (METIS)", flush=True)
        rc = partition_main(["--input", a.input, "--num-parts", str(a.ranks), "--out", parts_dir, "--force"])
        if rc:
            return rc
    run_dir = os.path.join(a.out, "run")
    print(f"== training GraphSAGE on {a.ranks} MPI ranks, {a.epochs} epochs", flush=True)
    cmd = [mpiexec(), "-n", str(a.ranks), sys.executable, os.path.join(REPO, "drivers", "train.py"),
           "--data", parts_dir, "--run-dir", run_dir, "--overwrite", "--epochs", str(a.epochs), "--eval-every", "10"]
    print("   " + " ".join(cmd[:1] + ["-n", str(a.ranks), "python"] + cmd[4:]), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
