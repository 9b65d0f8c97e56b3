"""The partition tool's parallel mode under real MPI ranks (pytest-mpi; passes at -n 1, 2 and 4):
the parts written and hashed by the ranks are the serial tool's, bit for bit, and ``verify``
shared between the ranks agrees with the serial one, damaged part included."""
from __future__ import annotations

import json
import os
import shutil

import h5py
import pytest
from conftest import BUNDLED_CORA

from partitioning.graph import InputError
from partitioning.parallel import partition_parallel
from partitioning.partition import partition_graph
from partitioning.sources import load_spec
from partitioning.verify import verify
from rudder.data.partition_store import METADATA_FILE, sha256_file

pytestmark = pytest.mark.mpi

# Generated features live in a scratch file every rank reads its parts' rows from; Cora's are in
# rank 0's memory and travel with the rows. Five parts: rounds of uneven size at 2 and 4 ranks.
SPECS = {"scratch-features": "synthetic:sbm:nodes=900,blocks=3,avg_degree=6,feat_dim=5,seed=4",
         "memory-features": f"planetoid:{BUNDLED_CORA}:cora"}
PARTS = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (parallel dir, serial dir), written by all ranks and by rank 0 alone."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    base = comm.bcast(str(tmp_path_factory.mktemp("parallel")) if comm.rank == 0 else None)
    dirs = {}
    for name, spec in SPECS.items():
        par, ser = f"{base}/{name}-par", f"{base}/{name}-ser"
        partition_parallel(comm, lambda spec=spec: load_spec(spec), PARTS, par, method="metis", source=spec)
        if comm.rank == 0:
            partition_graph(load_spec(spec), PARTS, ser, method="metis", source=spec)
        comm.Barrier()
        dirs[name] = (par, ser)
    return dirs


@pytest.mark.parametrize("name", SPECS)
def test_parallel_parts_are_the_serial_ones(runs, name):
    par, ser = runs[name]
    a, b = (json.load(open(f"{d}/{METADATA_FILE}")) for d in (par, ser))
    assert [p["sha256"] for p in a["parts"]] == [p["sha256"] for p in b["parts"]]
    assert (a["edge_hash"], a["offsets"], a["feature_dtype"]) == (b["edge_hash"], b["offsets"], b["feature_dtype"])
    assert [sha256_file(f"{par}/{p['file']}") for p in a["parts"]] == [p["sha256"] for p in a["parts"]]


def test_parallel_verify_agrees(runs, tmp_path):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    par, ser = runs["scratch-features"]
    assert verify(par, comm) == verify(ser)
    # A damaged part (an edge moved, its checksum resealed) fails with the serial check's one line on every rank.
    bad = comm.bcast(str(tmp_path / "damaged") if comm.rank == 0 else None)
    if comm.rank == 0:
        shutil.copytree(par, bad)
        with h5py.File(f"{bad}/part-00003.h5", "r+") as f:
            idx = f["csr/indices"][()]
            idx[0] = (idx[0] + 1) % 900
            f["csr/indices"][...] = idx
        meta = json.load(open(f"{bad}/{METADATA_FILE}"))
        meta["parts"][3]["sha256"] = sha256_file(f"{bad}/part-00003.h5")
        json.dump(meta, open(f"{bad}/{METADATA_FILE}", "w"))
    comm.Barrier()
    with pytest.raises(InputError) as parallel_error:
        verify(bad, comm)
    with pytest.raises(InputError) as serial_error:
        verify(bad)
    assert str(parallel_error.value) == str(serial_error.value)
    assert "part-00003.h5" in str(parallel_error.value) and "edge checksum" in str(parallel_error.value)
    assert len(set(comm.allgather(str(parallel_error.value)))) == 1


def test_parallel_error_reaches_every_rank(tmp_path):
    """Bad input on rank 0 ends every rank with the same one-line error; nothing is written."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = comm.bcast(str(tmp_path / "never") if comm.rank == 0 else None)
    with pytest.raises(InputError, match="--num-parts"):
        partition_parallel(comm, lambda: load_spec(SPECS["scratch-features"]), 901, out)
    assert not any(comm.allgather(os.path.exists(out)))
