"""Launched by tests/test_feature_store_paths.py under mpiexec with MPIR_CVAR_NUM_CLIQUES=2 (one
host seen as two nodes): checks gathers through RMA Get, the node partition mode and agent ranks.

    python -m mpi4py check_feature_store.py PARTS_DIR MODE AGENT   (MODE: trainer|node, AGENT: 0|1)
"""
import sys

import numpy as np
from mpi4py import MPI

from rudder.feature_store import FeatureStore
from rudder.layout import LayoutError, build_layout
from rudder.partition_store import PartitionMeta, read_features

parts_dir, mode, agent = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
world = MPI.COMM_WORLD
meta = PartitionMeta.load(parts_dir)
try:
    layout = build_layout(meta.num_parts, agent_per_node=agent, partition_mode=mode)
except LayoutError as e:  # every rank reaches it; rank 0 reports, then all leave together
    if world.rank == 0:
        print(f"LayoutError: {e}", flush=True)
    world.Barrier()
    sys.exit(2)
if layout.is_agent:
    print(f"rank {world.rank}: agent on node {layout.node_id}", flush=True)
    sys.exit(0)
truth = np.concatenate([read_features(parts_dir, p, meta) for p in range(meta.num_parts)])
store = FeatureStore(layout, meta, parts_dir)
ids = np.random.default_rng(world.rank).integers(0, meta.num_nodes, size=3000)
rows, stats = store.gather(ids)
assert np.array_equal(rows, truth[ids]), "rows differ from the owner's"
rows, full = store.gather(np.arange(meta.num_nodes))
assert np.array_equal(rows, truth)
on_node = sum(meta.parts[p].num_owned for p in store.views)
assert full.rows_local + full.rows_shared == on_node and full.rows_remote == meta.num_nodes - on_node
assert full.bytes_remote == full.rows_remote * meta.feat_dim * 4
layout.trainers.Barrier()
store.close()
print(f"rank {world.rank}: node {layout.node_id}/{layout.num_nodes} partition {layout.partition_id} "
      f"local {full.rows_local} shared {full.rows_shared} remote {full.rows_remote} owners {full.owners_touched} OK",
      flush=True)
