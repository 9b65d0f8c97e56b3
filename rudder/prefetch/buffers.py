"""The buffer protocol every prefetch buffer follows, one minibatch at a time:

1. ``lookup(nodes)``: find the minibatch's input nodes; a ``Lookup`` says which hit (and in which
   slot), how many cacheable inputs missed, and what a policy may weigh (replacement candidates,
   misses a replacement had evicted);
2. the policy decides from that (``rudder.prefetch.policies``);
3. ``replace(lookup, asked, budget=...)``: the buffer's own bookkeeping for the minibatch, and the
   replacement if the policy asked for one, of at most ``budget`` slots: which slots take which
   nodes (their rows are fetched together with the misses, in one request);
4. ``settle(lookup, replacement, refill_rows, x, future)`` once the rows have arrived: refills
   put in place, or (a demand-filled buffer) missed rows admitted.

``rudder.prefetch.assembly.CachedFeatures`` drives the protocol around the feature store, so a
buffer is one class: ``ScoredBuffer`` (MassiveGNN's, ``scored_buffer``) and ``WindowBuffer``
(Belady within a lookahead window, ``window_buffer``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INIT_MODES = ("degree", "vip", "random", "empty")
SCOPES = ("halo", "remote")
SPLITS = ("pool", "quota")  # how a node-shared buffer's slots are shared between its trainers


@dataclass
class BufferSettings:
    fraction: float = 0.25  # B = floor(fraction x |H|)
    init: str = "degree"  # degree | vip | random | empty
    alpha: float = 0.05  # score decay 1 - alpha per minibatch
    delta: int = 25  # eviction threshold round((1 - alpha)^delta, 3)
    compat: bool = False  # reproduce the reference code, quirks included
    scope: str = "halo"  # halo | remote
    split: str = "pool"  # pool | quota (a node-shared buffer)

    @classmethod
    def of(cls, buffer_section) -> BufferSettings:
        """From a run config's ``buffer`` section."""
        b = buffer_section
        return cls(b.fraction, b.init, b.alpha, b.delta, b.compat == "massivegnn", b.scope, b.split)


@dataclass
class Lookup:
    nodes: np.ndarray  # the minibatch's input nodes (unique global IDs)
    hit: np.ndarray  # per input node: found in the buffer
    slots: np.ndarray  # slot of each hit
    misses: int  # cacheable (admissible) inputs not found
    candidates: int = 0  # slots a replacement could take right now
    refetched: int = 0  # misses that the last replacement had evicted (its regret)
    miss_at: np.ndarray | None = None  # positions in ``nodes`` of the cacheable misses
    miss_index: np.ndarray | None = None  # their index in the buffer's per-node arrays (``AdmissibleIndex``)
    hit_index: np.ndarray | None = None  # the hits' index there

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
    """The protocol (module docstring). ``shareable``: the node's trainers may share one in shared
    memory; ``fills_statically``: it is filled once before training, by ``--buffer-init``."""

    shareable = False
    fills_statically = False
    capacity = 0
    features: np.ndarray
    # per admissible index (``AdmissibleIndex``), or None: rows this buffer keeps no copy of,
    # because the feature store reads them from shared memory as fast as a hit's copy; a hit
    # on one is read from the store (``rudder.prefetch.assembly``)
    store_rows: np.ndarray | None = None
    leaves_rows_to_store = False  # may take ``store_rows`` (a buffer that fetches rows of its own may not)

    @classmethod
    def build(cls, settings: BufferSettings, partition, num_nodes: int, dim: int, rng: np.random.Generator,
              shared=None, ranking=None) -> PrefetchBuffer:
        """The buffer of a trainer of ``partition`` (its halo and owned range), rows ``dim`` wide;
        ``shared``: a ``NodeSharedArrays`` when the node's trainers share it; ``ranking``: (node
        IDs sorted, score of each) that ``--buffer-init vip`` fills by (``rudder.prefetch.vip``)."""
        raise NotImplementedError

    def lookup(self, nodes: np.ndarray) -> Lookup:
        raise NotImplementedError

    def replace(self, lookup: Lookup, asked: bool, pending: bool = False, budget: int | None = None,
                claim: int | None = None) -> Replacement | None:
        """After the policy's verdict on this minibatch (``asked``); ``pending``: refilled slots stay
        unmatchable until ``settle`` (a buffer other trainers read meanwhile); ``budget``: the most
        slots the replacement may take (None: no bound); ``claim``: this trainer's new claim on a
        split node buffer (None: unchanged)."""
        return None

    def settle(self, lookup: Lookup, replacement: Replacement | None, refill_rows: np.ndarray | None, x: np.ndarray,
               future: list[np.ndarray]) -> int:
        """The minibatch's rows are in ``x`` (input order) and a replacement's in ``refill_rows``;
        returns the rows that entered the buffer."""
        return 0

    def held_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, node IDs) of the rows this buffer keeps a copy of: what the initial fill fetches,
        and what a resumed run fetches again (a checkpoint keeps the buffer's IDs, not its rows)."""
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    @property
    def occupancy(self) -> int:
        return 0

    @property
    def slots_held(self) -> int:
        """Slots this trainer holds of a node buffer split in quotas; -1 where there is no split."""
        return -1

    def state_dict(self, node: bool = True) -> dict:
        """Copies of what changes, for a checkpoint, but not the rows (``held_rows`` says which to
        fetch again). ``node``: with the arrays a node's trainers share (a node-shared buffer's
        first trainer keeps them; the others keep their own part)."""
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


class AdmissibleIndex:
    """Which nodes a buffer may hold, and each one's index into the buffer's per-node arrays
    (``size`` of them): with scope ``halo`` its position in the sorted halo, with ``remote`` the
    node ID (any real node owned elsewhere).

    A halo position is the node's rank in a bitmap of the halo over the node IDs up to its
    largest (one bit per ID and a count per 64 IDs: under a quarter byte per ID), found by a few
    vectorised operations per node, where a binary search of unsorted IDs into the halo costs
    tens of times more (``python bench/buffer_cost.py``: docs/results-buffer-cost.md)."""

    def __init__(self, halo: np.ndarray, owned: tuple[int, int], num_nodes: int, scope: str):
        self.halo = np.sort(np.asarray(halo, dtype=np.int64))
        self.owned, self.num_nodes, self.scope = owned, num_nodes, scope
        self.size = self.halo.size if scope == "halo" else num_nodes
        top = int(self.halo[-1]) if self.halo.size else -1
        self.words = np.zeros(top // 64 + 2, dtype=np.uint64)  # the last one stays empty: IDs past the halo's end
        np.bitwise_or.at(self.words, self.halo >> 6, np.left_shift(np.uint64(1), (self.halo & 63).astype(np.uint64)))
        counts = np.bitwise_count(self.words).astype(np.int64)
        self.before = np.cumsum(counts) - counts  # halo nodes in the words before each

    def find(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index, admissible) of each node (IDs >= 0); the index is 0 where the node is not admissible."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if self.scope == "remote":
            ok = ((nodes < self.owned[0]) | (nodes >= self.owned[1])) & (nodes < self.num_nodes)
            return np.where(ok, nodes, 0), ok
        word = nodes >> 6
        bits = np.take(self.words, word, mode="clip")  # past the halo's end: the empty last word
        mask = np.left_shift(np.uint64(1), nodes.view(np.uint64) & np.uint64(63))
        ok = (bits & mask) != 0
        mask -= np.uint64(1)
        below = np.bitwise_count(np.bitwise_and(bits, mask, out=mask))
        return np.where(ok, np.take(self.before, word, mode="clip") + below, 0), ok

    def node_of(self, index: np.ndarray) -> np.ndarray:
        """The node IDs of admissible indices."""
        return self.halo[index] if self.scope == "halo" else np.asarray(index, dtype=np.int64)


def capacity_of(fraction: float, halo_size: int) -> int:
    """B = floor(fraction x |halo|), the capacity of every buffer."""
    return int(np.floor(fraction * halo_size))
