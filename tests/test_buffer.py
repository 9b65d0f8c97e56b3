"""rudder.buffer's ScoredBuffer equals the plain-Python reference (tests/buffer_reference.py)
minibatch by minibatch on random access traces (hypothesis) and on a recorded Cora trace, in
both the corrected and the reference (compat) modes; plus the spec's float32 threshold quirk
and the lookahead buffer's Belady choice."""
from __future__ import annotations

import numpy as np
from buffer_reference import ReferenceBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from rudder.prefetch.buffers import BufferSettings, eviction_threshold
from rudder.prefetch.scored_buffer import ScoredBuffer
from rudder.prefetch.window_buffer import WindowBuffer


def step(buf, nodes, asked):
    """One minibatch through the buffer protocol, the policy's verdict being ``asked``."""
    look = buf.lookup(np.asarray(nodes, dtype=np.int64))
    return look, buf.replace(look, asked)


def replay(trace, triggers, halo, degree, fraction, init, alpha, delta, compat, num_nodes=1000, owned=(0, 10)):
    s = BufferSettings(fraction, init, alpha, delta, compat, "halo")
    ours = ScoredBuffer(s, halo, degree, owned, num_nodes, dim=1, rng=np.random.default_rng(0))
    ref = ReferenceBuffer(ours.ids, halo, alpha, delta, compat)  # the same initial contents
    for nodes, trigger in zip(trace, triggers):
        look, rep = step(ours, nodes, trigger)
        hits, misses, evicted, inserted = ref.step(nodes, trigger)
        assert (look.hits, look.misses) == (hits, misses)
        if rep is not None:
            assert rep.evicted.tolist() == evicted and rep.inserted.tolist() == inserted
        ref_slots, ref_counts = ref.state()
        order = np.argsort(ours.ids)
        assert list(zip(ours.ids[order].tolist(), ours.score[order].astype(float).tolist())) == ref_slots
        assert {int(h): float(c) for h, c in zip(ours.halo, ours.miss_count)} == ref_counts


traces = st.integers(10, 60).flatmap(lambda universe: st.tuples(
    st.just(universe),
    st.lists(st.lists(st.integers(0, universe - 1), unique=True, max_size=25), min_size=1, max_size=40),
    st.lists(st.booleans(), min_size=40, max_size=40),
    st.sampled_from(["degree", "random", "empty"]),
    st.sampled_from([(0.05, 1), (0.05, 2), (0.005, 32), (0.3, 3)]),
    st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    st.booleans()))


@settings(max_examples=150, deadline=None)
@given(traces)
def test_equals_reference_on_random_traces(case):
    universe, trace, triggers, init, (alpha, delta), fraction, compat = case
    rng = np.random.default_rng(universe)
    halo = np.sort(rng.choice(np.arange(10, universe + 10), size=universe // 2, replace=False))  # owned: 0..9
    degree = rng.integers(1, 50, size=halo.size)
    trace = [[n + 0 for n in t] for t in trace]  # nodes 0..universe-1: owned, halo and other remote
    replay(trace, triggers, halo, degree, fraction, init, alpha, delta, compat)


def test_equals_reference_on_a_recorded_cora_trace(tmp_path):
    """Input nodes of real sampled minibatches (Cora, 4 parts, partition 0's view)."""
    import torch
    from conftest import BUNDLED_CORA

    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec
    from rudder.data.dgl_bridge import load_dgl
    from rudder.data.partition_store import PartitionMeta, global_csr, read_partition

    out = str(tmp_path / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, out, method="metis", seed=0)
    meta = PartitionMeta.load(out)
    parts = [read_partition(out, p, meta) for p in range(4)]
    indptr, indices = global_csr(parts)
    dgl = load_dgl()
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.tensor([], dtype=torch.int64))))
    dgl.seed(0)
    sampler = dgl.dataloading.NeighborSampler([10, 25])
    p0 = parts[0]
    train = p0.node_start + np.flatnonzero(p0.train_mask | p0.val_mask)  # more minibatches
    rng = np.random.default_rng(1)
    trace = []
    for _ in range(6):
        order = rng.permutation(train)
        for lo in range(0, order.size, 16):
            input_nodes, _, _ = sampler.sample_blocks(g, torch.from_numpy(order[lo:lo + 16]))
            trace.append(input_nodes.numpy())
    triggers = [i % 3 == 0 for i in range(len(trace))]
    for compat in (False, True):
        replay(trace, triggers, p0.halo_nodes, p0.halo_in_degree, 0.25, "degree", 0.05, 2, compat,
               num_nodes=meta.num_nodes, owned=(p0.node_start, p0.node_end))


def test_float32_threshold_quirk():
    """alpha 0.05, delta 1: T = 0.95f and one miss gives 0.95f, not below T (spec 1.5)."""
    assert eviction_threshold(0.05, 1) == np.float32(0.95) and eviction_threshold(0.05, 25) == np.float32(0.277)
    s = BufferSettings(1.0, "degree", 0.05, 1, False, "halo")
    buf = ScoredBuffer(s, np.array([5, 6]), np.array([1, 1]), (0, 5), 10, 1, np.random.default_rng(0))
    buf.lookup(np.array([0]))
    assert buf.eviction_candidates().size == 0  # one minibatch without a hit: not yet
    buf.lookup(np.array([0]))
    assert buf.eviction_candidates().size == 2  # two: both slots


def test_compat_quirk_makes_empty_init_stick():
    """Rudder's example config (empty init, delta 1, a trigger every minibatch): once the
    sentinels are eviction candidates (minibatch 2 on), the reference quirk stops all miss
    counting, so rows first needed later are never inserted; corrected, they are."""
    halo = np.arange(10, 20)
    occupancy = {}
    for compat in (True, False):
        s = BufferSettings(0.5, "empty", 0.05, 1, compat, "halo")
        buf = ScoredBuffer(s, halo, np.ones(10), (0, 10), 100, 1, np.random.default_rng(0))
        for i in range(10):
            step(buf, [11] if i == 0 else [12, 13], True)
        occupancy[compat] = sorted(buf.ids[buf.ids < 100].tolist())
    assert occupancy == {True: [11], False: [11, 12, 13]}


def test_window_buffer_keeps_the_rows_needed_soonest():
    buf = WindowBuffer(2, halo=np.arange(10, 20), owned=(0, 10), num_nodes=100, dim=1, scope="halo")
    rows = lambda ids: np.asarray(ids, np.float32)[:, None]  # noqa: E731
    nodes = np.array([11, 12, 13, 3])
    look = buf.lookup(nodes)
    assert not look.hit.any() and look.misses == 3  # 3 is this partition's own: not cacheable
    assert buf.settle(look, None, None, rows(nodes), [np.array([13]), np.array([12, 11])]) == 2
    assert sorted(buf.ids.tolist()) == [11, 13]  # 13 next, then 11 or 12 (tie: lower ID); 3 is local
    look = buf.lookup(np.array([13, 14]))
    assert look.hit.tolist() == [True, False] and buf.features[look.slots, 0].tolist() == [13.0]
