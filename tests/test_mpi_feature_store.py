"""The RMA feature store under real MPI ranks: every gather returns exactly the owner's rows,
whatever the IDs (random, repeated, empty, all), at any process count, through every path
(own segment, same-node shared memory, RMA Get), in every storage type (float rows of this
graph stored lossily in the compact ones: the store must give back the stored values widened)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import partition_on_rank0

pytestmark = pytest.mark.mpi

SPEC = "synthetic:sbm:nodes=3000,blocks=5,avg_degree=6,feat_dim=24,seed=4"


@pytest.fixture(scope="module", params=["float32", "float16", "bfloat16", "uint8", "bits"])
def parts_dir(tmp_path_factory, request):
    return partition_on_rank0(tmp_path_factory, SPEC, "fs", method="random", seed=1, feature_dtype=request.param)


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
        # into chosen rows of a bigger matrix: a contiguous range, and scattered rows (the others kept)
        for at in (np.arange(3, 9), np.array([0, 2, 3, 7, 8, 11])):
            out = np.full((12, meta.feat_dim), -7.0, np.float32)
            ids = rng.integers(0, meta.num_nodes, size=at.size)
            store.gather(ids, out=out, at=at)
            np.testing.assert_array_equal(out[at], truth[ids])
            others = np.setdiff1d(np.arange(12), at)
            assert (out[others] == -7.0).all()
        assert stats.bytes_remote == stats.rows_remote * meta.feature_encoding.row_bytes
    finally:
        comm.Barrier()  # nobody frees the window while a peer may still read it
        store.close()
