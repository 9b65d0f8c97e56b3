"""Partitions under real MPI ranks: each rank reads only its own partition file, and the ranks
together reproduce the whole graph. Passes at any process count (one partition per rank)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA, partition_on_rank0

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    """The bundled Cora in one METIS part per rank."""
    return partition_on_rank0(tmp_path_factory, f"planetoid:{BUNDLED_CORA}:cora", "cora")


def test_each_rank_reads_its_partition(partitioned):
    from mpi4py import MPI

    from partitioning.sources import load_spec
    from rudder.data.partition_store import PartitionMeta, read_features, read_partition

    comm = MPI.COMM_WORLD
    meta = PartitionMeta.load(partitioned)
    part = read_partition(partitioned, comm.rank, meta)
    feats = read_features(partitioned, comm.rank, meta)
    assert (part.node_start, part.node_end) == (meta.offsets[comm.rank], meta.offsets[comm.rank + 1])

    # Together the ranks own every node once, and every edge once.
    owned = comm.allgather(part.orig_ids)
    assert np.array_equal(np.sort(np.concatenate(owned)), np.arange(meta.num_nodes))
    assert comm.allreduce(part.indices.size) == meta.num_edges == 10556

    # Each rank's rows and edges are exactly the input's, mapped through orig_ids.
    graph = load_spec(f"planetoid:{BUNDLED_CORA}:cora")
    np.testing.assert_array_equal(feats, graph.features[part.orig_ids])
    np.testing.assert_array_equal(part.labels, graph.labels[part.orig_ids])
    orig_of_new = np.concatenate(owned)
    for local, v in enumerate(part.orig_ids):
        srcs = orig_of_new[part.indices[part.indptr[local]:part.indptr[local + 1]]]
        np.testing.assert_array_equal(np.sort(srcs), graph.src[graph.dst == v])

    # The halo a rank records is owned by the ranks it names, which agree they own those rows.
    for owner in range(comm.size):
        wanted = part.halo_nodes[part.halo_owners == owner]
        ranges = comm.allgather((part.node_start, part.node_end))
        assert owner != comm.rank or wanted.size == 0
        lo, hi = ranges[owner]
        assert ((wanted >= lo) & (wanted < hi)).all()
