"""What a decision maker is: a class in the ``DECIDERS`` registry that turns one trainer's
context into a ``Decision``; the agent's service keeps the contexts and logs the decisions."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rudder.agent.protocol import HELLO_FIELDS, KEEP, WINDOW_METRICS, Decision, conditions
from rudder.registry import Registry

DECIDERS = Registry()
register_decider = DECIDERS.register


@dataclass
class TrainerContext:
    """What the agent knows of one trainer: static facts, latest window, the last 5 outcomes."""
    facts: dict
    latest: dict = field(default_factory=dict)
    history: deque = field(default_factory=lambda: deque(maxlen=5))
    pending: dict | None = None  # the decision sent last, with the metrics it was made on
    last_evicted: int = 0  # rows the trainer's most recent replacement evicted (however old)
    abandoned: Callable[[], bool] = lambda: False  # true once the trainer no longer waits for this answer


class Decider:
    name = "?"
    prompt_version = 0  # the version of its prompt templates, logged with the run (the llm's)

    def __init__(self, cfg, threads: int = 1):
        """``cfg``: the run config; ``threads``: the cores the agent rank may use."""
        self.cfg = cfg

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        """At start-up, on every rank (``is_agent``: this is the rank that will build it): what it
        needs is there, or a one-line ValueError."""

    def decide(self, ctx: TrainerContext) -> Decision:
        raise NotImplementedError

    def decide_all(self, contexts: list[TrainerContext]) -> list[Decision]:
        """Decisions for several trainers at once (the collective transport's pass over a node's
        windows), in their order. By default one ``decide`` each, a failure falling back for that
        trainer alone; a decider with a batched model call overrides it."""
        decided = []
        for ctx in contexts:
            try:
                decided.append(self.decide(ctx))
            except Exception as e:  # a decision maker's failure must never stop training
                decided.append(Decision(KEEP).fell_back("error", f"{type(e).__name__}: {e}"))
        return decided

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this decider beside the trainers' contexts (an online
        learner's statistics; {} for a decider that learns nothing). Saved when the node's
        trainers have all checkpointed, as the contexts are."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Back from ``state_dict``, before a resumed run's first decision."""

    def close(self) -> None:
        pass


def refill_wait_impact(rows: int, latest: dict) -> str:
    """A rule-based decider's predicted direction of the trainer's input wait after refilling
    ``rows``: the refilled rows are read in the same request as the next minibatch's misses, so
    where the trainer already waits for its inputs (the network is on its path) it waits more;
    where it does not wait, or nothing is refilled, the wait stays as it is."""
    return "increase" if rows > 0 and latest["wait_share"] > 0 else "stagnant"


def blank_context() -> TrainerContext:
    """A context of zeros (a model's warm-up question)."""
    latest = {**dict.fromkeys(("counter", "epoch", "step", "remaining"), 0), **dict.fromkeys(WINDOW_METRICS, 0.0),
              "refill_rows": 0.0, "refill_seconds": 0.0}
    return TrainerContext(dict.fromkeys(HELLO_FIELDS[1:], 0), {**latest, **conditions(latest)})
