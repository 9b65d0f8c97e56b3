"""Benchmark (not a test): epoch time of whole training runs with the torch GraphSAGE layer
(``--model-impl torch``, the default) against DGL's (``--model-impl dgl``), on CPU.

    python bench/model_impl_epoch.py [--ranks 2] [--epochs 4] [--reps 3] [--batch-size 1000]

Each repetition runs the real driver (``mpiexec -n RANKS python drivers/train.py``) once with each
layer, alternating which goes first, on Facebook Page-Page (when ../shared/data has it) and on
RMAT-16 with 128 features; everything else is equal, down to the losses. Epoch time is the
slowest trainer's, median over the steady epochs; the ratio torch / DGL is taken per repetition and its
median printed, with the training thread's forward+backward seconds per epoch beside it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import bench_datasets, cached_partition, train_job  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402


def measure(parts: str, run_dir: str, ranks: int, impl: str, a) -> tuple[float, float]:
    train_job(parts, run_dir, ranks, 1, ["--model-impl", impl, "--epochs", str(a.epochs), "--batch-size", str(a.batch_size)])
    run = load_run(run_dir)
    epochs = [r.epochs for r in run.ranks]
    timed = metrics.run_timed_epochs(epochs)
    compute = metrics.per_epoch_mean([r.minibatches for r in run.ranks], "t_forward_backward", timed) / len(run.ranks)
    return metrics.run_epoch_time(epochs), compute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "rudder-bench-parts"))
    a = ap.parse_args()
    for name, spec in bench_datasets(16, 128).items():
        parts = cached_partition(spec, a.ranks, os.path.join(a.cache, f"{name}-{a.ranks}"))
        results = {"torch": [], "dgl": []}
        with tempfile.TemporaryDirectory() as work:
            for rep in range(a.reps):
                for impl in (("torch", "dgl") if rep % 2 == 0 else ("dgl", "torch")):
                    results[impl].append(measure(parts, os.path.join(work, impl), a.ranks, impl, a))
        ours, theirs = np.array(results["torch"]), np.array(results["dgl"])
        ratio = np.median(ours[:, 0] / theirs[:, 0])
        print(f"{name}, {a.ranks} ranks, batch {a.batch_size}: epoch s torch {np.median(ours[:, 0]):.3f}, "
              f"DGL {np.median(theirs[:, 0]):.3f} (torch/DGL per repetition: "
              f"{', '.join(f'{r:.2f}' for r in ours[:, 0] / theirs[:, 0])}; median {ratio:.2f}x); forward+backward "
              f"s/epoch torch {np.median(ours[:, 1]):.3f}, DGL {np.median(theirs[:, 1]):.3f}")


if __name__ == "__main__":
    main()
