"""The minibatch pipeline: seeds -> sampled blocks -> assembled input features, in training order.

With ``depth`` >= 1 a background thread prepares up to ``depth`` minibatches ahead while the
training thread computes (the paper's 1-deep double buffering: sampling, lookup, replacement and
fetch of minibatch i+1 overlap forward/backward/allreduce of minibatch i). With ``depth`` 0 each
minibatch is prepared when the training thread asks for it: the DistDGL baseline's order.

A lookahead policy needs the inputs of the next W minibatches: the pipeline samples W ahead of
the minibatch it assembles. Sampling runs in one thread in schedule order whatever the depth or
window, so a seed gives the same minibatches under every policy. The trainer's ``stage`` puts
each minibatch's inputs on its device in the same thread (``rudder.train.staging``).
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from rudder.prefetch.assembly import AssemblyStats
from rudder.sampling.neighbors import SampledMinibatch


def matrices_in_flight(depth: int) -> int:
    """The input matrices a trainer holds at once (what ``RowBlocks`` keeps): with the thread,
    ``depth`` in the queue, one being prepared and the one being trained; without it, only the one
    being trained (the next is prepared once the step has let it go)."""
    return depth + 2 if depth else 1


@dataclass
class Prepared:
    epoch: int
    step: int
    seeds: np.ndarray
    minibatch: SampledMinibatch
    x: np.ndarray  # input features, one row per input node
    assembly: AssemblyStats
    t_sample: float
    t_assemble: float
    snapshot: dict | None = None  # buffer and policy state right after this minibatch (a checkpoint's)
    inputs: object = None  # what ``stage`` made of it (the trainer's: its inputs on the model's device)
    t_stage: float = 0.0
    # the preparing thread's CPU seconds (time.thread_time) in each: the work itself, without the
    # time it waited for a core, the interpreter lock or MPI (what a time model's CPU figures are)
    cpu_sample: float = 0.0
    cpu_assemble: float = 0.0
    cpu_stage: float = 0.0


class MinibatchPipeline:
    def __init__(self, schedule, sampler, assembler, depth: int, lookahead: int = 0, snapshot=None, stage=None,
                 watch=None):
        """``schedule``: iterator of (epoch, step, seeds) over the whole run; ``snapshot``:
        ``(epoch, step) -> dict | None``, called right after a minibatch is assembled, before the
        next one changes anything (a checkpoint's buffer and policy state); ``stage``:
        ``Prepared -> object``, called last, its result kept as ``Prepared.inputs``; ``watch(what)``:
        told what the preparing thread is doing (a watchdog's)."""
        self.schedule, self.sampler, self.assembler = schedule, sampler, assembler
        self.watch = watch or (lambda what: None)
        self.depth, self.lookahead, self.snapshot, self.stage = depth, lookahead, snapshot, stage
        self.ahead: collections.deque = collections.deque()  # sampled, not yet assembled
        self.done = False
        self.stop = threading.Event()
        self.thread = None
        if depth:
            self.queue: queue.Queue = queue.Queue(maxsize=depth)
            self.thread = threading.Thread(target=self._produce, name="minibatch-pipeline", daemon=True)
            self.thread.start()

    def _sample_next(self) -> bool:
        try:
            epoch, step, seeds = next(self.schedule)
        except StopIteration:
            return False
        t, c = time.perf_counter(), time.thread_time()
        self.watch(f"sampling minibatch {epoch}:{step} (adjacency reads by RMA)")
        mb = self.sampler.sample(seeds, key=(epoch, step))
        self.ahead.append((epoch, step, seeds, mb, time.perf_counter() - t, time.thread_time() - c))
        return True

    def _prepare(self) -> Prepared | None:
        while len(self.ahead) < 1 + self.lookahead and self._sample_next():
            pass
        if not self.ahead:
            return None
        epoch, step, seeds, mb, t_sample, cpu_sample = self.ahead.popleft()
        t, c = time.perf_counter(), time.thread_time()
        future = [item[3].input_nodes for item in self.ahead]
        self.watch(f"assembling the inputs of minibatch {epoch}:{step} (feature rows by RMA)")
        x, stats = self.assembler.assemble(mb.input_nodes, future)
        t_assemble, cpu_assemble = time.perf_counter() - t, time.thread_time() - c
        state = self.snapshot(epoch, step) if self.snapshot is not None else None
        item = Prepared(epoch, step, seeds, mb, x, stats, t_sample, t_assemble, state, cpu_sample=cpu_sample,
                        cpu_assemble=cpu_assemble)
        if self.stage is not None:
            t, c = time.perf_counter(), time.thread_time()
            item.inputs = self.stage(item)
            item.t_stage, item.cpu_stage = time.perf_counter() - t, time.thread_time() - c
        self.watch(f"minibatch {epoch}:{step} prepared, waiting to hand it over")
        return item

    def _produce(self) -> None:
        try:
            while not self.stop.is_set():
                item = self._prepare()
                while not self.stop.is_set():
                    try:
                        self.queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if item is None:
                    return
        except BaseException as e:  # handed to the training thread, which raises it
            self.queue.put(e)

    def next(self) -> tuple[Prepared, float]:
        """The next minibatch and the seconds the caller waited for it."""
        t = time.perf_counter()
        item = self.queue.get() if self.thread is not None else self._prepare()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the minibatch pipeline failed: {type(item).__name__}: {item}") from item
        if item is None:
            raise RuntimeError("the minibatch pipeline ran out of minibatches")
        return item, time.perf_counter() - t

    def close(self) -> None:
        """Stop preparing (the thread finishes the minibatch it is on)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
