"""When and how a training run checkpoints, and where a resumed one starts (the files are
``rudder.logs.checkpoints``).

Every trainer checkpoints at the same minibatch counter. The pipeline snapshots the buffer and
policy right after assembling that minibatch, before it prepares the next (``snapshot_if_due``),
and the trainer writes the files once the minibatch's step is done (``after_step``), or, for an
epoch's last minibatch, once the epoch's row is logged (``after_epoch``). Periods in minibatches
are known ahead; a period in seconds, or a stop request, sets a target collectively (the flags
ride in the gradient Allreduce): a few minibatches on, past every minibatch any trainer has
prepared, and after a stop request the run ends right after saving it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from rudder.comm import gate
from rudder.logs import checkpoints


@dataclass
class Resumed:
    """The checkpoint a resumed trainer starts from."""
    record: dict  # latest.json
    rank_state: dict  # this trainer's file: assembly and policy state, torch RNG, log row counts
    model_state: dict  # model and optimiser

    @property
    def start(self) -> int:
        """The first minibatch the resumed run trains on."""
        return self.record["counter"] + 1


def rank_file(world_rank: int) -> str:
    return f"rank-{world_rank:05d}.pt"


def load_resumed(run_dir: str, world_rank: int) -> Resumed:
    record = checkpoints.latest(run_dir)
    where = checkpoints.folder(run_dir, record["counter"])
    return Resumed(record, checkpoints.load(os.path.join(where, rank_file(world_rank))),
                   checkpoints.load(os.path.join(where, "model.pt")))


class CheckpointCoordinator:
    def __init__(self, cfg, trainers, world_rank: int, world_size: int, phases, log, snapshot_state,
                 model_state, on_snapshot):
        """``snapshot_state()``: the pipeline-side state (assembly, policy) to keep; ``model_state()``:
        the model and optimiser; ``on_snapshot(counter)``: the policy learns a checkpoint is taken."""
        self.cfg, self.trainers, self.world_rank, self.world_size = cfg, trainers, world_rank, world_size
        self.phases, self.log = phases, log  # rudder.sampling.phases.RunPhases: counters across epochs
        self.snapshot_state, self.model_state, self.on_snapshot = snapshot_state, model_state, on_snapshot
        self.period = cfg.checkpoint.period
        self.target: int | None = None  # the counter a collectively set checkpoint is taken at
        self.stop_at: int | None = None  # a stop request: the counter after which the run ends
        self.deferred = None  # (epoch, step, snapshot) of a checkpoint waiting for the end of its epoch
        self.last = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self.period is not None

    def snapshot_if_due(self, epoch: int, step: int) -> dict | None:
        """Called by the pipeline right after assembling minibatch (epoch, step)."""
        counter = self.phases.counter(epoch, step)
        kind, n = self.period
        if not ((kind == "minibatches" and (counter + 1) % n == 0) or counter == self.target):
            return None
        self.on_snapshot(counter)
        return self.snapshot_state()

    def due_by_clock(self) -> bool:
        """A checkpoint is due by time (trainer 0's clock decides; the flag rides in the Allreduce)."""
        return (self.period is not None and self.period[0] == "seconds" and self.trainers.rank == 0
                and time.monotonic() - self.last >= self.period[1])

    def after_step(self, epoch: int, step: int, snapshot: dict | None, checkpoint_asked: bool, stop_asked: bool) -> bool:
        """Save this minibatch's snapshot if one was taken; returns whether to stop now. With
        checkpoints on, a stop request first sets a checkpoint a few minibatches on."""
        counter = self.phases.counter(epoch, step)
        if snapshot is not None and step == self.phases.steps(epoch) - 1:
            self.deferred = (epoch, step, snapshot)  # saved once the epoch's row is logged
        elif snapshot is not None:
            self.save(epoch, step, snapshot)
        if self.period is None:
            return stop_asked
        if checkpoint_asked or stop_asked:
            if self.target is not None:
                coming = self.target
            elif self.deferred is not None:
                coming = self.phases.counter(self.deferred[0], self.deferred[1])
            else:  # past every minibatch any trainer has prepared by now
                coming = self.target = counter + self.cfg.sampling.prefetch_depth + 2
            if stop_asked and self.stop_at is None:
                self.stop_at = coming
        return self.stop_at is not None and counter >= self.stop_at

    def after_epoch(self) -> None:
        """A checkpoint after an epoch's last minibatch includes its epoch row."""
        if self.deferred is not None:
            self.save(*self.deferred)
            self.deferred = None

    def save(self, epoch: int, step: int, snapshot: dict) -> None:
        """Collective over the trainers, after minibatch (epoch, step) was trained on."""
        counter = int(self.phases.counter(epoch, step))
        run_dir = self.cfg.output.run_dir
        where = checkpoints.folder(run_dir, counter)
        t = time.perf_counter()
        self.log.flush()  # every row up to here on disk: a resumed run continues right after them
        if self.trainers.rank == 0:
            checkpoints.save(os.path.join(where, "model.pt"), self.model_state())
        checkpoints.save(os.path.join(where, rank_file(self.world_rank)),
                         {"counter": counter, **snapshot, "torch_rng": torch.get_rng_state(),
                          "log_rows": dict(self.log.written)})
        gate.collective(self.trainers, self.trainers.Barrier)  # beside the pipeline thread: rudder.comm.gate
        if self.trainers.rank == 0:
            checkpoints.commit(run_dir, {"counter": counter, "epoch": epoch, "step": step, "world_size": self.world_size,
                                         "save_seconds": time.perf_counter() - t,
                                         "config": json.loads(self.cfg.to_json())})
        self.target, self.last = None, time.monotonic()
