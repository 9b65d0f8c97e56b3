"""Phases of a run: what is sampled may shift at epoch boundaries (``--shift``).

``--shift "EPOCH:KEY=VALUE[;KEY=VALUE...] [EPOCH:...]"``: from epoch EPOCH (0-based) on, train with
other settings; each shift keeps what it does not name from the phase before it. Keys:

- ``fanouts=F1,F2``: neighbours sampled per layer, input side first (as many layers as ``--fanouts``);
- ``batch=B``: seeds per trainer per minibatch (0: the ``--batch-size 0`` rule on the phase's seeds);
- ``seeds=all|FRACTION``: which of each partition's training nodes are seeds: all of them, or the
  first ``round(FRACTION x n)`` of a fixed random ranking of them keyed by ``--seed`` and the
  partition (so a smaller fraction is a subset of a larger one, and the simulator picks alike).

Steps per epoch are a phase's: the busiest trainer's seed count in the phase over the phase's
batch size, equal on every trainer (they all meet in every step's Allreduce). A minibatch's
place in the run (its ``counter``, what checkpoints, policies and the agent count by) runs on
across phases: ``RunPhases.counter`` and ``RunPhases.position`` convert.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SHIFT_KEYS = ("fanouts", "batch", "seeds")


@dataclass(frozen=True)
class Shift:
    """One ``EPOCH:...`` term of ``--shift``: None where it keeps the previous phase's setting."""
    epoch: int
    fanouts: tuple[int, ...] | None = None
    batch: int | None = None
    seeds: float | None = None  # fraction of the training split; 1.0 = all


def parse_shifts(text: str) -> list[Shift]:
    """The shifts of a ``--shift`` value, in epoch order; a ValueError says what is wrong (one line,
    without the flag: the caller names it)."""
    shifts = []
    for term in text.split():
        m = re.fullmatch(r"([0-9]+):(.+)", term)
        if not m:
            raise ValueError(f"{term!r} is not EPOCH:KEY=VALUE[;KEY=VALUE...]")
        values = {}
        for item in m.group(2).split(";"):
            key, eq, value = item.partition("=")
            if not eq or key not in SHIFT_KEYS:
                raise ValueError(f"{item!r} in {term!r}: expected KEY=VALUE with KEY one of {', '.join(SHIFT_KEYS)}")
            if key in values:
                raise ValueError(f"{key} given twice in {term!r}")
            values[key] = parse_value(key, value)
        shifts.append(Shift(int(m.group(1)), **values))
    if not shifts:
        raise ValueError("no EPOCH:KEY=VALUE term")
    epochs = [s.epoch for s in shifts]
    if epochs[0] < 1 or any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise ValueError(f"shift epochs {epochs} must increase, from 1 on (epoch 0 is the flags' own phase)")
    return shifts


def parse_value(key: str, value: str):
    if key == "fanouts":
        try:
            fanouts = tuple(int(f) for f in value.split(","))
        except ValueError:
            fanouts = ()
        if not fanouts or any(f < 1 and f != -1 for f in fanouts):
            raise ValueError(f"fanouts={value!r}: expected comma-separated positive integers (or -1 for all)")
        return fanouts
    if key == "batch":
        if not re.fullmatch(r"[0-9]+", value):
            raise ValueError(f"batch={value!r}: expected a non-negative integer (0: the default rule)")
        return int(value)
    if value == "all":
        return 1.0
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(f"seeds={value!r}: expected all or a fraction in (0, 1]")
    return fraction


@dataclass(frozen=True)
class PhaseSettings:
    """What a phase samples, before its steps per epoch are known."""
    first_epoch: int
    fanouts: tuple[int, ...]
    batch_setting: int  # --batch-size's meaning: 0 resolves from the phase's seeds
    seed_fraction: float


def phase_settings(fanouts: list[int], batch_size: int, shift: str) -> list[PhaseSettings]:
    """Phase 0 from the flags, then one phase per shift."""
    phases = [PhaseSettings(0, tuple(fanouts), batch_size, 1.0)]
    for s in parse_shifts(shift) if shift else []:
        last = phases[-1]
        phases.append(PhaseSettings(s.epoch, s.fanouts or last.fanouts, last.batch_setting if s.batch is None else s.batch,
                                    last.seed_fraction if s.seeds is None else s.seeds))
    return phases


def phase_seeds(seed: int, partition_id: int, train_nodes: np.ndarray, fraction: float) -> np.ndarray:
    """A partition's seeds in a phase: all its training nodes, or a fraction of them chosen by a
    ranking keyed by (seed, partition) alone (nested across fractions, equal on every rank)."""
    if fraction >= 1.0:
        return train_nodes
    ranking = np.random.default_rng([seed, 3, partition_id]).permutation(train_nodes.size)
    return train_nodes[np.sort(ranking[:int(round(fraction * train_nodes.size))])]


@dataclass(frozen=True)
class Phase:
    index: int
    first_epoch: int
    fanouts: tuple[int, ...]
    batch_size: int
    steps_per_epoch: int
    seed_fraction: float

    def describe(self) -> dict:
        return {"phase": self.index, "first_epoch": self.first_epoch, "fanouts": list(self.fanouts),
                "batch_size": self.batch_size, "steps_per_epoch": self.steps_per_epoch, "seeds": self.seed_fraction}


class RunPhases:
    """The phases of a run of ``epochs`` epochs, and the minibatch counter across them."""

    def __init__(self, phases: list[Phase], epochs: int):
        self.phases, self.epochs = phases, epochs
        self.index_of = np.array([max(p.index for p in phases if p.first_epoch <= e) for e in range(epochs)], dtype=np.int64)
        steps = np.array([phases[i].steps_per_epoch for i in self.index_of], dtype=np.int64)
        self.first_counter = np.concatenate([[0], np.cumsum(steps)])  # of each epoch, then the run's total
        self.total = int(self.first_counter[-1])

    def of_epoch(self, epoch: int) -> Phase:
        return self.phases[int(self.index_of[epoch])]

    def steps(self, epoch: int) -> int:
        return self.of_epoch(epoch).steps_per_epoch

    def counter(self, epoch, step):
        """The minibatch's place in the run (arrays work too)."""
        counter = self.first_counter[epoch] + step
        return int(counter) if np.ndim(counter) == 0 else counter

    def position(self, counter: int) -> tuple[int, int]:
        """(epoch, step) of a minibatch counter (``total``: (epochs, 0), the end of the run)."""
        epoch = int(np.searchsorted(self.first_counter, counter, side="right")) - 1
        return epoch, int(counter - self.first_counter[epoch])

    def describe(self) -> list[dict]:
        return [p.describe() for p in self.phases]


def phase_sampler_fanouts(phases: RunPhases):
    """``key -> fanouts`` for ``NeighborSampler``: a minibatch keyed (epoch, step) samples with its
    epoch's phase's fanouts."""
    return lambda key: phases.of_epoch(key[0]).fanouts
