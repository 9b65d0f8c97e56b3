"""The ``tuner`` decider: an online bandit, the non-LLM adaptive baseline that needs no offline
training. Per trainer, UCB1 over a few actions: with ``--agent-action structured`` the refill
budgets 0, 1/4, 1/2 and all of the buffer's capacity (times the windows half and all of the limit,
where the buffer looks ahead), with ``paper`` keep and evict. Each action's reward is minus the
wait share of the window reported after it (the share of step time the training thread waited
for its inputs, as measured), so it learns which budget costs the steps least as conditions go;
where nobody waits, every action scores alike and it goes on trying them in turn, which then
costs no time either. Every action is tried once, in order, before any is repeated. Its predicted
wait (structured): the chosen action's mean wait share so far against the latest window's, higher
"increase", lower "decrease", untried or equal "stagnant"."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from rudder.agent.action import Action, ActionLimits
from rudder.agent.deciders.base import Decider, TrainerContext, register_decider
from rudder.agent.protocol import EVICT, KEEP, Decision

FRACTIONS = (0.0, 0.25, 0.5, 1.0)
EXPLORATION = 1.0  # UCB1's c: rewards lie in [-1, 0]


@dataclass
class Arms:
    actions: list[Action]
    pulls: list[int] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    last: int | None = None  # the action chosen last, whose reward the next request reports

    def __post_init__(self):
        self.pulls, self.total = [0] * len(self.actions), [0.0] * len(self.actions)

    def state(self) -> dict:
        return {"pulls": list(self.pulls), "total": list(self.total), "last": self.last}

    @classmethod
    def restored(cls, actions: list[Action], state: dict) -> Arms:
        """Arms over ``actions`` with the statistics a checkpoint saved (``state``)."""
        if len(state["pulls"]) != len(actions) or len(state["total"]) != len(actions):
            raise ValueError(f"--resume: the tuner's checkpoint has {len(state['pulls'])} arms, this run {len(actions)}")
        arms = cls(actions)
        arms.pulls, arms.total, arms.last = list(state["pulls"]), list(state["total"]), state["last"]
        return arms

    def choose(self) -> int:
        n = sum(self.pulls)
        untried = [i for i, p in enumerate(self.pulls) if p == 0]
        if untried:
            return untried[0]
        ucb = [t / p + EXPLORATION * math.sqrt(2 * math.log(n) / p) for t, p in zip(self.total, self.pulls)]
        return max(range(len(ucb)), key=lambda i: (ucb[i], -i))  # ties: the smaller budget


def actions_of(limits: ActionLimits, structured: bool) -> list[Action]:
    if not structured:
        return [Action.paper(False, limits), Action.paper(True, limits)]
    windows = sorted({limits.window // 2, limits.window}) if limits.window else [0]
    budgets = sorted({int(f * limits.refill) for f in FRACTIONS})
    return [Action.budget(b, w, limits.share) for b in budgets for w in windows]  # an equal claim: arms stay few


@register_decider("tuner")
class Tuner(Decider):
    def __init__(self, cfg, threads: int = 1):
        super().__init__(cfg)
        self.structured = cfg.agent.action == "structured"
        self.arms: dict[int, Arms] = {}
        self.saved: dict[int, dict] = {}  # a resumed run's arms, by trainer, until its first request

    def decide(self, ctx: TrainerContext) -> Decision:
        rank = int(ctx.facts["world_rank"])
        if rank not in self.arms:
            actions = actions_of(ActionLimits.of(ctx.facts), self.structured)
            self.arms[rank] = Arms.restored(actions, self.saved.pop(rank)) if rank in self.saved else Arms(actions)
        arms = self.arms[rank]
        reward = -ctx.latest["wait_share"]
        if arms.last is not None:
            arms.pulls[arms.last] += 1
            arms.total[arms.last] += reward
        arms.last = arms.choose()
        action = arms.actions[arms.last]
        mean = [t / p if p else None for t, p in zip(arms.total, arms.pulls)]
        expected = mean[arms.last]  # minus the chosen action's mean wait share
        wait = None if not self.structured else "stagnant" if expected is None or expected == reward else (
            "decrease" if expected > reward else "increase")
        return Decision(EVICT if action.evict else KEEP, explanation=f"arm {arms.last} of {len(arms.actions)}",
                        raw=f'{{"arm": {arms.last}, "reward": {reward:.4f}, "means": {mean}}}',
                        action=action if self.structured else None, wait_impact=wait)

    def state_dict(self) -> dict:
        """Every trainer's arms: a resumed run goes on from what the tuner had learnt (the arms of
        a trainer that has not asked since the resume are kept as saved)."""
        return {"arms": {**self.saved, **{rank: arms.state() for rank, arms in self.arms.items()}}}

    def load_state_dict(self, state: dict) -> None:
        self.saved = {int(rank): arms for rank, arms in state.get("arms", {}).items()}
