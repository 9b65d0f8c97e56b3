"""Data-parallel training over MPI: every trainer holds a full replica of the model; each step
sums the trainers' gradients with one Allreduce of a flat float32 buffer.

Each trainer back-propagates the *sum* of its seeds' losses and the buffer carries the seed
count along, so the averaged gradient is the mean over all seeds of the global minibatch, even
when trainers hold minibatches of different sizes (or none). Two more scalars ride in the same
message: the loss sum (for the log) and a stop flag, so that a SIGINT/SIGTERM seen by any rank
stops every rank after the same step without an extra collective.

On a GPU the buffer is gathered on the device and, unless the MPI library is CUDA-aware, staged
through pinned host memory around the call (``GradientAllreduce.path`` says which; the trainer
logs it with the run and the staging copies' time with each minibatch).

Replicas start identical (parameters broadcast from trainer 0) and stay identical because every
rank applies the same reduced gradient with the same optimiser; ``parameter_digest`` lets the
trainer check that every epoch. Every step checks it too, in the same message (``ReplicaCheck``):
each rank adds a digest of its parameters as they entered the step, split into small integers
whose sums stay exact, and a rank whose parameters differ (a disturbed reduction, a bad update,
``--inject-divergence``) is found at the next step by every rank alike, with no extra message or
wait (``rudder.train.replicas`` repairs it).
"""
from __future__ import annotations

import hashlib
import math
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from rudder.comm import gate, waiting


@dataclass
class StepTotals:
    seeds: int  # seeds in the global minibatch (all trainers)
    loss_sum: float  # summed loss over those seeds
    stop: bool  # some rank asked to stop
    checkpoint: bool = False  # some rank asked for a checkpoint
    replicas_agree: bool = True  # every trainer's parameters entered the step equal (ReplicaCheck)


def step_digest(params: list[torch.Tensor]) -> int:
    """A 32-bit CRC of the parameters' bytes, the per-step check's digest: it finds every change of
    one element (any flipped bit; every burst of up to 32 bits) and misses a random difference with
    probability 2^-32, at each step again while it lasts. About 60 us for Cora's 46,103 parameters
    on this host, where blake2b (``parameter_digest``, the epoch's check) took 370 us."""
    crc = 0
    for p in params:
        crc = zlib.crc32(memoryview(np.ascontiguousarray(p.detach().cpu().numpy())).cast("B"), crc)
    return crc


class ReplicaCheck:
    """The digest slots of the gradient message. Each rank writes its digest as ``slots`` chunks of
    ``chunk_bits`` bits and their squares, all integer-valued floats; summed over P ranks they stay
    below 2^24, so float32 sums are exact in any reduction order. Rank j finds the replicas equal iff
    every chunk's sum is P x its own chunk and every square's sum P x its own square: then each
    chunk's variance over the ranks is 0, so every rank reaches the same verdict from the same
    reduced buffer (a sum alone could equal P x one rank's chunk while others differ)."""

    DIGEST_BITS = 32  # step_digest's

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.chunk_bits = (24 - math.ceil(math.log2(ranks))) // 2 if ranks > 1 else 12  # chunk^2 * P < 2^24
        if self.chunk_bits < 1:
            raise ValueError(f"ReplicaCheck: {ranks} trainers leave no exact bits in a float32 sum")
        self.slots = -(-self.DIGEST_BITS // self.chunk_bits)
        self.size = 2 * self.slots  # floats in the message

    def encode(self, digest: int) -> np.ndarray:
        mask = (1 << self.chunk_bits) - 1
        chunks = np.array([(digest >> (i * self.chunk_bits)) & mask for i in range(self.slots)], dtype=np.float64)
        return np.concatenate([chunks, chunks * chunks]).astype(np.float32)

    def agrees(self, reduced: np.ndarray, own: np.ndarray) -> bool:
        return bool(np.array_equal(np.asarray(reduced, dtype=np.float64), self.ranks * own.astype(np.float64)))


class GradientAllreduce:
    EXTRAS = 4  # seeds, loss sum, stop flag, checkpoint flag
    PATHS = ("host", "staged", "device")  # where MPI reads and writes the flat buffer

    def __init__(self, comm, module: torch.nn.Module, device_buffer: bool = False, wait: str = "spin",
                 check: bool = True):
        """Gradients on the CPU: one host buffer (path ``host``). On a GPU: gathered into a
        device buffer that MPI reads directly when ``device_buffer`` (a CUDA-aware MPI: path
        ``device``), else copied through a pinned host buffer (path ``staged``). ``check``: carry
        the per-step replica check (``ReplicaCheck``) after the extras."""
        self.comm, self.wait = comm, wait
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.check = ReplicaCheck(comm.size) if check else None
        self.check_at = self.numel + self.EXTRAS  # the digest slots' offset in the flat buffer
        device = self.params[0].device if self.params else torch.device("cpu")
        self.path = "host" if device.type == "cpu" else "device" if device_buffer else "staged"
        size = self.check_at + (self.check.size if self.check else 0)
        self.flat = torch.zeros(size, dtype=torch.float32, device=device)  # where gradients gather
        if self.path == "staged":
            self.wire = torch.zeros(self.flat.shape, dtype=torch.float32, pin_memory=True)  # what MPI reads
        else:
            self.wire = self.flat
        self.wire_buffer = self.wire.numpy() if self.path != "device" else self.wire  # the same memory, for MPI
        self.seconds_staging = 0.0  # the last call's copies between device and host (path staged)

    def allreduce(self, num_seeds: int, loss_sum: float, stop: bool, checkpoint: bool = False) -> StepTotals:
        """Sum gradients (of summed losses) over the trainers, then set each ``.grad`` to the
        mean over all seeds. Collective: every trainer calls it once per step."""
        from mpi4py import MPI

        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device)
                 for p in self.params]
        if num_seeds:
            self.flat[:self.numel].copy_(torch.cat(grads))
        else:  # an empty minibatch contributes nothing
            self.flat[:self.numel].zero_()
        self.flat[self.numel:self.check_at] = torch.tensor([num_seeds, loss_sum, float(stop), float(checkpoint)])
        own = self.check.encode(step_digest(self.params)) if self.check else None  # the parameters entering the step
        if own is not None:
            self.flat[self.check_at:] = torch.from_numpy(own)
        self._to_wire()
        # Nonblocking whatever the wait, so that spin and yield reduce in the same order; started
        # under the rank's MPI lock and completed by tests that release it between them, so the
        # pipeline thread's Gets go on but never inside MPI beside this thread (rudder.comm.gate)
        with gate.held():
            request = self.comm.Iallreduce(MPI.IN_PLACE, self.wire_buffer, op=MPI.SUM)
        waiting.wait_all([request], self.wait)
        self._from_wire()
        seeds, loss, stops, checkpoints = (float(x) for x in self.wire[self.numel:self.check_at].tolist())
        if own is not None and not self.check.agrees(self.wire[self.check_at:].cpu().numpy(), own):
            # the gradients may come from unequal replicas: the caller repairs them and reduces again
            return StepTotals(int(round(seeds)), loss, stops > 0, checkpoints > 0, replicas_agree=False)
        if seeds > 0:
            self.flat[:self.numel].div_(seeds)
            offset = 0
            for p in self.params:
                n = p.numel()
                chunk = self.flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = chunk.to(p.device).clone()
                else:
                    p.grad.copy_(chunk)
                offset += n
        return StepTotals(int(round(seeds)), loss, stops > 0, checkpoints > 0)

    def _to_wire(self) -> None:
        """MPI knows no CUDA stream: the buffer must be complete before the call."""
        self.seconds_staging = 0.0
        if self.path == "host":
            return
        start = time.perf_counter()
        if self.path == "staged":
            self.wire.copy_(self.flat, non_blocking=True)
        torch.cuda.current_stream(self.flat.device).synchronize()
        if self.path == "staged":
            self.seconds_staging = time.perf_counter() - start

    def _from_wire(self) -> None:
        if self.path == "staged":
            start = time.perf_counter()
            self.flat.copy_(self.wire, non_blocking=True)
            torch.cuda.current_stream(self.flat.device).synchronize()
            self.seconds_staging += time.perf_counter() - start


def broadcast_parameters(comm, module: torch.nn.Module, root: int = 0) -> None:
    """Make every replica equal to the root's (collective)."""
    for tensor in list(module.parameters()) + list(module.buffers()):
        host = tensor.detach().cpu().contiguous()
        array = host.numpy()
        gate.collective(comm, comm.Bcast, array, root=root)  # a repair's runs beside the pipeline thread
        tensor.data.copy_(torch.from_numpy(array))


def parameter_digest(module: torch.nn.Module) -> int:
    """A 63-bit digest of every parameter's bytes: equal on all ranks iff replicas are identical."""
    h = hashlib.blake2b(digest_size=8)
    for tensor in module.parameters():
        h.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes())
    return int.from_bytes(h.digest(), "little") >> 1
