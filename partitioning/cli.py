"""Command line of the partition tool.

    python -m partitioning --input SPEC --num-parts N --out DIR [--method auto|metis|multilevel|random] [--seed S]
                           [--feature-dtype auto|float32|float16|bfloat16|uint8|bits] [--force] [--scratch DIR]
    python -m partitioning --plan (--input SPEC | --like papers100M|products) --num-parts N [--ranks K]
    python -m partitioning verify DIR

Under ``mpiexec -n K`` the parts are shared between the ranks, in partitioning and in verify.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from partitioning.graph import InputError
from partitioning.metis import METIS_LEVELS
from partitioning.ondisk import set_scratch_dir
from partitioning.parallel import mpi_world, partition_parallel
from partitioning.partition import FEATURE_DTYPES, METHODS, check_feature_dtype, partition_graph
from partitioning.plan import PRESETS, format_plan, plan_for
from partitioning.sources import __doc__ as SPEC_DOC
from partitioning.sources import load_spec
from partitioning.verify import verify

PROG = "python -m partitioning"


def partition_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Partition a graph for Rudder: relabel nodes so each partition owns a contiguous ID range, "
                    "and write one HDF5 file per partition plus metadata.json.",
        epilog=SPEC_DOC.split("\n", 2)[2] + f"\nCheck a partition directory:\n    {PROG} verify DIR\n")
    ap.add_argument("--input", metavar="SPEC", help="input graph spec (see below)")
    ap.add_argument("--num-parts", required=True, type=int, metavar="N", help="number of partitions")
    ap.add_argument("--out", metavar="DIR", help="output directory (created; must be empty or absent)")
    ap.add_argument("--method", choices=sorted(METHODS), default="auto",
                    help="auto (default): metis when the graph fits METIS's 32-bit indices (2^31 - 1 directed edges), "
                         "multilevel beyond; metis: k-way, balanced on nodes, train nodes and edges; multilevel: the "
                         "same balance, coarsened below METIS's limit first; random: seeded, equal sizes")
    ap.add_argument("--seed", type=int, default=0, help="seed for the random method and METIS (default 0)")
    ap.add_argument("--metis-levels", choices=METIS_LEVELS, default=METIS_LEVELS[0],
                    help="where METIS keeps its coarse levels while it works: disk (default: each level it is done with "
                         "goes to the scratch directory until it refines back through it) or memory (faster, with 2.5-"
                         "2.8x the memory); the parts are the same either way")
    ap.add_argument("--feature-dtype", default="auto", metavar="|".join(FEATURE_DTYPES),
                    help="storage type of the features, held and moved so between ranks and widened to float32 on "
                         "arrival; auto (default): the smallest that stores them exactly (bits for 0/1 values, uint8 "
                         "for integers 0..255, float16 or bfloat16 when every value is one, else float32); an explicit "
                         "type is used even when lossy, and metadata.json says so")
    ap.add_argument("--force", action="store_true", help="replace an existing partition directory at --out")
    ap.add_argument("--scratch", metavar="DIR", help="where scratch files go (generated features, edge lists "
                                                      "parsed, compressed archive members); default: beside --out (else $TMPDIR)")
    ap.add_argument("--plan", action="store_true", help="print the predicted peak memory, disk and time, and exit "
                                                        "(nothing is read beyond the input's headers)")
    ap.add_argument("--like", choices=sorted(PRESETS), help="with --plan: a known graph's sizes instead of --input")
    ap.add_argument("--ranks", type=int, default=1, metavar="K", help="with --plan: ranks (nodes) of the parallel mode")
    return ap


def verify_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"{PROG} verify",
                                 description="Check a partition directory: checksums, counts, ID ranges, every edge "
                                             "accounted for exactly once, halos and their owners and degrees.")
    ap.add_argument("dir", metavar="DIR")
    return ap


def load_and_report(spec: str):
    t0 = time.perf_counter()
    graph = load_spec(spec)
    load_s = time.perf_counter() - t0
    print(f"loaded {graph.name}: {graph.num_nodes} nodes, {graph.num_edges} directed edges, {graph.feat_dim} features, "
          f"{graph.num_classes} classes, train/val/test {int(graph.train_mask.sum())}/{int(graph.val_mask.sum())}/"
          f"{int(graph.test_mask.sum())} ({load_s:.1f} s)", flush=True)
    return graph


def run_plan(args) -> None:
    if (args.input is None) == (args.like is None):
        raise InputError("--plan", "needs exactly one of --input SPEC or --like NAME")
    print(format_plan(plan_for(args.input or args.like, args.num_parts, args.ranks, like=args.like is not None,
                               method=args.method, metis_levels=args.metis_levels)))


def run_partition(args, comm) -> None:
    """Serially, or under mpiexec with the parts shared between the ranks (rank 0 reports)."""
    for flag, value in (("--input", args.input), ("--out", args.out)):
        if value is None:
            raise InputError(flag, "is required (or --plan to predict the run)")
    check_feature_dtype(args.feature_dtype)  # before a long load
    if args.scratch:
        os.makedirs(args.scratch, exist_ok=True)
    beside_out = os.path.dirname(os.path.abspath(args.out))
    set_scratch_dir(args.scratch or (beside_out if os.path.isdir(beside_out) else None))
    if comm is None:
        meta, timings = partition_graph(load_and_report(args.input), args.num_parts, args.out, args.method, args.seed,
                                        args.force, args.input, args.feature_dtype, args.metis_levels)
    else:
        meta, timings = partition_parallel(comm, lambda: load_and_report(args.input), args.num_parts, args.out,
                                           args.method, args.seed, args.force, args.input, args.feature_dtype,
                                           args.metis_levels)
        if comm.rank:
            return
        print(f"parts relabelled, written and hashed on {comm.size} ranks")
    chosen = meta.partitioner.get("reason", f"--method {args.method}")
    cut = meta.partitioner.get("edge_cut")
    print(f"partitioned with {meta.method} ({chosen}; seed {args.seed}"
          f"{'' if cut is None else f'; edge cut {cut}'}) into {meta.num_parts} parts in "
          f"{timings['assign_s']:.1f} s, relabelled in {timings['relabel_s']:.1f} s, written in {timings['write_s']:.1f} s")
    enc = meta.feature_encoding
    exactness = "lossless" if meta.feature_lossless else f"LOSSY, largest error {meta.feature_max_abs_error:.3g}"
    print(f"features stored as {enc.name} ({args.feature_dtype}): {enc.row_bytes} bytes a row, "
          f"{enc.row_bytes / (4 * meta.feat_dim):.3f}x float32; {exactness} (chosen in {timings['encoding_s']:.1f} s)")
    print(f"{'part':>4} {'nodes':>10} {'in-edges':>12} {'halo':>10} {'train':>8} {'val':>8} {'test':>8}  file")
    for p, info in enumerate(meta.parts):
        print(f"{p:>4} {info.num_owned:>10} {info.num_in_edges:>12} {info.num_halo:>10} {info.num_train:>8} "
              f"{info.num_val:>8} {info.num_test:>8}  {info.file}")
    print(f"wrote {args.out}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # SIGTERM (a job's time limit, mpiexec ending the other ranks) unwinds like an exception, so the
    # temporary directory and the scratch files are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    comm = mpi_world()
    speaks = comm is None or comm.rank == 0  # under mpiexec rank 0 reports for all
    try:
        if argv[:1] == ["verify"]:
            args = verify_parser().parse_args(argv[1:])
            summary = verify(args.dir, comm)
            if speaks:
                print(f"OK {args.dir}: {summary['num_parts']} partitions, {summary['num_nodes']} nodes, "
                      f"{summary['num_edges']} edges, halo sizes {summary['halo']}")
        else:
            args = partition_parser().parse_args(argv)
            if args.plan:
                if speaks:
                    run_plan(args)
            else:
                run_partition(args, comm)
    except InputError as e:
        if speaks:
            print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 128 + signal.SIGPIPE
    except (OSError, MemoryError) as e:
        if speaks:
            print(f"{PROG}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 0
