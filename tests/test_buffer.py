"""rudder.buffer's ScoredBuffer equals the plain-Python reference (tests/buffer_reference.py)
minibatch by minibatch on random access traces (hypothesis) and on a recorded Cora trace, in
both the corrected and the reference (compat) modes; plus the spec's float32 threshold quirk
and the lookahead buffer's Belady choice."""
from __future__ import annotations

import numpy as np
import pytest
from buffer_reference import ReferenceBuffer, ReferenceWindow
from hypothesis import given, settings
from hypothesis import strategies as st

from rudder.agent.action import SHARE_SCALE
from rudder.prefetch.buffers import AdmissibleIndex, BufferSettings, eviction_threshold, find_sorted
from rudder.prefetch.policies import Policy
from rudder.prefetch.scored_buffer import ScoredBuffer, most_missed
from rudder.prefetch.window_buffer import WindowBuffer
from rudder.train.config import TrainConfig


def step(buf, nodes, asked, pending=False):
    """One minibatch through the buffer protocol, the policy's verdict being ``asked``; a
    pending replacement's rows (a node's row: its ID) arrive at once."""
    look = buf.lookup(np.asarray(nodes, dtype=np.int64))
    assert (buf.features[look.slots, 0] == look.nodes[look.hit]).all()  # a hit's row is its node's
    rep = buf.replace(look, asked, pending)
    if rep is not None:
        buf.settle(look, rep, rep.inserted.astype(np.float32)[:, None], None, [])
    return look, rep


def replay(trace, triggers, halo, degree, fraction, init, alpha, delta, compat, num_nodes=1000, owned=(0, 10),
           pending=False):
    s = BufferSettings(fraction, init, alpha, delta, compat, "halo")
    ours = ScoredBuffer(s, halo, degree, owned, num_nodes, dim=1, rng=np.random.default_rng(0))
    ref = ReferenceBuffer(ours.ids, halo, alpha, delta, compat)  # the same initial contents
    ours.features[:, 0] = ours.ids
    for nodes, trigger in zip(trace, triggers):
        look, rep = step(ours, nodes, trigger, pending)
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
    st.booleans(), st.booleans()))


@settings(max_examples=150, deadline=None)
@given(traces)
def test_equals_reference_on_random_traces(case):
    """Pending replacements (a shared buffer's) whose rows arrive at once are the same buffer."""
    universe, trace, triggers, init, (alpha, delta), fraction, compat, pending = case
    rng = np.random.default_rng(universe)
    halo = np.sort(rng.choice(np.arange(10, universe + 10), size=universe // 2, replace=False))  # owned: 0..9
    degree = rng.integers(1, 50, size=halo.size)
    trace = [[n + 0 for n in t] for t in trace]  # nodes 0..universe-1: owned, halo and other remote
    replay(trace, triggers, halo, degree, fraction, init, alpha, delta, compat, pending=pending)


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


windows = st.tuples(
    st.lists(st.lists(st.integers(0, 40), unique=True, max_size=14), min_size=1, max_size=30),
    st.integers(0, 12), st.integers(1, 6), st.sampled_from(["halo", "remote"]),
    st.lists(st.integers(0, 29), max_size=3))


@settings(max_examples=200, deadline=None)
@given(windows)
def test_window_buffer_equals_its_definition(case):
    """Buffered rows and their last uses, minibatch by minibatch, against the plain sort of
    buffer and misses; the window shrinks at the trace's end, and at the ``breaks`` minibatches
    the buffer is checkpointed and restored (its window bookkeeping rebuilt) or handed a window
    it has not seen (shifted by one)."""
    trace, capacity, window, scope, breaks = case
    owned, num_nodes = (0, 5), 60
    halo = np.arange(5, 41, 2) if scope == "halo" else np.arange(5, 41)
    arrays = [np.array(t, dtype=np.int64) for t in trace]
    ours = WindowBuffer(capacity, halo, owned, num_nodes, dim=1, scope=scope)
    ours.queue.chunk = 2  # its reads end inside a minibatch's rows, as they do at scale
    admissible = [n for n in range(num_nodes) if not owned[0] <= n < owned[1]] if scope == "remote" else halo
    ref = ReferenceWindow(ours.capacity, admissible, num_nodes)
    for b, nodes in enumerate(arrays):
        future = arrays[b + 1:b + 1 + window]
        if b in breaks and b % 2:  # restored into a new buffer, its rows read again as a resumed run does
            state, ours = ours.state_dict(), WindowBuffer(capacity, halo, owned, num_nodes, dim=1, scope=scope)
            ours.queue.chunk = 2
            ours.load_state_dict(state)
            assert "features" not in state
            read_again(ours)
        elif b in breaks:
            future = [a.copy() for a in arrays[b + 2:b + 2 + window]]  # equal content, new arrays: not the last window
        look = ours.lookup(nodes)
        assert (ours.features[look.slots, 0] == nodes[look.hit]).all()  # a hit's row is its node's
        ours.settle(look, None, None, nodes.astype(np.float32)[:, None], future)
        assert look.hits == ref.step(nodes, future)
        assert dict(zip(ours.ids.tolist(), ours.last_used.tolist())) == ref.slots
        assert ours.occupancy == sum(n < num_nodes for n in ref.slots)


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 700), max_size=80), st.lists(st.integers(0, 2000), max_size=60), st.integers(0, 700))
def test_admissible_index_equals_a_binary_search_of_the_halo(halo, nodes, owned_end):
    halo, nodes = np.array(sorted(halo), dtype=np.int64), np.array(nodes, dtype=np.int64)
    index, ok = AdmissibleIndex(halo, (0, owned_end), 701, "halo").find(nodes)
    pos, found = find_sorted(halo, nodes)
    assert ok.tolist() == found.tolist() and index[ok].tolist() == pos[found].tolist() and not index[~ok].any()
    index, ok = AdmissibleIndex(halo, (0, owned_end), 701, "remote").find(nodes)
    assert ok.tolist() == ((nodes >= owned_end) & (nodes < 701)).tolist() and index[ok].tolist() == nodes[ok].tolist()


class SharedArrays:
    """The arrays of the first buffer built with ``alloc``, handed in the same order to the next
    (what ``rudder.comm.shared_memory.NodeSharedArrays`` does across the trainers of a node)."""

    def __init__(self):
        self.arrays, self.next = [], 0

    def alloc(self, shape, dtype):
        if self.next == len(self.arrays):
            self.arrays.append(np.zeros(shape, dtype=dtype))
        self.next += 1
        return self.arrays[self.next - 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 59), unique=True, max_size=20), st.booleans(),
                          st.one_of(st.none(), st.integers(0, 100))), min_size=1, max_size=60),
       st.sampled_from(["degree", "empty"]), st.booleans(), st.sampled_from(["pool", "quota"]))
def test_two_trainers_sharing_a_buffer_read_only_arrived_rows(ops, init, compat, split):
    """Three trainers share one buffer and take turns (each op: a trainer's minibatch, asking
    for a replacement or not, and with ``quota`` perhaps a new claim); a trainer's pending rows
    arrive only when it next takes a turn, so the others replace and look up around slots still
    awaiting rows. Every hit reads its node's own row, and the buffer holds what its IDs say.
    Split in quotas, a trainer replaces only slots it holds or takes from a trainer above its
    quota while it is below its own, never past its quota nor a donor below theirs."""
    halo, num_nodes = np.arange(10, 50), 60
    s = BufferSettings(0.5, init, 0.3, 2, compat, "halo", split)
    shared = SharedArrays()
    trainers = []
    for t in range(3):
        shared.next = 0
        trainers.append(ScoredBuffer(s, halo, np.arange(40) % 7, (0, 10), num_nodes, 1, np.random.default_rng(0),
                                     alloc=shared.alloc, initialise=t == 0, trainer=t, trainers=3))
    buf = trainers[0]
    buf.features[:, 0] = buf.ids
    if split == "quota":
        assert buf.quotas().tolist() == np.bincount(buf.owner, minlength=3).tolist() == [7, 7, 6]
    waiting = [None] * 3
    for who, nodes, asked, claim in ops:
        b = trainers[who]
        if waiting[who] is not None:
            rep = waiting[who]
            b.settle(None, rep, rep.inserted.astype(np.float32)[:, None], None, [])
            waiting[who] = None
        look = b.lookup(np.array(nodes, dtype=np.int64))
        assert (b.features[look.slots, 0] == np.array(nodes, dtype=np.int64)[look.hit]).all()
        owner = None if buf.owner is None else buf.owner.copy()
        waiting[who] = b.replace(look, asked, pending=True, claim=claim)
        real = np.flatnonzero(buf.ids < num_nodes)
        assert (buf.features[real, 0] == buf.ids[real]).all() and buf.occupancy == real.size
        mapped = buf.slot_of[buf.slot_of >= 0]
        assert (buf.ids[mapped] == halo[buf.slot_of >= 0]).all()  # a mapped slot holds its node, arrived
        if owner is not None and waiting[who] is not None:
            quota, before, after = buf.quotas(), np.bincount(owner, minlength=3), np.bincount(buf.owner, minlength=3)
            taken = waiting[who].slots
            assert (buf.owner[taken] == who).all() and buf.quotas().sum() == buf.capacity
            assert after[who] <= max(before[who], quota[who])
            assert all(after[u] >= min(before[u], quota[u]) for u in range(3) if u != who)
            assert (buf.owner == owner)[np.setdiff1d(np.arange(buf.capacity), taken)].all()
        if buf.owner is not None:
            assert buf.held.tolist() == np.bincount(buf.owner, minlength=3).tolist()


def read_again(buf) -> None:
    """What a resumed run does after restoring a buffer from a checkpoint (which keeps no rows):
    the rows of its ``held_rows`` read from their owners (here each row is its node's ID)."""
    buf.features[:] = -1  # whatever a row not read again holds, a hit on it would fail the checks
    slots, ids = buf.held_rows()
    buf.features[slots, 0] = ids


def node_of_three(split: str) -> list[ScoredBuffer]:
    """Three trainers sharing one buffer (each row: its node's ID), the first one filling it."""
    shared, trainers = SharedArrays(), []
    for t in range(3):
        shared.next = 0
        trainers.append(ScoredBuffer(BufferSettings(0.5, "degree", 0.3, 2, split=split), np.arange(10, 50),
                                     np.arange(40) % 7, (0, 10), 60, 1, np.random.default_rng(0),
                                     alloc=shared.alloc, initialise=t == 0, trainer=t, trainers=3))
    trainers[0].features[:, 0] = trainers[0].ids
    return trainers


def turns(trainers, rng, count, waiting):
    """``count`` minibatches of random trainers (one in three with a new claim); a trainer's
    pending rows arrive when it next takes a turn (``waiting``: its replacement in flight)."""
    for _ in range(count):
        who = int(rng.integers(3))
        b = trainers[who]
        if waiting[who] is not None:
            b.settle(None, waiting[who], waiting[who].inserted.astype(np.float32)[:, None], None, [])
            waiting[who] = None
        look = b.lookup(rng.choice(np.arange(60), size=12, replace=False))
        assert (b.features[look.slots, 0] == look.nodes[look.hit]).all()  # a hit reads its node's row
        claim = int(rng.integers(1, 101)) if rng.random() < 1 / 3 else None
        waiting[who] = b.replace(look, bool(rng.random() < 0.5), pending=True, claim=claim)


@pytest.mark.parametrize("split", ["pool", "quota"])
def test_a_node_shared_buffer_resumes_from_its_first_trainers_state(split):
    """A checkpoint of a node-shared buffer: the node's arrays from its first trainer, each
    trainer's own part from itself. Restored into freshly built trainers, with every row
    arrived, the node goes on exactly as the original; with a replacement still awaiting its
    rows at the snapshot, those slots stay unmatched and every hit still reads its node's row."""
    rng = np.random.default_rng(5)
    original, waiting = node_of_three(split), [None] * 3
    turns(original, rng, 40, waiting)
    for who, rep in enumerate(waiting):  # every row arrives
        if rep is not None:
            original[who].settle(None, rep, rep.inserted.astype(np.float32)[:, None], None, [])
    states = [b.state_dict(node=t == 0) for t, b in enumerate(original)]
    assert "ids" in states[0] and "ids" not in states[1] and ("owner" in states[0]) == (split == "quota")
    assert not any("features" in state for state in states)  # IDs and scores, no rows
    restored = node_of_three(split)
    for b, state in zip(restored, states):
        b.load_state_dict(state)
    read_again(restored[0])
    ops = rng.bit_generator.state
    for node in (original, restored):
        rng.bit_generator.state = ops
        turns(node, rng, 40, [None] * 3)
    for k in (*ScoredBuffer.NODE_STATE, "slot_of"):
        if getattr(original[0], k) is not None:
            np.testing.assert_array_equal(getattr(original[0], k), getattr(restored[0], k), err_msg=k)
    for a, b in zip(original, restored):
        np.testing.assert_array_equal(a.last_evicted, b.last_evicted)
        np.testing.assert_array_equal(a.evicted, b.evicted)
    # a snapshot with trainer 1's replacement in flight: its slots never match after the resume
    original, waiting = node_of_three(split), [None] * 3
    turns(original, rng, 40, waiting)
    while waiting[1] is None or not (original[0].ids[waiting[1].slots] == waiting[1].tokens).any():
        turns(original, rng, 1, waiting)
    states = [b.state_dict(node=t == 0) for t, b in enumerate(original)]
    restored = node_of_three(split)
    for b, state in zip(restored, states):
        b.load_state_dict(state)
    read_again(restored[0])
    awaited = np.flatnonzero(restored[0].ids >= restored[0].pending_base)
    assert awaited.size and not np.isin(awaited, restored[0].slot_of).any()
    turns(restored, rng, 60, [None] * 3)
    real = np.flatnonzero(restored[0].ids < 60)
    assert (restored[0].features[real, 0] == restored[0].ids[real]).all() and restored[0].occupancy == real.size


def test_a_split_buffers_quotas_follow_the_claims():
    """Largest remainders, ties to the lower trainer, equal where nobody claims."""
    shared = SharedArrays()
    buf = ScoredBuffer(BufferSettings(0.5, "degree", 0.3, 2, split="quota"), np.arange(10, 30), np.arange(20), (0, 10), 40, 1,
                       np.random.default_rng(0), alloc=shared.alloc, trainer=0, trainers=3)
    assert buf.capacity == 10
    for claims, quotas in (([100, 100, 100], [4, 3, 3]), ([0, 0, 0], [4, 3, 3]), ([100, 0, 0], [10, 0, 0]),
                           ([50, 25, 25], [5, 3, 2]), ([1, 2, 1], [3, 5, 2])):
        buf.claims[:] = claims
        assert buf.quotas().tolist() == quotas, claims
    # trainer 0 claims everything: its replacement takes every cold slot, the others' too
    held = np.bincount(buf.owner, minlength=3)
    assert held.tolist() == [4, 3, 3]
    cold = np.setdiff1d(np.arange(10, 30), buf.ids)
    for _ in range(3):  # scores decay below the threshold; the cold nodes' misses are counted
        look = buf.lookup(cold)
        buf.replace(look, False, claim=100)
    rep = buf.replace(buf.lookup(cold), True, claim=100)
    assert rep.slots.size == 10 and (buf.owner == 0).all() and set(rep.inserted.tolist()) == set(cold.tolist())
    # a trainer below its quota takes the slots owed to it before its own colder ones, even when a
    # budget of one binds
    node = node_of_three("quota")
    cold = np.setdiff1d(np.arange(10, 50), node[0].ids)
    for _ in range(3):  # every slot cold; trainers 0 and 2 claim little, and trainer 1 misses rows
        for claim, b in zip((1, 100, 1), node):
            b.replace(b.lookup(cold[:4]), False, claim=claim)
    donors = node[0].ids[node[0].owner != 1]
    node[0].replace(node[0].lookup(donors), False)  # hits: the others' slots stay warmer than trainer 1's
    assert node[1].quotas().tolist() == [0, 20, 0] and node[1].held.tolist() == [7, 7, 6]
    rep = node[1].replace(node[1].lookup(cold[:4]), True, budget=1)
    assert rep.slots.size == 1 and np.isin(rep.evicted, donors).all() and node[1].held.tolist() == [6, 8, 6]
    # one trainer a node is split too (its limits then admit the claim that the llm's grammar asks for)
    alone = ScoredBuffer(BufferSettings(0.5, "degree", split="quota"), np.arange(10, 30), np.arange(20), (0, 10), 40, 1,
                         np.random.default_rng(0), trainer=0, trainers=1)
    assert alone.slots_held == alone.capacity == 10 and alone.quotas().tolist() == [10]
    assert Policy(TrainConfig.from_flat({"data": "-", "run_dir": "-"})).action_limits(alone).share == SHARE_SCALE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 1e-39, 2.5e-38, 7.0, 1e30]), max_size=60),
       st.integers(0, 70))
def test_most_missed_is_a_stable_sort_by_count(counts, k):
    """Selecting before sorting (float32 bits as keys, subnormal counts too) gives the first k
    of the stable descending sort of the counts above 0."""
    counts = np.array(counts, dtype=np.float32)
    wanted = np.flatnonzero(counts > 0)
    assert most_missed(counts, k).tolist() == wanted[np.argsort(-counts[wanted], kind="stable")][:k].tolist()
