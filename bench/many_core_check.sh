#!/usr/bin/env bash
# The many-core check (issues 38 and 40): what a 2-core host cannot show, on the lent machine's 16
# cores, in one call of about 8 minutes.
#
#   bench/many_core_check.sh --prepare        here, once: the mpich and mpi4py wheels into .whl/, Cora
#                                             in 4 parts and the weak series' RMAT parts into .many-core/
#   bench/many_core_check.sh [--out DIR] [--replica-seconds 200] [--points 4,8,16] [--policies none,lookahead]
#                            [--only "replicas scale busy"]
#
# There (the device tool's run: carry [".whl", ".many-core"], command "bash bench/many_core_check.sh",
# timeout_s 600), after installing what is missing from the carried wheels (bench/device_mpi.sh):
#  1. replicas (issue 38): bench/replica_runs.py in the configuration whose replicas diverged in 2
#     of 10 runs on 16 cores: Cora p4, 4 ranks with no binding (4 threads a rank), --policy fixed,
#     --mpi-wait spin, jobs alternately --mpi-lock off and on for --replica-seconds;
#  2. scale (issue 40): bench/scale.py's weak series at --points with a core a rank (--bind core):
#     start-up CPU, memory, MPI calls and collectives as P grows, without ranks sharing cores;
#  3. busy (issue 40): bench/busy_owner.py at P = 16, 4 emulated nodes, owners computing for real
#     (--owner-work matmul, a core each) while rank 0 reads, with and without the progress thread.
# --out (default $OUT if set, else .many-core/out) gets machine.txt (cores, Python, torch, MPI),
# replicas.json, scale.json and check.log (everything printed, the busy owners' table too).
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
CHECK=${MANY_CORE_DIR:-$REPO/.many-core}  # the carried partitions
WHEELS=$REPO/.whl
OUT=${OUT:-$CHECK/out}
MPICH_PREFIX=${MPICH_PREFIX:-/tmp/mpich}
SITE=${SITE:-/tmp/site}
REPLICA_SECONDS=200
POINTS=4,8,16
POLICIES=none,lookahead
ONLY="replicas scale busy"
MODE=run
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) MODE=prepare ;;
    --prepare-data) MODE=prepare-data ;;
    --out) OUT=$2; shift ;;
    --replica-seconds) REPLICA_SECONDS=$2; shift ;;
    --points) POINTS=$2; shift ;;
    --policies) POLICIES=$2; shift ;;
    --only) ONLY=$2; shift ;;
    *) echo "many_core_check.sh: unknown argument $1 (see the header of bench/many_core_check.sh)" >&2; exit 2 ;;
  esac
  shift
done
CHECK_NAME=many_core_check.sh
. bench/device_mpi.sh

# -- here: what the device machine needs ------------------------------------------------------
prepare_data() {
  # bench/scale.py finds its partitions under its --workdir by these names, and reuses them
  "$PYTHON" - "$CHECK" "$POINTS" <<'EOF' || exit 1
import math, os, sys
sys.path.insert(0, "bench")
from mpi_job import cached_partition
from scale import spec
check, points = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
cached_partition("planetoid:data/cora:cora", 4, os.path.join(check, "cora4"))
for p in points:
    scale = int(math.log2(p * 1024))
    cached_partition(spec(scale), p, os.path.join(check, "scale", f"rmat{scale}-p{p}"))
EOF
  du -sh "$CHECK"/cora4 "$CHECK"/scale/*
}

case $MODE in
  prepare) prepare_data; prepare_mpi_wheels; exit 0 ;;
  prepare-data) prepare_data; exit 0 ;;
esac

# -- there: the runtime, then the checks --------------------------------------------------------
[ -f "$CHECK/cora4/metadata.json" ] || { echo "many_core_check.sh: $CHECK/cora4 missing (run --prepare here and carry .many-core)"; exit 1; }
mkdir -p "$OUT"
run_checks() {
  use_device_mpi
  {
    echo "cores: $(nproc) (affinity), $(getconf _NPROCESSORS_ONLN) online; memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
    mpi_library
    echo "mpiexec: $MPIEXEC; gcc: $(command -v gcc || echo none); nm: $(command -v nm || echo none)"
  } | tee "$OUT/machine.txt"
  local status=0
  if [[ " $ONLY " == *" replicas "* ]]; then
    echo "== replicas: Cora p4, 4 ranks, fixed, spin, --mpi-lock off/on, ${REPLICA_SECONDS} s"
    "$PYTHON" bench/replica_runs.py --data "$CHECK/cora4" --seconds "$REPLICA_SECONDS" --json "$OUT/replicas.json" || status=1
  fi
  if [[ " $ONLY " == *" scale "* ]]; then
    echo "== scale: weak series P = $POINTS, $POLICIES, a core a rank"
    "$PYTHON" bench/scale.py --points "$POINTS" --policies "$POLICIES" --bind core --workdir "$CHECK/scale" \
      --out "$OUT/scale.json" || status=1
  fi
  if [[ " $ONLY " == *" busy "* ]]; then
    echo "== busy owners: P = 16 on 4 nodes, owners computing (matmul) while rank 0 reads"
    "$PYTHON" bench/busy_owner.py --ranks 16 --ranks-per-node 4 --owner-work matmul || status=1
  fi
  return $status
}
run_checks 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
