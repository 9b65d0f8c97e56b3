"""The agent's action, one definition for the protocol, the deciders, the policies and the logs
(its fields are the log columns ``rudder.logs.schema.ACTION_COLUMNS``):

* ``evict``: replace now, the paper's action (kept to reproduce it);
* ``refill``: the most rows that replacement may take, 0..``ActionLimits.refill`` (the buffer's
  capacity where it refills, else 0). The scored buffer replaces min(its eviction candidates,
  its refill candidates, ``refill``) slots; where the budget binds, its lowest-scored candidates
  go, for its most-missed rows. A budget of the capacity never binds: the paper's replacement;
* ``window``: how many minibatches ahead a lookahead buffer ranks by for the next interval,
  0..``ActionLimits.window`` (what the pipeline samples ahead, ``--lookahead``); 0 where the
  buffer does not look ahead;
* ``share``: with a node-shared buffer split in quotas (``--buffer-split quota``), the trainer's
  claim on the node's capacity, 0..``ActionLimits.share`` (``SHARE_SCALE``); each trainer's quota
  is its claim's part of the sum of the node's claims (``rudder.prefetch.scored_buffer``), so a
  trainer decides its claim alone. 0 where the buffer has no split. Deciders that do not weigh
  the split claim ``SHARE_SCALE`` each: equal quotas.

``--agent-action paper`` deciders answer evict or keep (``Action.paper``: the full budget and
the configured window, an equal claim); ``structured`` ones answer the budget, the window and
the claim. ``validate``
says whether an action may be applied, as a fallback code (``FALLBACKS``): the agent checks what
its decider answered, the trainer what it received, and neither applies one that fails.
"""
from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields

from rudder.logs.schema import ACTION_FIELDS

MODES = ("paper", "structured")
SHARE_SCALE = 100  # the largest claim on a split node buffer


@dataclass(frozen=True)
class ActionLimits:
    refill: int  # most rows a replacement may take (the buffer's capacity; 0: the buffer never refills)
    window: int  # largest lookahead window (0: the buffer does not look ahead)
    share: int = 0  # largest claim on the node's split buffer (SHARE_SCALE; 0: the buffer has no split)

    @classmethod
    def of(cls, facts: dict) -> ActionLimits:
        """From a trainer's facts (``rudder.agent.protocol.trainer_facts``)."""
        return cls(int(facts["max_refill"]), int(facts["max_window"]), int(facts["max_share"]))


def share_limit(cfg) -> int:
    """The largest claim of a run's agent actions on a split node buffer (``--buffer-split quota``), else 0."""
    return SHARE_SCALE if cfg.buffer.split == "quota" else 0


def window_limit(cfg) -> int:
    """The largest window of a run's agent actions: what the pipeline samples ahead where the
    agent's buffer looks ahead (``--agent-buffer window``), else 0."""
    return cfg.buffer.lookahead if cfg.agent.buffer == "window" else 0


@dataclass(frozen=True)
class Action:
    evict: bool
    refill: int
    window: int
    share: int = 0  # 0: no claim (a buffer without a split)

    @classmethod
    def paper(cls, evict: bool, limits: ActionLimits) -> Action:
        """The paper's evict or keep: an unbounded replacement, the window unchanged, an equal claim."""
        return cls(bool(evict), limits.refill, limits.window, limits.share)

    @classmethod
    def budget(cls, rows: int, window: int, share: int) -> Action:
        """A structured answer: replace at most ``rows`` rows now (none: keep)."""
        return cls(bool(rows > 0), rows, window, share)

    def validate(self, limits: ActionLimits) -> str:
        """"none" if the action may be applied; else why not: "invalid_action" (a field of the
        wrong type, not finite or not whole), "out_of_range" (outside ``limits``)."""
        if not isinstance(self.evict, bool):
            return "invalid_action"
        for value in (self.refill, self.window, self.share):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value != int(value):
                return "invalid_action"
        if not (0 <= self.refill <= limits.refill and 0 <= self.window <= limits.window
                and 0 <= self.share <= limits.share):
            return "out_of_range"
        return "none"

    def payload(self) -> list[float]:
        """As floats, in ``ACTION_FIELDS`` order (a message's or a log row's)."""
        return [float(v) for v in astuple(self)]

    @classmethod
    def from_payload(cls, values) -> Action:
        """Back from ``payload``; a value that is not whole stays as it is, for ``validate`` to refuse."""
        evict, *rest = (float(v) for v in values)
        whole = [int(v) if math.isfinite(v) and v == int(v) else v for v in rest]
        return cls(evict == 1.0 if evict in (0.0, 1.0) else evict, *whole)

    def row(self) -> dict:
        return {"evict": int(self.evict), "refill": int(self.refill), "window": int(self.window), "share": int(self.share)}


assert tuple(f.name for f in fields(Action)) == ACTION_FIELDS, "Action and the log's ACTION_COLUMNS disagree"
