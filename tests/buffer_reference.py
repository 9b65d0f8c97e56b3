"""A small, obviously-correct MassiveGNN buffer, written straight from the spec (1.2-1.6) with
plain Python lists and dicts and one node at a time: the yardstick for rudder.buffer."""
from __future__ import annotations

import numpy as np

f32 = np.float32


class ReferenceBuffer:
    def __init__(self, initial_ids, admissible, alpha, delta, compat):
        self.slots = [[int(i), f32(1.0)] for i in initial_ids]  # [node id, eviction score]
        self.admissible = set(int(a) for a in admissible)
        self.miss_count = {a: f32(0.0) for a in self.admissible}
        for node, _ in self.slots:
            if node in self.miss_count:
                self.miss_count[node] = f32(-1.0)
        self.decay = f32(1.0 - alpha)
        self.threshold = f32(round((1.0 - alpha) ** delta, 3))
        self.compat = compat

    def step(self, nodes, replace_now):
        """One minibatch; returns (hits, admissible misses, evicted ids, inserted ids)."""
        self.slots.sort(key=lambda s: s[0])
        for s in self.slots:
            s[1] = f32(s[1] * self.decay)
        where = {s[0]: s for s in self.slots}
        hits, missed = 0, []
        for n in (int(n) for n in nodes):
            if n in where:
                where[n][1] = f32(where[n][1] / self.decay)
                hits += 1
            else:
                missed.append(n)
        admissible_missed = [n for n in missed if n in self.admissible]
        candidates = [i for i, s in enumerate(self.slots) if s[1] < self.threshold]
        skip_counting = self.compat and replace_now and candidates
        if not self.compat:
            for n in admissible_missed:
                self.miss_count[n] = f32(self.miss_count[n] + 1)
        evicted, inserted = [], []
        if replace_now:
            wanted = sorted((n for n, c in self.miss_count.items() if c > 0),
                            key=lambda n: (-float(self.miss_count[n]), n))
            k = min(len(candidates), len(wanted))
            for i, n in zip(candidates[:k], wanted[:k]):
                old, score = self.slots[i]
                if old in self.miss_count:
                    self.miss_count[old] = score
                self.slots[i] = [n, self.miss_count[n]]
                self.miss_count[n] = f32(-1.0)
                evicted.append(old)
                inserted.append(n)
        if self.compat and not skip_counting:
            for n in admissible_missed:
                self.miss_count[n] = f32(self.miss_count[n] + 1)
        return hits, len(admissible_missed), evicted, inserted

    def state(self):
        return sorted((s[0], float(s[1])) for s in self.slots), {n: float(c) for n, c in self.miss_count.items()}


class ReferenceWindow:
    """The lookahead buffer from its definition: after each minibatch, of the buffered rows and
    the minibatch's admissible misses keep the ``capacity`` first by (next use within the window,
    last use latest first, node ID); empty slots are used never and rank by their sentinel IDs."""

    def __init__(self, capacity, admissible, num_nodes):
        self.slots = {num_nodes + i: -1 for i in range(capacity)}  # node id -> last use
        self.admissible, self.capacity, self.clock = set(int(a) for a in admissible), capacity, 0

    def step(self, nodes, future):
        """One minibatch; returns its number of hits."""
        self.clock += 1
        nodes = [int(n) for n in nodes]
        hits = [n for n in nodes if n in self.slots]
        for n in hits:
            self.slots[n] = self.clock
        pool = dict(self.slots)
        pool.update({n: self.clock for n in nodes if n not in self.slots and n in self.admissible})

        def next_use(n):
            return next((d for d, f in enumerate(future, start=1) if n in set(int(i) for i in f)), float("inf"))

        kept = sorted(pool, key=lambda n: (next_use(n), -pool[n], n))[:self.capacity]
        self.slots = {n: pool[n] for n in kept}
        return len(hits)
