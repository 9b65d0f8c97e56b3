"""The buffer protocol every prefetch buffer follows, one minibatch at a time:

1. ``lookup(nodes)``: find the minibatch's input nodes; a ``Lookup`` says which hit (and in which
   slot), how many cacheable inputs missed, and what a policy may weigh (replacement candidates,
   misses a replacement had evicted);
2. the policy decides from that (``rudder.prefetch.policies``);
3. ``replace(lookup, asked)``: the buffer's own bookkeeping for the minibatch, and the
   replacement if the policy asked for one: which slots take which nodes (their rows are fetched
   together with the misses, in one request);
4. ``settle(lookup, replacement, refill_rows, x, future)`` once the rows have arrived: refills
   put in place, or (a demand-filled buffer) missed rows admitted.

``rudder.prefetch.assembly.CachedFeatures`` drives the protocol around the feature store, so a
buffer is one class: ``ScoredBuffer`` (MassiveGNN's, ``scored_buffer``) and ``WindowBuffer``
(Belady within a lookahead window, ``window_buffer``).
"""
from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
    def of(cls, buffer_section) -> BufferSettings:
        """From a run config's ``buffer`` section."""
        b = buffer_section
        return cls(b.fraction, b.init, b.alpha, b.delta, b.compat == "massivegnn", b.scope)


@dataclass
class Lookup:
    nodes: np.ndarray  # the minibatch's input nodes (unique global IDs)
    hit: np.ndarray  # per input node: found in the buffer
    slots: np.ndarray  # slot of each hit
    misses: int  # cacheable (admissible) inputs not found
    candidates: int = 0  # slots a replacement could take right now
    refetched: int = 0  # misses that the last replacement had evicted (its regret)

    @property
    def hits(self) -> int:
        return int(self.hit.sum())

    @property
    def missed(self) -> np.ndarray:
        return self.nodes[~self.hit]


@dataclass
class Replacement:
    slots: np.ndarray  # buffer slots refilled
    evicted: np.ndarray  # node IDs that left (sentinels included)
    inserted: np.ndarray  # node IDs that came in (their rows still to be fetched)
    candidates: int  # eviction candidates found (k = min(candidates, refill candidates))
    tokens: np.ndarray  # what the slots hold right after the replacement (pending tokens, or the IDs)
    pending: bool = False  # the slots await their rows (a shared buffer): ``settle`` completes them by token


class PrefetchBuffer:
    """The protocol (module docstring). ``shareable``: the node's trainers may share one in shared memory."""

    shareable = False
    capacity = 0
    features: np.ndarray

    @classmethod
    def build(cls, settings: BufferSettings, partition, num_nodes: int, dim: int, rng: np.random.Generator,
              shared=None) -> PrefetchBuffer:
        """The buffer of a trainer of ``partition`` (its halo and owned range), rows ``dim`` wide;
        ``shared``: a ``NodeSharedArrays`` when the node's trainers share it."""
        raise NotImplementedError

    def lookup(self, nodes: np.ndarray) -> Lookup:
        raise NotImplementedError

    def replace(self, lookup: Lookup, asked: bool, pending: bool = False) -> Replacement | None:
        """After the policy's verdict on this minibatch (``asked``); ``pending``: refilled slots stay
        unmatchable until ``settle`` (a buffer other trainers read meanwhile)."""
        return None

    def settle(self, lookup: Lookup, replacement: Replacement | None, refill_rows: np.ndarray | None, x: np.ndarray,
               future: list[np.ndarray]) -> int:
        """The minibatch's rows are in ``x`` (input order) and a replacement's in ``refill_rows``;
        returns the rows that entered the buffer."""
        return 0

    def initial_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) the initial fill must fetch."""
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    @property
    def occupancy(self) -> int:
        return 0

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def eviction_threshold(alpha: float, delta: int) -> np.float32:
    return np.float32(round((1.0 - alpha) ** delta, 3))


def find_sorted(sorted_ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each value in ``sorted_ids`` and whether it is there (binary search)."""
    if not sorted_ids.size:
        return np.zeros(values.size, dtype=np.int64), np.zeros(values.size, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_ids, values), sorted_ids.size - 1)
    return pos, sorted_ids[pos] == values


def admissible(nodes: np.ndarray, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, scope: str):
    """Which ``nodes`` a buffer may hold, and their miss-count index: with scope ``halo`` the
    position in the sorted halo, with ``remote`` the node ID (any real node owned elsewhere)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if scope == "remote":
        ok = ((nodes < owned[0]) | (nodes >= owned[1])) & (nodes < num_nodes)
        return np.where(ok, nodes, 0), ok
    return find_sorted(halo, nodes)


def capacity_of(fraction: float, halo_size: int) -> int:
    """B = floor(fraction x |halo|), the capacity of every buffer."""
    return int(np.floor(fraction * halo_size))
