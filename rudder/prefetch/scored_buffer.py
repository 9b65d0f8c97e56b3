"""The persistent prefetch buffer of remote feature rows, with MassiveGNN's scoring (spec 1.2-1.6).

Per trainer: B = floor(f x |H|) slots of (node ID, feature row, eviction score S_E), plus a miss
count S_N per admissible node outside the buffer (-1 for buffered ones). Admissible nodes are
the partition's 1-hop halo H (the paper), or with scope ``remote`` every node owned elsewhere
(S_N then spans all node IDs: the reference's "standard" variant; the halo one is its
"memory-efficient" variant, which gives identical results).

Every minibatch: slots are re-sorted by ID if a replacement reordered them, every score decays by
d = 1 - alpha, a hit divides its slot's score by d (freezing it), and each admissible miss adds
1 to its S_N. On a replacement: eviction candidates are the slots with S_E < round(d^delta, 3)
compared in float32, in slot (= ID) order; refills are the admissible nodes with S_N > 0, most
missed first (stable); k = min of the two counts; evicted nodes get S_N := their S_E, inserted
ones S_E := their S_N and S_N := -1. The refills are fetched together with the minibatch's
misses in one request (``rudder.prefetch.assembly``).

``compat=True`` reproduces the reference code exactly, including its quirk (spec 1.6 item 10):
on a minibatch that triggered a replacement and found eviction candidates, the S_N update is
skipped. By default the miss counts are always updated, before the replacement is chosen, so the
ranking sees this minibatch's misses and evicted rows stop ping-ponging.
"""
from __future__ import annotations

import numpy as np

from rudder.prefetch.buffers import (
    BufferSettings,
    Lookup,
    PrefetchBuffer,
    Replacement,
    admissible,
    capacity_of,
    eviction_threshold,
    find_sorted,
)


def _private(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


class ScoredBuffer(PrefetchBuffer):
    """MassiveGNN's buffer for one trainer. ``owned`` = [start, end) of the trainer's partition.

    Its state lives in arrays from ``alloc(shape, dtype)`` and is only ever updated in place, so
    the trainers of a node can share one buffer in shared memory (``rudder.comm.shared_memory``);
    there, ``initialise`` is true on one of them, and a replacement leaves the refilled slots
    *pending* (unmatchable) until their rows arrive (``complete``), so that no other trainer
    reads a slot before its row is there."""

    shareable = True
    STATE = ("ids", "score", "features", "miss_count", "pending", "state")

    def __init__(self, settings: BufferSettings, halo: np.ndarray, halo_in_degree: np.ndarray, owned: tuple[int, int],
                 num_nodes: int, dim: int, rng: np.random.Generator, alloc=_private, initialise: bool = True):
        self.settings = s = settings
        order = np.argsort(halo, kind="stable")
        self.halo, halo_in_degree = np.asarray(halo, np.int64)[order], np.asarray(halo_in_degree)[order]
        self.owned, self.num_nodes = owned, num_nodes
        self.capacity = capacity_of(s.fraction, self.halo.size)
        self.decay = np.float32(1.0 - s.alpha)
        self.threshold = eviction_threshold(s.alpha, s.delta)
        B = self.capacity
        self.ids = alloc((B,), np.int64)
        self.score = alloc((B,), np.float32)
        self.features = alloc((B, dim), np.float32)
        # S_N: one float32 per admissible node (halo: by position in the sorted halo; remote: by ID)
        self.miss_count = alloc((self.halo.size if s.scope == "halo" else num_nodes,), np.float32)
        self.pending = alloc((B,), np.int64)  # node ID awaited by a pending slot
        self.state = alloc((2,), np.int64)  # [ids unsorted since the last replacement, pending tokens issued]
        self.pending_base = num_nodes + B  # pending slots hold IDs from here: never a node, never an empty sentinel
        self.last_evicted = np.zeros(0, dtype=np.int64)  # sorted real IDs the latest replacement evicted (this trainer's)
        if not initialise:
            return
        if s.init == "degree":  # top-B halo nodes by global in-degree, ties by ID
            pick = np.argsort(-halo_in_degree, kind="stable")[:B]
            self.ids[:] = self.halo[np.sort(pick)]
        elif s.init == "random":
            self.ids[:] = np.sort(rng.choice(self.halo, size=B, replace=False))
        else:  # empty: sentinel IDs that can never match a node
            self.ids[:] = np.arange(num_nodes, num_nodes + B, dtype=np.int64)
        self.score[:] = 1.0
        self.miss_count[:] = 0
        self.state[:] = 0
        idx, ok = self.admissible(self.ids)
        self.miss_count[idx[ok]] = -1

    @classmethod
    def build(cls, settings, partition, num_nodes, dim, rng, shared=None) -> ScoredBuffer:
        extra = {"alloc": shared.alloc, "initialise": shared.comm.rank == 0} if shared is not None else {}
        return cls(settings, partition.halo_nodes, partition.halo_in_degree, (partition.node_start, partition.node_end),
                   num_nodes, dim, rng, **extra)

    def initial_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) whose features the initial fill must fetch (none for sentinels)."""
        real = np.flatnonzero(self.ids < self.num_nodes)
        return real, self.ids[real]

    def admissible(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """S_N index of each node, and whether the node is admissible at all."""
        return admissible(nodes, self.halo, self.owned, self.num_nodes, self.settings.scope)

    def lookup(self, nodes: np.ndarray) -> Lookup:
        """Decay, then find ``nodes`` (unique); hits freeze their slots' scores."""
        if self.state[0]:
            order = np.argsort(self.ids, kind="stable")
            self.ids[:], self.score[:], self.pending[:] = self.ids[order], self.score[order], self.pending[order]
            self.features[:] = self.features[order]
            self.state[0] = 0
        self.score *= self.decay
        pos, hit = find_sorted(self.ids, nodes)
        slots = pos[hit]
        self.score[slots] /= self.decay
        missed = nodes[~hit]
        _, ok = self.admissible(missed)
        return Lookup(nodes, hit, slots, int(ok.sum()), int(self.eviction_candidates().size),
                      int(find_sorted(self.last_evicted, missed)[1].sum()))

    def count_misses(self, missed: np.ndarray) -> int:
        """S_N += 1 for each admissible missed node; returns how many were admissible."""
        idx, ok = self.admissible(missed)
        np.add.at(self.miss_count, idx[ok], 1)  # nodes are unique, but stay safe
        return int(ok.sum())

    def replace(self, lookup: Lookup, asked: bool, pending: bool = False) -> Replacement | None:
        """The miss counts (corrected or reference order), then the replacement if asked for."""
        if not self.settings.compat or not (asked and lookup.candidates):  # the reference skips it then
            self.count_misses(lookup.missed)
        return self._replace(pending) if asked else None

    def eviction_candidates(self) -> np.ndarray:
        return np.flatnonzero(self.score < self.threshold)  # float32 compare, slot order

    def _replace(self, pending: bool) -> Replacement:
        cand = self.eviction_candidates()
        counts = self.miss_count
        wanted = np.flatnonzero(counts > 0)
        wanted = wanted[np.argsort(-counts[wanted], kind="stable")]
        k = min(cand.size, wanted.size)
        slots, take = cand[:k], wanted[:k]
        inserted = self.halo[take] if self.settings.scope == "halo" else take.astype(np.int64)
        evicted = self.ids[slots].copy()
        awaited = evicted >= self.pending_base  # a pending slot leaves before its row came
        evicted[awaited] = self.pending[slots[awaited]]
        idx, ok = self.admissible(evicted)
        new_scores = counts[take].copy()
        counts[idx[ok]] = self.score[slots][ok]  # evicted: S_N := last S_E
        counts[take] = -1
        self.score[slots] = new_scores  # inserted: S_E := S_N
        if pending:
            tokens = self.pending_base + self.state[1] + np.arange(k, dtype=np.int64)
            self.state[1] += k
            self.ids[slots], self.pending[slots] = tokens, inserted
        else:
            self.ids[slots] = inserted
        if k:
            self.state[0] = 1
            self.last_evicted = np.sort(evicted[evicted < self.num_nodes])
        return Replacement(slots, evicted, inserted, int(cand.size), self.ids[slots].copy(), pending)

    def settle(self, lookup: Lookup, replacement: Replacement | None, refill_rows: np.ndarray | None, x: np.ndarray,
               future: list[np.ndarray]) -> int:
        if replacement is None or not replacement.slots.size:
            return 0
        if replacement.pending:
            self.complete(replacement, refill_rows)
        else:
            self.features[replacement.slots] = refill_rows
        return int(replacement.slots.size)

    def complete(self, rep: Replacement, rows: np.ndarray) -> int:
        """Put the fetched rows of a pending replacement in place, found by their tokens (other
        trainers may have re-sorted the slots meanwhile, or replaced some again: those are left
        alone). Returns the slots completed."""
        order = np.argsort(self.ids, kind="stable")
        pos, still = find_sorted(self.ids[order], rep.tokens)
        slots = order[pos[still]]
        self.features[slots] = rows[still]
        self.ids[slots] = rep.inserted[still]
        if slots.size:
            self.state[0] = 1
        return int(slots.size)

    def state_dict(self) -> dict:
        """Copies of everything that changes (for a checkpoint)."""
        return {**{k: getattr(self, k).copy() for k in self.STATE}, "last_evicted": self.last_evicted.copy()}

    def load_state_dict(self, state: dict) -> None:
        for k in self.STATE:  # in place: the arrays may live in shared memory
            getattr(self, k)[...] = state[k]
        self.last_evicted = state["last_evicted"]

    @property
    def occupancy(self) -> int:
        return int((self.ids < self.num_nodes).sum())

    @property
    def sorted(self) -> bool:
        return not self.state[0]
