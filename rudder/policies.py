"""Buffer policies: each answers one question per minibatch, "replace now?", from what it sees;
the buffer (``rudder.buffer``) does the how. A policy is one class and one ``@register`` line.

    none       no buffer: every remote row is fetched (the DistDGL baseline)
    static     fill once (by --buffer-init), never replace (MassiveGNN with delta = alpha = 0)
    fixed      replace every --delta minibatches, counted across epochs (MassiveGNN, "DistDGL+fixed")
    lookahead  sample --lookahead W minibatches ahead and keep, of the buffer and this minibatch's
               fetched rows, those needed soonest within the window (Belady inside the window;
               the clairvoyant design point of RapidGNN/Ginex)

Agent and classifier policies (the agent issue) plug into the same interface.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICIES: dict[str, type["Policy"]] = {}
# Who asked for a replacement, as logged per minibatch (``asked_by``); the agent issue adds its own.
ASKERS = {"": 0, "timer": 1, "agent": 2, "classifier": 3}


def register(name: str):
    def add(cls):
        cls.name = name
        POLICIES[name] = cls
        return cls
    return add


@dataclass
class MinibatchView:
    """What a policy may look at before deciding (the minibatch's own lookup is already done)."""
    counter: int  # minibatches served so far, across epochs
    hits: int
    misses: int  # admissible misses
    candidates: int  # slots below the eviction threshold right now


class Policy:
    name = "?"
    asker = ""  # what ``asked_by`` records when this policy asks for a replacement
    buffer_kind = "scored"  # scored: MassiveGNN's buffer; window: Belady within a lookahead; none
    lookahead = 0  # minibatches the sampler must run ahead

    def __init__(self, cfg):
        self.cfg = cfg

    def wants_replacement(self, view: MinibatchView) -> bool:
        return False


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


def make_policy(cfg) -> Policy:
    return POLICIES[cfg.policy](cfg)
