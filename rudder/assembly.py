"""Feature assembly: the input feature matrix of a sampled minibatch, with or without a buffer.

One call per minibatch: look the input nodes up in the buffer (hits are copied from it), ask
the policy whether to replace now, and fetch everything else, the refills of a replacement
included, in ONE request to the feature store (own and same-node rows by shared memory, the
rest by RMA). The result is bit-identical to a plain gather, whatever the policy; the stats are
the per-minibatch metrics of spec 1.10 plus timings.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from rudder.buffer import BufferSettings, ScoredBuffer, WindowBuffer
from rudder.dist_array import ReadStats, take_rows
from rudder.policies import ASKERS, MinibatchView, Policy


@dataclass
class AssemblyStats:
    fetch: ReadStats  # everything this minibatch read from the store (misses + refills)
    hits: int = 0
    misses: int = 0  # admissible (cacheable) inputs not in the buffer
    refills: int = 0  # rows fetched into the buffer by a replacement (or admitted by lookahead)
    evictions: int = 0
    candidates: int = 0  # eviction candidates when a replacement was asked for
    refetched: int = 0  # misses that the last replacement had evicted
    replaced: bool = False  # a replacement was asked for on this minibatch
    asked_by: int = 0  # who asked (rudder.policies.ASKERS)
    occupancy: int = 0  # buffer slots holding a real row, after this minibatch
    hit_total: int = 0  # cumulative since the start (spec 1.10)
    miss_total: int = 0
    t_lookup: float = 0.0
    t_replace: float = 0.0
    t_fetch: float = 0.0

    @property
    def comm_volume(self) -> int:
        """The paper's communication volume: admissible misses plus refills."""
        return self.misses + self.refills

    @property
    def hit_percent(self) -> int:
        """Cumulative %-hits as the paper reports it (an integer)."""
        total = self.hit_total + self.miss_total
        return int(round(100 * self.hit_total / total)) if total else 0


class FeatureAssembler:
    def __init__(self, store, policy: Policy, settings: BufferSettings | None, partition, num_nodes: int,
                 rng: np.random.Generator, shared=None):
        """``shared``: a ``NodeSharedArrays`` when the node's trainers share one scored buffer."""
        self.store, self.policy, self.settings, self.shared = store, policy, settings, shared
        owned = (partition.node_start, partition.node_end)
        self.buffer = None
        self.counter = 0
        self.hit_total = self.miss_total = 0
        self.lock = shared.lock if shared is not None else contextlib.nullcontext
        if policy.buffer_kind == "scored":
            extra = {"alloc": shared.alloc, "initialise": shared.comm.rank == 0} if shared is not None else {}
            self.buffer = ScoredBuffer(settings, partition.halo_nodes, partition.halo_in_degree, owned, num_nodes,
                                       store.dim, rng, **extra)
        elif policy.buffer_kind == "window":
            capacity = int(np.floor(settings.fraction * partition.halo_nodes.size))
            self.buffer = WindowBuffer(capacity, partition.halo_nodes, owned, num_nodes, store.dim, settings.scope)
        self.init_stats = ReadStats()

    def fill(self) -> ReadStats:
        """The initial bulk fetch of a scored buffer (one request; by one trainer of a node
        when they share the buffer, collective over them then)."""
        if isinstance(self.buffer, ScoredBuffer) and (self.shared is None or self.shared.comm.rank == 0):
            slots, ids = self.buffer.initial_rows()
            rows, self.init_stats = self.store.gather(ids)
            self.buffer.features[slots] = rows
        if self.shared is not None:
            self.shared.comm.Barrier()
        return self.init_stats

    def state_dict(self) -> dict:
        return {"counter": self.counter, "hit_total": self.hit_total, "miss_total": self.miss_total,
                "buffer": self.buffer.state_dict() if self.buffer is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.counter, self.hit_total, self.miss_total = state["counter"], state["hit_total"], state["miss_total"]
        if self.buffer is not None:
            self.buffer.load_state_dict(state["buffer"])

    def assemble(self, input_nodes: np.ndarray, future: list[np.ndarray] = ()) -> tuple[np.ndarray, AssemblyStats]:
        """Feature rows of ``input_nodes`` (unique global IDs); ``future``: the next minibatches'
        input nodes, nearest first (used by a lookahead policy)."""
        if self.buffer is None:
            t = time.perf_counter()
            x, fetch = self.store.gather(input_nodes)
            self.counter += 1
            return x, AssemblyStats(fetch, t_fetch=time.perf_counter() - t)
        if isinstance(self.buffer, WindowBuffer):
            return self._assemble_window(input_nodes, future)
        return self._assemble_scored(input_nodes)

    def _assemble_scored(self, nodes: np.ndarray) -> tuple[np.ndarray, AssemblyStats]:
        buf = self.buffer

        views = []

        def decide(hits, misses, candidates, refetched):
            total = self.hit_total + self.miss_total + hits + misses
            percent = int(round(100 * (self.hit_total + hits) / total)) if total else 0
            views.append(MinibatchView(self.counter, hits, misses, candidates, percent, refetched))
            return self.policy.wants_replacement(views[0])

        shared = self.shared is not None
        x = np.empty((nodes.size, self.store.dim), dtype=np.float32)
        with self.lock():  # a shared buffer: the hits are copied before anyone changes a slot
            st = buf.step(nodes, decide, pending=shared)
            if shared:
                take_rows(buf.features, st.slots, x, np.flatnonzero(st.hit))
        t0 = time.perf_counter()
        hit, rep = st.hit, st.replacement
        miss_at = np.flatnonzero(~hit)
        missed = nodes[miss_at]
        refill_ids = rep.inserted if rep is not None else np.zeros(0, dtype=np.int64)
        if refill_ids.size == 0:  # the common case: misses land straight in their rows of x
            # (a buffer of this trainer's own: its hits are copied after, so the fetch may spare them)
            _, fetch = self.store.gather(missed, out=x, at=miss_at, spare=not shared)
        elif self.settings.compat:  # the reference's merged request: refills, then misses
            rows, fetch = self.store.gather(np.concatenate([refill_ids, missed]))
            x[miss_at] = rows[refill_ids.size:]
            refill_rows = rows[:refill_ids.size]
        else:  # one request too, but a refill that is also a miss is fetched once
            request, where = np.unique(np.concatenate([refill_ids, missed]), return_inverse=True)
            rows, fetch = self.store.gather(request)
            refill_rows = rows[where[:refill_ids.size]]
            x[miss_at] = rows[where[refill_ids.size:]]
        if not shared:  # before the refills change any slot
            take_rows(buf.features, st.slots, x, np.flatnonzero(hit))
        if refill_ids.size and shared:
            with self.lock():
                buf.complete(rep, refill_rows)
        elif refill_ids.size:
            buf.features[rep.slots] = refill_rows
        k = rep.slots.size if rep is not None else 0
        self.policy.observe(views[0], k)
        self.counter += 1
        self.hit_total += int(hit.sum())
        self.miss_total += st.misses
        return x, AssemblyStats(fetch, int(hit.sum()), st.misses, k, k, st.candidates, st.refetched, st.asked,
                                ASKERS[self.policy.asker] if st.asked else 0, buf.occupancy, self.hit_total,
                                self.miss_total, st.t_lookup, st.t_replace, time.perf_counter() - t0)

    def _assemble_window(self, nodes: np.ndarray, future) -> tuple[np.ndarray, AssemblyStats]:
        buf = self.buffer
        t0 = time.perf_counter()
        hit, slots = buf.lookup(nodes)
        x = np.empty((nodes.size, self.store.dim), dtype=np.float32)
        miss_at = np.flatnonzero(~hit)
        missed = nodes[miss_at]
        misses = int(buf.admissible(missed).sum())
        t1 = time.perf_counter()
        _, fetch = self.store.gather(missed, out=x, at=miss_at, spare=True)  # the hits are copied next
        take_rows(buf.features, slots, x, np.flatnonzero(hit))
        t2 = time.perf_counter()
        admitted = buf.settle(missed, x, miss_at, list(future))
        t3 = time.perf_counter()
        self.counter += 1
        self.hit_total += int(hit.sum())
        self.miss_total += misses
        # Admitted rows were fetched as misses anyway: they cost no extra traffic (no refills).
        return x, AssemblyStats(fetch, int(hit.sum()), misses, 0, admitted, 0, 0, False, 0, buf.occupancy,
                                self.hit_total, self.miss_total, t1 - t0, t3 - t2, t2 - t1)
