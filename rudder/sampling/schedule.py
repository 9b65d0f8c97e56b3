"""The minibatch schedule: which seeds each trainer trains on, in which order, for the whole run.
Keyed by (seed, partition, epoch), so a resumed run, the simulator and every trainer of a node
shuffle alike."""
from __future__ import annotations

import numpy as np

from rudder.sampling.phases import RunPhases, phase_seeds


def my_share(items: np.ndarray, layout) -> np.ndarray:
    """This trainer's part of its partition's ``items``: all of them in ``trainer`` mode, a
    contiguous 1/k slice among the node's k trainers in ``node`` mode."""
    if layout.partition_mode == "trainer":
        return items
    return np.array_split(items, layout.node_trainers.size)[layout.node_trainers.rank]


def minibatch_schedule(seed: int, partition_id: int, train_nodes: np.ndarray, share, phases: RunPhases,
                       start: int = 0):
    """(epoch, step, seeds) for a whole run from minibatch counter ``start`` on: each epoch a fresh
    shuffle of the partition's seeds in the epoch's phase (``phase_seeds``: all its training
    nodes unless a ``--shift`` says otherwise), keyed by the epoch, so a resumed run and the
    simulator shuffle alike, and the same on a node's trainers; ``share(order)`` of it (this
    trainer's part), split into the phase's steps per epoch."""
    first_epoch, first_step = phases.position(start)
    for epoch in range(first_epoch, phases.epochs):
        phase = phases.of_epoch(epoch)
        seeds_now = phase_seeds(seed, partition_id, train_nodes, phase.seed_fraction)
        order = np.random.default_rng([seed, 1, partition_id, epoch]).permutation(seeds_now)
        for step, seeds in enumerate(np.array_split(share(order), phase.steps_per_epoch)):
            if epoch > first_epoch or step >= first_step:
                yield epoch, step, seeds
