"""Belady within a lookahead window (demand fill), the ``lookahead`` policy's buffer.

After each minibatch, of the buffered rows and the minibatch's fetched admissible rows, keep the
``capacity`` needed soonest in the next W minibatches; rows not needed within the window count
as infinitely far, and among those the most recently used stay (LRU); remaining ties go to the
lower node ID. It starts empty and never fetches a row of its own: everything it holds came in
as a miss, so it costs no extra traffic.

The choice costs work in proportion to the minibatch and the window, not to the buffer: how
many minibatches of the window need each node is kept up to date as the window slides
(``Window``), rows the window does not need wait in a queue by last use (``AgeQueue``), and
when the window needs more rows than there are slots, those needed latest are found through the
window's minibatches from its far end. The chosen set is the one a full sort of buffer and misses
by (next use, last use, ID) gives (tests/test_buffer.py checks it against that sort).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from rudder.prefetch.buffers import AdmissibleIndex, Lookup, PrefetchBuffer, Replacement, capacity_of


@dataclass
class WindowEntry:
    index: int  # the minibatch's number (that of the buffer's clock when it is served)
    source: np.ndarray  # its input nodes as given (to recognise it in the next window)
    found: tuple[np.ndarray, np.ndarray]  # AdmissibleIndex.find of them
    nodes: np.ndarray  # its admissible nodes' indices


class Window:
    """The minibatches of the lookahead window, and for every admissible node how many of them
    hold it (``count``: the window needs the node iff it is above 0), kept up to date as the
    window slides by one minibatch a step: O(minibatch) per step."""

    def __init__(self, size: int):
        self.count = np.zeros(size, dtype=np.int32)
        self.later = np.zeros(size, dtype=np.int32)  # scratch of ``by_first_use``
        self.entries: deque[WindowEntry] = deque()
        self.valid = False

    def _continues(self, now: int, future: list[np.ndarray]) -> bool:
        """``future`` (minibatches now+1, ...) extends the window seen so far."""
        ahead = [e for e in self.entries if e.index > now]
        if not self.valid or len(ahead) > len(future) or any(e.index < now for e in self.entries):
            return False
        return all(e.index == now + 1 + i and (e.source is future[i] or np.array_equal(e.source, future[i]))
                   for i, e in enumerate(ahead))

    def advance(self, now: int, future: list[np.ndarray], index: AdmissibleIndex):
        """Minibatch ``now`` is being served and ``future`` follows it. Returns the nodes that
        ``now`` needed and the window no longer holds (before the newcomers), the nodes the
        newcomers brought into the window, and whether everything was rebuilt instead (a window
        that does not continue the last one)."""
        rebuilt = not self._continues(now, future)
        if rebuilt:
            self.count[:] = 0
            self.entries.clear()
            self.valid = True
        left = np.zeros(0, dtype=np.int64)
        if self.entries and self.entries[0].index == now:
            nodes = self.entries.popleft().nodes
            self.count[nodes] -= 1  # unique: the nodes are
            left = nodes[self.count[nodes] == 0]
        arrived_upto = self.entries[-1].index if self.entries else now
        entered = [self._arrive(now + 1 + i, future[i], index) for i in range(arrived_upto - now, len(future))]
        return left, np.concatenate(entered) if entered else np.zeros(0, dtype=np.int64), rebuilt

    def _arrive(self, j: int, source: np.ndarray, index: AdmissibleIndex) -> np.ndarray:
        idx, ok = index.find(source)
        nodes = idx[ok]
        entered = nodes[self.count[nodes] == 0]
        self.count[nodes] += 1
        self.entries.append(WindowEntry(j, source, (idx, ok), nodes))
        return entered

    def by_first_use(self):
        """(minibatch number, the admissible nodes first needed there), from the window's far end."""
        walked = []
        try:
            for e in reversed(self.entries):  # first needed at e: held by e and by no window minibatch before it
                yield e.index, e.nodes[self.count[e.nodes] == self.later[e.nodes] + 1]
                self.later[e.nodes] += 1
                walked.append(e.nodes)
        finally:
            for nodes in walked:
                self.later[nodes] = 0

    def found(self, j: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``AdmissibleIndex.find(nodes)`` as done when minibatch ``j`` entered the window, if these are its nodes."""
        e = self.entries[0] if self.valid and self.entries else None
        return e.found if e is not None and e.index == j and e.source is nodes else None

    def invalidate(self) -> None:
        self.valid = False


def highest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest of distinct ``values``, in no order (a partial selection)."""
    if k >= values.size:
        return np.arange(values.size)
    return np.argpartition(values, values.size - k)[values.size - k:]


class AgeQueue:
    """Slots in the order an LRU eviction takes them: oldest use first, then higher node ID first
    (``key``: the node IDs of slots). Appended a use at a time, in no order within a use: only
    where a ``take`` ends inside a use are that use's entries sorted by ID. Lazy deletion: a slot
    used again is appended anew, and an entry for which ``current(slots, uses)`` no longer holds
    is dropped when reached, or when stale entries outnumber ``limit`` (amortised O(1) per use)."""

    chunk = 4096

    def __init__(self, current, key, limit: int):
        self.current, self.key, self.limit = current, key, limit
        self.reset(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def append(self, slots: np.ndarray, use: int) -> None:
        """``slots`` last used at ``use`` (later than any appended before)."""
        if self.tail - self.head > 2 * self.limit + 1024:
            keep = self.head + np.flatnonzero(self.current(self.slots[self.head:self.tail], self.uses[self.head:self.tail]))
            self.reset(self.slots[keep], self.uses[keep])
        if self.tail + slots.size > self.slots.size:
            live = self.tail - self.head
            size = max(1024, 2 * (live + slots.size))
            for name in ("slots", "uses"):
                grown = np.zeros(size, dtype=np.int64)
                grown[:live] = getattr(self, name)[self.head:self.tail]
                setattr(self, name, grown)
            self.head, self.tail = 0, live
        self.slots[self.tail:self.tail + slots.size] = slots
        self.uses[self.tail:self.tail + slots.size] = use
        self.tail += slots.size

    def take(self, wanted: int | None) -> np.ndarray:
        """Up to ``wanted`` of the first current entries (all of them if None), dropping the
        stale ones passed over; read about twice ``wanted`` entries (at least ``chunk``) at a time,
        whole uses. The entries taken must stop being current before the next call."""
        out = []
        while (wanted is None or wanted > 0) and self.head < self.tail:
            end = self.tail if wanted is None else min(self.tail, self.head + max(2 * wanted, self.chunk))
            if end < self.tail and self.uses[end - 1] == self.uses[end]:  # whole uses: back to that use's start,
                start = self.head + int(np.searchsorted(self.uses[self.head:end], self.uses[end]))  # or on to its end
                end = start if start > self.head else end + int(np.searchsorted(self.uses[end:self.tail], self.uses[end],
                                                                                side="right"))
            slots, uses = self.slots[self.head:end], self.uses[self.head:end]
            ok = np.flatnonzero(self.current(slots, uses))
            if wanted is None or ok.size < wanted:
                out.append(slots[ok])
                self.head = end
                wanted = None if wanted is None else wanted - ok.size
                continue
            last = uses[ok[wanted - 1]]  # the use the take ends in: of its current entries, the highest IDs
            before, within = slots[ok[uses[ok] < last]], slots[ok[uses[ok] == last]]
            out += [before, within[highest(self.key(within), wanted - before.size)]]
            self.head += int(np.searchsorted(uses, last))  # the rest of that use stays
            break
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def reset(self, slots: np.ndarray, uses: np.ndarray) -> None:
        """Exactly these entries, in this order (uses not decreasing)."""
        self.slots, self.uses = slots.astype(np.int64), uses.astype(np.int64)
        self.head, self.tail = 0, slots.size


class WindowBuffer(PrefetchBuffer):
    # demand-filled: a row left to the store is read as a hit there, and no count changes
    leaves_rows_to_store = True

    def __init__(self, capacity: int, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, dim: int, scope: str):
        self.capacity, self.num_nodes = capacity, num_nodes
        self.index = AdmissibleIndex(halo, owned, num_nodes, scope)
        self.halo = self.index.halo
        self.ids = np.arange(num_nodes, num_nodes + capacity, dtype=np.int64)  # sentinels: empty
        self.features = np.zeros((capacity, dim), dtype=np.float32)
        self.last_used = np.full(capacity, -1, dtype=np.int64)
        self.clock = 0
        self.node_at = np.full(capacity, -1, dtype=np.int64)  # admissible index of each slot's node (-1: empty)
        self.slot_of = np.full(self.index.size, -1, dtype=np.int32)  # slot of each buffered node
        self.miss_of = np.full(self.index.size, -1, dtype=np.int32)  # while settling: position among the misses
        self.window = Window(self.index.size)
        self.queue = AgeQueue(self._unneeded, self._node_ids, capacity)  # the slots whose rows the window does not need
        self.needed = 0  # buffered rows the window needs
        self.filled = 0

    @classmethod
    def build(cls, settings, partition, num_nodes, dim, rng, shared=None, ranking=None) -> WindowBuffer:
        return cls(capacity_of(settings.fraction, partition.halo_nodes.size), partition.halo_nodes,
                   (partition.node_start, partition.node_end), num_nodes, dim, settings.scope)

    def lookup(self, nodes: np.ndarray) -> Lookup:
        idx, ok = self.window.found(self.clock + 1, nodes) or self.index.find(nodes)
        slot = np.where(ok, self.slot_of[idx], -1) if self.index.size else np.full(nodes.size, -1)
        hit = slot >= 0
        slots = slot[hit]
        self.clock += 1
        self.last_used[slots] = self.clock
        miss_at = np.flatnonzero(ok & ~hit)
        return Lookup(nodes, hit, slots, int(miss_at.size), miss_at=miss_at, miss_index=idx[miss_at], hit_index=idx[hit])

    def needed_in_window(self, slots: np.ndarray) -> np.ndarray:
        node = self.node_at[slots]
        return (node >= 0) & (self.window.count[np.maximum(node, 0)] > 0)

    def _node_ids(self, slots: np.ndarray) -> np.ndarray:
        return self.ids[slots]

    def _unneeded(self, slots: np.ndarray, uses: np.ndarray) -> np.ndarray:
        """Queue entries still current: the slot's last use, and a row the window does not need."""
        return (self.last_used[slots] == uses) & ~self.needed_in_window(slots)

    def settle(self, lookup: Lookup, replacement: Replacement | None, refill_rows: np.ndarray | None, x: np.ndarray,
               future: list[np.ndarray]) -> int:
        """Admit missed rows (their features are in ``x``) by next use within ``future`` (the next
        minibatches' input nodes, nearest first); returns how many rows entered."""
        if not self.capacity:
            return 0
        left, entered, rebuilt = self.window.advance(self.clock, list(future), self.index)
        if rebuilt:
            self._recount()
        else:
            self.needed += int(np.count_nonzero(self.slot_of[entered] >= 0)) - int(np.count_nonzero(self.slot_of[left] >= 0))
        misses = lookup.miss_index
        far_miss = self.window.count[misses] == 0
        far_hits = lookup.slots[self.window.count[lookup.hit_index] == 0]
        needed = self.needed + int(np.count_nonzero(~far_miss))
        if needed >= self.capacity:  # the window needs them all: its soonest stay
            leaving, enter = self._keep_soonest(lookup, far_miss, far_hits, needed - self.capacity)
        else:  # the window's rows stay, and of the others the most recent
            leaving, enter = self._keep_recent(lookup, far_miss, far_hits)
        slots, at = leaving, lookup.miss_at[enter]
        far_hit_ids = self.ids[far_hits]
        real = self.node_at[slots] >= 0
        self.needed += int(np.count_nonzero(~far_miss[enter])) - int(np.count_nonzero(self.needed_in_window(slots)))
        self.filled += int(np.count_nonzero(~real))
        self.slot_of[self.node_at[slots[real]]] = -1
        self.ids[slots] = lookup.nodes[at]
        self.node_at[slots] = misses[enter]
        self.slot_of[misses[enter]] = slots
        if self.store_rows is None:
            self.features[slots] = x[at]
        else:  # only the rows the store would read by RMA are worth a copy
            copy = ~self.store_rows[misses[enter]]
            self.features[slots[copy]] = x[at[copy]]
        self.last_used[slots] = self.clock
        staying = far_hits[self.ids[far_hits] == far_hit_ids]
        unneeded_now = np.concatenate([staying, slots[far_miss[enter]]])  # used now, not needed in the window
        self.queue.append(unneeded_now, self.clock)
        return int(slots.size)

    def _keep_recent(self, lookup: Lookup, far_miss: np.ndarray, far_hits: np.ndarray):
        """Fewer rows needed than slots: as many rows not needed leave (or stay out) as misses
        came, the least recently used first, then the higher node ID."""
        count = lookup.miss_index.size
        leaving = [self.queue.take(count)]  # used before this minibatch
        enter = np.ones(count, dtype=bool)
        rest = count - leaving[0].size
        if rest:  # of the rows used now (hits and misses) that the window does not need
            far_at = np.flatnonzero(far_miss)
            ids = np.concatenate([self.ids[far_hits], lookup.nodes[lookup.miss_at[far_at]]])
            drop = highest(ids, rest)
            leaving.append(far_hits[drop[drop < far_hits.size]])
            enter[far_at[drop[drop >= far_hits.size] - far_hits.size]] = False
        return np.concatenate(leaving), enter

    def _keep_soonest(self, lookup: Lookup, far_miss: np.ndarray, far_hits: np.ndarray, excess: int):
        """The window needs at least as many rows as there are slots: every row it does not need
        leaves (or stays out), and so do the ``excess`` needed latest (then least recently used,
        then higher node ID), found minibatch by minibatch from the window's far end."""
        leaving = [self.queue.take(None), far_hits]
        enter = ~far_miss
        misses = lookup.miss_index
        self.miss_of[misses] = np.arange(misses.size)
        groups = self.window.by_first_use()
        while excess:
            _, group = next(groups)
            slot, miss = self.slot_of[group], self.miss_of[group]
            held, pool = slot >= 0, (slot >= 0) | (miss >= 0)
            group, slot, miss, held = group[pool], slot[pool], miss[pool], held[pool]
            last = np.where(held, self.last_used[slot], self.clock)
            ids = np.where(held, self.ids[slot], self.index.node_of(group))
            drop = np.lexsort((-ids, last))[:excess]
            leaving.append(slot[drop][held[drop]])
            enter[miss[drop][~held[drop]]] = False
            excess -= drop.size
        groups.close()
        self.miss_of[misses] = -1
        return np.concatenate(leaving), enter

    def _recount(self) -> None:
        """``needed`` and the queue from scratch (a new window, or a loaded state); the rows used
        by the minibatch being settled join the queue after it."""
        needed = self.needed_in_window(np.arange(self.capacity))
        self.needed = int(np.count_nonzero(needed))
        far = np.flatnonzero(~needed & (self.last_used < self.clock))
        order = np.argsort(self.last_used[far], kind="stable")
        self.queue.reset(far[order], self.last_used[far[order]])

    @property
    def occupancy(self) -> int:
        return self.filled

    def held_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) of the rows this buffer copied (none when it is new: it fills on demand)."""
        real = np.flatnonzero(self.node_at >= 0)
        if self.store_rows is not None:  # rows left to the store were never copied
            real = real[~self.store_rows[self.node_at[real]]]
        return real, self.ids[real]

    def state_dict(self, node: bool = True) -> dict:
        return {"ids": self.ids.copy(), "last_used": self.last_used.copy(), "clock": self.clock}

    def load_state_dict(self, state: dict) -> None:
        """The slots' IDs and uses; their rows are fetched again (``held_rows``)."""
        self.ids[:], self.last_used[:] = state["ids"], state["last_used"]
        self.clock = state["clock"]
        idx, ok = self.index.find(self.ids)
        self.node_at = np.where(ok, idx, -1)
        self.slot_of[:] = -1
        self.slot_of[idx[ok]] = np.flatnonzero(ok)
        self.filled = int(np.count_nonzero(ok))
        self.window.invalidate()  # the next settle rebuilds the window, ``needed`` and the queue
