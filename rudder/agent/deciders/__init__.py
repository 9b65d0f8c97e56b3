"""The decision makers, one class each in the ``DECIDERS`` registry: ``heuristic`` (the paper's
rules), ``llm`` (a small instruct model in context), ``classifier`` (a model trained offline) and
``tuner`` (an online bandit)."""
from __future__ import annotations

from rudder.agent.deciders import classifier, heuristic, llm, tuner  # noqa: F401  (each registers its decider)
from rudder.agent.deciders.base import DECIDERS, Decider, TrainerContext


def make_decider(cfg, threads: int = 1) -> Decider:
    """The decider of ``cfg``'s policy (the policy's name is its decider's), given the agent rank's cores."""
    return DECIDERS[cfg.buffer.policy](cfg, threads)


__all__ = ["DECIDERS", "Decider", "TrainerContext", "make_decider"]
