"""A trainer's connection to its node's agent rank over MPI (``rudder.agent.protocol`` over
point-to-point messages on the node communicator; the agent is the node's highest rank). Used
from the pipeline thread, which is why the job asks MPI for ``MPI_THREAD_MULTIPLE``."""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from rudder.agent.protocol import (
    BYE,
    CHECKPOINT,
    DECISION_FIELDS,
    HELLO,
    HELLO_FIELDS,
    REQUEST_FIELDS,
    TAG_BYE,
    TAG_READY,
    TAG_TO_AGENT,
    TAG_TO_TRAINER,
    DecisionLink,
)


class AgentLink(DecisionLink):
    def __init__(self, node_comm, facts: dict, window: int, latency: int = 0):
        super().__init__(window, latency)
        self.comm, self.agent = node_comm, node_comm.size - 1
        self.answer = np.zeros(len(DECISION_FIELDS))
        self.receive = None
        self.sent: list = []
        self._send(np.array([HELLO] + [float(facts[k]) for k in HELLO_FIELDS[1:]]))
        self.waited_for_agent = self._wait_ready()

    def _wait_ready(self) -> float:
        """Seconds until the agent said READY. Polled with short sleeps, not ``Wait``: MPICH's
        blocking wait spins, and on a shared core it would slow the agent's warm-up it waits for."""
        flag = np.zeros(1)
        start, ready = time.perf_counter(), self.comm.Irecv(flag, source=self.agent, tag=TAG_READY)
        while not ready.Test():
            time.sleep(0.005)
        return time.perf_counter() - start

    def _send(self, payload: np.ndarray, tag: int = TAG_TO_AGENT) -> None:
        self.sent = [r for r in self.sent if not r.Test()]  # keep the buffers of sends in flight
        self.sent.append(self.comm.Isend(payload, dest=self.agent, tag=tag))  # holds the buffer

    def _post(self, request: dict) -> None:
        self.answer = np.zeros(len(DECISION_FIELDS))
        self.receive = self.comm.Irecv(self.answer, source=self.agent, tag=TAG_TO_TRAINER)
        self._send(np.array([request[k] for k in REQUEST_FIELDS], dtype=np.float64))

    def _arrived(self) -> np.ndarray | None:
        if not self.receive.Test():
            return None
        return self.answer.copy()

    def _wait(self) -> np.ndarray:
        while not self.receive.Test():  # sleeps, not a spinning Wait: the agent may share this core
            time.sleep(0.0005)
        return self.answer.copy()

    def checkpoint(self, counter: int) -> None:
        """Tell the agent that this trainer checkpoints after minibatch ``counter``."""
        self._send(np.array([CHECKPOINT, counter] + [0.0] * (len(REQUEST_FIELDS) - 2)))

    def close(self) -> None:
        """Say BYE and collect the last answer (the agent answers everything before a BYE, and
        cuts a decision short once it sees the BYE behind it)."""
        self._send(np.array([BYE] + [0.0] * (len(REQUEST_FIELDS) - 1)), tag=TAG_BYE)
        if self.outstanding is not None:
            self.receive.Wait()
        MPI.Request.Waitall(self.sent)
