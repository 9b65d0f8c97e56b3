"""The agent rank: one per node, it serves its node's trainers' decisions (``rudder.agent.protocol``
on the node communicator; the agent is the node's highest rank), over one of two transports.

``--agent-transport collective`` (``CollectiveServer``): windows at agreed minibatches (every
``--agent-window``, counted from the run's start). The node's trainers take the same minibatches
and join a gradient Allreduce every step, so they reach each window within a step of one another
anyway: every trainer joins every window's ``Igather`` (the agent its root), with a request or a
SKIP row (its decision still outstanding: the metrics it gathered meanwhile are stale and
dropped, as in p2p, so the agent has nothing to decide for it), and tests the window's
``Iscatter`` of answers each minibatch, never waiting. The agent keeps up to
``--agent-windows-in-flight`` gathers posted ahead on one duplicate of the node communicator,
decides every request of the windows gathered so far in one pass (``DecisionService.answer_all``:
the in-process llm answers a pass in one batched model call, the other deciders one by one), and
answers each window with an ``Iscatter`` on another duplicate, in window order; gathers posted
apart from answers let it keep gathering while it decides. A trainer has at most one request in
flight, so an agent behind by several windows has no older request of a trainer to supersede: it
decides them all together. The number of windows follows from the trainers' HELLO (total
minibatches, start) and the window, so every collective posted is matched, at the run's end too.

``--agent-transport p2p`` (``AgentServer``): a request per trainer whenever it is due, answered
point-to-point. Requests are answered oldest first, all messages that have arrived being taken in before each
decision, so one model serves its trainers fairly (MPI's ANY_SOURCE matching is not fair: low
ranks could starve the others). BYE ends a trainer; the agent answers everything it received
first (messages from one trainer are processed in order), cuts a decision short once it sees the
trainer's BYE behind it, and exits when all its trainers said BYE. HELLO/READY, CHECKPOINT
and BYE are point-to-point in both.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from rudder.agent.deciders import DECIDERS, Decider, TrainerContext, make_decider
from rudder.agent.link import duplicate
from rudder.agent.protocol import (
    BYE,
    CHECKPOINT,
    DECISION_FIELDS,
    HELLO,
    HELLO_FIELDS,
    HELLO_START,
    MESSAGE_SIZE,
    REQUEST,
    REQUEST_FIELDS,
    TAG_BYE,
    TAG_READY,
    TAG_TO_TRAINER,
    window_counters,
)
from rudder.agent.service import DecisionService
from rudder.comm.runtime import library_versions
from rudder.logs import checkpoints
from rudder.logs.schema import AGENT, AGENT_RAGGED, AGENT_TABLES
from rudder.logs.writer import RunLog, log_path


@dataclass(frozen=True)
class IdlePoll:
    """How the agent looks for messages while it has nothing to decide: it sleeps ``first``
    seconds, doubling up to ``longest``, and starts again from ``first`` after each decision.
    Every look enters MPICH's progress engine (shared memory and sockets polled) and wakes the
    process: on the trainers' cores each wake-up preempts a trainer's thread, so an agent sharing
    them looks less often (its answers arrive a little later: ``rudder.analyze`` reports the
    gap); on a core of its own (``--agent-cores``) looking costs the trainers nothing."""
    first: float
    longest: float

    def after(self, idle: float) -> float:
        return min(2 * idle, self.longest)


POLL_OWN_CORE = IdlePoll(0.0005, 0.005)
POLL_SHARED_CORES = IdlePoll(0.002, 0.02)


class AgentServer(DecisionService):
    """The agent rank's loop: the node's trainers' requests over MPI, answered by a DecisionService."""

    def __init__(self, layout, decider: Decider, log, delay: float = 0.0, run_dir: str = "", contexts=None,
                 poll: IdlePoll = POLL_OWN_CORE):
        super().__init__(decider, log, delay, contexts)
        self.poll = poll
        self.comm, self.run_dir, self.world_rank = layout.node, run_dir, layout.world.rank
        self.trainers = self.comm.size - 1  # every other rank of the node trains
        self.checkpoints: dict[int, int] = {}  # counter: trainers that reported it
        self.gone: set[int] = set()  # trainers that said BYE
        self.starts: dict[int, int] = {}  # the minibatch each trainer starts from (its HELLO)
        self.sends: list = []
        self.status = MPI.Status()

    def answer_all(self, requests: list[tuple[int, dict]]) -> list[np.ndarray]:
        # A BYE behind a request means nobody will use the answer (a trainer awaiting an answer
        # sends nothing else point-to-point but checkpoint notices, which have the common tag).
        for trainer, _ in requests:
            self.contexts[trainer].abandoned = lambda t=trainer: t in self.gone or self.comm.Iprobe(source=t, tag=TAG_BYE)
        return super().answer_all(requests)

    def receive(self) -> list[tuple[int, dict]]:
        """Take in every point-to-point message that has arrived; returns the requests among them."""
        requests, status = [], self.status
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            buf = np.zeros(MESSAGE_SIZE)
            n = status.Get_count(MPI.DOUBLE)
            self.comm.Recv([buf, n, MPI.DOUBLE], source=status.Get_source(), tag=status.Get_tag())
            trainer, kind = status.Get_source(), int(buf[0])
            if kind == HELLO:  # the decider is built (and warm): the trainer may start
                self.hello(trainer, dict(zip(HELLO_FIELDS[1:], buf[1:len(HELLO_FIELDS)].tolist())))
                self.starts[trainer] = int(buf[HELLO_START])
                self.sends.append(self.comm.Isend(np.ones(1), dest=trainer, tag=TAG_READY))
            elif kind == CHECKPOINT:
                self.checkpoint(int(buf[1]))
            elif kind == BYE:
                self.gone.add(trainer)
            else:
                requests.append((trainer, dict(zip(REQUEST_FIELDS, buf[:len(REQUEST_FIELDS)].tolist()))))
        return requests

    def serve(self) -> int:
        """Answer requests oldest first until every trainer said BYE; returns the decisions made."""
        waiting, idle = deque(), self.poll.first
        while len(self.gone) < self.trainers or waiting:
            waiting.extend(self.receive())
            if not waiting:  # idle: leave the core to the node's trainers, polling less and less often
                self.log.maybe_flush()
                time.sleep(idle)
                idle = self.poll.after(idle)
                continue
            idle = self.poll.first
            trainer, req = waiting.popleft()
            answer = self.answer(trainer, req)
            self.sends = [r for r in self.sends if not r.Test()] + [self.comm.Isend(answer, dest=trainer, tag=TAG_TO_TRAINER)]
            self.log.maybe_flush()
        MPI.Request.Waitall(self.sends)
        return self.decisions

    def checkpoint(self, counter: int) -> None:
        """Once every trainer of the node checkpoints after ``counter``: save the contexts."""
        self.checkpoints[counter] = self.checkpoints.get(counter, 0) + 1
        if self.checkpoints[counter] < self.trainers:
            return
        del self.checkpoints[counter]
        self.log.flush()
        # the trainers do not wait for this file: a newer checkpoint may have replaced this one
        checkpoints.save_late(self.run_dir, counter, agent_file(self.world_rank),
                              {"counter": counter, "contexts": self.saved_contexts(), "decider": self.decider.state_dict(),
                               "log_rows": dict(self.log.written)})


class CollectiveServer(AgentServer):
    """The agent rank's loop over the collective transport (the module's docstring)."""

    def __init__(self, layout, decider: Decider, log, window: int, in_flight: int, delay: float = 0.0,
                 run_dir: str = "", contexts=None, poll: IdlePoll = POLL_OWN_CORE):
        super().__init__(layout, decider, log, delay, run_dir, contexts, poll)
        self.window, self.in_flight = window, in_flight

    def windows(self) -> range:
        """The windows every trainer joins, from their HELLOs (all take the same minibatches)."""
        totals = {int(c.facts["total_minibatches"]) for t, c in self.contexts.items() if t in self.starts}
        starts = set(self.starts.values())
        if len(totals) != 1 or len(starts) != 1:
            raise RuntimeError(f"the node's trainers disagree on their minibatches (totals {sorted(totals)}, "
                               f"starts {sorted(starts)}): the collective transport needs them equal")
        return window_counters(starts.pop(), totals.pop(), self.window)

    def serve(self) -> int:
        """Gather, decide and answer every window until every window is answered and every
        trainer said BYE; returns the decisions made."""
        while len(self.starts) < self.trainers:  # every HELLO in (and READY sent) before the windows are known
            self.receive()
            time.sleep(0.0005)
        gather_comm, scatter_comm = duplicate(self.comm), duplicate(self.comm)
        windows = self.windows()
        size, rows = self.comm.size, len(DECISION_FIELDS)
        own = np.zeros(MESSAGE_SIZE)  # the agent's own row of each gather (it has no request)
        posted, gathered, scatters, answered, idle = deque(), [], [], 0, self.poll.first
        while answered < len(windows) or len(self.gone) < self.trainers:
            self.receive()
            while answered + len(gathered) + len(posted) < len(windows) and len(gathered) + len(posted) < self.in_flight:
                counter = windows[answered + len(gathered) + len(posted)]
                buf = np.zeros((size, MESSAGE_SIZE))
                posted.append((counter, buf, gather_comm.Igather(own, buf, root=size - 1)))
            while posted and posted[0][2].Test():  # in order: a window is complete once every trainer joined it
                gathered.append(posted.popleft()[:2])
            if not gathered:
                self.log.maybe_flush()
                time.sleep(idle)
                idle = self.poll.after(idle)
                continue
            idle = self.poll.first
            requests = [(counter, trainer, dict(zip(REQUEST_FIELDS, buf[trainer, :len(REQUEST_FIELDS)].tolist())))
                        for counter, buf in gathered for trainer in range(self.trainers) if buf[trainer, 0] == REQUEST]
            answers = self.answer_all([(trainer, req) for _, trainer, req in requests])
            by_window: dict[int, np.ndarray] = {}
            for (counter, trainer, _), answer in zip(requests, answers):
                by_window.setdefault(counter, np.zeros((size, rows)))[trainer] = answer
            scatters = [s for s in scatters if not s[0].Test()]
            for counter, _ in gathered:  # a row of zeros answers a SKIP (the trainer reads no answer there)
                out, mine = by_window.get(counter, np.zeros((size, rows))), np.zeros(rows)
                scatters.append((scatter_comm.Iscatter(out, mine, root=size - 1), out, mine))  # holds the buffers
            answered += len(gathered)
            gathered = []
            self.log.maybe_flush()
        MPI.Request.Waitall(self.sends + [s[0] for s in scatters])
        return self.decisions


def agent_file(world_rank: int) -> str:
    return f"agent-{world_rank:05d}.pt"


def run_agent(cfg, layout, meta) -> int:
    """An agent rank's whole job: serve its node's trainers until they all said BYE."""
    contexts, rows, decider_state = None, None, {}
    if cfg.checkpoint.resume:  # the contexts saved with the trainers' latest checkpoint (if the agent got there)
        contexts, rows, decider_state = resumed_contexts(cfg.output.run_dir, layout.world.rank)
    decider_class = DECIDERS[cfg.buffer.policy]
    log = RunLog(log_path(cfg.output.run_dir, layout.world.rank),
                 {"role": AGENT, "config": cfg.to_json(), "versions": json.dumps(library_versions()),
                  "layout": json.dumps(layout.describe()),
                  "run": json.dumps({"decider": decider_class.name, "prompt_version": decider_class.prompt_version}),
                  "data": json.dumps({"dir": cfg.data.path, "dataset": meta.dataset})},
                 AGENT_TABLES, AGENT_RAGGED, flush_seconds=cfg.output.log_flush_seconds, resume_rows=rows)
    t = time.perf_counter()
    decider = make_decider(cfg, layout.threads_per_rank)
    decider.load_state_dict(decider_state)
    log.flush(decider_build_seconds=time.perf_counter() - t, decider_ready_at=time.time())
    poll = POLL_SHARED_CORES if layout.shares_cores else POLL_OWN_CORE
    try:
        if cfg.agent.transport == "collective":
            server = CollectiveServer(layout, decider, log, cfg.agent.window, cfg.agent.in_flight, cfg.agent.delay,
                                      cfg.output.run_dir, contexts, poll)
        else:
            server = AgentServer(layout, decider, log, cfg.agent.delay, cfg.output.run_dir, contexts, poll)
        decisions = server.serve()
    except Exception as e:
        log.close("failed", f"{type(e).__name__}: {e}")
        raise
    finally:
        decider.close()
    log.close("completed")
    return decisions


def resumed_contexts(run_dir: str, world_rank: int) -> tuple[dict, dict, dict]:
    """(contexts by trainer, log row counts, the decider's state) from the latest checkpoint;
    without an agent file there (the job ended before the agent saved), empty contexts, the log
    kept whole and the decider fresh."""
    record = checkpoints.latest(run_dir)
    path = os.path.join(checkpoints.folder(run_dir, record["counter"]), agent_file(world_rank))
    if not os.path.exists(path):
        return {}, {name: np.iinfo(np.int64).max for name in (*AGENT_TABLES, *AGENT_RAGGED)}, {}
    saved = checkpoints.load(path)
    contexts = {}
    for trainer, c in saved["contexts"].items():
        contexts[trainer] = TrainerContext(c["facts"], history=deque(c["history"], maxlen=5), pending=c["pending"],
                                           last_evicted=c["last_evicted"])
    return contexts, saved["log_rows"], saved.get("decider", {})  # older checkpoints kept no decider state
