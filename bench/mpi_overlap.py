"""Counting two threads of a rank inside MPI at once, below Python: a PMPI shim preloaded into
every rank (``LD_PRELOAD``) that wraps every ``MPI_`` function the loaded libmpi exports and
counts, per process, the calls and those entered while another thread was inside one, with the
pairs of functions (this call, and the one any thread entered last: mostly the other thread's). Used by the stress harness
(bench/replica_stress.py: how often a run forced the overlap) and the tests (the MPI lock,
rudder.comm.gate, leaves none).

mpi4py's methods are Cython functions, which Python's profile hooks do not see, hence C. Each
wrapper takes and passes twelve integer arguments: on x86-64 Linux a callee reads only the ones it
declares (MPI passes no floating-point arguments), so one wrapper fits every function that returns
an ``int``; the few that return something else (``MPI_Wtime``, ``MPI_Wtick``, ``MPI_Aint_add``,
``MPI_Aint_diff``), ``MPI_Pcontrol`` (variadic) and ``MPI_Abort`` (ending the job from any thread
is allowed) are not wrapped, nor the handle queries (``QUERIES``: ``MPI_Comm_rank`` and the
like). At ``MPI_Finalize`` each rank writes ``LOG.<pid>`` (JSON).

    python bench/mpi_overlap.py --build DIR      # prints the shim's path
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys

LOG_ENV = "RUDDER_MPI_OVERLAP_LOG"
SKIP = {"MPI_Wtime", "MPI_Wtick", "MPI_Aint_add", "MPI_Aint_diff", "MPI_Pcontrol", "MPI_Abort", "MPI_Finalize",
        "MPI_Init", "MPI_Init_thread"}
# Queries that read a handle or the library's state and nothing else (no progress engine, no lock
# in MPICH): mpi4py calls them for every ``comm.rank`` and ``comm.size``, which the run path reads
# outside the MPI lock (a checkpoint's ``trainers.rank == 0``), so they are not counted.
QUERIES = {"MPI_Comm_rank", "MPI_Comm_size", "MPI_Query_thread", "MPI_Initialized", "MPI_Finalized", "MPI_Is_thread_main"}

PROLOGUE = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static long calls, overlaps;
static int inside, pair_lock;
static const char *last;
static __thread int depth;
#define PAIRS 32
static const char *pair_a[PAIRS], *pair_b[PAIRS];
static long pair_n[PAIRS];
static void note(const char *me, const char *other) {
    while (__atomic_exchange_n(&pair_lock, 1, __ATOMIC_ACQUIRE)) {}
    for (int i = 0; i < PAIRS; i++) {
        if (!pair_a[i]) { pair_a[i] = me; pair_b[i] = other; pair_n[i] = 1; break; }
        if (pair_a[i] == me && pair_b[i] == other) { pair_n[i]++; break; }
    }
    __atomic_store_n(&pair_lock, 0, __ATOMIC_RELEASE);
}
static inline void enter(const char *me) {
    if (depth++) return;
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    int n = __atomic_add_fetch(&inside, 1, __ATOMIC_ACQ_REL);
    const char *other = __atomic_exchange_n(&last, me, __ATOMIC_ACQ_REL);
    if (n > 1) { __atomic_add_fetch(&overlaps, 1, __ATOMIC_RELAXED); note(me, other ? other : "?"); }
}
static inline void leave(void) { if (!--depth) __atomic_sub_fetch(&inside, 1, __ATOMIC_ACQ_REL); }
static void dump(void) {
    const char *path = getenv("RUDDER_MPI_OVERLAP_LOG");
    if (!path) return;
    char name[4096];
    snprintf(name, sizeof name, "%s.%d", path, (int)getpid());
    FILE *f = fopen(name, "w");
    if (!f) return;
    fprintf(f, "{\"calls\": %ld, \"overlaps\": %ld, \"pairs\": [", calls, overlaps);
    for (int i = 0; i < PAIRS && pair_a[i]; i++)
        fprintf(f, "%s[\"%s\", \"%s\", %ld]", i ? ", " : "", pair_a[i], pair_b[i], pair_n[i]);
    fprintf(f, "]}\n");
    fclose(f);
}
extern int PMPI_Finalize(void);
int MPI_Finalize(void) { dump(); return PMPI_Finalize(); }
__attribute__((destructor)) static void at_exit(void) { dump(); }
#define W(f) extern int P##f(long, long, long, long, long, long, long, long, long, long, long, long); \
int f(long a, long b, long c, long d, long e, long g, long h, long i, long j, long k, long l, long m) { \
    enter(#f); int r = P##f(a, b, c, d, e, g, h, i, j, k, l, m); leave(); return r; }
"""


def libmpi() -> str | None:
    """The libmpi mpi4py is told to load (``MPI4PY_LIBMPI``, as bench/device_mpi.sh sets it for an
    MPICH installed apart), else the one beside this Python's environment (the mpich wheel's), else None."""
    told = os.environ.get("MPI4PY_LIBMPI")
    if told and os.path.isfile(told):
        return told
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmpi.so.*")))
    return found[0] if found else None


def shim_library() -> str | None:
    """The libmpi a PMPI shim is built against, or None where one cannot be built here (not
    x86-64 Linux, no compiler, no nm, no libmpi)."""
    lib = libmpi()
    if platform.machine() != "x86_64" or not lib or not shutil.which("gcc") or not shutil.which("nm"):
        return None
    return lib


def wrappable(lib: str, skip=frozenset()) -> list[str]:
    """The MPI functions of ``lib`` a shim wraps: those with a PMPI twin, less SKIP, QUERIES, the
    tools interface and ``skip``."""
    defined = set(subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                                 check=True).stdout.split())
    return sorted(n for n in defined if n.startswith("MPI_") and "P" + n in defined and n not in SKIP
                  and n not in QUERIES and n not in skip and not n.startswith("MPI_T_"))


def compile_shim(lib: str, out_dir: str, name: str, source_text: str, libs=()) -> str:
    """``source_text`` written to OUT_DIR/NAME.c and compiled against ``lib``: the shim's path."""
    os.makedirs(out_dir, exist_ok=True)
    source, shim = os.path.join(out_dir, f"{name}.c"), os.path.join(out_dir, f"{name}.so")
    with open(source, "w") as f:
        f.write(source_text)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", shim, source, lib, *libs,
                    f"-Wl,-rpath,{os.path.dirname(lib)}"], check=True)
    return shim


def build_cli(build, doc: str) -> None:
    """A shim module's command line: ``--build DIR`` prints the built shim's path."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--build", metavar="DIR", required=True)
    shim_path = build(parser.parse_args().build)
    print(shim_path or "the shim cannot be built here (x86-64 Linux, gcc, nm and the mpich wheel's libmpi needed)")


def build(out_dir: str) -> str | None:
    """Compile the shim for the libmpi beside this Python; its path, or None where it cannot be
    built here (``shim_library``)."""
    lib = shim_library()
    if lib is None:
        return None
    return compile_shim(lib, out_dir, "mpi_overlap", PROLOGUE + "".join(f"W({n})\n" for n in wrappable(lib)))


def env(shim: str, log: str) -> dict:
    """The variables that preload the shim into a rank and name its log prefix."""
    return {"LD_PRELOAD": shim, LOG_ENV: log}


def read(log: str) -> dict:
    """Every rank's counts under the prefix ``log``, summed: calls, overlaps, and the pairs."""
    total = {"ranks": 0, "calls": 0, "overlaps": 0, "pairs": {}}
    for path in sorted(glob.glob(log + ".*")):
        with open(path) as f:
            counts = json.load(f)
        total["ranks"] += 1
        total["calls"] += counts["calls"]
        total["overlaps"] += counts["overlaps"]
        for a, b, n in counts["pairs"]:
            total["pairs"][f"{a} / {b}"] = total["pairs"].get(f"{a} / {b}", 0) + n
    return total


if __name__ == "__main__":
    build_cli(build, __doc__)
