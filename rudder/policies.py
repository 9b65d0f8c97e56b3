"""Buffer policies: each answers one question per minibatch, "replace now?", from what it sees;
the buffer (``rudder.buffer``) does the how. A policy is one class and one ``@register`` line.

    none       no buffer: every remote row is fetched (the DistDGL baseline)
    static     fill once (by --buffer-init), never replace (MassiveGNN with delta = alpha = 0)
    fixed      replace every --delta minibatches, counted across epochs (MassiveGNN, "DistDGL+fixed")
    heuristic  ask the node's agent rank, which applies the paper's prompt rules (rudder.agent)
    classifier ask the node's agent rank, where a model trained offline decides (rudder.classifier)
    llm        ask the node's agent rank, where a small LLM decides in context (rudder.llm)
    lookahead  sample --lookahead W minibatches ahead and keep, of the buffer and this minibatch's
               fetched rows, those needed soonest within the window (Belady inside the window;
               the clairvoyant design point of RapidGNN/Ginex)
    replay     replace at the minibatches where an earlier run (--replay RUN) replaced: the same
               buffer work without its decision maker (to price an agent's overhead)

``fixed --collect-traces`` is the classifiers' collection mode: it logs one training row per
replacement interval (``rudder.classifier.TraceCollector``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.registry import Registry

POLICIES = Registry()
register = POLICIES.register
# Who asked for a replacement, as logged per minibatch (``asked_by``); the agent issue adds its own.
ASKERS = {"": 0, "timer": 1, "agent": 2, "classifier": 3, "replay": 4}


@dataclass
class MinibatchView:
    """What a policy may look at before deciding (the minibatch's own lookup is already done)."""
    counter: int  # minibatches served so far, across epochs
    hits: int
    misses: int  # admissible misses
    candidates: int  # slots below the eviction threshold right now
    hit_percent: int = 0  # cumulative integer %-hits including this minibatch (spec 1.10)
    refetched: int = 0  # misses the last replacement had evicted (its regret; the spec's post Node_Freq)


class Policy:
    name = "?"
    asker = ""  # what ``asked_by`` records when this policy asks for a replacement
    buffer_kind = "scored"  # scored: MassiveGNN's buffer; window: Belady within a lookahead; none
    lookahead = 0  # minibatches the sampler must run ahead
    needs_agent = False  # an agent rank per node serves this policy's decisions

    def __init__(self, cfg):
        self.cfg = cfg

    def log_tables(self, cfg) -> dict:
        """Tables this policy adds to the trainer's log (name: row dtype)."""
        return {}

    def start(self, trainer) -> None:
        """Once the trainer is built (its facts, layout and log exist), before the first minibatch."""

    def wants_replacement(self, view: MinibatchView) -> bool:
        return False

    def observe(self, view: MinibatchView, refills: int) -> None:
        """After the minibatch was served (``refills``: rows a replacement brought in)."""

    def state_dict(self) -> dict:
        """What a checkpoint must keep of this policy (taken between two minibatches)."""
        return {}

    def on_checkpoint(self, counter: int) -> None:
        """A checkpoint is being taken after minibatch ``counter`` (from the pipeline thread)."""

    def load_state_dict(self, state: dict) -> None:
        pass

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
    collector = None

    def log_tables(self, cfg) -> dict:
        from rudder.classifier import TRACE_ROW

        return {"classifier_trace": TRACE_ROW} if cfg.collect_traces else {}

    def start(self, trainer) -> None:
        if self.cfg.collect_traces:
            from rudder.classifier import TraceCollector

            self.collector = TraceCollector(trainer.facts, self.cfg.agent_window, trainer.log)

    def wants_replacement(self, view: MinibatchView) -> bool:
        return view.counter % self.cfg.delta == 0

    def observe(self, view: MinibatchView, refills: int) -> None:
        if self.collector is not None:
            self.collector.observe(view, self.wants_replacement(view), refills)

    def state_dict(self) -> dict:
        return dict(vars(self.collector), log=None) if self.collector is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.collector is not None:
            vars(self.collector).update({k: v for k, v in state.items() if k != "log"})


@register("replay")
class Replay(Policy):
    asker = "replay"

    def start(self, trainer) -> None:
        self.at = replacement_minibatches(self.cfg.replay, trainer.layout.trainer_rank, trainer.steps_per_epoch)

    def wants_replacement(self, view: MinibatchView) -> bool:
        return view.counter in self.at


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

    def start(self, trainer) -> None:
        self.link = trainer.connect_agent(self.cfg.agent_window)  # over MPI, or in-process when simulated
        self.steps_per_epoch, self.total = trainer.steps_per_epoch, trainer.facts["total_minibatches"]
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
        self.link.observe(window_metrics(view))
        epoch, step = divmod(view.counter, self.steps_per_epoch)
        self.link.maybe_request(view.counter, epoch, step, self.total - view.counter - 1)

    def state_dict(self) -> dict:
        """The request numbering and the metrics window; a decision still outstanding is lost
        with the interrupted job (the resumed trainer asks afresh)."""
        return {"next_id": self.link.next_id, "report": list(self.link.report), "metrics": list(self.link.metrics)}

    def load_state_dict(self, state: dict) -> None:
        self.link.next_id, self.link.report, self.link.metrics = state["next_id"], state["report"], state["metrics"]

    def on_checkpoint(self, counter: int) -> None:
        self.link.checkpoint(counter)  # the agent saves its contexts too

    def close(self) -> None:
        self.link.close()


@register("heuristic")
class HeuristicAgent(AgentPolicy):
    pass


@register("classifier")
class ClassifierAgent(AgentPolicy):
    asker = "classifier"


@register("llm")
class LLMAgent(AgentPolicy):
    pass


def replacement_minibatches(run_dir: str, trainer_rank: int, steps_per_epoch: int) -> set[int]:
    """The minibatch counters at which trainer ``trainer_rank`` of an earlier run replaced."""
    from rudder.analyze import AnalysisError, trainer_table

    try:
        run, mb = trainer_table(run_dir, trainer_rank)
    except AnalysisError as e:
        raise ValueError(f"--replay {e}") from None
    if run["steps_per_epoch"] != steps_per_epoch:
        raise ValueError(f"--replay {run_dir}: {run['steps_per_epoch']} steps per epoch there, "
                         f"{steps_per_epoch} here (replay needs the same data, batch size and ranks)")
    replaced = mb[mb["replaced"] == 1]
    return set((replaced["epoch"].astype(np.int64) * steps_per_epoch + replaced["step"]).tolist())


def window_metrics(view: MinibatchView) -> dict:
    """One minibatch's entry in an agent window (``rudder.agent.WINDOW_METRICS``), the same for
    the agent and a classifier's collection mode."""
    return {"hitrate": view.hit_percent, "comm_volume": view.misses, "candidates": view.candidates,
            "refetched": view.refetched}


def make_policy(cfg) -> Policy:
    return POLICIES[cfg.policy](cfg)
