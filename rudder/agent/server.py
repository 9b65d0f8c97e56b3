"""The agent rank: one per node, it serves its node's trainers' decisions (``rudder.agent.protocol``
over point-to-point messages on the node communicator; the agent is the node's highest rank).

Requests are answered oldest first, all messages that have arrived being taken in before each
decision, so one model serves its trainers fairly (MPI's ANY_SOURCE matching is not fair: low
ranks could starve the others). BYE ends a trainer; the agent answers everything it received
first (messages from one trainer are processed in order), cuts a decision short once it sees the
trainer's BYE behind it, and exits when all its trainers said BYE.

Point-to-point rather than nonblocking collectives: trainers reach their windows at different
moments and must never wait for one another or for the agent, and an ``Igather`` completes only
when every member of the node has joined it.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque

import numpy as np
from mpi4py import MPI

from rudder.agent.deciders import DECIDERS, Decider, TrainerContext, make_decider
from rudder.agent.protocol import (
    BYE,
    CHECKPOINT,
    HELLO,
    HELLO_FIELDS,
    MESSAGE_SIZE,
    REQUEST_FIELDS,
    TAG_BYE,
    TAG_READY,
    TAG_TO_TRAINER,
)
from rudder.agent.service import DecisionService
from rudder.comm.runtime import library_versions
from rudder.logs import checkpoints
from rudder.logs.schema import AGENT, AGENT_RAGGED, AGENT_TABLES
from rudder.logs.writer import RunLog, log_path


class AgentServer(DecisionService):
    """The agent rank's loop: the node's trainers' requests over MPI, answered by a DecisionService."""

    def __init__(self, layout, decider: Decider, log, delay: float = 0.0, run_dir: str = "", contexts=None):
        super().__init__(decider, log, delay, contexts)
        self.comm, self.run_dir, self.world_rank = layout.node, run_dir, layout.world.rank
        self.trainers = self.comm.size - 1  # every other rank of the node trains
        self.checkpoints: dict[int, int] = {}  # counter: trainers that reported it
        self.gone: set[int] = set()  # trainers that said BYE

    def answer(self, trainer: int, req: dict) -> np.ndarray:
        # A BYE behind this request means nobody will use the answer (a trainer awaiting an
        # answer sends nothing else but checkpoint notices, which have the common tag).
        self.contexts[trainer].abandoned = lambda: trainer in self.gone or self.comm.Iprobe(source=trainer, tag=TAG_BYE)
        return super().answer(trainer, req)

    def serve(self) -> int:
        """Answer requests oldest first until every trainer said BYE; returns the decisions made."""
        done, sends, waiting = 0, [], deque()
        status, idle = MPI.Status(), 0.0005
        while done < self.trainers or waiting:
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                buf = np.zeros(MESSAGE_SIZE)
                n = status.Get_count(MPI.DOUBLE)
                self.comm.Recv([buf, n, MPI.DOUBLE], source=status.Get_source(), tag=status.Get_tag())
                trainer, kind = status.Get_source(), int(buf[0])
                if kind == HELLO:  # the decider is built (and warm): the trainer may start
                    self.hello(trainer, dict(zip(HELLO_FIELDS[1:], buf[1:len(HELLO_FIELDS)].tolist())))
                    sends.append(self.comm.Isend(np.ones(1), dest=trainer, tag=TAG_READY))
                elif kind == CHECKPOINT:
                    self.checkpoint(int(buf[1]))
                elif kind == BYE:
                    done += 1
                    self.gone.add(trainer)
                else:
                    waiting.append((trainer, dict(zip(REQUEST_FIELDS, buf[:len(REQUEST_FIELDS)].tolist()))))
            if not waiting:  # idle: leave the core to the node's trainers, polling less and less often
                self.log.maybe_flush()
                time.sleep(idle)
                idle = min(2 * idle, 0.005)
                continue
            idle = 0.0005
            trainer, req = waiting.popleft()
            answer = self.answer(trainer, req)
            sends = [r for r in sends if not r.Test()] + [self.comm.Isend(answer, dest=trainer, tag=TAG_TO_TRAINER)]
            self.log.maybe_flush()
        MPI.Request.Waitall(sends)
        return self.decisions

    def checkpoint(self, counter: int) -> None:
        """Once every trainer of the node checkpoints after ``counter``: save the contexts."""
        self.checkpoints[counter] = self.checkpoints.get(counter, 0) + 1
        if self.checkpoints[counter] < self.trainers:
            return
        del self.checkpoints[counter]
        self.log.flush()
        checkpoints.save(os.path.join(checkpoints.folder(self.run_dir, counter), agent_file(self.world_rank)),
                         {"counter": counter, "contexts": self.saved_contexts(), "log_rows": dict(self.log.written)})


def agent_file(world_rank: int) -> str:
    return f"agent-{world_rank:05d}.pt"


def run_agent(cfg, layout, meta) -> int:
    """An agent rank's whole job: serve its node's trainers until they all said BYE."""
    contexts, rows = None, None
    if cfg.checkpoint.resume:  # the contexts saved with the trainers' latest checkpoint (if the agent got there)
        contexts, rows = resumed_contexts(cfg.output.run_dir, layout.world.rank)
    decider_class = DECIDERS[cfg.buffer.policy]
    log = RunLog(log_path(cfg.output.run_dir, layout.world.rank),
                 {"role": AGENT, "config": cfg.to_json(), "versions": json.dumps(library_versions()),
                  "layout": json.dumps(layout.describe()),
                  "run": json.dumps({"decider": decider_class.name, "prompt_version": decider_class.prompt_version}),
                  "data": json.dumps({"dir": cfg.data.path, "dataset": meta.dataset})},
                 AGENT_TABLES, AGENT_RAGGED, flush_seconds=cfg.output.log_flush_seconds, resume_rows=rows)
    t = time.perf_counter()
    decider = make_decider(cfg, layout.threads_per_rank)
    log.flush(decider_build_seconds=time.perf_counter() - t, decider_ready_at=time.time())
    try:
        decisions = AgentServer(layout, decider, log, cfg.agent.delay, cfg.output.run_dir, contexts).serve()
    except Exception as e:
        log.close("failed", f"{type(e).__name__}: {e}")
        raise
    finally:
        decider.close()
    log.close("completed")
    return decisions


def resumed_contexts(run_dir: str, world_rank: int) -> tuple[dict, dict]:
    """(contexts by trainer, log row counts) from the latest checkpoint; without an agent file
    there (the job ended before the agent saved), empty contexts and the log kept whole."""
    record = checkpoints.latest(run_dir)
    path = os.path.join(checkpoints.folder(run_dir, record["counter"]), agent_file(world_rank))
    if not os.path.exists(path):
        return {}, {name: np.iinfo(np.int64).max for name in (*AGENT_TABLES, *AGENT_RAGGED)}
    saved = checkpoints.load(path)
    contexts = {}
    for trainer, c in saved["contexts"].items():
        contexts[trainer] = TrainerContext(c["facts"], history=deque(c["history"], maxlen=5), pending=c["pending"],
                                           last_evicted=c["last_evicted"])
    return contexts, saved["log_rows"]
