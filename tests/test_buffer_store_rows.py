"""A buffer that leaves shared-memory rows to the store (the window buffer on one node) gives
the same rows and the same counts as one that copies every row."""
import types

import numpy as np
import pytest

from rudder.comm.dist_array import DistributedArray
from rudder.prefetch.assembly import CachedFeatures, UncachedFeatures
from rudder.prefetch.buffers import BufferSettings
from rudder.prefetch.policies import Lookahead
from rudder.prefetch.window_buffer import WindowBuffer

PART, DIM = 500, 8


class Store:
    """Four partitions of PART rows in memory; ``shared`` says which the store claims to read
    from shared memory (the reads themselves are the same copies either way)."""

    def __init__(self, shared: set[int]):
        rng = np.random.default_rng(1)
        self.dim, self.shared, self.offsets = DIM, shared, np.arange(5, dtype=np.int64) * PART
        tables = [rng.standard_normal((PART, DIM), dtype=np.float32) for _ in range(4)]
        self.rows = types.SimpleNamespace(row_shape=(DIM,), dtype=np.dtype(np.float32), exposer=np.arange(4),
                                          own_part=0, own=tables[0], views=dict(enumerate(tables)))

    def in_shared_memory(self, gids):
        return np.isin(np.asarray(gids) // PART, list(self.shared))

    def gather(self, gids, out=None, at=None, spare=False, while_fetching=None):
        gids = np.asarray(gids, dtype=np.int64)
        parts = gids // PART
        return DistributedArray.read(self.rows, parts, gids - self.offsets[parts], out, at, spare, while_fetching)


@pytest.mark.parametrize("shared", [set(), {1}, {1, 2, 3}])
def test_rows_left_to_the_store_change_nothing_but_copies(shared):
    rng = np.random.default_rng(0)
    halo = np.sort(rng.choice(np.arange(PART, 4 * PART), size=900, replace=False))
    part = types.SimpleNamespace(halo_nodes=halo, halo_in_degree=np.ones(halo.size, np.int64), node_start=0,
                                 node_end=PART)
    trace = [rng.choice(4 * PART, size=300, replace=False) for _ in range(30)]
    settings = BufferSettings(fraction=0.25)

    def cached(store):
        policy = Lookahead(types.SimpleNamespace(buffer=types.SimpleNamespace(lookahead=4)))
        return CachedFeatures(store, WindowBuffer.build(settings, part, 4 * PART, DIM, rng), policy, False)

    copying, leaving, plain = cached(Store(set())), cached(Store(shared)), UncachedFeatures(Store(set()))
    assert leaving.buffer.store_rows is not None and leaving.buffer.store_rows.sum() == \
        np.isin(halo // PART, list(shared)).sum()
    for i, nodes in enumerate(trace):
        future = trace[i + 1:i + 5]
        (xc, sc), (xl, sl), (xp, _) = copying.assemble(nodes, future), leaving.assemble(nodes, future), \
            plain.assemble(nodes, future)
        assert xl.tobytes() == xc.tobytes() == xp.tobytes()
        assert (sl.hits, sl.misses, sl.evictions, vars(sl.fetch)) == (sc.hits, sc.misses, sc.evictions, vars(sc.fetch))
    assert copying.hit_total > 0

