"""The decision service: requests in, decisions out, keeping each trainer's context (the last
5 outcomes as the self-reflection history, spec 2.4) and logging every decision and outcome.
No transport: the agent rank serves it over MPI (``rudder.agent.server``), the simulator in-process."""
from __future__ import annotations

import time

import numpy as np

from rudder.agent.action import ActionLimits
from rudder.agent.deciders import Decider, TrainerContext
from rudder.agent.protocol import (
    ACTION_IN_DECISION,
    DECISION_FIELDS,
    EVICT,
    KEEP,
    WINDOW_METRICS,
    Decision,
    check_observation,
    conditions,
)
from rudder.logs.schema import FALLBACKS


class DecisionService:
    def __init__(self, decider: Decider, log, delay: float = 0.0, contexts=None):
        """``log``: where decisions and outcomes go (a RunLog, or the simulator's memory log);
        ``contexts``: the trainers' contexts from a checkpoint, when the run is resumed."""
        self.decider, self.log, self.delay = decider, log, delay
        self.contexts: dict[int, TrainerContext] = dict(contexts or {})
        self.decisions = 0

    def hello(self, trainer: int, facts: dict) -> None:
        if trainer in self.contexts:  # resumed: its history goes on
            self.contexts[trainer].facts = facts
        else:
            self.contexts[trainer] = TrainerContext(facts)

    def answer(self, trainer: int, req: dict) -> np.ndarray:
        """The decision on request ``req`` (``REQUEST_FIELDS``) as a ``DECISION_FIELDS`` payload."""
        return self.answer_all([(trainer, req)])[0]

    def answer_all(self, requests: list[tuple[int, dict]]) -> list[np.ndarray]:
        """The decisions on several trainers' requests (at most one each), made in one pass: the
        decider sees all their contexts at once (``Decider.decide_all``: one batched model call),
        and each decision's latency is the pass's."""
        contexts = [self._latest(trainer, req) for trainer, req in requests]
        start = time.perf_counter()
        if self.delay:  # --agent-delay: a deliberately slow decision maker (experiments, tests)
            time.sleep(self.delay)
        decided: list[Decision | None] = [None] * len(contexts)
        for i, ctx in enumerate(contexts):
            if ctx.abandoned():  # finished while its request waited behind others': do not spend a decision on it
                decided[i] = Decision(KEEP).fell_back("trainer_finished", "the trainer finished before the decision started")
            elif check_observation(ctx.latest) != "none":
                bad = {k: v for k, v in ctx.latest.items() if not (np.isfinite(v) and v >= 0)}
                decided[i] = Decision(KEEP).fell_back("invalid_observation", f"not finite or negative: {bad}")
        asked = [i for i, d in enumerate(decided) if d is None]
        try:
            for i, d in zip(asked, self.decider.decide_all([contexts[i] for i in asked]), strict=True):
                decided[i] = d
        except Exception as e:  # a decision maker's failure must never stop training
            for i in asked:
                decided[i] = Decision(KEEP).fell_back("error", f"{type(e).__name__}: {e}")
        for i, (ctx, d) in enumerate(zip(contexts, decided)):
            limits = ActionLimits.of(ctx.facts)
            action = d.resolved(limits)
            code = action.validate(limits)
            if code != "none":  # the decider's answer is not an action this trainer can take
                decided[i] = Decision(KEEP, raw=d.raw, prompt=d.prompt).fell_back(code, f"{action} outside {limits}")
        latency = time.perf_counter() - start
        return [self._logged(ctx, req, d, latency) for ctx, (_, req), d in zip(contexts, requests, decided)]

    def _latest(self, trainer: int, req: dict) -> TrainerContext:
        """The trainer's context, its previous decision reflected on and the request's window its latest."""
        ctx = self.contexts[trainer]
        self.reflect(ctx, req)
        ctx.latest = {k: req[k] for k in ("counter", "epoch", "step", "remaining", *WINDOW_METRICS, "refill_rows",
                                          "refill_seconds")}
        ctx.latest.update(conditions(ctx.latest))
        return ctx

    def _logged(self, ctx: TrainerContext, req: dict, d: Decision, latency: float) -> np.ndarray:
        """Log decision ``d`` on ``req`` and return its payload."""
        action = d.resolved(ActionLimits.of(ctx.facts))
        ctx.pending = {"request": int(req["request"]), "decision": int(action.evict), "hitrate": req["hitrate"],
                       "comm_volume": req["comm_volume"], "wait_seconds": req["wait_seconds"], "counter": int(req["counter"])}
        self.decisions += 1
        code = FALLBACKS.index(d.fallback)
        impacts = d.impact_codes()
        self.log.append("decisions", {
            "trainer": int(ctx.facts["world_rank"]), "request": int(req["request"]), "minibatch": int(req["counter"]),
            "epoch": int(req["epoch"]), "remaining": int(req["remaining"]), "hitrate": req["hitrate"],
            "comm_volume": req["comm_volume"], "wait_seconds": req["wait_seconds"],
            **{k: ctx.latest[k] for k in ("bandwidth", "wait_share", "headroom")}, "decision": int(action.evict),
            **action.row(), **impacts, "latency": latency, "fallback": int(code != 0), "fallback_code": code})
        for name, text in (("prompt", d.prompt), ("answer", d.raw or d.explanation), ("fallback_reason", d.fallback_reason)):
            self.log.append_ragged(name, np.frombuffer(text.encode(), dtype=np.uint8))
        sent = {"request": req["request"], **dict(zip(ACTION_IN_DECISION, action.payload())),
                **impacts, "latency": latency, "fallback": float(code)}
        return np.array([float(sent[k]) for k in DECISION_FIELDS])

    def reflect(self, ctx: TrainerContext, req: dict) -> None:
        """Turn the pending decision into a history record with before/after deltas (spec 2.4)."""
        p = ctx.pending
        if p is None:
            return
        arrived = int(req["prev_request"]) == p["request"] and req["prev_applied"] >= 0
        refused = FALLBACKS[int(req["prev_fallback"])] if arrived else "none"
        applied = arrived and refused == "none"
        evicted = int(req["prev_evicted"]) if applied else 0
        if arrived and not applied:
            status = "not_applied"
        elif p["decision"] == EVICT:
            status = "triggered" if evicted else "skipped"
            ctx.last_evicted = evicted or ctx.last_evicted
        else:
            status = "decision_no_evict"
        ctx.history.append({"status": status, "evicted": evicted, "hitrate_delta": req["hitrate"] - p["hitrate"],
                            "comm_delta": req["comm_volume"] - p["comm_volume"],
                            "wait_delta": req["wait_seconds"] - p.get("wait_seconds", req["wait_seconds"]),
                            "before": {"hitrate": p["hitrate"], "comm_volume": p["comm_volume"]}})
        if arrived:
            self.log.append("outcomes", {"trainer": int(ctx.facts["world_rank"]), "request": p["request"],
                                         "applied_minibatch": int(req["prev_applied"]), "evicted": evicted,
                                         "candidates": int(req["prev_candidates"]), "age": int(req["prev_age"]),
                                         "action_fallback": FALLBACKS.index(refused)})
        ctx.pending = None

    def saved_contexts(self) -> dict:
        """The contexts as a checkpoint keeps them."""
        return {t: {"facts": c.facts, "history": list(c.history), "pending": c.pending, "last_evicted": c.last_evicted}
                for t, c in self.contexts.items()}
