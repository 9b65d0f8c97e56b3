"""The ``heuristic`` decider: the rules of the paper's system prompt, applied transparently (an
honest non-LLM baseline), and with ``--agent-action structured`` a rule for how much to refill."""
from __future__ import annotations

from rudder.agent.action import Action, ActionLimits
from rudder.agent.deciders.base import Decider, TrainerContext, refill_wait_impact, register_decider
from rudder.agent.protocol import EVICT, KEEP, Decision


@register_decider("heuristic")
class Heuristic(Decider):
    """Evict when nothing hits yet, or when the hit rate fell or traffic rose since the last
    window; keep when the last eviction found no candidates, when the last two evictions changed
    nothing, when the hit rate is rising on its own, or with under 5% of training left."""

    def decide(self, ctx: TrainerContext) -> Decision:
        d = self.paper(ctx)
        if getattr(getattr(self.cfg, "agent", None), "action", "paper") == "structured":
            d.action = self.budget(ctx, d.decision == EVICT)
            d.wait_impact = refill_wait_impact(d.action.refill, ctx.latest)
        return d

    def paper(self, ctx: TrainerContext) -> Decision:
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

    @staticmethod
    def budget(ctx: TrainerContext, evict: bool) -> Action:
        """How much of the paper's replacement to do. Where the paper's rules keep: nothing.
        Where they evict: the candidates the buffer has now (a larger budget would not bind),
        shrunk by the share of step time the trainer already waits for its inputs (every refilled
        row is read in the same request as the misses, on that path), and no more than the rows
        the latest refill's request could read in the time of a step at the bandwidth achieved
        (its cost per row, measured). The window stays the largest: a longer lookahead ranks better.
        On a split node buffer the trainer claims capacity by the share of its inputs that miss
        (``claim``), whether or not it refills now."""
        limits, m = ActionLimits.of(ctx.facts), ctx.latest
        share = Heuristic.claim(ctx, limits)
        if not evict:
            return Action.budget(0, limits.window, share)
        rows = m["candidates"] * (1.0 - m["wait_share"]) if m["hitrate"] > 0 else limits.refill
        if m["refill_rows"] > 0 and m["refill_seconds"] > 0 and m["step_seconds"] > 0:
            rows = min(rows, m["step_seconds"] * m["refill_rows"] / m["refill_seconds"])
        return Action.budget(int(min(limits.refill, max(0.0, rows))), limits.window, share)

    @staticmethod
    def claim(ctx: TrainerContext, limits: ActionLimits) -> int:
        """A trainer's claim on its node's split buffer: in proportion to the share of its inputs
        that miss (the buffer's slots serve every trainer's hits, but each trainer refills only its
        own, with its own most-missed rows), at least 1 so that no trainer is starved outright."""
        if not limits.share:
            return 0
        missing = 1.0 - min(100.0, max(0.0, ctx.latest["hitrate"])) / 100.0
        return int(min(limits.share, max(1, round(limits.share * missing))))
