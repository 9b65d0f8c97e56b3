"""The minibatch schedule: which seeds each trainer trains on, in which order, for the whole run.
Keyed by (seed, partition, epoch), so a resumed run, the simulator and every trainer of a node
shuffle alike."""
from __future__ import annotations

import numpy as np


def my_share(items: np.ndarray, layout) -> np.ndarray:
    """This trainer's part of its partition's ``items``: all of them in ``trainer`` mode, a
    contiguous 1/k slice among the node's k trainers in ``node`` mode."""
    if layout.partition_mode == "trainer":
        return items
    return np.array_split(items, layout.node_trainers.size)[layout.node_trainers.rank]


def minibatch_schedule(seed: int, partition_id: int, train_nodes: np.ndarray, share, steps_per_epoch: int,
                       epochs: int, start: int = 0):
    """(epoch, step, seeds) for a whole run from minibatch ``start`` on: each epoch a fresh
    shuffle of the partition's training nodes (keyed by the epoch, so a resumed run and the
    simulator shuffle alike, and the same on a node's trainers), ``share(order)`` of it (this
    trainer's part), split into ``steps_per_epoch`` steps."""
    first_epoch, first_step = divmod(start, steps_per_epoch)
    for epoch in range(first_epoch, epochs):
        order = np.random.default_rng([seed, 1, partition_id, epoch]).permutation(train_nodes)
        for step, seeds in enumerate(np.array_split(share(order), steps_per_epoch)):
            if epoch > first_epoch or step >= first_step:
                yield epoch, step, seeds
