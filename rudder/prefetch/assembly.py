"""A minibatch's input feature matrix, with or without a buffer, behind one interface:
``assemble(input_nodes, future) -> (x, AssemblyStats)``, and ``release_idle()`` to give back the
input matrices no minibatch holds.

``UncachedFeatures`` reads every row from the feature store. ``CachedFeatures`` wraps the store
the way GraphBolt's ``CPUCachedFeature`` wraps a ``Feature``: it drives a buffer through its
protocol (``rudder.prefetch.buffers``): look the input nodes up, let the policy decide, replace,
then fetch everything else, the refills of a replacement included, in ONE request to the store
(own and same-node rows by shared memory, the rest by RMA), copy the hits, and settle. The result
is bit-identical to a plain gather whatever the policy; the stats are the per-minibatch metrics
(spec 1.10) plus timings.

The store moves rows in their stored type (bits, uint8, float16, ...) and hands them over
widened to float32, so buffers hold widened rows: a hit is a plain copy (no decode on every
minibatch), the buffers and the node-shared buffer stay type-free, and a buffer's capacity is
in rows (``--buffer-fraction`` of the halo), so compact slots would save memory but not hold
more rows without changing the remote-row counts the policies are compared on.

A buffer that fetches no row of its own (the window buffer) keeps no copy of rows the store
reads from shared memory: a hit on one is read from the store with the misses, uncounted.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from rudder.comm import gate
from rudder.comm.dist_array import ReadStats, take_rows
from rudder.data.row_blocks import RowBlocks
from rudder.logs import metrics
from rudder.prefetch.buffers import BufferSettings, PrefetchBuffer, find_sorted
from rudder.prefetch.observation import MinibatchView
from rudder.prefetch.policies import ASKERS, Policy


@dataclass
class AssemblyStats:
    fetch: ReadStats  # everything this minibatch read from the store (misses + refills)
    hits: int = 0
    misses: int = 0  # admissible (cacheable) inputs not in the buffer
    refills: int = 0  # rows a replacement fetched into the buffer (extra traffic)
    evictions: int = 0  # rows that entered the buffer (and as many left)
    candidates: int = 0  # eviction candidates when the policy decided
    refetched: int = 0  # misses that the last replacement had evicted
    replaced: bool = False  # a replacement was asked for on this minibatch
    asked_by: int = 0  # who asked (rudder.prefetch.policies.ASKERS)
    occupancy: int = 0  # buffer slots holding a real row, after this minibatch
    hit_total: int = 0  # cumulative since the start (spec 1.10)
    miss_total: int = 0
    t_lookup: float = 0.0  # lookup and the policy's decision
    t_replace: float = 0.0  # the buffer's bookkeeping, replacement and settling
    t_gather: float = 0.0  # the store's read and the hits' copy
    refill_budget: int = -1  # most slots the replacement could take (-1: no bound, or none asked for)
    lookahead_window: int = 0  # minibatches ahead the buffer ranked by
    decision: tuple[int, int, int] = (-1, -1, 0)  # an agent decision that arrived here: request, age, fallback code
    slots_held: int = -1  # slots of a split node buffer this trainer holds (-1: no split)

    @property
    def comm_volume(self) -> int:
        return metrics.comm_volume(self.misses, self.refills)

    @property
    def hit_percent(self) -> int:
        return metrics.paper_hit_percent(self.hit_total, self.miss_total)


class UncachedFeatures:
    """Every input row from the store (``--policy none``)."""

    buffer = None

    def __init__(self, store, in_flight: int = 1):
        self.store, self.counter = store, 0
        self.blocks = RowBlocks(store.dim, in_flight)

    def fill(self) -> ReadStats:
        return ReadStats()

    def assemble(self, input_nodes: np.ndarray, future: list[np.ndarray] = ()) -> tuple[np.ndarray, AssemblyStats]:
        t = time.perf_counter()
        x, fetch = self.store.gather(input_nodes, out=self.blocks.take(input_nodes.size))
        self.counter += 1
        return x, AssemblyStats(fetch, t_gather=time.perf_counter() - t)

    def release_idle(self) -> None:
        """Give back the input matrices nothing refers to (before an evaluation)."""
        self.blocks.release_idle()

    def state_dict(self) -> dict:
        return {"counter": self.counter}

    def load_state_dict(self, state: dict) -> None:
        self.counter = state["counter"]


class CachedFeatures:
    def __init__(self, store, buffer: PrefetchBuffer, policy: Policy, compat: bool = False, shared=None,
                 in_flight: int = 1):
        """``compat``: fetch refills and misses as the reference does (a refill that is also a miss
        twice); ``shared``: a ``NodeSharedArrays`` when the node's trainers share this buffer;
        ``in_flight``: the input matrices a run holds at once (``RowBlocks``)."""
        self.store, self.buffer, self.policy, self.compat, self.shared = store, buffer, policy, compat, shared
        self.blocks = RowBlocks(store.dim, in_flight)
        self.counter = self.hit_total = self.miss_total = 0
        self.lock = shared.lock if shared is not None else contextlib.nullcontext
        self.init_stats = ReadStats()
        if buffer.leaves_rows_to_store and shared is None:
            # on one node every row is in shared memory, where a buffer's copy of it saves nothing
            # and costs a copy per admitted row (docs/results-buffer-cost.md)
            buffer.store_rows = store.in_shared_memory(buffer.index.node_of(np.arange(buffer.index.size)))

    def release_idle(self) -> None:
        """Give back the input matrices nothing refers to (before an evaluation)."""
        self.blocks.release_idle()

    def fill(self) -> ReadStats:
        """The buffer's rows in one request: the initial fill, or after ``load_state_dict`` the
        checkpointed buffer's, fetched again from their owners (by one trainer of a node when they
        share the buffer, collective over them then)."""
        if self.shared is None or self.shared.comm.rank == 0:
            slots, ids = self.buffer.held_rows()
            rows, self.init_stats = self.store.gather(ids)
            self.buffer.features[slots] = rows
        if self.shared is not None:
            gate.collective(self.shared.comm, self.shared.comm.Barrier)
        return self.init_stats

    def state_dict(self) -> dict:
        """A node-shared buffer's arrays are kept by the node's first trainer, copied under the
        node's lock (no other trainer's replacement half done; slots still awaiting another
        trainer's rows stay unmatched after a resume, until replaced); every trainer keeps its own part."""
        with self.lock():
            buffer = self.buffer.state_dict(node=self.shared is None or self.shared.comm.rank == 0)
        return {"counter": self.counter, "hit_total": self.hit_total, "miss_total": self.miss_total, "buffer": buffer}

    def load_state_dict(self, state: dict) -> None:
        """Collective over the node's trainers when they share the buffer; the rows follow by ``fill``."""
        self.counter, self.hit_total, self.miss_total = state["counter"], state["hit_total"], state["miss_total"]
        self.buffer.load_state_dict(state["buffer"])
        if self.shared is not None:
            gate.collective(self.shared.comm, self.shared.comm.Barrier)  # the node's arrays are back before any trainer looks up

    def assemble(self, nodes: np.ndarray, future: list[np.ndarray] = ()) -> tuple[np.ndarray, AssemblyStats]:
        """Feature rows of ``nodes`` (unique global IDs); ``future``: the next minibatches' input
        nodes, nearest first (what a lookahead buffer ranks by)."""
        buf, shared = self.buffer, self.shared is not None
        t0 = time.perf_counter()
        with self.lock():  # a shared buffer: the hits are copied before anyone changes a slot
            look = buf.lookup(nodes)
            hits = look.hits
            view = MinibatchView(self.counter, hits, look.misses, look.candidates,
                                 metrics.paper_hit_percent(self.hit_total + hits, self.miss_total + look.misses),
                                 look.refetched)
            asked = bool(self.policy.wants_replacement(view))
            budget = self.policy.refill_budget() if asked else None
            t1 = time.perf_counter()
            rep = buf.replace(look, asked, pending=shared, budget=budget, claim=self.policy.capacity_claim())
            refill_ids = rep.inserted if rep is not None else np.zeros(0, dtype=np.int64)
            # a row per input node, and past them room for the refills that are not inputs
            rows = self.blocks.take(nodes.size + refill_ids.size)
            x = rows[:nodes.size]
            if shared:
                take_rows(buf.features, look.slots, x, np.flatnonzero(look.hit))
        t2 = time.perf_counter()
        hit_at, hit_slots, read = np.flatnonzero(look.hit), look.slots, ~look.hit
        left = 0
        if buf.store_rows is not None:  # hits whose rows the buffer left to the store are read with the misses
            by_store = buf.store_rows[look.hit_index]
            read[hit_at[by_store]] = True
            hit_at, hit_slots, left = hit_at[~by_store], hit_slots[~by_store], int(np.count_nonzero(by_store))
        read_at = np.flatnonzero(read)
        refill_rows = None
        # a buffer of this trainer's own: its hits are copied while the Gets are in flight, after
        # the store's own copies (so the fetch may spare their rows) and before settling changes a slot
        copy_hits = None if shared else (lambda: take_rows(buf.features, hit_slots, x, hit_at))
        if refill_ids.size == 0:  # the common case: misses land straight in their rows of x
            _, fetch = self.store.gather(nodes[read_at], out=x, at=read_at, spare=not shared, while_fetching=copy_hits)
        else:  # one request for misses and refills, each row fetched straight to where it goes
            request, at, refill_at = self._request(nodes, read_at, refill_ids)
            _, fetch = self.store.gather(request, out=rows, at=at, spare=not shared, while_fetching=copy_hits)
            refill_rows = rows[refill_at]
        fetch.rows_shared -= left  # hits all the same: read from a same-node peer, not fetched
        t3 = time.perf_counter()
        window = min(len(future), self.policy.lookahead_now())  # the policy's window for this minibatch
        with (self.lock() if rep is not None else contextlib.nullcontext()):
            entered = buf.settle(look, rep, refill_rows, x, list(future)[:window])
        refills = int(rep.slots.size) if rep is not None else 0
        view.rows_rma, view.bytes_rma, view.fetch_seconds = fetch.rows_remote, fetch.bytes_remote, fetch.seconds_remote
        view.headroom = buf.capacity - buf.occupancy
        self.policy.observe(view, refills)
        self.counter += 1
        self.hit_total += hits
        self.miss_total += look.misses
        return x, AssemblyStats(fetch, hits, look.misses, refills, entered, look.candidates, look.refetched, asked,
                                ASKERS[self.policy.asker] if asked else 0, buf.occupancy, self.hit_total,
                                self.miss_total, t1 - t0, t2 - t1 + time.perf_counter() - t3, t3 - t2,
                                -1 if budget is None else int(budget), window, self.policy.arrived_decision(),
                                buf.slots_held)

    def _request(self, nodes: np.ndarray, miss_at: np.ndarray, refill_ids: np.ndarray):
        """(IDs to read, the output row each goes to, the output row of each refill) for the
        misses (rows ``miss_at`` of x) and a replacement's refills (rows past the inputs; a refill
        that is also a miss is read once into x, unless ``compat``: the reference reads refills,
        then misses, such a row twice)."""
        n, missed = nodes.size, nodes[miss_at]
        if self.compat:
            tail = n + np.arange(refill_ids.size)
            return np.concatenate([refill_ids, missed]), np.concatenate([tail, miss_at]), tail
        order = np.argsort(missed, kind="stable")
        pos, is_miss = find_sorted(missed[order], refill_ids)
        refill_at = np.empty(refill_ids.size, dtype=np.int64)
        refill_at[is_miss] = miss_at[order[pos[is_miss]]]
        refill_at[~is_miss] = n + np.arange(np.count_nonzero(~is_miss))
        return np.concatenate([missed, refill_ids[~is_miss]]), np.concatenate([miss_at, refill_at[~is_miss]]), refill_at


def feature_source(store, policy: Policy, settings: BufferSettings, partition, num_nodes: int, rng: np.random.Generator,
                   shared=None, ranking=None, in_flight: int = 1) -> UncachedFeatures | CachedFeatures:
    """The store itself, or the store behind the buffer ``policy`` asks for (``buffer_class``);
    ``ranking``: what a ``--buffer-init vip`` fill ranks by (``rudder.prefetch.vip.fill_ranking``);
    ``in_flight``: the input matrices a run holds at once (``rudder.prefetch.pipeline.matrices_in_flight``;
    1: each minibatch assembled once the one before is done with)."""
    if policy.buffer_class is None:
        return UncachedFeatures(store, in_flight)
    buffer = policy.buffer_class.build(settings, partition, num_nodes, store.dim, rng, shared, ranking)
    return CachedFeatures(store, buffer, policy, settings.compat, shared, in_flight)
