"""The ``tuner`` decider: an online bandit, the non-LLM adaptive baseline that needs no offline
training. Per trainer, UCB2 (Auer, Cesa-Bianchi and Fischer, 2002) over a few actions: with
``--agent-action structured`` the refill budgets 0, 1/4, 1/2 and all of the buffer's capacity
(times the windows half and all of the limit, where the buffer looks ahead), with ``paper`` keep
and evict. Each action's reward is minus the wait share of the window reported after it (the
share of step time the training thread waited for its inputs, as measured), so it learns which
budget costs the steps least as conditions go. Every action is tried once, in order, before any
is repeated. Then UCB2 plays the action it picks for an epoch of windows in a row, epochs growing
by ``ALPHA`` each time an action is picked again: a change of action costs the buffer work (a
lookahead window that shrinks is rebuilt), and UCB1, which may change at every window, changed
at most of them where actions waited alike (docs/results-agent.md); UCB2 changes O(log n) times,
with UCB1's order of regret. Its
predictions, for the hit rate, the communication volume and (structured) the wait: the chosen
action's mean of that figure over the windows that followed it so far, against the latest
window's: higher "increase", lower "decrease", not yet seen or equal "stagnant"."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from rudder.agent.action import Action, ActionLimits
from rudder.agent.deciders.base import Decider, TrainerContext, register_decider
from rudder.agent.protocol import EVICT, KEEP, Decision

FRACTIONS = (0.0, 0.25, 0.5, 1.0)
ALPHA = 0.5  # UCB2's epoch growth: an action's r-th epoch ends after tau(r) = ceil((1 + ALPHA)^r) windows of it
PREDICTED = ("hitrate", "comm_volume", "wait_share")  # window figures whose direction it predicts


@dataclass
class Arms:
    actions: list[Action]
    pulls: list[int] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    last: int | None = None  # the action chosen last, whose reward the next request reports
    seen: dict[str, list[float]] = field(default_factory=dict)  # per PREDICTED figure, its sum after each action
    observed: list[int] = field(default_factory=list)  # windows summed in ``seen``, per action
    epochs: list[int] = field(default_factory=list)  # UCB2's r: the epochs each action was picked for
    left: int = 0  # windows the last action still plays in its epoch

    def __post_init__(self):
        self.pulls, self.total = [0] * len(self.actions), [0.0] * len(self.actions)
        self.seen, self.observed = {m: [0.0] * len(self.actions) for m in PREDICTED}, [0] * len(self.actions)
        self.epochs = [0] * len(self.actions)

    def state(self) -> dict:
        return {"pulls": list(self.pulls), "total": list(self.total), "last": self.last,
                "seen": {m: list(v) for m, v in self.seen.items()}, "observed": list(self.observed),
                "epochs": list(self.epochs), "left": self.left}

    @classmethod
    def restored(cls, actions: list[Action], state: dict) -> Arms:
        """Arms over ``actions`` with the statistics a checkpoint saved (``state``; one saved before
        the predictions' sums starts them afresh, one saved before UCB2's epochs starts those)."""
        if len(state["pulls"]) != len(actions) or len(state["total"]) != len(actions):
            raise ValueError(f"--resume: the tuner's checkpoint has {len(state['pulls'])} arms, this run {len(actions)}")
        arms = cls(actions)
        arms.pulls, arms.total, arms.last = list(state["pulls"]), list(state["total"]), state["last"]
        if "observed" in state:
            arms.seen, arms.observed = {m: list(state["seen"][m]) for m in PREDICTED}, list(state["observed"])
        if "epochs" in state:
            arms.epochs, arms.left = list(state["epochs"]), int(state["left"])
        return arms

    def observe(self, latest: dict) -> None:
        """The window after the last action: its reward (minus the wait share) and the figures it predicts."""
        if self.last is None:
            return
        self.pulls[self.last] += 1
        self.total[self.last] -= latest["wait_share"]
        self.observed[self.last] += 1
        for m in PREDICTED:
            self.seen[m][self.last] += float(latest[m])

    def direction(self, figure: str, arm: int, now: float) -> str:
        """``arm``'s mean of ``figure`` so far against ``now`` (IMPACTS)."""
        if not self.observed[arm]:
            return "stagnant"
        mean = self.seen[figure][arm] / self.observed[arm]
        return "increase" if mean > now else "decrease" if mean < now else "stagnant"

    def choose(self) -> int:
        """The last action while its epoch lasts; else the first untried one; else UCB2's pick,
        which then plays tau(r + 1) - tau(r) windows, r its epochs so far."""
        if self.left and self.last is not None:
            self.left -= 1
            return self.last
        untried = [i for i, p in enumerate(self.pulls) if p == 0]
        if untried:
            return untried[0]
        n = sum(self.pulls)

        def bonus(r: int) -> float:
            return math.sqrt((1 + ALPHA) * max(0.0, math.log(math.e * n / tau(r))) / (2 * tau(r)))

        ucb = [t / p + bonus(r) for t, p, r in zip(self.total, self.pulls, self.epochs)]
        chosen = max(range(len(ucb)), key=lambda i: (ucb[i], -i))  # ties: the smaller budget
        r = self.epochs[chosen]
        self.epochs[chosen], self.left = r + 1, tau(r + 1) - tau(r) - 1  # this window is the epoch's first
        return chosen


def tau(r: int) -> int:
    return math.ceil((1 + ALPHA) ** r)


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
        arms.observe(ctx.latest)
        arms.last = arms.choose()
        action = arms.actions[arms.last]
        mean = [t / p if p else None for t, p in zip(arms.total, arms.pulls)]
        impact = {m: arms.direction(m, arms.last, float(ctx.latest[m])) for m in PREDICTED}
        return Decision(EVICT if action.evict else KEEP, hitrate_impact=impact["hitrate"],
                        comm_impact=impact["comm_volume"], explanation=f"arm {arms.last} of {len(arms.actions)}",
                        raw=f'{{"arm": {arms.last}, "reward": {-ctx.latest["wait_share"]:.4f}, "means": {mean}}}',
                        action=action if self.structured else None,
                        wait_impact=impact["wait_share"] if self.structured else None)

    def state_dict(self) -> dict:
        """Every trainer's arms: a resumed run goes on from what the tuner had learnt (the arms of
        a trainer that has not asked since the resume are kept as saved)."""
        return {"arms": {**self.saved, **{rank: arms.state() for rank, arms in self.arms.items()}}}

    def load_state_dict(self, state: dict) -> None:
        self.saved = {int(rank): arms for rank, arms in state.get("arms", {}).items()}
