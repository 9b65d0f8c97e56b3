"""The persistent prefetch buffer of remote feature rows, with MassiveGNN's scoring (spec 1.2-1.6).

Per trainer: B = floor(f x |H|) slots of (node ID, feature row, eviction score S_E), plus a miss
count S_N per admissible node outside the buffer (-1 for buffered ones). Admissible nodes are
the partition's 1-hop halo H (the paper), or with scope ``remote`` every node owned elsewhere
(S_N then spans all node IDs: the reference's "standard" variant; the halo one is its
"memory-efficient" variant, which gives identical results).

It starts filled by ``--buffer-init``: the top-B halo nodes by global in-degree, the top-B
admissible nodes by vertex-inclusion probability (``vip``, from ``rudder.prefetch.vip``), B
random halo nodes, or nothing.

Every minibatch every score decays by d = 1 - alpha, a hit divides its slot's score by d
(freezing it), and each admissible miss adds 1 to its S_N. On a replacement: eviction
candidates are the slots with S_E < round(d^delta, 3) compared in float32, in node ID order;
refills are the admissible nodes with S_N > 0, most missed first (stable); k = min of the two
counts (and at most the policy's refill budget: where it binds, the lowest-scored candidates
go, ties by node ID); evicted nodes get S_N := their S_E, inserted ones S_E := their S_N and S_N := -1. The
refills are fetched together with the minibatch's misses in one request
(``rudder.prefetch.assembly``).

Slots stay where they are (a map from admissible node to slot finds the hits), so a minibatch
costs work in proportion to its inputs; only the decay, one float32 multiply of every score in
place, and the count of candidates below the threshold touch every slot. A lazy decay (d^k from
a stored age) would not be the same scores: k float32 multiplications round k times, and a hit's
divide-by-d does not always undo a multiply, while the
reference and the simulator's equality with real runs need them bit for bit.

A buffer the trainers of a node share (``--buffer-sharing node``) is one pool by default: any
trainer replaces any slot, ranking refills by the node's miss counts. Split in quotas
(``--buffer-split quota``), every slot has an owner and every trainer its own miss counts: a
trainer replaces only slots it holds, with its own most-missed rows, while hits are served from
every slot. Each trainer claims a weight (``claim``: equal at first, then its agent's action
``share``); its quota is its part of the capacity by the claims (largest remainders, ties by
trainer). A trainer below its quota takes, when it replaces, the eviction candidates of those
above theirs, lowest-scored first, never more than their surplus, before any of its own; one
above its quota keeps its slots until another takes them. So a re-split moves slots only through ordinary replacements,
and every row a trainer reads is a row the store holds (the exactness tests cover it).

``compat=True`` reproduces the reference code exactly, including its quirk (spec 1.6 item 10):
on a minibatch that triggered a replacement and found eviction candidates, the S_N update is
skipped. By default the miss counts are always updated, before the replacement is chosen, so the
ranking sees this minibatch's misses and evicted rows stop ping-ponging.
"""
from __future__ import annotations

import numpy as np

from rudder.agent.action import SHARE_SCALE
from rudder.prefetch.buffers import (
    AdmissibleIndex,
    BufferSettings,
    Lookup,
    PrefetchBuffer,
    Replacement,
    capacity_of,
    eviction_threshold,
)
from rudder.prefetch.node_pool import NodePool


def _private(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


def most_missed(counts: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` indices with a count above 0, most missed first, ties by index (a stable
    sort of them by count), selecting before sorting: positive float32 counts order as their bits."""
    wanted = np.flatnonzero(counts > 0)
    if k >= wanted.size:
        return wanted[np.argsort(-counts[wanted], kind="stable")]
    key = (np.int64(2**31 - 1) - counts[wanted].view(np.int32)) << 32 | wanted  # index < 2^32
    first = np.argpartition(key, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
    return wanted[first[np.argsort(key[first])]]


class ScoredBuffer(PrefetchBuffer):
    """MassiveGNN's buffer for one trainer. ``owned`` = [start, end) of the trainer's partition;
    ``capacity``: slots, instead of f x the halo (a node's pool, ``rudder.prefetch.node_pool``).

    Its state lives in arrays from ``alloc(shape, dtype)`` and is only ever updated in place, so
    the trainers of a node can share one buffer in shared memory (``rudder.comm.shared_memory``);
    there, ``initialise`` is true on one of them, and a replacement leaves the refilled slots
    *pending* (holding a token, mapped from no node) until their rows arrive (``complete``), so
    that no other trainer reads a slot before its row is there."""

    shareable = True
    fills_statically = True
    # what changes, all of it in shared memory when a node's trainers share the buffer (slot_of
    # follows from ids; owner, held and claims exist when split)
    NODE_STATE = ("ids", "score", "features", "miss_counts", "pending", "counters", "owner", "held", "claims")

    def __init__(self, settings: BufferSettings, halo: np.ndarray, halo_in_degree: np.ndarray, owned: tuple[int, int],
                 num_nodes: int, dim: int, rng: np.random.Generator, alloc=_private, initialise: bool = True,
                 ranking: tuple[np.ndarray, np.ndarray] | None = None, trainer: int = 0, trainers: int = 1,
                 capacity: int | None = None):
        self.settings = s = settings
        order = np.argsort(halo, kind="stable")
        self.halo, halo_in_degree = np.asarray(halo, np.int64)[order], np.asarray(halo_in_degree)[order]
        self.index = AdmissibleIndex(self.halo, owned, num_nodes, s.scope)
        self.owned, self.num_nodes = owned, num_nodes
        self.capacity = capacity_of(s.fraction, self.halo.size) if capacity is None else capacity
        self.decay = np.float32(1.0 - s.alpha)
        self.threshold = eviction_threshold(s.alpha, s.delta)
        B = self.capacity
        self.ids = alloc((B,), np.int64)
        self.score = alloc((B,), np.float32)
        self.features = alloc((B, dim), np.float32)
        # per admissible node (halo: by position in the sorted halo; remote: by ID): S_N, and the slot
        # holding it; S_N per trainer where a node's buffer is split (each refills by its own misses)
        split = s.split == "quota"  # with one trainer a node too: its agent's action claims as the config says
        self.miss_counts = alloc((trainers if split else 1, self.index.size), np.float32)
        self.miss_count = self.miss_counts[trainer if split else 0]  # this trainer's S_N (a view)
        self.trainer = trainer
        self.owner = alloc((B,), np.int32) if split else None  # the trainer holding each slot
        self.held = alloc((trainers,), np.int64) if split else None  # slots each trainer holds (of owner)
        self.claims = alloc((trainers,), np.int64) if split else None
        self.slot_of = alloc((self.index.size,), np.int32)  # -1: in no slot (or in a pending one)
        self.pending = alloc((B,), np.int64)  # node ID awaited by a pending slot
        self.counters = alloc((2,), np.int64)  # [pending tokens issued, slots holding a real row]
        self.pending_base = num_nodes + B  # pending slots hold IDs from here: never a node, never an empty sentinel
        # this trainer's latest replacement: the real IDs it evicted (sorted), and a mark per admissible node
        self.last_evicted = np.zeros(0, dtype=np.int64)
        self.evicted = np.zeros(self.index.size, dtype=bool)
        if not initialise:
            return
        if s.init == "degree":  # top-B halo nodes by global in-degree, ties by ID
            pick = np.argsort(-halo_in_degree, kind="stable")[:B]
            self.ids[:] = self.halo[np.sort(pick)]
        elif s.init == "vip":
            self.ids[:] = self.most_included(ranking)
        elif s.init == "random":
            self.ids[:] = np.sort(rng.choice(self.halo, size=B, replace=False))
        else:  # empty: sentinel IDs that can never match a node
            self.ids[:] = np.arange(num_nodes, num_nodes + B, dtype=np.int64)
        self.score[:] = 1.0
        self.miss_counts[:] = 0
        self.counters[:] = [0, np.count_nonzero(self.ids < num_nodes)]
        self._map_slots()
        idx, ok = self.index.find(self.ids)
        self.miss_counts[:, idx[ok]] = -1
        if self.owner is not None:  # equal claims, and the slots dealt out to match their quotas
            self.claims[:] = SHARE_SCALE
            self.owner[:] = np.arange(B) % trainers
            self.held[:] = np.bincount(self.owner, minlength=trainers)

    def most_included(self, ranking: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """The initial slots under ``--buffer-init vip``: the top-B admissible nodes by inclusion
        probability (``ranking``: node IDs sorted, probability of each), ties by ID, those no
        minibatch can reach (probability 0) left out; empty sentinels in the slots left over."""
        if ranking is None:
            raise ValueError("--buffer-init vip: the buffer needs the inclusion probabilities (rudder.prefetch.vip)")
        ids, q = ranking
        _, ok = self.index.find(ids)  # the halo, or with scope remote any node owned elsewhere
        ok &= q > 0
        ids, q = ids[ok], q[ok]
        chosen = np.sort(ids[np.argsort(-q, kind="stable")[:self.capacity]])
        empty = np.arange(self.num_nodes + chosen.size, self.num_nodes + self.capacity, dtype=np.int64)
        return np.concatenate([chosen, empty])

    @classmethod
    def build(cls, settings, partition, num_nodes, dim, rng, shared=None, ranking=None) -> ScoredBuffer:
        extra = ({"alloc": shared.alloc, "initialise": shared.comm.rank == 0, "trainer": shared.comm.rank,
                  "trainers": shared.comm.size} if shared is not None else {})
        return cls(settings, partition.halo_nodes, partition.halo_in_degree, (partition.node_start, partition.node_end),
                   num_nodes, dim, rng, ranking=ranking, capacity=partition.capacity if isinstance(partition, NodePool) else None,
                   **extra)

    def _map_slots(self) -> None:
        """``slot_of`` from ``ids`` (pending tokens and sentinels map from no node)."""
        self.slot_of[:] = -1
        idx, ok = self.index.find(self.ids)
        self.slot_of[idx[ok]] = np.flatnonzero(ok)

    def held_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) of the slots holding a real row (not sentinels, nor pending slots, whose
        rows have not arrived)."""
        real = np.flatnonzero(self.ids < self.num_nodes)
        return real, self.ids[real]

    def lookup(self, nodes: np.ndarray) -> Lookup:
        """Decay, then find ``nodes`` (unique); hits freeze their slots' scores."""
        np.multiply(self.score, self.decay, out=self.score)
        idx, ok = self.index.find(nodes)
        slot = np.where(ok, self.slot_of[idx], -1) if self.index.size else np.full(nodes.size, -1)
        hit = slot >= 0
        slots = slot[hit]
        self.score[slots] /= self.decay
        miss_at = np.flatnonzero(ok & ~hit)
        miss_index = idx[miss_at]
        return Lookup(nodes, hit, slots, int(miss_at.size), self.candidate_count(),
                      int(np.count_nonzero(self.evicted[miss_index])), miss_at, miss_index)

    def candidate_count(self) -> int:
        return int(np.count_nonzero(self.score < self.threshold))  # float32 compare

    def count_misses(self, lookup: Lookup) -> int:
        """S_N += 1 for each admissible missed node; returns how many were admissible."""
        self.miss_count[lookup.miss_index] += 1  # unique: the nodes are
        return lookup.misses

    def replace(self, lookup: Lookup, asked: bool, pending: bool = False, budget: int | None = None,
                claim: int | None = None) -> Replacement | None:
        """The claim and the miss counts (corrected or reference order), then the replacement if asked for."""
        if claim is not None and self.claims is not None:
            self.claims[self.trainer] = claim
        if not self.settings.compat or not (asked and lookup.candidates):  # the reference skips it then
            self.count_misses(lookup)
        return self._replace(pending, budget) if asked else None

    def quotas(self) -> np.ndarray:
        """Slots each trainer of a split buffer is due: the capacity in proportion to the claims,
        by largest remainders (ties to the lower trainer); equal where nobody claims anything."""
        claims = self.claims.astype(np.int64)
        if not claims.sum():
            claims = np.ones_like(claims)
        exact = self.capacity * claims
        quota, remainder = exact // claims.sum(), exact % claims.sum()
        quota[np.argsort(-remainder, kind="stable")[:self.capacity - int(quota.sum())]] += 1
        return quota

    def own_candidates(self, cand: np.ndarray) -> tuple[np.ndarray, int]:
        """Of the eviction candidates ``cand`` (node ID order), those this trainer may replace in a
        split buffer, and how many of them come first because they are owed: while it holds fewer
        than its quota, others' candidates from trainers above theirs, lowest-scored first (ties
        by node ID), at most each one's surplus and this trainer's deficit; then its own. Owed
        slots go first so that a replacement smaller than the candidates (too few missed rows, a
        refill budget) still moves them: else a claim could wait many replacements to be met.
        Each part keeps the order of ``cand``."""
        if self.owner is None:
            return cand, 0
        quota, held = self.quotas(), self.held
        mine = self.owner[cand] == self.trainer
        deficit = int(quota[self.trainer] - held[self.trainer])
        surplus = np.maximum(held - quota, 0)
        others = np.flatnonzero(~mine & (surplus[self.owner[cand]] > 0))
        if deficit <= 0 or not others.size:
            return cand[mine], 0
        others = others[np.argsort(self.score[cand[others]], kind="stable")]  # lowest-scored first
        donor = self.owner[cand[others]]
        by_donor = np.argsort(donor, kind="stable")  # each donor's candidates in score order
        first = np.searchsorted(donor[by_donor], donor[by_donor])
        rank = np.empty(others.size, dtype=np.int64)
        rank[by_donor] = np.arange(others.size) - first
        owed = np.sort(others[rank < surplus[donor]][:deficit])
        return np.concatenate([cand[owed], cand[mine]]), int(owed.size)

    def eviction_candidates(self) -> np.ndarray:
        """Slots with S_E below the threshold, in node ID order (pending tokens and sentinels
        order by their IDs too, as when the slots were kept sorted)."""
        cand = np.flatnonzero(self.score < self.threshold)
        return cand[np.argsort(self.ids[cand], kind="stable")]

    def _replace(self, pending: bool, budget: int | None = None) -> Replacement:
        cand, owed = self.own_candidates(self.eviction_candidates())
        counts = self.miss_count
        take = most_missed(counts, cand.size)
        k = take.size
        slots = cand[:k]
        if budget is not None and budget < k:  # the owed, then the worst candidates (by score, ties in ID order) go
            worst = np.concatenate([np.arange(owed), owed + np.argsort(self.score[cand[owed:]], kind="stable")])
            worst = worst[:max(budget, 0)]
            k, slots, take = worst.size, cand[np.sort(worst)], take[:worst.size]
        inserted = self.index.node_of(take)
        evicted = self.ids[slots].copy()
        self.counters[1] -= np.count_nonzero(evicted < self.num_nodes)
        awaited = evicted >= self.pending_base  # a pending slot leaves before its row came
        evicted[awaited] = self.pending[slots[awaited]]
        idx, ok = self.index.find(evicted)
        new_scores = counts[take].copy()
        self.miss_counts[:, idx[ok]] = 0  # evicted: S_N := last S_E (this trainer's; the others' start again)
        counts[idx[ok]] = self.score[slots][ok]
        self.miss_counts[:, take] = -1  # inserted: in the buffer for every trainer
        if self.owner is not None:
            self.held -= np.bincount(self.owner[slots], minlength=self.held.size)
            self.held[self.trainer] += slots.size
            self.owner[slots] = self.trainer
        self.score[slots] = new_scores  # inserted: S_E := S_N
        left = idx[ok][self.slot_of[idx[ok]] == slots[ok]]  # a node two pending slots awaited is mapped to one
        self.slot_of[left] = -1
        if pending:
            tokens = self.pending_base + self.counters[0] + np.arange(k, dtype=np.int64)
            self.counters[0] += k
            self.ids[slots], self.pending[slots] = tokens, inserted
        else:
            self.ids[slots] = inserted
            self.slot_of[take] = slots
            self.counters[1] += k
        if k:
            self._mark_evicted(False)
            self.last_evicted = np.sort(evicted[evicted < self.num_nodes])
            self._mark_evicted(True)
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
        """Put the fetched rows of a pending replacement in place: its slots that still hold its
        tokens (another trainer may have replaced some again meanwhile: those are left alone).
        Returns the slots completed."""
        still = self.ids[rep.slots] == rep.tokens
        slots, nodes = rep.slots[still], rep.inserted[still]
        self.features[slots] = rows[still]
        self.ids[slots] = nodes
        self.slot_of[self.index.find(nodes)[0]] = slots
        self.counters[1] += slots.size
        return int(slots.size)

    def state_dict(self, node: bool = True) -> dict:
        """Copies of everything that changes but the rows (for a checkpoint: a resumed run fetches
        the ``held_rows`` again); ``node``: the node's arrays too, not only this trainer's own part
        (its latest eviction)."""
        state = {"last_evicted": self.last_evicted.copy()}
        if node:
            state.update({k: getattr(self, k).copy() for k in self.NODE_STATE
                          if k != "features" and getattr(self, k) is not None})
        return state

    def load_state_dict(self, state: dict) -> None:
        """A state without the node's arrays restores this trainer's own part only (another
        trainer of the node restores the arrays they share). The rows are not in it (a checkpoint
        of format 4 has them: they are left aside, and fetched again like any other's)."""
        if "ids" in state:
            for k in self.NODE_STATE:  # in place: the arrays may live in shared memory
                if k != "features" and getattr(self, k) is not None:
                    getattr(self, k)[...] = state[k]
            self._map_slots()
        self.evicted[:] = False
        self.last_evicted = state["last_evicted"]
        self._mark_evicted(True)

    def _mark_evicted(self, value: bool) -> None:
        idx, ok = self.index.find(self.last_evicted)
        self.evicted[idx[ok]] = value

    @property
    def occupancy(self) -> int:
        return int(self.counters[1])

    @property
    def slots_held(self) -> int:
        return -1 if self.held is None else int(self.held[self.trainer])
