"""The Rudder agent: one dedicated rank per node decides, for each trainer of its node, whether
the trainer's buffer should replace now.

Protocol (point-to-point on the node communicator; the agent is the node's highest rank):

* a trainer sends HELLO once (its static facts) and waits for READY, which the agent sends once
  its decision maker is built and warmed up (an LLM's load and first answer take tens of seconds
  on a shared core: without the wait a short run trained before its first decision); then, whenever it has no decision outstanding
  and a full window of fresh metrics, a REQUEST (``Isend``) and posts the ``Irecv`` for the
  answer; every minibatch it ``Test``s that receive and never waits for it. At most one
  decision is outstanding per trainer, and an answer is applied on the minibatch it is found
  (spec 2.5). Metrics gathered while a decision was outstanding are stale and dropped, and a
  minibatch that acted on "evict" sends nothing. The reference's race (its worker could
  publish before pausing) cannot happen: a request is only sent after the previous answer was
  consumed.
* each REQUEST also reports how the trainer's previous decision played out (applied on which
  minibatch, rows evicted, or skipped for lack of candidates), which the agent turns into the
  self-reflection history (spec 2.4: the last 5 records with before/after deltas).
* BYE ends a trainer; the agent answers everything it received first (messages from one
  trainer are processed in order) and exits when all its trainers said BYE.

Point-to-point rather than nonblocking collectives: trainers reach their windows at different
moments and must never wait for one another or for the agent, and an ``Igather`` completes only
when every member of the node has joined it.

Decision makers are a registry (``DECIDERS``), one class each; this module has ``heuristic``.
"""
from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rudder.registry import Registry

TAG_TO_AGENT, TAG_TO_TRAINER, TAG_BYE, TAG_READY = 71, 72, 73, 74  # BYE has a tag of its own: the agent probes for it alone
HELLO, REQUEST, BYE, CHECKPOINT = 0, 1, 2, 3
KEEP, EVICT = 0, 1
IMPACTS = ("stagnant", "increase", "decrease")
# Per-minibatch metrics a trainer reports, averaged over its window: hit rate (cumulative integer
# %-hits), comm volume (admissible misses), eviction candidates, refetched (misses the last
# replacement had evicted).
WINDOW_METRICS = ("hitrate", "comm_volume", "candidates", "refetched")
# REQUEST payload (float64): kind, request id, minibatch counter, epoch, step, remaining minibatches,
# the window means, then the previous decision's outcome: its request id, minibatch applied
# (-1 none), rows evicted, eviction candidates at that minibatch.
REQUEST_FIELDS = ("kind", "request", "counter", "epoch", "step", "remaining", *WINDOW_METRICS,
                  "prev_request", "prev_applied", "prev_evicted", "prev_candidates")
HELLO_FIELDS = ("kind", "world_rank", "num_nodes", "num_edges", "partition", "num_parts", "batch_size",
                "total_minibatches", "halo", "capacity")


def trainer_facts(meta, world_rank: int, partition: int, batch_size: int, total_minibatches: int, halo: int,
                  capacity: int) -> dict:
    """What the agent (and a classifier's features) know of a trainer, fixed for the run
    (``HELLO_FIELDS``); the trainer and the simulator build it alike."""
    return {"world_rank": world_rank, "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "partition": partition,
            "num_parts": meta.num_parts, "batch_size": batch_size, "total_minibatches": total_minibatches, "halo": halo,
            "capacity": capacity}


# DECISION payload: request id, decision (KEEP/EVICT), predicted hit-rate and comm impact (IMPACTS index),
# latency seconds, fallback (1 if a fallback decision was used)
DECISION_FIELDS = ("request", "decision", "hitrate_impact", "comm_impact", "latency", "fallback")


@dataclass
class Decision:
    decision: int  # KEEP or EVICT
    hitrate_impact: str = "stagnant"
    comm_impact: str = "stagnant"
    explanation: str = ""
    raw: str = ""  # the decision maker's own output (prompt answer, features...)
    prompt: str = ""
    fallback_reason: str = ""


@dataclass
class TrainerContext:
    """What the agent knows of one trainer: static facts, latest window, the last 5 outcomes."""
    facts: dict
    latest: dict = field(default_factory=dict)
    history: deque = field(default_factory=lambda: deque(maxlen=5))
    pending: dict | None = None  # the decision sent last, with the metrics it was made on
    last_evicted: int = 0  # rows the trainer's most recent replacement evicted (however old)
    abandoned: Callable[[], bool] = lambda: False  # true once the trainer no longer waits for this answer


# -- decision makers -----------------------------------------------------------------------------
DECIDERS = Registry()
register_decider = DECIDERS.register


class Decider:
    name = "?"

    def __init__(self, cfg):
        self.cfg = cfg

    def decide(self, ctx: TrainerContext) -> Decision:
        raise NotImplementedError

    def close(self) -> None:
        pass


@register_decider("heuristic")
class Heuristic(Decider):
    """The rules of the paper's system prompt, applied transparently (an honest non-LLM
    baseline): evict when nothing hits yet, or when the hit rate fell or traffic rose since the
    last window; keep when the last eviction found no candidates, when the last two evictions
    changed nothing, when the hit rate is rising on its own, or with under 5% of training left."""

    def decide(self, ctx: TrainerContext) -> Decision:
        m, facts, past = ctx.latest, ctx.facts, list(ctx.history)
        previous = past[-1] if past else None
        if m["remaining"] < 0.05 * facts["total_minibatches"]:
            return Decision(KEEP, explanation="under 5% of training left")
        if previous is not None and previous["status"] == "skipped":
            return Decision(KEEP, explanation="the last eviction found no candidates")
        evictions = [h for h in past if h["status"] in ("triggered", "skipped")][-2:]
        if len(evictions) == 2 and all(h["evicted"] == 0 or abs(h["hitrate_delta"]) < 0.5 for h in evictions):
            return Decision(KEEP, explanation="the last two evictions changed nothing")
        if m["hitrate"] == 0:
            return Decision(EVICT, "increase", "decrease", "no hits yet")
        if previous is not None:
            if previous["hitrate_delta"] < 0 or previous["comm_delta"] > 0:
                return Decision(EVICT, "increase", "decrease", "hit rate fell or traffic rose")
            if previous["status"] == "decision_no_evict" and previous["hitrate_delta"] > 0:
                return Decision(KEEP, explanation="hit rate rising without eviction")
        return Decision(KEEP, explanation="steady")


def make_decider(cfg, threads: int = 1) -> Decider:
    if cfg.policy == "llm":
        import rudder.llm  # noqa: F401  (registers the llm decider)

        return DECIDERS["llm"](cfg, threads)
    if cfg.policy == "classifier":
        import rudder.classifier  # noqa: F401  (registers the classifier decider)
    return DECIDERS[cfg.policy](cfg)


# -- the trainer's side ----------------------------------------------------------------------------
def window_means(window: list[dict]) -> dict:
    """The metrics a request carries: each of ``WINDOW_METRICS`` averaged over the window (the
    agent's requests and a classifier's collection rows use this one function)."""
    return {k: float(np.mean([m[k] for m in window])) for k in WINDOW_METRICS}


class DecisionLink:
    """A trainer's side of the protocol without the transport: the metrics window, request
    numbering and the previous decision's outcome; ``_post`` sends a request, ``poll`` finds
    its answer. ``AgentLink`` carries them over MPI; the simulator (``rudder.simulate``)
    answers in-process after a modelled delay."""

    def __init__(self, window: int):
        self.window, self.metrics = window, []
        self.next_id, self.outstanding = 0, None
        self.report = [-1.0, -1.0, 0.0, 0.0]  # the previous decision's outcome

    def _post(self, request: dict) -> None:
        raise NotImplementedError

    def poll(self) -> np.ndarray | None:
        """The answer (``DECISION_FIELDS``) to the outstanding request, if it has arrived (never blocks)."""
        raise NotImplementedError

    def observe(self, metrics: dict) -> None:
        self.metrics.append(metrics)

    def drop_stale(self) -> None:
        self.metrics.clear()

    def maybe_request(self, counter: int, epoch: int, step: int, remaining: int) -> bool:
        if self.outstanding is not None or len(self.metrics) < self.window:
            return False
        request = {"kind": REQUEST, "request": self.next_id, "counter": counter, "epoch": epoch, "step": step,
                   "remaining": remaining, **window_means(self.metrics[-self.window:]),
                   **dict(zip(REQUEST_FIELDS[-4:], self.report))}
        self._post(request)
        self.next_id += 1
        self.metrics.clear()
        return True

    def record_outcome(self, request: int, applied: int, evicted: int, candidates: int) -> None:
        self.report = [float(request), float(applied), float(evicted), float(candidates)]

    def checkpoint(self, counter: int) -> None:
        pass

    def close(self) -> None:
        pass


class AgentLink(DecisionLink):
    """A trainer's connection to its node's agent rank (used from the pipeline thread)."""

    def __init__(self, layout, facts: dict, window: int):
        super().__init__(window)
        self.comm, self.agent = layout.node, layout.node.size - 1
        self.answer = np.zeros(len(DECISION_FIELDS))
        self.sent: list = []
        hello = np.array([HELLO] + [float(facts[k]) for k in HELLO_FIELDS[1:]])
        self._send(hello)
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
        self.outstanding = self.comm.Irecv(self.answer, source=self.agent, tag=TAG_TO_TRAINER)
        self._send(np.array([request[k] for k in REQUEST_FIELDS], dtype=np.float64))

    def poll(self) -> np.ndarray | None:
        if self.outstanding is None or not self.outstanding.Test():
            return None
        self.outstanding = None
        return self.answer.copy()

    def checkpoint(self, counter: int) -> None:
        """Tell the agent that this trainer checkpoints after minibatch ``counter``."""
        self._send(np.array([CHECKPOINT, counter] + [0.0] * (len(REQUEST_FIELDS) - 2)))

    def close(self) -> None:
        """Say BYE and collect the last answer (the agent answers everything before a BYE, and
        cuts a decision short once it sees the BYE behind it)."""
        self._send(np.array([BYE] + [0.0] * (len(REQUEST_FIELDS) - 1)), tag=TAG_BYE)
        if self.outstanding is not None:
            self.outstanding.Wait()
        from mpi4py import MPI

        MPI.Request.Waitall(self.sent)


# -- the agent's side ------------------------------------------------------------------------------
DECISION_ROW = np.dtype([
    ("trainer", "i4"),  # the trainer's world rank
    ("request", "i4"), ("minibatch", "i8"),  # the trainer's request number, and the minibatch it was sent after
    ("epoch", "i4"), ("remaining", "i8"),
    ("hitrate", "f4"), ("comm_volume", "f4"), ("decision", "i1"), ("hitrate_impact", "i1"), ("comm_impact", "i1"),
    ("latency", "f8"), ("fallback", "i1"),
])
OUTCOME_ROW = np.dtype([("trainer", "i4"), ("request", "i4"), ("applied_minibatch", "i8"), ("evicted", "i8"),
                        ("candidates", "i8")])


class DecisionService:
    """Requests in, decisions out, keeping each trainer's context and logging every decision
    and outcome; no transport (the agent rank serves it over MPI, the simulator in-process)."""

    def __init__(self, decider: Decider, log, delay: float = 0.0, contexts=None):
        """``contexts``: the trainers' contexts from a checkpoint, when the run is resumed."""
        self.decider, self.log, self.delay = decider, log, delay
        self.contexts: dict[int, TrainerContext] = dict(contexts or {})
        self.decisions = 0

    def hello(self, trainer: int, facts: dict) -> None:
        if trainer in self.contexts:  # resumed: its history goes on
            self.contexts[trainer].facts = facts
        else:
            self.contexts[trainer] = TrainerContext(facts)

    def answer(self, trainer: int, req: dict) -> np.ndarray:
        ctx = self.contexts[trainer]
        self.reflect(trainer, ctx, req)
        ctx.latest = {k: req[k] for k in ("counter", "epoch", "step", "remaining", *WINDOW_METRICS)}
        start = time.perf_counter()
        if self.delay:  # --agent-delay: a deliberately slow decision maker (experiments, tests)
            time.sleep(self.delay)
        try:
            if ctx.abandoned():  # finished while its request waited behind others': do not spend a decision on it
                d = Decision(KEEP, fallback_reason="the trainer finished before the decision started")
            else:
                d = self.decider.decide(ctx)
        except Exception as e:  # a decision maker's failure must never stop training
            d = Decision(KEEP, fallback_reason=f"{type(e).__name__}: {e}")
        latency = time.perf_counter() - start
        ctx.pending = {"request": int(req["request"]), "decision": d.decision, "hitrate": req["hitrate"],
                       "comm_volume": req["comm_volume"]}
        self.decisions += 1
        self.log.append("decisions", (int(ctx.facts["world_rank"]), int(req["request"]), int(req["counter"]), int(req["epoch"]),
                                      int(req["remaining"]), req["hitrate"], req["comm_volume"], d.decision,
                                      IMPACTS.index(d.hitrate_impact), IMPACTS.index(d.comm_impact), latency,
                                      bool(d.fallback_reason)))
        for name, text in (("prompt", d.prompt), ("answer", d.raw or d.explanation), ("fallback_reason", d.fallback_reason)):
            self.log.append_ragged(name, np.frombuffer(text.encode(), dtype=np.uint8))
        return np.array([req["request"], d.decision, IMPACTS.index(d.hitrate_impact), IMPACTS.index(d.comm_impact),
                         latency, float(bool(d.fallback_reason))])

    def reflect(self, trainer: int, ctx: TrainerContext, req: dict) -> None:
        """Turn the pending decision into a history record with before/after deltas (spec 2.4)."""
        p = ctx.pending
        if p is None:
            return
        applied = int(req["prev_request"]) == p["request"] and req["prev_applied"] >= 0
        evicted = int(req["prev_evicted"]) if applied else 0
        if p["decision"] == EVICT:
            status = "triggered" if evicted else "skipped"
            ctx.last_evicted = evicted or ctx.last_evicted
        else:
            status = "decision_no_evict"
        ctx.history.append({"status": status, "evicted": evicted, "hitrate_delta": req["hitrate"] - p["hitrate"],
                            "comm_delta": req["comm_volume"] - p["comm_volume"],
                            "before": {"hitrate": p["hitrate"], "comm_volume": p["comm_volume"]}})
        if applied:
            self.log.append("outcomes", (int(ctx.facts["world_rank"]), p["request"], int(req["prev_applied"]), evicted,
                                         int(req["prev_candidates"])))
        ctx.pending = None


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
        """Answer requests oldest first until every trainer said BYE. All messages that have
        arrived are taken in before each decision, so one model serves its trainers fairly (MPI's
        ANY_SOURCE matching is not fair: low ranks could starve the others)."""
        from mpi4py import MPI

        done, sends, waiting = 0, [], deque()
        status, idle = MPI.Status(), 0.0005
        while done < self.trainers or waiting:
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                buf = np.zeros(max(len(REQUEST_FIELDS), len(HELLO_FIELDS)))
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
        from rudder import checkpoint

        self.checkpoints[counter] = self.checkpoints.get(counter, 0) + 1
        if self.checkpoints[counter] < self.trainers:
            return
        del self.checkpoints[counter]
        self.log.flush()
        contexts = {t: {"facts": c.facts, "history": list(c.history), "pending": c.pending, "last_evicted": c.last_evicted}
                    for t, c in self.contexts.items()}
        checkpoint.save(os.path.join(checkpoint.folder(self.run_dir, counter), f"agent-{self.world_rank:05d}.pt"),
                        {"counter": counter, "contexts": contexts, "log_rows": dict(self.log.written)})


def run_agent(cfg, layout, meta) -> int:
    """An agent rank's whole job: serve its node's trainers until they all said BYE."""
    import json

    from rudder.run_log import RunLog, log_path
    from rudder.trainer import library_versions

    contexts, rows = None, None
    if cfg.resume:  # the contexts saved with the trainers' latest checkpoint (if the agent got there)
        contexts, rows = resumed_contexts(cfg, layout)
    log = RunLog(log_path(cfg.run_dir, layout.world.rank),
                 {"role": "agent", "config": cfg.to_json(), "versions": json.dumps(library_versions()),
                  "layout": json.dumps(layout.describe()),
                  "run": json.dumps({"decider": cfg.policy, "prompt_version": _prompt_version(cfg)}),
                  "data": json.dumps({"dir": cfg.data, "dataset": meta.dataset})},
                 {"decisions": DECISION_ROW, "outcomes": OUTCOME_ROW},
                 {"prompt": np.uint8, "answer": np.uint8, "fallback_reason": np.uint8}, flush_seconds=cfg.log_flush_seconds,
                 resume_rows=rows)
    decider = make_decider(cfg, layout.threads_per_rank)
    try:
        decisions = AgentServer(layout, decider, log, cfg.agent_delay, cfg.run_dir, contexts).serve()
    except Exception as e:
        log.close("failed", f"{type(e).__name__}: {e}")
        raise
    finally:
        decider.close()
    log.close("completed")
    return decisions


def resumed_contexts(cfg, layout) -> tuple[dict, dict]:
    """(contexts by trainer, log row counts) from the latest checkpoint; without an agent file
    there (the job ended before the agent saved), empty contexts and the log kept whole."""
    from rudder import checkpoint

    record = checkpoint.latest(cfg.run_dir)
    path = os.path.join(checkpoint.folder(cfg.run_dir, record["counter"]), f"agent-{layout.world.rank:05d}.pt")
    if not os.path.exists(path):
        return {}, {name: np.iinfo(np.int64).max for name in ("decisions", "outcomes", "prompt", "answer", "fallback_reason")}
    saved = checkpoint.load(path)
    contexts = {}
    for trainer, c in saved["contexts"].items():
        contexts[trainer] = TrainerContext(c["facts"], history=deque(c["history"], maxlen=5), pending=c["pending"],
                                           last_evicted=c["last_evicted"])
    return contexts, saved["log_rows"]


def _prompt_version(cfg) -> int:
    if cfg.policy != "llm":
        return 0
    from rudder.llm import PROMPT_VERSION

    return PROMPT_VERSION
