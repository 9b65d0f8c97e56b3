"""The persistent prefetch buffer of remote feature rows, with MassiveGNN's scoring (spec 1.2-1.6).

Per trainer: B = floor(f x |H|) slots of (node ID, feature row, eviction score S_E), plus a miss
count S_N per admissible node outside the buffer (-1 for buffered ones). Admissible nodes are
the partition's 1-hop halo H (the paper), or with scope ``remote`` every node owned elsewhere
(S_N then spans all node IDs: the reference's "standard" variant; the halo one is its
"memory-efficient" variant, which gives identical results).

Every minibatch (``lookup`` then ``settle``): slots are re-sorted by ID if a replacement
reordered them, every score decays by d = 1 - alpha, a hit divides its slot's score by d
(freezing it), and each admissible miss adds 1 to its S_N. On a replacement (``replace``):
eviction candidates are the slots with S_E < round(d^delta, 3) compared in float32, in slot
(= ID) order; refills are the admissible nodes with S_N > 0, most missed first (stable);
k = min of the two counts; evicted nodes get S_N := their S_E, inserted ones S_E := their S_N
and S_N := -1. The caller fetches the refills together with the minibatch's misses in one
request (``rudder.assembly``).

``compat=True`` reproduces the reference code exactly, including its quirk (spec 1.6 item 10):
on a minibatch that triggered a replacement and found eviction candidates, the S_N update is
skipped. By default the miss counts are always updated, before the replacement is chosen, so the
ranking sees this minibatch's misses and evicted rows stop ping-ponging.
"""
from __future__ import annotations

from dataclasses import dataclass

import time

import numpy as np

INIT_MODES = ("degree", "random", "empty")
SCOPES = ("halo", "remote")


@dataclass
class BufferSettings:
    fraction: float = 0.25  # B = floor(fraction x |H|)
    init: str = "degree"  # degree | random | empty
    alpha: float = 0.05  # score decay 1 - alpha per minibatch
    delta: int = 25  # eviction threshold round((1 - alpha)^delta, 3)
    compat: bool = False  # reproduce the reference code, quirks included
    scope: str = "halo"  # halo | remote


@dataclass
class Replacement:
    slots: np.ndarray  # buffer slots refilled
    evicted: np.ndarray  # node IDs that left (sentinels included)
    inserted: np.ndarray  # node IDs that came in (their rows still to be fetched)
    candidates: int  # eviction candidates found (k = min(candidates, refill candidates))
    tokens: np.ndarray  # what the slots hold right after the replacement (pending tokens, or the IDs)


@dataclass
class BufferStep:
    hit: np.ndarray  # per input node: found in the buffer
    slots: np.ndarray  # slot of each hit
    misses: int  # admissible inputs not found
    candidates: int  # eviction candidates at decision time
    refetched: int  # admissible misses that the last replacement had evicted (its regret)
    asked: bool  # the policy asked for a replacement
    replacement: Replacement | None
    t_lookup: float
    t_replace: float


def eviction_threshold(alpha: float, delta: int) -> np.float32:
    return np.float32(round((1.0 - alpha) ** delta, 3))


def find_sorted(sorted_ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each value in ``sorted_ids`` and whether it is there (binary search)."""
    if not sorted_ids.size:
        return np.zeros(values.size, dtype=np.int64), np.zeros(values.size, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_ids, values), sorted_ids.size - 1)
    return pos, sorted_ids[pos] == values


def admissible(nodes: np.ndarray, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, scope: str):
    """Which ``nodes`` a buffer may hold, and their S_N index: with scope ``halo`` the position
    in the sorted halo, with ``remote`` the node ID (any real node owned elsewhere)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if scope == "remote":
        ok = ((nodes < owned[0]) | (nodes >= owned[1])) & (nodes < num_nodes)
        return np.where(ok, nodes, 0), ok
    return find_sorted(halo, nodes)


def _private(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


class ScoredBuffer:
    """MassiveGNN's buffer for one trainer. ``owned`` = [start, end) of the trainer's partition.

    Its state lives in arrays from ``alloc(shape, dtype)`` and is only ever updated in place, so
    the trainers of a node can share one buffer in shared memory (``rudder.shared_memory``);
    there, ``initialise`` is true on one of them, and a replacement leaves the refilled slots
    *pending* (unmatchable) until their rows arrive (``complete``), so that no other trainer
    reads a slot before its row is there."""

    def __init__(self, settings: BufferSettings, halo: np.ndarray, halo_in_degree: np.ndarray, owned: tuple[int, int],
                 num_nodes: int, dim: int, rng: np.random.Generator, alloc=_private, initialise: bool = True):
        self.settings = s = settings
        order = np.argsort(halo, kind="stable")
        self.halo, halo_in_degree = np.asarray(halo, np.int64)[order], np.asarray(halo_in_degree)[order]
        self.owned, self.num_nodes = owned, num_nodes
        self.capacity = int(np.floor(s.fraction * self.halo.size))
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

    def initial_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) whose features the initial fill must fetch (none for sentinels)."""
        real = np.flatnonzero(self.ids < self.num_nodes)
        return real, self.ids[real]

    def admissible(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """S_N index of each node, and whether the node is admissible at all."""
        return admissible(nodes, self.halo, self.owned, self.num_nodes, self.settings.scope)

    def lookup(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decay, then find ``nodes`` (unique) in the buffer: (hit mask, slot of each hit)."""
        if self.state[0]:
            order = np.argsort(self.ids, kind="stable")
            self.ids[:], self.score[:], self.pending[:] = self.ids[order], self.score[order], self.pending[order]
            self.features[:] = self.features[order]
            self.state[0] = 0
        self.score *= self.decay
        pos, hit = find_sorted(self.ids, nodes)
        slots = pos[hit]
        self.score[slots] /= self.decay
        return hit, slots

    def count_misses(self, missed: np.ndarray) -> int:
        """S_N += 1 for each admissible missed node; returns how many were admissible."""
        idx, ok = self.admissible(missed)
        np.add.at(self.miss_count, idx[ok], 1)  # nodes are unique, but stay safe
        return int(ok.sum())

    def step(self, nodes: np.ndarray, decide, pending: bool = False) -> BufferStep:
        """One minibatch: lookup, the policy's decision ``decide(hits, misses, candidates,
        refetched)``, the miss counts (corrected or reference order) and the replacement if asked for."""
        t0 = time.perf_counter()
        hit, slots = self.lookup(nodes)
        missed = nodes[~hit]
        _, ok = self.admissible(missed)
        candidates = int(self.eviction_candidates().size)
        refetched = int(find_sorted(self.last_evicted, missed)[1].sum())
        asked = bool(decide(int(hit.sum()), int(ok.sum()), candidates, refetched))
        t1 = time.perf_counter()
        if not self.settings.compat or not (asked and candidates):  # the reference skips it then
            self.count_misses(missed)
        rep = self.replace(pending) if asked else None
        return BufferStep(hit, slots, int(ok.sum()), candidates, refetched, asked, rep, t1 - t0, time.perf_counter() - t1)

    def eviction_candidates(self) -> np.ndarray:
        return np.flatnonzero(self.score < self.threshold)  # float32 compare, slot order

    def replace(self, pending: bool = False) -> Replacement:
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
        return Replacement(slots, evicted, inserted, int(cand.size), self.ids[slots].copy())

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

    STATE = ("ids", "score", "features", "miss_count", "pending", "state")

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


class WindowBuffer:
    """Belady within a lookahead window (demand fill). After each minibatch, of the buffered rows
    and the minibatch's fetched admissible rows, keep the ``capacity`` needed soonest in the next
    W minibatches; rows not needed within the window count as infinitely far, and among those
    the most recently used stay (LRU). Starts empty."""

    NEVER = np.iinfo(np.int64).max

    def __init__(self, capacity: int, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, dim: int, scope: str):
        self.capacity, self.owned, self.num_nodes, self.scope = capacity, owned, num_nodes, scope
        self.halo = np.sort(np.asarray(halo, np.int64))
        self.ids = np.arange(num_nodes, num_nodes + capacity, dtype=np.int64)  # sentinels: empty
        self.features = np.zeros((capacity, dim), dtype=np.float32)
        self.last_used = np.full(capacity, -1, dtype=np.int64)
        self.order = np.arange(capacity)  # slots sorted by ID, for lookups
        self.clock = 0

    def admissible(self, nodes: np.ndarray) -> np.ndarray:
        return admissible(nodes, self.halo, self.owned, self.num_nodes, self.scope)[1]

    def lookup(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos, hit = find_sorted(self.ids[self.order], nodes)
        slots = self.order[pos[hit]]
        self.clock += 1
        self.last_used[slots] = self.clock
        return hit, slots

    def settle(self, missed: np.ndarray, rows: np.ndarray, at: np.ndarray, future: list[np.ndarray]) -> int:
        """Admit missed rows (``missed[i]``'s features are ``rows[at[i]]``) by next use within
        ``future`` (the next minibatches' input nodes, nearest first); returns how many rows entered."""
        if not self.capacity:
            return 0
        keep = self.admissible(missed)
        missed, at = missed[keep], at[keep]
        ids = np.concatenate([self.ids, missed])
        next_use = np.full(ids.size, self.NEVER, dtype=np.int64)
        for distance, nodes in enumerate(future, start=1):
            unseen = next_use == self.NEVER
            next_use[unseen & np.isin(ids, nodes)] = distance
        last = np.concatenate([self.last_used, np.full(missed.size, self.clock, dtype=np.int64)])
        ranked = np.lexsort((ids, -last, next_use))[:self.capacity]
        chosen = np.zeros(ids.size, dtype=bool)
        chosen[ranked] = True
        free = np.flatnonzero(~chosen[:self.capacity])  # slots whose row leaves
        entering = np.flatnonzero(chosen[self.capacity:])  # missed rows that come in
        slots = free[:entering.size]  # as many leave as enter
        self.ids[slots] = missed[entering]
        self.features[slots] = rows[at[entering]]
        self.last_used[slots] = self.clock
        if entering.size:
            self.order = np.argsort(self.ids, kind="stable")
        return int(entering.size)

    @property
    def occupancy(self) -> int:
        return int((self.ids < self.num_nodes).sum())

    def state_dict(self) -> dict:
        return {"ids": self.ids.copy(), "features": self.features.copy(), "last_used": self.last_used.copy(),
                "order": self.order.copy(), "clock": self.clock}

    def load_state_dict(self, state: dict) -> None:
        self.ids, self.features, self.last_used = state["ids"], state["features"], state["last_used"]
        self.order, self.clock = state["order"], state["clock"]
