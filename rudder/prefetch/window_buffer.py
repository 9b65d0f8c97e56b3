"""Belady within a lookahead window (demand fill), the ``lookahead`` policy's buffer.

After each minibatch, of the buffered rows and the minibatch's fetched admissible rows, keep the
``capacity`` needed soonest in the next W minibatches; rows not needed within the window count
as infinitely far, and among those the most recently used stay (LRU). It starts empty and never
fetches a row of its own: everything it holds came in as a miss, so it costs no extra traffic.
"""
from __future__ import annotations

import numpy as np

from rudder.prefetch.buffers import Lookup, PrefetchBuffer, Replacement, admissible, capacity_of, find_sorted


class WindowBuffer(PrefetchBuffer):
    NEVER = np.iinfo(np.int64).max

    def __init__(self, capacity: int, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, dim: int, scope: str):
        self.capacity, self.owned, self.num_nodes, self.scope = capacity, owned, num_nodes, scope
        self.halo = np.sort(np.asarray(halo, np.int64))
        self.ids = np.arange(num_nodes, num_nodes + capacity, dtype=np.int64)  # sentinels: empty
        self.features = np.zeros((capacity, dim), dtype=np.float32)
        self.last_used = np.full(capacity, -1, dtype=np.int64)
        self.order = np.arange(capacity)  # slots sorted by ID, for lookups
        self.clock = 0

    @classmethod
    def build(cls, settings, partition, num_nodes, dim, rng, shared=None) -> WindowBuffer:
        return cls(capacity_of(settings.fraction, partition.halo_nodes.size), partition.halo_nodes,
                   (partition.node_start, partition.node_end), num_nodes, dim, settings.scope)

    def admissible(self, nodes: np.ndarray) -> np.ndarray:
        return admissible(nodes, self.halo, self.owned, self.num_nodes, self.scope)[1]

    def lookup(self, nodes: np.ndarray) -> Lookup:
        pos, hit = find_sorted(self.ids[self.order], nodes)
        slots = self.order[pos[hit]]
        self.clock += 1
        self.last_used[slots] = self.clock
        return Lookup(nodes, hit, slots, int(self.admissible(nodes[~hit]).sum()))

    def settle(self, lookup: Lookup, replacement: Replacement | None, refill_rows: np.ndarray | None, x: np.ndarray,
               future: list[np.ndarray]) -> int:
        """Admit missed rows (their features are in ``x``) by next use within ``future`` (the next
        minibatches' input nodes, nearest first); returns how many rows entered."""
        if not self.capacity:
            return 0
        at = np.flatnonzero(~lookup.hit)
        missed = lookup.nodes[at]
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
        self.features[slots] = x[at[entering]]
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
