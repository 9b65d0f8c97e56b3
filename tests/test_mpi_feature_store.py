"""The RMA feature store under real MPI ranks: every gather returns exactly the owner's rows,
whatever the IDs (random, repeated, empty, all), at any process count, through every path
(own segment, same-node shared memory, RMA Get)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import partition_on_rank0

pytestmark = pytest.mark.mpi

SPEC = "synthetic:sbm:nodes=3000,blocks=5,avg_degree=6,feat_dim=24,seed=4"


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory):
    return partition_on_rank0(tmp_path_factory, SPEC, "fs", method="random", seed=1)


def expected_rows(parts_dir):
    """Features in new-ID order, read straight from the files (the store is not involved)."""
    from rudder.data.partition_store import PartitionMeta, read_features

    meta = PartitionMeta.load(parts_dir)
    return meta, np.concatenate([read_features(parts_dir, p, meta) for p in range(meta.num_parts)])


def test_gather_equals_owner_rows(parts_dir):
    from mpi4py import MPI

    from rudder.comm.layout import build_layout
    from rudder.data.feature_store import FeatureStore

    comm = MPI.COMM_WORLD
    meta, truth = expected_rows(parts_dir)
    layout = build_layout(meta.num_parts)
    store = FeatureStore(layout, meta, parts_dir)
    try:
        rng = np.random.default_rng(100 + comm.rank)
        for size in (0, 1, 17, 500, 2000):
            ids = rng.integers(0, meta.num_nodes, size=size)
            rows, stats = store.gather(ids)
            np.testing.assert_array_equal(rows, truth[ids])
            assert stats.rows_local + stats.rows_shared + stats.rows_remote == size
        everything = np.arange(meta.num_nodes)[::-1].copy()
        rows, stats = store.gather(everything)
        np.testing.assert_array_equal(rows, truth[everything])
        owned = meta.parts[layout.partition_id].num_owned
        assert stats.rows_local == owned
        # On one host every peer is on-node: shared memory, no RMA traffic.
        assert stats.rows_shared == meta.num_nodes - owned and stats.rows_remote == 0
        out = np.zeros((3, meta.feat_dim), np.float32)
        store.gather(np.array([5, 5, 0]), out=out)
        np.testing.assert_array_equal(out, truth[[5, 5, 0]])
    finally:
        comm.Barrier()  # nobody frees the window while a peer may still read it
        store.close()
