"""The agent protocol without its transport: what a trainer tells its node's agent, what comes
back, and the trainer's side of the exchange (``DecisionLink``).

* a trainer sends HELLO once (its static facts, ``HELLO_FIELDS``) and waits for READY, which the
  agent sends once its decision maker is built and warm (an LLM's load and first answer take tens
  of seconds on a shared core: without the wait a short run trained before its first decision);
* then, whenever it has no decision outstanding and a full window of fresh metrics, a REQUEST
  (``REQUEST_FIELDS``: the window's means and how its previous decision played out), and every
  minibatch it looks for the answer (``DECISION_FIELDS``) without waiting. At most one decision
  is outstanding per trainer, and an answer is applied on the minibatch it is found (spec 2.5).
  Metrics gathered while a decision was outstanding are stale and dropped, and a minibatch that
  acted on "evict" sends nothing. The reference's race (its worker could publish before pausing)
  cannot happen: a request is only sent after the previous answer was consumed;
* with a fixed ``latency`` L (``--agent-latency``) the answer to a request sent after minibatch c
  is applied on minibatch c + L exactly, the trainer waiting for it if it is late (and no request
  is sent whose answer would come after the run's end): runs then do not depend on how fast the
  agent is (the simulator's model of an agent);
* CHECKPOINT tells the agent its trainer checkpoints after a minibatch; BYE ends a trainer.

``rudder.agent.link.AgentLink`` carries this over MPI; the simulator answers in-process.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.logs.schema import FALLBACKS

TAG_TO_AGENT, TAG_TO_TRAINER, TAG_BYE, TAG_READY = 71, 72, 73, 74  # BYE has a tag of its own: the agent probes for it alone
HELLO, REQUEST, BYE, CHECKPOINT = 0, 1, 2, 3
KEEP, EVICT = 0, 1
IMPACTS = ("stagnant", "increase", "decrease")
# Per-minibatch metrics a trainer reports, averaged over its window: hit rate (cumulative integer
# %-hits), communication volume (misses + refills: rudder.logs.metrics), eviction candidates,
# refetched (misses the last replacement had evicted).
WINDOW_METRICS = ("hitrate", "comm_volume", "candidates", "refetched")
# REQUEST payload (float64): kind, request id, minibatch counter, epoch, step, remaining minibatches,
# the window means, then the previous decision's outcome: its request id, minibatch applied
# (-1 none), rows evicted, eviction candidates at that minibatch.
REQUEST_FIELDS = ("kind", "request", "counter", "epoch", "step", "remaining", *WINDOW_METRICS,
                  "prev_request", "prev_applied", "prev_evicted", "prev_candidates")
HELLO_FIELDS = ("kind", "world_rank", "num_nodes", "num_edges", "partition", "num_parts", "batch_size",
                "total_minibatches", "halo", "capacity")
# DECISION payload: request id, decision (KEEP/EVICT), predicted hit-rate and comm impact (IMPACTS index),
# latency seconds, fallback code (rudder.logs.schema.FALLBACKS; 0: the decider's own answer)
DECISION_FIELDS = ("request", "decision", "hitrate_impact", "comm_impact", "latency", "fallback")
MESSAGE_SIZE = max(len(REQUEST_FIELDS), len(HELLO_FIELDS))


@dataclass
class Decision:
    decision: int  # KEEP or EVICT
    hitrate_impact: str = "stagnant"
    comm_impact: str = "stagnant"
    explanation: str = ""
    raw: str = ""  # the decision maker's own output (prompt answer, features...)
    prompt: str = ""
    fallback: str = "none"  # why the fallback was used (rudder.logs.schema.FALLBACKS); "none": it was not
    fallback_reason: str = ""  # the same, in words

    def fell_back(self, code: str, reason: str) -> Decision:
        assert code in FALLBACKS and code != "none", code
        self.fallback, self.fallback_reason = code, reason
        return self


def trainer_facts(meta, world_rank: int, partition: int, batch_size: int, total_minibatches: int, halo: int,
                  capacity: int) -> dict:
    """What the agent (and a classifier's features) know of a trainer, fixed for the run
    (``HELLO_FIELDS``); the trainer and the simulator build it alike."""
    return {"world_rank": world_rank, "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "partition": partition,
            "num_parts": meta.num_parts, "batch_size": batch_size, "total_minibatches": total_minibatches, "halo": halo,
            "capacity": capacity}


def window_means(window: list[dict]) -> dict:
    """The metrics a request carries: each of ``WINDOW_METRICS`` averaged over the window (the
    agent's requests and a classifier's collection rows use this one function)."""
    return {k: float(np.mean([m[k] for m in window])) for k in WINDOW_METRICS}


class DecisionLink:
    """A trainer's side of the protocol without the transport: the metrics window, request
    numbering, the previous decision's outcome and the fixed latency; ``_post`` sends a request,
    ``_arrived`` says whether its answer is here, ``_wait`` waits for it."""

    def __init__(self, window: int, latency: int = 0):
        self.window, self.latency, self.metrics = window, latency, []
        self.next_id, self.outstanding, self.due = 0, None, 0
        self.report = [-1.0, -1.0, 0.0, 0.0]  # the previous decision's outcome

    def _post(self, request: dict) -> None:
        raise NotImplementedError

    def _arrived(self) -> np.ndarray | None:
        raise NotImplementedError

    def _wait(self) -> np.ndarray:
        raise NotImplementedError

    def poll(self) -> np.ndarray | None:
        """The answer (``DECISION_FIELDS``) to the outstanding request if it is to be applied on
        this minibatch: whenever it has arrived, or with a fixed latency on exactly that minibatch."""
        if self.outstanding is None:
            return None
        if self.latency:
            self.due -= 1
            if self.due > 0:
                return None
            answer = self._wait()
        else:
            answer = self._arrived()
            if answer is None:
                return None
        self.outstanding = None
        return answer

    def observe(self, metrics: dict) -> None:
        self.metrics.append(metrics)

    def drop_stale(self) -> None:
        self.metrics.clear()

    def maybe_request(self, counter: int, epoch: int, step: int, remaining: int) -> bool:
        """Send a request after minibatch ``counter`` if one is due (``remaining``: minibatches
        after this one; with a fixed latency, none whose answer would come after the run's end)."""
        if self.outstanding is not None or len(self.metrics) < self.window or remaining < self.latency:
            return False
        request = {"kind": REQUEST, "request": self.next_id, "counter": counter, "epoch": epoch, "step": step,
                   "remaining": remaining, **window_means(self.metrics[-self.window:]),
                   **dict(zip(REQUEST_FIELDS[-4:], self.report))}
        self._post(request)
        self.outstanding, self.due = request["request"], self.latency
        self.next_id += 1
        self.metrics.clear()
        return True

    def record_outcome(self, request: int, applied: int, evicted: int, candidates: int) -> None:
        self.report = [float(request), float(applied), float(evicted), float(candidates)]

    def state_dict(self) -> dict:
        """The request numbering and the metrics window; a decision still outstanding is lost
        with an interrupted job (the resumed trainer asks afresh)."""
        return {"next_id": self.next_id, "report": list(self.report), "metrics": list(self.metrics)}

    def load_state_dict(self, state: dict) -> None:
        self.next_id, self.report, self.metrics = state["next_id"], state["report"], state["metrics"]

    def checkpoint(self, counter: int) -> None:
        pass

    def close(self) -> None:
        pass
