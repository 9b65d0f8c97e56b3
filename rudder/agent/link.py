"""A trainer's connection to its node's agent rank over MPI (``rudder.agent.protocol`` on the
node communicator; the agent is the node's highest rank). Used from the pipeline thread, which
is why the job asks MPI for ``MPI_THREAD_MULTIPLE``; every call goes through the rank's MPI lock
(``rudder.comm.gate``), so it is never inside MPI beside the training thread.

``AgentLink`` (``--agent-transport p2p``) sends each request and receives its answer
point-to-point. ``CollectiveLink`` (``collective``) joins every window at the agreed minibatches
with an ``Igather`` of its row (a request, or SKIP) and an ``Iscatter`` of the node's answers,
each on a duplicate of the node communicator of its own (collectives on one communicator are
matched in the order they start: apart, the agent can post gathers ahead of the answers it still
owes); HELLO/READY, CHECKPOINT and BYE stay point-to-point. Neither waits for the agent but for
READY, with a fixed latency, and at the close."""
from __future__ import annotations

import time

import numpy as np

from rudder.agent.protocol import (
    BYE,
    CHECKPOINT,
    DECISION_FIELDS,
    HELLO,
    HELLO_FIELDS,
    MESSAGE_SIZE,
    REQUEST_FIELDS,
    SKIP,
    TAG_BYE,
    TAG_READY,
    TAG_TO_AGENT,
    TAG_TO_TRAINER,
    DecisionLink,
)
from rudder.comm import gate


class AgentLink(DecisionLink):
    def __init__(self, node_comm, facts: dict, window: int, latency: int = 0, start: int = 0, aligned: bool = False):
        """``start``: the minibatch this trainer starts from (resumed: after its checkpoint)."""
        super().__init__(window, latency, aligned)
        self.comm, self.agent = node_comm, node_comm.size - 1
        self.answer = np.zeros(len(DECISION_FIELDS))
        self.receive = None
        self.sent: list = []
        self._send(np.array([HELLO] + [float(facts[k]) for k in HELLO_FIELDS[1:]] + [float(start)]))
        self.waited_for_agent = self._wait_ready()

    def _wait_ready(self) -> float:
        """Seconds until the agent said READY. Polled with short sleeps, not ``Wait``: MPICH's
        blocking wait spins, and on a shared core it would slow the agent's warm-up it waits for."""
        flag = np.zeros(1)
        start = time.perf_counter()
        with gate.held():
            ready = self.comm.Irecv(flag, source=self.agent, tag=TAG_READY)
        gate.settle(ready, 0.005)
        return time.perf_counter() - start

    def _send(self, payload: np.ndarray, tag: int = TAG_TO_AGENT) -> None:
        with gate.held():  # the pipeline thread's calls, beside the training thread's (rudder.comm.gate)
            self.sent = [r for r in self.sent if not r.Test()]  # keep the buffers of sends in flight
            self.sent.append(self.comm.Isend(payload, dest=self.agent, tag=tag))  # holds the buffer

    def _post(self, request: dict) -> None:
        self.answer = np.zeros(len(DECISION_FIELDS))
        with gate.held():
            self.receive = self.comm.Irecv(self.answer, source=self.agent, tag=TAG_TO_TRAINER)
        self._send(np.array([request[k] for k in REQUEST_FIELDS], dtype=np.float64))

    def _arrived(self) -> np.ndarray | None:
        with gate.held():
            if not self.receive.Test():
                return None
        return self.answer.copy()

    def _wait(self) -> np.ndarray:
        settle(self.receive)
        return self.answer.copy()

    def checkpoint(self, counter: int) -> None:
        """Tell the agent that this trainer checkpoints after minibatch ``counter``."""
        self._send(np.array([CHECKPOINT, counter] + [0.0] * (len(REQUEST_FIELDS) - 2)))

    def close(self) -> None:
        """Say BYE and collect the last answer (the agent answers everything before a BYE, and
        cuts a decision short once it sees the BYE behind it)."""
        self._send(np.array([BYE] + [0.0] * (len(REQUEST_FIELDS) - 1)), tag=TAG_BYE)
        if self.outstanding is not None:
            settle(self.receive)
        gate.complete(self.sent, "yield")


def settle(request) -> None:
    """Wait for ``request`` with short sleeps, not a spinning ``Wait`` (the agent may share this core)."""
    gate.settle(request, 0.0005)


def duplicate(comm):
    """``comm`` duplicated (collective over it), waited for as ``settle`` waits."""
    with gate.held():
        copy, request = comm.Idup()
    settle(request)
    return copy


class CollectiveLink(AgentLink):
    """The trainer's side of the collective transport: a window's row goes out with an ``Igather``
    (the agent its root) and the node's answers come back with an ``Iscatter``, both posted at the
    window and tested every minibatch, never waited for (but with a fixed latency, on the
    minibatch the answer is due, and at the close)."""

    def __init__(self, node_comm, facts: dict, window: int, latency: int = 0, start: int = 0):
        super().__init__(node_comm, facts, window, latency, start, aligned=True)
        # The agent duplicates the node communicator once all its trainers said HELLO (after READY).
        self.gather_comm, self.scatter_comm = duplicate(self.comm), duplicate(self.comm)
        self.windows: list = []  # (gather, scatter, row, answer) of the windows joined and not yet complete

    def _window(self, row: np.ndarray):
        answer = np.zeros(len(DECISION_FIELDS))
        with gate.held():
            posted = (self.gather_comm.Igather(row, None, root=self.agent),
                      self.scatter_comm.Iscatter(None, answer, root=self.agent), row, answer)  # holds the buffers
            self.windows = [w for w in self.windows if not (w[0].Test() and w[1].Test())] + [posted]
        return posted

    def _post(self, request: dict) -> None:
        row = np.zeros(MESSAGE_SIZE)
        row[:len(REQUEST_FIELDS)] = [request[k] for k in REQUEST_FIELDS]
        _, self.receive, _, self.answer = self._window(row)

    def _join(self, counter: int) -> None:
        row = np.zeros(MESSAGE_SIZE)
        row[:2] = SKIP, counter
        self._window(row)

    def close(self) -> None:
        """Say BYE and complete every window joined (the agent answers every window)."""
        self._send(np.array([BYE] + [0.0] * (len(REQUEST_FIELDS) - 1)), tag=TAG_BYE)
        for gather, scatter, _, _ in self.windows:
            settle(gather)
            settle(scatter)
        gate.complete(self.sent, "yield")
