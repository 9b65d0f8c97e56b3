"""Checkpoints of a training run, and resuming from them.

Layout under the run directory::

    checkpoint/latest.json                   the newest complete checkpoint: its minibatch
                                             counter, epoch, step, the run's config and layout
    checkpoint/minibatch-NNNNNNNNN/model.pt  model and optimiser (trainer rank 0; replicas are equal)
    checkpoint/minibatch-NNNNNNNNN/rank-NNNNN.pt
                                             per trainer: buffer and policy state (the buffer's
                                             node IDs and scores, not its rows: a resumed run
                                             reads them again from their owners), torch's RNG
                                             (dropout), and its log's row counts
    checkpoint/minibatch-NNNNNNNNN/agent-NNNNN.pt
                                             per agent: every trainer's context (last 5
                                             outcomes, pending decision) and its log's row counts

A checkpoint is taken between two minibatches on every trainer at the same counter: the
minibatch pipeline snapshots the buffer and policy right after assembling that minibatch,
before it prepares the next, and the trainer writes the files once the minibatch's step is done.
``latest.json`` is replaced (atomically) only after every trainer has written its file, so a
job killed mid-checkpoint resumes from the previous one. Sampling and shuffling draw from
streams keyed by (epoch, step), so a resumed run samples exactly what the uninterrupted run
would have, and the loss sequence is the same bit for bit (tested).
"""
from __future__ import annotations

import glob
import json
import os
import shutil

# 2: config sections, policy and collector states by name; 3: buffer slots in no order, scored
# buffer counters; 4: a scored buffer's miss counts per trainer, a split's owners, holdings and
# claims (node-shared buffers checkpoint); 5: no buffer rows (a resumed run reads them again from
# their owners), so a rank's file no longer grows with the rows' width. Format 4 still resumes (its
# rows are left aside and read again: the same values).
FORMAT_VERSION = 5
READS = (4, 5)


def root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoint")


def folder(run_dir: str, counter: int) -> str:
    return os.path.join(root(run_dir), f"minibatch-{counter:09d}")


def save(path: str, state: dict) -> None:
    """torch.save to ``path``, atomically (a reader never sees half a file)."""
    import torch

    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def committed_counter(run_dir: str) -> int:
    """The minibatch counter of the latest committed checkpoint (``latest``), -1 if none."""
    try:
        return int(latest(run_dir)["counter"])
    except (OSError, ValueError, KeyError):
        return -1


def save_late(run_dir: str, counter: int, name: str, state: dict) -> bool:
    """``save`` of a rank's file NAME into checkpoint ``counter`` by a rank the trainers do not wait
    for (an agent): by the time it writes, they may have committed a newer checkpoint and dropped
    this one's folder, and then the file is of no use (no resume reads it). Whether it was saved."""
    where = folder(run_dir, counter)
    if committed_counter(run_dir) > counter:
        return False
    try:
        save(os.path.join(where, name), state)
        return True
    except FileNotFoundError:  # the folder went while writing
        if committed_counter(run_dir) <= counter:
            raise
    shutil.rmtree(where, ignore_errors=True)  # what the save may have made again
    return False


def load(path: str) -> dict:
    import torch

    return torch.load(path, weights_only=False)


def commit(run_dir: str, record: dict) -> None:
    """Make the checkpoint at ``record["counter"]`` the latest, then drop older ones."""
    path = os.path.join(root(run_dir), "latest.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"format_version": FORMAT_VERSION, **record}, f, indent=1)
    os.replace(path + ".tmp", path)
    keep = folder(run_dir, record["counter"])
    for old in glob.glob(os.path.join(root(run_dir), "minibatch-*")):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: str) -> dict:
    path = os.path.join(root(run_dir), "latest.json")
    with open(path) as f:
        record = json.load(f)
    if record.get("format_version") not in READS:
        raise ValueError(f"--resume {run_dir}: {path} is of checkpoint format {record.get('format_version')}, which is "
                         f"not supported (expected format {' or '.join(map(str, READS))}: resume it with the version "
                         "that wrote it)")
    return record
