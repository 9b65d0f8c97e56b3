"""`make demo`: the main job on the embedded default dataset (Cora, bundled in data/cora).

Until the trainer lands (issue 3), the demo partitions the default dataset, verifies the
result and prints what it wrote. Later it goes on to train on those partitions.

    python drivers/demo.py [--out runs/demo] [--num-parts 2]
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from partitioning.cli import main as partition_main  # noqa: E402

DEFAULT_INPUT = f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "demo"), help="demo output directory")
    ap.add_argument("--num-parts", type=int, default=2)
    ap.add_argument("--input", default=DEFAULT_INPUT, help="input spec (default: the bundled Cora)")
    a = ap.parse_args()
    parts_dir = os.path.join(a.out, f"cora-{a.num_parts}parts")
    print(f"== partitioning {a.input} into {a.num_parts} parts (METIS)", flush=True)
    rc = partition_main(["--input", a.input, "--num-parts", str(a.num_parts), "--out", parts_dir, "--force"])
    if rc:
        return rc
    print("== verifying", flush=True)
    rc = partition_main(["verify", parts_dir])
    if rc:
        return rc
    print(f"\nDemo done. Partition files in {parts_dir}:")
    for name in sorted(os.listdir(parts_dir)):
        print(f"  {name:<16} {os.path.getsize(os.path.join(parts_dir, name)):>10,d} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
