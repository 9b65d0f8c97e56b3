#!/usr/bin/env bash
# The GPU check (issue 20): training with --device cuda against --device cpu, with and without a
# buffer policy, on partitions carried with the working tree, on a machine that has a GPU and a
# CUDA torch but possibly no MPI runtime, no DGL and no network.
#
#   bench/gpu_check.sh --prepare        here, once: wheels into .whl/ and partitions into .gpu-check/
#   bench/gpu_check.sh --prepare-data   the partitions alone (no download)
#   bench/gpu_check.sh [--out DIR] [--runs DIR] [--cpu-only] [--datasets "cora4 rmat4"] [--epochs N]
#                      [--train-args "ARGS"]   (more options for every run, e.g. "--dropout 0 --hidden 256")
#
# A run installs what is missing from the carried wheels (the mpich runtime with --prefix
# $MPICH_PREFIX, default /tmp/mpich, where the MPI that mpi4py loads is not MPICH; mpi4py into
# $SITE, default /tmp/site, only if the installed one does not load that MPICH), then for each
# dataset runs `mpiexec -n 4 python drivers/train.py` on cuda and on cpu, each with --policy none
# and --policy fixed, MPICH told each rank is a node of its own (so remote rows cross RMA; each
# rank is then its node's trainer 0, so all four share GPU 0), and prints bench/gpu_report.py's
# table: accuracy, epoch time, the time breakdown, the share of the epoch the GPU waits for
# inputs, and whether the runs agree. Without a GPU the CUDA half is skipped with the reason.
# Both folders are ignored by git: carry them (.whl, .gpu-check).
# The runs' logs go to --runs (default /tmp/gpu-check-runs); --out (default $OUT if set, else
# .gpu-check/out) gets three files: report.txt, report.json and runs.tar.gz (every run's logs and
# output). With the default 8 epochs on both datasets a run takes a few minutes.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
CHECK=${GPU_CHECK_DIR:-$REPO/.gpu-check}  # the carried partitions (parts/NAME)
WHEELS=$REPO/.whl
OUT=${OUT:-$CHECK/out}
RUNS=/tmp/gpu-check-runs
MPICH_PREFIX=${MPICH_PREFIX:-/tmp/mpich}  # where a carried mpich wheel installs
SITE=${SITE:-/tmp/site}                   # where a carried mpi4py wheel installs
DATASETS="cora4 rmat4"
EPOCHS=${EPOCHS:-8}
TRAIN_ARGS=""
DEVICES="cuda cpu"
MODE=run
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) MODE=prepare ;;
    --prepare-data) MODE=prepare-data ;;
    --out) OUT=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --cpu-only) DEVICES=cpu ;;
    --datasets) DATASETS=$2; shift ;;
    --epochs) EPOCHS=$2; shift ;;
    --train-args) TRAIN_ARGS=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (see the header of bench/gpu_check.sh)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# -- here: what the device machine needs ------------------------------------------------------
prepare_data() {
  # Cora as bundled, and an RMAT graph with small features (the carried tree stays under 64 MiB).
  "$PYTHON" - "$CHECK/parts" $DATASETS <<'EOF' || exit 1
import os, sys
from bench.mpi_job import cached_partition
specs = {"cora4": "planetoid:data/cora:cora", "rmat4": "synthetic:rmat:scale=15,edge_factor=8,feat_dim=32,classes=8,seed=1"}
out, names = sys.argv[1], sys.argv[2:]
for name in names:
    if name not in specs:
        sys.exit(f"gpu_check.sh: --datasets {name}: expected some of {', '.join(specs)}")
    cached_partition(specs[name], 4, os.path.join(out, name))
EOF
  du -sh "$CHECK/parts"/*
}

prepare_wheels() {
  # For the device's Python 3.12 on x86-64 Linux: the MPI runtime, and mpi4py in case its own fails.
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$WHEELS" mpich==5.0.2 mpi4py==4.1.2 || exit 1
  ls -la "$WHEELS"
}

case $MODE in
  prepare) prepare_data; prepare_wheels; exit 0 ;;
  prepare-data) prepare_data; exit 0 ;;
esac

# -- there: the runtime, then the runs ---------------------------------------------------------
find_mpiexec() {
  for candidate in "$(dirname "$PYTHON")/mpiexec" "$MPICH_PREFIX/bin/mpiexec" "$(command -v mpiexec)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
}
mpi_library() { "$PYTHON" -c "from mpi4py import MPI; print('MPI:', MPI.Get_library_version().splitlines()[0])" 2>/dev/null; }
use_carried_mpich() {
  # The runs emulate a node per rank with MPIR_CVAR_NUM_CLIQUES, which only MPICH reads: another MPI
  # (the device image's mpi4py loads an Open MPI) would put all four ranks on one node, where no row
  # is remote and the buffer policy has nothing to do.
  ls "$WHEELS"/mpich-*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: no MPICH here ($1) and no mpich wheel in $WHEELS (run --prepare first)"; exit 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix "$MPICH_PREFIX" \
    "$WHEELS"/mpich-*.whl || exit 1
  export PATH=$MPICH_PREFIX/bin:$PATH LD_LIBRARY_PATH=$MPICH_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  MPIEXEC=$MPICH_PREFIX/bin/mpiexec
  if ! mpi_library | grep -q '^MPI: MPICH'; then  # this mpi4py was built for another MPI: the carried one loads any
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/mpi4py-*.whl || exit 1
    export PYTHONPATH=$SITE:$PYTHONPATH MPI4PY_LIBMPI=$MPICH_PREFIX/lib/libmpi.so.12
  fi
}

MPIEXEC=$(find_mpiexec)
if [ -z "$MPIEXEC" ]; then
  use_carried_mpich "no mpiexec"
elif ! mpi_library | grep -q '^MPI: MPICH'; then
  use_carried_mpich "mpi4py loads $(mpi_library || echo no MPI library)"
fi
mpi_library | grep '^MPI: MPICH' || { echo "gpu_check.sh: mpi4py cannot load an MPICH library ($(mpi_library))"; exit 1; }
"$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
if [[ " $DEVICES " == *" cuda "* ]]; then
  reason=$("$PYTHON" -c "import torch; print('' if torch.cuda.is_available() else 'torch.cuda.is_available() is False (torch ' + torch.__version__ + ')')")
  if [ -n "$reason" ]; then
    echo "gpu_check.sh: skipping the CUDA half: $reason"
    DEVICES=cpu
  else
    "$PYTHON" -c "import torch; print('gpu', torch.cuda.get_device_name(0))"
  fi
fi

mkdir -p "$OUT" "$RUNS"
runs=()
for dataset in $DATASETS; do
  parts=$CHECK/parts/$dataset
  [ -f "$parts/metadata.json" ] || { echo "gpu_check.sh: $parts missing (run --prepare here and carry .gpu-check)"; exit 1; }
  for device in $DEVICES; do
    for policy in none fixed; do
      run=$RUNS/$dataset-$device-$policy
      echo "== $dataset --device $device --policy $policy"
      start=$(date +%s)
      MPIR_CVAR_NUM_CLIQUES=4 timeout 300 "$MPIEXEC" -n 4 "$PYTHON" drivers/train.py --data "$parts" --run-dir "$run" \
        --overwrite --device "$device" --policy "$policy" --delta 10 --epochs "$EPOCHS" --eval-every 0 \
        --progress none $TRAIN_ARGS > "$run.log" 2>&1
      status=$?
      echo "   exit status $status after $(( $(date +%s) - start )) s (output: $run.log)"
      [ $status -eq 0 ] || tail -5 "$run.log"
      runs+=("$run")
    done
  done
done
"$PYTHON" bench/gpu_report.py "${runs[@]}" --json "$OUT/report.json" | tee "$OUT/report.txt"
tar czf "$OUT/runs.tar.gz" -C "$RUNS" .
