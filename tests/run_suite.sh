#!/usr/bin/env bash
# The whole suite: serial tests once, then the MPI tests under mpiexec -n 1, 2 and 4.
# Each MPI run is wrapped in `timeout` and launched through `python -m mpi4py`, so a rank that
# fails aborts every rank instead of leaving the others blocked in a collective; each rank gets
# its own pytest temp dir (tests/conftest.py appends the rank to --basetemp).
# Env: PYTHON (default .venv/bin/python), MPIEXEC (default: the venv's, else PATH's mpiexec),
#      MPI_SIZES (default "1 2 4"), PYTEST_WORKERS (default 2; 0: the serial tests in one process),
#      PYTEST_ARGS (extra pytest arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
MPIEXEC=${MPIEXEC:-$( [ -x .venv/bin/mpiexec ] && echo .venv/bin/mpiexec || command -v mpiexec )}
MPI_SIZES=${MPI_SIZES:-1 2 4}
BASE=$(mktemp -d "${TMPDIR:-/tmp}/rudder-tests.XXXXXX")
trap 'rm -rf "$BASE"' EXIT
# Oversubscribed ranks must not each start one thread per core.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
start=$(date +%s)

# Byte-compile the checkout once: where PYTHONDONTWRITEBYTECODE is set (CI images set it), every
# one of the suite's hundreds of rank starts would otherwise compile the package's sources again.
"$PYTHON" -m compileall -q -j 0 rudder partitioning drivers bench tests >/dev/null || status=1

echo "== serial tests"
# In pytest-xdist workers, a test file each (--dist loadfile: a module's fixtures, such as the
# evaluation grid, are made once). A serial test spends much of its time single-threaded in its
# own process (partitioning, reading logs, the simulator's replay) between its mpiexec jobs; a
# second worker fills those gaps (docs/testing.md has the figures).
WORKERS=${PYTEST_WORKERS:-2}
# The timeout only ends a hung run: this host's speed varies ~1.5x over a day, and a slow hour
# must not fail a suite that passes (CI allows 90 min for the install and the whole suite).
timeout 3600 "$PYTHON" -m pytest -q -n "$WORKERS" --dist loadfile --durations=25 --basetemp="$BASE/serial" --junitxml="$BASE/serial.xml" ${PYTEST_ARGS:-} || status=1

# Every rank collects only the MPI test files (tests/conftest.py refuses an MPI test elsewhere)
# and loads no plugin it does not use: collecting every file and importing hypothesis cost each
# rank about 4 s of CPU, a quarter of these runs (docs/testing.md).
MPI_TESTS=(tests/test_mpi_*.py)
MPI_PLUGINS="-p no:cacheprovider -p no:hypothesispytest -p no:anyio"
for n in $MPI_SIZES; do
  echo "== MPI tests, mpiexec -n $n"
  timeout 600 "$MPIEXEC" -n "$n" "$PYTHON" -m mpi4py -m pytest -q --with-mpi -m mpi \
      --basetemp="$BASE/mpi$n" --junitxml="$BASE/mpi$n.xml" $MPI_PLUGINS ${PYTEST_ARGS:-} "${MPI_TESTS[@]}"
  rc=$?
  # pytest exits 5 when a size selects no test (e.g. all need more ranks): not a failure.
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
    echo "MPI run with $n ranks failed (exit $rc$([ $rc -eq 124 ] && echo ': timed out'))"; status=1
  fi
done
echo "== suite finished in $(( $(date +%s) - start )) s"
# One closing line for the whole suite (MPI runs counted once, from rank 0's report).
reports=("$BASE/serial.xml"); for n in $MPI_SIZES; do reports+=("$BASE/mpi$n.xml"); done
"$PYTHON" tests/junit_totals.py "${reports[@]}" || status=1
exit $status
