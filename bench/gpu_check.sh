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
CHECK_NAME=gpu_check.sh
. bench/device_mpi.sh

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

case $MODE in
  prepare) prepare_data; prepare_mpi_wheels; exit 0 ;;
  prepare-data) prepare_data; exit 0 ;;
esac

# -- there: the runtime, then the runs ---------------------------------------------------------
use_device_mpi
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
