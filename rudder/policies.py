"""Buffer policies: each answers one question per minibatch, "replace now?", from what it sees;
the buffer (``rudder.buffer``) does the how. A policy is one class and one ``@register`` line.

    none       no buffer: every remote row is fetched (the DistDGL baseline)
    static     fill once (by --buffer-init), never replace (MassiveGNN with delta = alpha = 0)
    fixed      replace every --delta minibatches, counted across epochs (MassiveGNN, "DistDGL+fixed")
    heuristic  ask the node's agent rank, which applies the paper's prompt rules (rudder.agent)
    llm        ask the node's agent rank, where a small LLM decides in context (rudder.llm)
    lookahead  sample --lookahead W minibatches ahead and keep, of the buffer and this minibatch's
               fetched rows, those needed soonest within the window (Belady inside the window;
               the clairvoyant design point of RapidGNN/Ginex)

Agent and classifier policies (the agent issue) plug into the same interface.
"""
from __future__ import annotations

from dataclasses import dataclass

from rudder.registry import Registry

POLICIES = Registry()
register = POLICIES.register
# Who asked for a replacement, as logged per minibatch (``asked_by``); the agent issue adds its own.
ASKERS = {"": 0, "timer": 1, "agent": 2, "classifier": 3}


@dataclass
class MinibatchView:
    """What a policy may look at before deciding (the minibatch's own lookup is already done)."""
    counter: int  # minibatches served so far, across epochs
    hits: int
    misses: int  # admissible misses
    candidates: int  # slots below the eviction threshold right now
    hit_percent: int = 0  # cumulative integer %-hits including this minibatch (spec 1.10)


class Policy:
    name = "?"
    asker = ""  # what ``asked_by`` records when this policy asks for a replacement
    buffer_kind = "scored"  # scored: MassiveGNN's buffer; window: Belady within a lookahead; none
    lookahead = 0  # minibatches the sampler must run ahead
    needs_agent = False  # an agent rank per node serves this policy's decisions

    def __init__(self, cfg):
        self.cfg = cfg

    def wants_replacement(self, view: MinibatchView) -> bool:
        return False

    def observe(self, view: MinibatchView, refills: int) -> None:
        """After the minibatch was served (``refills``: rows a replacement brought in)."""

    def close(self) -> None:
        pass


@register("none")
class NoBuffer(Policy):
    buffer_kind = "none"


@register("static")
class Static(Policy):
    pass


@register("fixed")
class Fixed(Policy):
    asker = "timer"

    def wants_replacement(self, view: MinibatchView) -> bool:
        return view.counter % self.cfg.delta == 0


@register("lookahead")
class Lookahead(Policy):
    buffer_kind = "window"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lookahead = cfg.lookahead


class AgentPolicy(Policy):
    """Replace when the node's agent says so (``rudder.agent``): each minibatch, look for its
    answer without waiting, apply an "evict" on this minibatch, and send a fresh window of
    metrics whenever no decision is outstanding."""
    asker = "agent"
    needs_agent = True

    def attach(self, link, steps_per_epoch: int, total: int) -> None:
        self.link, self.steps_per_epoch, self.total = link, steps_per_epoch, total
        self.applying = None  # (request id, evict?) of the answer found on this minibatch

    def wants_replacement(self, view: MinibatchView) -> bool:
        from rudder.agent import EVICT

        answer = self.link.poll()
        self.applying = None
        if answer is None:
            return False
        self.link.drop_stale()  # metrics gathered while the agent thought
        self.applying = (int(answer[0]), int(answer[1]) == EVICT)
        return self.applying[1]

    def observe(self, view: MinibatchView, refills: int) -> None:
        if self.applying is not None:
            self.link.record_outcome(self.applying[0], view.counter, refills, view.candidates)
            if self.applying[1]:
                return  # a minibatch that acted on "evict" sends nothing (its stats are stale)
        self.link.observe({"hitrate": view.hit_percent, "comm_volume": view.misses})
        epoch, step = divmod(view.counter, self.steps_per_epoch)
        self.link.maybe_request(view.counter, epoch, step, self.total - view.counter - 1)

    def close(self) -> None:
        self.link.close()


@register("heuristic")
class HeuristicAgent(AgentPolicy):
    pass


@register("llm")
class LLMAgent(AgentPolicy):
    pass


def make_policy(cfg) -> Policy:
    return POLICIES[cfg.policy](cfg)
