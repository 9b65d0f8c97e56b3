"""Launched by tests/test_remote_paths.py under mpiexec with MPIR_CVAR_NUM_CLIQUES=2 (one
host seen as two nodes): checks feature gathers and 2-hop sampling through RMA Get, the node
partition mode and agent ranks.

    python -m mpi4py check_remote_paths.py PARTS_DIR MODE AGENT [PARTS_DIR MODE AGENT ...]
                                                              (MODE: trainer|node, AGENT: 0|1)

Each triple is a case, checked one after another in the same launch; a trainer's report line
starts with ``case K:``.
"""
import sys

import numpy as np
from mpi4py import MPI

from rudder.comm.dist_array import DistributedArray
from rudder.comm.layout import LayoutError, build_layout, exposer_table
from rudder.data.adjacency import Adjacency
from rudder.data.feature_store import FeatureStore
from rudder.data.partition_store import PartitionMeta, global_csr, read_features, read_partition
from rudder.sampling.neighbors import NeighborSampler


def check(case: int, parts_dir: str, mode: str, agent: bool) -> None:
    meta = PartitionMeta.load(parts_dir)
    try:
        layout = build_layout(meta.num_parts, agent_per_node=agent, partition_mode=mode)
    except LayoutError as e:  # every rank reaches it; rank 0 reports, then all leave together
        if world.rank == 0:
            print(f"LayoutError: {e}", flush=True)
        world.Barrier()
        sys.exit(2)
    if layout.is_agent:
        print(f"case {case}: rank {world.rank}: agent on node {layout.node_id}", flush=True)
        return
    truth = np.concatenate([read_features(parts_dir, p, meta) for p in range(meta.num_parts)])
    store = FeatureStore(layout, meta, parts_dir)
    ids = np.random.default_rng(world.rank).integers(0, meta.num_nodes, size=3000)
    rows, stats = store.gather(ids)
    assert np.array_equal(rows, truth[ids]), "rows differ from the owner's"
    rows, full = store.gather(np.arange(meta.num_nodes))
    assert np.array_equal(rows, truth)
    on_node = sum(meta.parts[p].num_owned for p in store.views)
    assert full.rows_local + full.rows_shared == on_node and full.rows_remote == meta.num_nodes - on_node
    assert full.bytes_remote == full.rows_remote * meta.feature_encoding.row_bytes  # rows move as stored

    # 2-hop sampling from this trainer's seeds: every destination gets min(in-degree, fanout) true
    # in-neighbours, with adjacency of the other node read by RMA.
    parts = [read_partition(parts_dir, p, meta) for p in range(meta.num_parts)]
    indptr, indices = global_csr(parts)
    adjacency = Adjacency(layout, meta, parts[layout.partition_id], exposer_table(layout, meta.num_parts))
    own = parts[layout.partition_id]
    seeds = own.node_start + np.flatnonzero(own.train_mask)[layout.node_trainers.rank::layout.node_trainers.size]
    mb = NeighborSampler(adjacency, [4, 6], seed=world.rank).sample(seeds)
    src_nodes = mb.input_nodes
    for layer, fanout in zip(mb.layers, [4, 6]):
        dst_nodes = src_nodes[:layer.num_dst]
        degree = indptr[dst_nodes + 1] - indptr[dst_nodes]
        assert np.array_equal(np.bincount(layer.dst, minlength=layer.num_dst), np.minimum(degree, fanout))
        s_, d_ = src_nodes[layer.src], dst_nodes[layer.dst]
        for v in dst_nodes[:100]:
            assert np.isin(s_[d_ == v], indices[indptr[v]:indptr[v + 1]]).all()
        src_nodes = dst_nodes
    assert mb.stats.rows_remote > 0, "the sampler read no remote adjacency"

    # Every way of issuing the Gets reads the same entries (with repeats, in any order): per run,
    # indexed, and by row size; 1-D and 2-D rows; waited for in Flush (spin) or by testing the last
    # Rget of each owner (yield).
    exposer = exposer_table(layout, meta.num_parts)
    rng = np.random.default_rng(100 + world.rank)
    for row_shape in [(), (3,)]:
        sizes = [p.num_in_edges for p in meta.parts]
        truth_rows = [np.arange(n * max(1, int(np.prod(row_shape))), dtype=np.int64).reshape((n, *row_shape)) + 10**6 * p
                      for p, n in enumerate(sizes)]
        for gets, wait in (("runs", "spin"), ("indexed", "spin"), ("auto", "spin"), ("runs", "yield"), ("indexed", "yield")):
            arr = DistributedArray(layout.trainers, sizes, exposer, layout.partition_id, np.int64, row_shape,
                                   fill=lambda own, rows=truth_rows: own.__setitem__(slice(None), rows[layout.partition_id]),
                                   gets=gets, wait=wait)
            want_parts = rng.integers(0, meta.num_parts, size=2000)
            want_index = (rng.random(2000) * np.asarray(sizes)[want_parts]).astype(np.int64)
            want_index[::7] = want_index[0] if sizes[want_parts[0]] else 0  # repeats
            want_parts[::7] = want_parts[0]
            got, s = arr.read(want_parts, want_index)
            expect = np.stack([truth_rows[p][i] for p, i in zip(want_parts, want_index)])
            assert np.array_equal(got, expect), f"gets={gets} wait={wait} row_shape={row_shape}: wrong rows"
            assert s.rows_remote == int(np.isin(want_parts, [p for p in range(meta.num_parts) if p not in arr.views]).sum())
            arr.close()
    adjacency.close()
    store.close()
    print(f"case {case}: rank {world.rank}: node {layout.node_id}/{layout.num_nodes} partition {layout.partition_id} "
          f"local {full.rows_local} shared {full.rows_shared} remote {full.rows_remote} owners {full.owners_touched} OK",
          flush=True)


world = MPI.COMM_WORLD
cases = sys.argv[1:]
if not cases or len(cases) % 3:
    sys.exit("usage: check_remote_paths.py PARTS_DIR MODE AGENT [PARTS_DIR MODE AGENT ...]")
for k in range(len(cases) // 3):
    check(k, cases[3 * k], cases[3 * k + 1], cases[3 * k + 2] == "1")
    world.Barrier()  # one case's Gets and windows done everywhere before the next's
