"""Model replicas that diverged: what the trainers do once a check found them unequal (the step's
check in the gradient allreduce, ``rudder.train.data_parallel.ReplicaCheck``, or the epoch's
digest check), as ``--on-divergence`` says.

This is the rare path, so it may cost a collective: every trainer's digest of all its parameters
and of each tensor is gathered on a communicator of its own. The source is the lowest trainer
whose parameters agree with the majority's (more than half the trainers); with no majority (two
trainers, or a tie) trainer 0. ``repair`` broadcasts the source's parameters and Adam state to
every trainer, after which the caller recomputes the step (the same minibatch, the same dropout
draws): the training goes on exactly as if nothing had diverged. ``abort`` ends the job with one
line naming the minibatch and the trainers, every trainer's log closed first. Either way every
trainer logs the event (``rudder.logs.schema.REPAIR_ROW``).

When every digest agrees although the step's check failed, the parameters are equal and the
reduction was not: nothing is restored and the step is recomputed. A trainer that alone saw the
check fail (its reduced buffer differs from the others', a disturbed reduction) finds no one in
the gather: after ``GATHER_DEADLINE`` seconds it ends the job, saying so.
"""
from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from rudder.comm import gate
from rudder.comm.runtime import abort_job
from rudder.logs.schema import DIVERGENCE_ACTIONS, DIVERGENCE_CHECKS, LISTED_CHARS
from rudder.train.data_parallel import broadcast_parameters, parameter_digest

GATHER_DEADLINE = 30.0  # seconds a trainer waits for the others in the digests' gather
POLL_SECONDS = 1e-3


def tensor_digest(tensor: torch.Tensor) -> int:
    """A 63-bit digest of one tensor's bytes (as ``parameter_digest`` of a whole model)."""
    data = np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def listed(items) -> str:
    """Comma-separated, cut to the log's column width."""
    text = ",".join(map(str, items))
    return text if len(text) <= LISTED_CHARS else text[:LISTED_CHARS - 3] + "..."


@dataclass
class Divergence:
    minibatch: int
    epoch: int
    check: str  # DIVERGENCE_CHECKS
    trainers: int
    source: int
    majority: bool
    agreeing: int  # trainers whose parameters equal the source's
    diverged: list[int]  # trainer ranks
    tensors: list[str]

    @property
    def action(self) -> str:
        return "repaired" if self.diverged else "recomputed"

    def describe(self) -> str:
        where = f"minibatch {self.minibatch} (epoch {self.epoch}, the {self.check}'s check)"
        if not self.diverged:
            return f"replicas checked unequal at {where}, yet every trainer's parameters agree: the reduction differed"
        who = ", ".join(map(str, self.diverged))
        return (f"model replicas diverged at {where}: trainer{'s' if len(self.diverged) > 1 else ''} {who} differed "
                f"from trainer {self.source} ({self.agreeing} of {self.trainers} agreeing"
                f"{'' if self.majority else ', no majority: trainer 0 taken'}) in {', '.join(self.tensors)}")


class ReplicaRepair:
    def __init__(self, trainers, model: torch.nn.Module, optimizer, mode: str, log):
        """Collective over ``trainers`` (a communicator of its own for the rare path)."""
        self.comm = gate.collective(trainers, trainers.Dup)
        self.model, self.optimizer, self.mode, self.log = model, optimizer, mode, log
        self.named = list(model.named_parameters())

    def handle(self, minibatch: int, epoch: int, check: str) -> Divergence:
        """Collective: find who differs, log it, and repair (or end the job with ``abort``)."""
        start = time.perf_counter()
        divergence = self._find(minibatch, epoch, check)
        action = "aborted" if self.mode == "abort" and divergence.diverged else divergence.action
        if action == "aborted":
            self._record(divergence, action, time.perf_counter() - start)
            self._abort(divergence)
        if divergence.diverged:
            broadcast_parameters(self.comm, self.model, root=divergence.source)
            state = gate.collective(self.comm, self.comm.bcast,
                                    self.optimizer.state_dict() if self.comm.rank == divergence.source else None,
                                    root=divergence.source)
            if self.comm.rank != divergence.source:
                self.optimizer.load_state_dict(state)
        self._record(divergence, action, time.perf_counter() - start)
        if self.comm.rank == 0:
            done = f"every trainer restored from trainer {divergence.source}" if divergence.diverged else "nothing restored"
            print(f"train.py: {divergence.describe()}; {done}, {'the step recomputed' if check == 'step' else 'going on'}",
                  file=sys.stderr, flush=True)
        return divergence

    def _find(self, minibatch: int, epoch: int, check: str) -> Divergence:
        mine = np.array([parameter_digest(self.model)] + [tensor_digest(p) for _, p in self.named], dtype=np.int64)
        table = np.empty((self.comm.size, mine.size), dtype=np.int64)
        with gate.held():
            request = self.comm.Iallgather(mine, table)
        deadline = time.monotonic() + GATHER_DEADLINE
        while not _tested(request):
            if time.monotonic() > deadline:
                abort_job(None, f"the replica check failed at minibatch {minibatch} on this trainer, but no other "
                          f"trainer joined the digests' gather in {GATHER_DEADLINE:.0f} s: its reduced gradient "
                          f"buffer differs from theirs (a disturbed reduction)", log=self.log)
            time.sleep(POLL_SECONDS)
        whole = table[:, 0]
        values, counts = np.unique(whole, return_counts=True)
        majority = bool(counts.max() * 2 > whole.size)
        source = int(np.flatnonzero(whole == values[counts.argmax()])[0]) if majority else 0
        diverged = [int(r) for r in np.flatnonzero(whole != whole[source])]
        tensors = [name for i, (name, _) in enumerate(self.named) if (table[:, 1 + i] != table[source, 1 + i]).any()]
        return Divergence(minibatch, epoch, check, int(whole.size), source, majority,
                          int((whole == whole[source]).sum()), diverged, tensors)

    def _record(self, d: Divergence, action: str, seconds: float) -> None:
        self.log.append("repairs", {"minibatch": d.minibatch, "epoch": d.epoch, "check": DIVERGENCE_CHECKS.index(d.check),
                                    "action": DIVERGENCE_ACTIONS.index(action),
                                    "source": d.source if d.diverged else -1, "majority": d.majority,
                                    "diverged_count": len(d.diverged), "diverged": listed(d.diverged),
                                    "tensors": listed(d.tensors), "seconds": seconds})

    def close(self) -> None:
        """Collective over the trainers."""
        gate.collective(self.comm, self.comm.Free)

    def _abort(self, d: Divergence) -> None:
        """Every trainer's log closed, then trainer 0 ends the job with the one line."""
        message = f"{d.describe()} (--on-divergence abort)"
        self.log.close("failed", message)
        gate.collective(self.comm, self.comm.Barrier)
        if self.comm.rank == 0:
            abort_job(None, message, log=self.log)
        gate.collective(self.comm, self.comm.Barrier)  # trainer 0 never joins: its abort ends this rank


def _tested(request) -> bool:
    """One test, under the rank's MPI lock (``rudder.comm.gate``)."""
    with gate.held():
        return request.Test()
