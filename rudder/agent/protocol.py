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
* an answer carries an action (``rudder.agent.action``); the trainer applies it only if it is
  fresh and valid (``accept``): one that arrives more than ``stale_after`` minibatches after its
  request (``--agent-stale-after``) was decided on metrics of another interval and is dropped
  ("stale"), one outside the trainer's limits is refused ("out_of_range", "invalid_action"); the
  minibatches between request and arrival and the reason are logged (minibatches table) and
  reported back with the next request (the agent's outcomes table);
* CHECKPOINT tells the agent its trainer checkpoints after a minibatch; BYE ends a trainer.

With windows at agreed minibatches (``aligned``, the collective transport) a request is due only
after minibatch c with (c + 1) % window == 0 (``window_counters``: counted from the run's start,
so a resumed run keeps the schedule), carrying the means of the fresh metrics since the previous
window (at least one minibatch's), and every trainer of the node joins every window: a trainer
that sends no request there (its decision outstanding, no fresh metrics, or, with a fixed
latency, an answer that would come after the run's end) sends a SKIP row. The node's trainers
all take the same minibatches (one gradient Allreduce each), so they all reach every window.

``rudder.agent.link`` carries this over MPI (point-to-point or collectives); the simulator
answers in-process.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.agent.action import Action, ActionLimits
from rudder.logs.schema import FALLBACKS

TAG_TO_AGENT, TAG_TO_TRAINER, TAG_BYE, TAG_READY = 71, 72, 73, 74  # BYE has a tag of its own: the agent probes for it alone
HELLO, REQUEST, BYE, CHECKPOINT, SKIP = 0, 1, 2, 3, 4  # SKIP: a window's row without a request
KEEP, EVICT = 0, 1
IMPACTS = ("stagnant", "increase", "decrease")
# Per-minibatch metrics a trainer reports, averaged over its window: hit rate (cumulative integer
# %-hits), communication volume (misses + refills: rudder.logs.metrics), eviction candidates,
# refetched (misses the last replacement had evicted); what the cause of a slow step is measured
# by: feature bytes read by RMA and the seconds reading them, the seconds the training thread
# waited for its inputs and its steps' seconds (both as measured since the previous minibatch's
# entry: the training thread measures them), and free buffer slots.
WINDOW_METRICS = ("hitrate", "comm_volume", "candidates", "refetched", "bytes_rma", "fetch_seconds", "wait_seconds",
                  "step_seconds", "headroom")
# REQUEST payload (float64): kind, request id, minibatch counter, epoch, step, remaining minibatches,
# the window means, the cost of the trainer's latest refill (rows, and the seconds of its request
# attributed to them by row count), then the previous decision's outcome: its request id,
# minibatch applied (-1 none), rows evicted, eviction candidates at that minibatch, minibatches
# between request and arrival, and the trainer's fallback code (0: applied).
REQUEST_FIELDS = ("kind", "request", "counter", "epoch", "step", "remaining", *WINDOW_METRICS, "refill_rows",
                  "refill_seconds", "prev_request", "prev_applied", "prev_evicted", "prev_candidates", "prev_age",
                  "prev_fallback")
REPORT_FIELDS = REQUEST_FIELDS[-6:]
HELLO_FIELDS = ("kind", "world_rank", "num_nodes", "num_edges", "partition", "num_parts", "batch_size",
                "total_minibatches", "halo", "capacity", "max_refill", "max_window", "max_share")
# DECISION payload: request id, the action (decision KEEP/EVICT, refill budget, window), predicted
# hit-rate and comm impact (IMPACTS index), latency seconds, fallback code (FALLBACKS; 0: the decider's
# own), the predicted impact on the trainer's input wait (IMPACTS index; -1: none predicted, the
# paper's action), then the action's claim on a split node buffer. New fields go at the end: the
# transport reads the payload by position.
DECISION_FIELDS = ("request", "decision", "refill", "window", "hitrate_impact", "comm_impact", "latency", "fallback",
                   "wait_impact", "share")
ACTION_IN_DECISION = ("decision", "refill", "window", "share")  # where Action's fields go, in Action's order
ACTION_AT = [DECISION_FIELDS.index(f) for f in ACTION_IN_DECISION]
NO_IMPACT = -1  # a direction not predicted (the wait_impact of a paper-mode decision)
HELLO_START = len(HELLO_FIELDS)  # the HELLO message's last value: the minibatch the trainer starts from (resumed: > 0)
MESSAGE_SIZE = max(len(REQUEST_FIELDS), HELLO_START + 1)


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
    action: Action | None = None  # a structured answer; None: the paper's evict/keep (``Action.paper``)
    wait_impact: str | None = None  # predicted direction of the trainer's input wait (IMPACTS); None: not predicted

    def impact_codes(self) -> dict:
        """The predicted directions as IMPACTS indices (``NO_IMPACT``: not predicted), by log column."""
        return {"hitrate_impact": IMPACTS.index(self.hitrate_impact), "comm_impact": IMPACTS.index(self.comm_impact),
                "wait_impact": NO_IMPACT if self.wait_impact is None else IMPACTS.index(self.wait_impact)}

    def resolved(self, limits: ActionLimits) -> Action:
        return self.action if self.action is not None else Action.paper(self.decision == EVICT, limits)

    def fell_back(self, code: str, reason: str) -> Decision:
        assert code in FALLBACKS and code != "none", code
        self.fallback, self.fallback_reason = code, reason
        return self


def trainer_facts(meta, world_rank: int, partition: int, batch_size: int, total_minibatches: int, halo: int,
                  capacity: int, limits: ActionLimits | None = None) -> dict:
    """What the agent (and a classifier's features) know of a trainer, fixed for the run
    (``HELLO_FIELDS``; ``limits``: its actions' bounds); the trainer and the simulator build it alike."""
    limits = limits or ActionLimits(capacity, 0)
    return {"world_rank": world_rank, "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "partition": partition,
            "num_parts": meta.num_parts, "batch_size": batch_size, "total_minibatches": total_minibatches, "halo": halo,
            "capacity": capacity, "max_refill": limits.refill, "max_window": limits.window, "max_share": limits.share}


def window_counters(start: int, total: int, window: int) -> range:
    """The minibatches after which a window is due from minibatch ``start`` on (aligned windows)."""
    return range((start + window) // window * window - 1, total, window)


def accept(answer: np.ndarray, age: int, limits: ActionLimits, stale_after: int) -> tuple[Action, str]:
    """The action of an answer (``DECISION_FIELDS``) that arrived ``age`` minibatches after its
    request, and "none" if it is to be applied, else why not (then the action is "keep")."""
    action = Action.from_payload(answer[ACTION_AT])
    code = "stale" if stale_after and age > stale_after else action.validate(limits)
    return (action, code) if code == "none" else (Action.paper(False, limits), code)


def window_means(window: list[dict]) -> dict:
    """The metrics a request carries: each of ``WINDOW_METRICS`` averaged over the window (the
    agent's requests and a classifier's collection rows use this one function)."""
    return {k: float(np.mean([m[k] for m in window])) for k in WINDOW_METRICS}


def conditions(latest: dict) -> dict:
    """What a window's means say of the cause of slow steps: the achieved RMA fetch bandwidth
    (feature bytes per second of reading them; 0 when nothing was read), the share of step time
    the training thread waited for its inputs, and the free buffer slots."""
    fetch, step = latest["fetch_seconds"], latest["step_seconds"]
    return {"bandwidth": latest["bytes_rma"] / fetch if fetch > 0 else 0.0,
            "wait_share": min(1.0, latest["wait_seconds"] / step) if step > 0 else 0.0, "headroom": latest["headroom"]}


def check_observation(latest: dict) -> str:
    """"none" if a request's numbers are finite and not negative, else "invalid_observation"
    (a decider never decides on garbage)."""
    ok = all(np.isfinite(v) and v >= 0 for k, v in latest.items() if k not in ("epoch", "step"))
    return "none" if ok else "invalid_observation"


class DecisionLink:
    """A trainer's side of the protocol without the transport: the metrics window, request
    numbering, the previous decision's outcome and the fixed latency; ``_post`` sends a request,
    ``_arrived`` says whether its answer is here, ``_wait`` waits for it."""

    def __init__(self, window: int, latency: int = 0, aligned: bool = False):
        self.window, self.latency, self.aligned, self.metrics = window, latency, aligned, []
        self.next_id, self.outstanding, self.due, self.requested_at = 0, None, 0, -1
        self.report = [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0]  # the previous decision's outcome (REPORT_FIELDS)
        self.refill_cost = [0.0, 0.0]  # rows and seconds of the latest refill

    def _post(self, request: dict) -> None:
        raise NotImplementedError

    def _arrived(self) -> np.ndarray | None:
        raise NotImplementedError

    def _wait(self) -> np.ndarray:
        raise NotImplementedError

    def _join(self, counter: int) -> None:
        """Join the window after minibatch ``counter`` without a request (aligned windows)."""

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
        after this one; with a fixed latency, none whose answer would come after the run's end).
        Called after every minibatch (one that acted on "evict" has no fresh metrics: it sends
        nothing, but joins its window if one is due)."""
        if self.aligned:
            if (counter + 1) % self.window:
                return False
            if self.outstanding is not None or not self.metrics or remaining < self.latency:
                self._join(counter)
                return False
        elif self.outstanding is not None or len(self.metrics) < self.window or remaining < self.latency:
            return False
        request = {"kind": REQUEST, "request": self.next_id, "counter": counter, "epoch": epoch, "step": step,
                   "remaining": remaining, **window_means(self.metrics[-self.window:]),
                   **dict(zip(("refill_rows", "refill_seconds"), self.refill_cost)), **dict(zip(REPORT_FIELDS, self.report))}
        self._post(request)
        self.outstanding, self.due, self.requested_at = request["request"], self.latency, counter
        self.next_id += 1
        self.metrics.clear()
        return True

    def record_outcome(self, request: int, applied: int, evicted: int, candidates: int, age: int = 0,
                       fallback: str = "none") -> None:
        """How the answer to ``request`` played out (``applied``: the minibatch it arrived on)."""
        self.report = [float(request), float(applied), float(evicted), float(candidates), float(age),
                       float(FALLBACKS.index(fallback))]

    def record_refill(self, rows: int, seconds: float) -> None:
        self.refill_cost = [float(rows), float(seconds)]

    def state_dict(self) -> dict:
        """The request numbering and the metrics window; a decision still outstanding is lost
        with an interrupted job (the resumed trainer asks afresh)."""
        return {"next_id": self.next_id, "report": list(self.report), "metrics": list(self.metrics),
                "refill_cost": list(self.refill_cost)}

    def load_state_dict(self, state: dict) -> None:
        self.next_id, self.metrics = state["next_id"], state["metrics"]
        self.report = list(state["report"]) + [0.0] * (len(REPORT_FIELDS) - len(state["report"]))  # older checkpoints
        self.refill_cost = state.get("refill_cost", [0.0, 0.0])

    def checkpoint(self, counter: int) -> None:
        pass

    def close(self) -> None:
        pass
