"""The ``heuristic`` decider: the rules of the paper's system prompt, applied transparently (an
honest non-LLM baseline)."""
from __future__ import annotations

from rudder.agent.deciders.base import Decider, TrainerContext, register_decider
from rudder.agent.protocol import EVICT, KEEP, Decision


@register_decider("heuristic")
class Heuristic(Decider):
    """Evict when nothing hits yet, or when the hit rate fell or traffic rose since the last
    window; keep when the last eviction found no candidates, when the last two evictions changed
    nothing, when the hit rate is rising on its own, or with under 5% of training left."""

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
