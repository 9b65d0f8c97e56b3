# Sourced by the device checks (bench/gpu_check.sh, bench/many_core_check.sh): an MPICH for mpi4py
# on a machine whose image may have none, or another MPI, and no network. Here, `prepare_mpi_wheels`
# downloads the mpich and mpi4py wheels for the device's Python 3.12 into $WHEELS; there,
# `use_device_mpi` installs what is missing from them and exports MPIEXEC (and PATH,
# LD_LIBRARY_PATH, PYTHONPATH, MPI4PY_LIBMPI where it installed them). The checks emulate nodes
# with MPIR_CVAR_NUM_CLIQUES, which only MPICH reads: another MPI (the device image's mpi4py loads
# an Open MPI) would put every rank on one node, where no row is remote.
# Needs: REPO (the checkout, the working directory), WHEELS, MPICH_PREFIX (where the mpich wheel
# installs), SITE (where mpi4py does), CHECK_NAME (for messages); PYTHON if set (else the venv's,
# else python3).

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

prepare_mpi_wheels() {
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$WHEELS" mpich==5.0.2 mpi4py==4.1.2 || exit 1
  ls -la "$WHEELS"
}

find_mpiexec() {
  for candidate in "$(dirname "$PYTHON")/mpiexec" "$MPICH_PREFIX/bin/mpiexec" "$(command -v mpiexec)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
}

mpi_library() { "$PYTHON" -c "from mpi4py import MPI; print('MPI:', MPI.Get_library_version().splitlines()[0])" 2>/dev/null; }

use_carried_mpich() {
  ls "$WHEELS"/mpich-*.whl >/dev/null 2>&1 || { echo "$CHECK_NAME: no MPICH here ($1) and no mpich wheel in $WHEELS (run --prepare first)"; exit 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix "$MPICH_PREFIX" \
    "$WHEELS"/mpich-*.whl || exit 1
  # MPI4PY_LIBMPI: the library the carried mpi4py loads, and the one bench/mpi_overlap.py's shims wrap
  export PATH=$MPICH_PREFIX/bin:$PATH LD_LIBRARY_PATH=$MPICH_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    MPI4PY_LIBMPI=$MPICH_PREFIX/lib/libmpi.so.12
  MPIEXEC=$MPICH_PREFIX/bin/mpiexec
  if ! mpi_library | grep -q '^MPI: MPICH'; then  # this mpi4py was built for another MPI: the carried one loads any
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/mpi4py-*.whl || exit 1
    export PYTHONPATH=$SITE:$PYTHONPATH
  fi
}

use_device_mpi() {
  MPIEXEC=$(find_mpiexec)
  if [ -z "$MPIEXEC" ]; then
    use_carried_mpich "no mpiexec"
  elif ! mpi_library | grep -q '^MPI: MPICH'; then
    use_carried_mpich "mpi4py loads $(mpi_library || echo no MPI library)"
  fi
  mpi_library | grep '^MPI: MPICH' || { echo "$CHECK_NAME: mpi4py cannot load an MPICH library ($(mpi_library))"; exit 1; }
  export MPIEXEC
}
