"""Counting a rank's MPI calls by function, below Python: bench/mpi_overlap.py's PMPI shim, made
to count each function apart and the bytes of the data-moving ones, and to write its counts so
far whenever the rank asks (``rudder.train.footprint.mpi_counts_mark``, at each start-up phase
and memory sample), so a benchmark takes the calls of an epoch, an evaluation or the start-up as
the difference of two marks. Used by bench/scale.py. ``MPI_Type_size`` is not counted (the shim
calls it for the bytes).

Bytes: a Get's or Put's origin data (count x the origin type's size), a send's data, and what a
rank contributes to a collective (its send count x type size; Allreduce, Reduce and Bcast their
count; a Barrier none). Each line of ``LOG.<pid>`` is one mark: ``{"tag": ..., "calls": {name:
n}, "bytes": {name: n}, "rank": world rank, "inside_cpu_ns": n, "inside_wall_ns": n}``: the last two,
the CPU and wall nanoseconds the rank's threads have spent inside MPI so far (outermost calls; a
blocking call polls, so its wait for other ranks is CPU too). The last mark, ``finalize``, is written
at MPI_Finalize (or exit).

    python bench/mpi_counts.py --build DIR      # prints the shim's path
"""
from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_overlap import build_cli, compile_shim, shim_library, wrappable  # noqa: E402

from rudder.train.footprint import COUNTS_ENV  # noqa: E402

# The data-moving functions whose bytes are counted: the argument positions (0-based) of the
# count and the datatype whose product is the bytes (MPICH's ABI: handles are ints).
MOVES = {"MPI_Get": (1, 2), "MPI_Rget": (1, 2), "MPI_Put": (1, 2), "MPI_Accumulate": (1, 2),
         "MPI_Send": (1, 2), "MPI_Isend": (1, 2), "MPI_Ssend": (1, 2), "MPI_Issend": (1, 2),
         "MPI_Allreduce": (2, 3), "MPI_Iallreduce": (2, 3), "MPI_Reduce": (2, 3), "MPI_Bcast": (1, 2),
         "MPI_Allgather": (1, 2), "MPI_Allgatherv": (1, 2), "MPI_Gather": (1, 2), "MPI_Gatherv": (1, 2),
         "MPI_Alltoall": (1, 2), "MPI_Scatter": (1, 2)}

PROLOGUE = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
extern const char *NAMES[];
extern const int NFUNCS;
static long calls[NFUNCS_MAX], bytes[NFUNCS_MAX];
static __thread int depth;
/* CPU and wall nanoseconds the rank's threads spent inside MPI (outermost calls): a blocking
   call's polling burns CPU while it waits for other ranks, more where ranks share cores */
static long inside_cpu_ns, inside_wall_ns;
static __thread struct timespec cpu0, wall0;
static inline long ns_since(clockid_t clock, const struct timespec *t0) {
    struct timespec t; clock_gettime(clock, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}
static pthread_mutex_t mark_lock = PTHREAD_MUTEX_INITIALIZER;
extern int PMPI_Type_size(int, int *);
extern int PMPI_Initialized(int *);
extern int PMPI_Finalized(int *);
extern int PMPI_Comm_rank(int, int *);
#define WORLD 0x44000000  /* MPI_COMM_WORLD in MPICH's ABI */
static inline void enter(int k) {
    if (!depth++) {
        __atomic_add_fetch(&calls[k], 1, __ATOMIC_RELAXED);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
        clock_gettime(CLOCK_MONOTONIC, &wall0);
    }
}
static inline void moved(int k, long count, long type) {
    int size = 0;
    if (depth == 1 && count > 0 && PMPI_Type_size((int)type, &size) == 0)
        __atomic_add_fetch(&bytes[k], count * size, __ATOMIC_RELAXED);
}
static inline void leave(void) {
    if (!--depth) {
        __atomic_add_fetch(&inside_cpu_ns, ns_since(CLOCK_THREAD_CPUTIME_ID, &cpu0), __ATOMIC_RELAXED);
        __atomic_add_fetch(&inside_wall_ns, ns_since(CLOCK_MONOTONIC, &wall0), __ATOMIC_RELAXED);
    }
}
static void dump(FILE *f, const long *counts) {
    int first = 1;
    for (int k = 0; k < NFUNCS; k++)
        if (counts[k]) { fprintf(f, "%s\"%s\": %ld", first ? "" : ", ", NAMES[k], counts[k]); first = 0; }
}
void rudder_mpi_counts_mark(const char *tag) {
    const char *path = getenv("RUDDER_MPI_COUNTS");
    if (!path) return;
    char name[4096];
    snprintf(name, sizeof name, "%s.%d", path, (int)getpid());
    int up = 0, down = 0, rank = -1;
    PMPI_Initialized(&up);
    PMPI_Finalized(&down);
    if (up && !down) PMPI_Comm_rank(WORLD, &rank);
    pthread_mutex_lock(&mark_lock);
    FILE *f = fopen(name, "a");
    if (f) {
        fprintf(f, "{\"tag\": \"%s\", \"rank\": %d, \"calls\": {", tag, rank);
        dump(f, calls);
        fprintf(f, "}, \"bytes\": {");
        dump(f, bytes);
        fprintf(f, "}, \"inside_cpu_ns\": %ld, \"inside_wall_ns\": %ld}\n", inside_cpu_ns, inside_wall_ns);
        fclose(f);
    }
    pthread_mutex_unlock(&mark_lock);
}
extern int PMPI_Finalize(void);
static int finalized;
int MPI_Finalize(void) { rudder_mpi_counts_mark("finalize"); finalized = 1; return PMPI_Finalize(); }
__attribute__((destructor)) static void at_exit(void) { if (!finalized) rudder_mpi_counts_mark("exit"); }
#define ARGS long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8, long a9, long a10, long a11
#define PASS a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11
#define W(f, k) extern int P##f(ARGS); \
int f(ARGS) { enter(k); int r = P##f(PASS); leave(); return r; }
#define M(f, k, c, t) extern int P##f(ARGS); \
int f(ARGS) { long v[12] = {PASS}; enter(k); moved(k, v[c], v[t]); int r = P##f(PASS); leave(); return r; }
"""


def build(out_dir: str) -> str | None:
    """Compile the shim for the libmpi beside this Python; its path, or None where it cannot be
    built here (``mpi_overlap.shim_library``)."""
    lib = shim_library()
    if lib is None:
        return None
    wrapped = wrappable(lib, skip={"MPI_Type_size"})
    lines = [f"#define NFUNCS_MAX {len(wrapped) + 1}", PROLOGUE,
             f"const int NFUNCS = {len(wrapped)};",
             "const char *NAMES[] = {" + ", ".join(f'"{n}"' for n in wrapped) + "};"]
    for k, n in enumerate(wrapped):
        base = n.removesuffix("_c")  # the large-count variant (mpi4py 4 calls these) takes its arguments in the same places
        lines.append(f"M({n}, {k}, {MOVES[base][0]}, {MOVES[base][1]})" if base in MOVES else f"W({n}, {k})")
    return compile_shim(lib, out_dir, "mpi_counts", "\n".join(lines) + "\n", libs=("-lpthread",))


def env(shim: str, log: str) -> dict:
    """The variables that preload the shim into a rank and name its log prefix."""
    return {"LD_PRELOAD": shim, COUNTS_ENV: log}


def canonical(counts: dict) -> dict:
    """Counts by function, a large-count variant (``MPI_Get_c``) counted as its function."""
    out = {}
    for name, n in counts.items():
        out[name.removesuffix("_c")] = out.get(name.removesuffix("_c"), 0) + n
    return out


def read(log: str) -> dict[int, list[dict]]:
    """Each process's marks under the prefix ``log``: {pid: [mark, ...]} in the order written."""
    out = {}
    for path in sorted(glob.glob(log + ".*")):
        with open(path) as f:
            marks = [json.loads(line) for line in f if line.strip()]
        out[int(path.rsplit(".", 1)[1])] = [{**m, "calls": canonical(m["calls"]), "bytes": canonical(m["bytes"])}
                                            for m in marks]
    return out


def between(marks: list[dict], first: str, last: str) -> dict:
    """Calls and bytes by function, and the nanoseconds inside MPI, between the marks tagged
    ``first`` and ``last`` (the earliest of each)."""
    tags = {m["tag"]: m for m in reversed(marks)}
    a, b = tags[first], tags[last]
    out = {kind: {name: n - a[kind].get(name, 0) for name, n in b[kind].items() if n - a[kind].get(name, 0)}
           for kind in ("calls", "bytes")}
    for kind in ("inside_cpu_ns", "inside_wall_ns"):  # marks from before these were counted: none
        out[kind] = b.get(kind, 0) - a.get(kind, 0)
    return out


if __name__ == "__main__":
    build_cli(build, __doc__)
