"""Buffer policies: each answers one question per minibatch, "replace now?", from what it sees;
its buffer (``buffer_class``) does the how. A policy is one class and one ``@register`` line.

    none       no buffer: every remote row is fetched (the DistDGL baseline)
    static     fill once (by --buffer-init), never replace (MassiveGNN with delta = alpha = 0)
    fixed      replace every --delta minibatches, counted across epochs (MassiveGNN, "DistDGL+fixed"),
               each replacement at most --refill-budget of the capacity
    heuristic  ask the node's agent rank, which applies the paper's prompt rules (rudder.agent)
    classifier ask the node's agent rank, where a model trained offline decides
    llm        ask the node's agent rank, where a small LLM decides in context
    tuner      ask the node's agent rank, where an online bandit tries actions and keeps what waits least
    lookahead  sample --lookahead W minibatches ahead and keep, of the buffer and this minibatch's
               fetched rows, those needed soonest within the window (Belady inside the window;
               the clairvoyant design point of RapidGNN/Ginex)
    replay     replace at the minibatches where an earlier run (--replay RUN) replaced: the same
               buffer work without its decision maker (to price an agent's overhead)

A policy sees a ``PolicyContext`` (the trainer's facts, its log, its rank, the run's phases:
(epoch, step) <-> minibatch counter, and a way to open the agent link), never the trainer: the simulator builds the same context.
``fixed --collect-traces`` is the classifiers' collection mode (``trace_collection``).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rudder.agent.action import SHARE_SCALE, ActionLimits
from rudder.agent.deciders import DECIDERS
from rudder.agent.protocol import DecisionLink, accept
from rudder.logs.reader import LogError, trainer_table
from rudder.logs.schema import CLASSIFIER_TRACE_ROW, FALLBACKS
from rudder.prefetch.buffers import PrefetchBuffer
from rudder.prefetch.observation import MinibatchView, window_metrics
from rudder.prefetch.scored_buffer import ScoredBuffer
from rudder.prefetch.trace_collection import TraceCollector
from rudder.prefetch.window_buffer import WindowBuffer
from rudder.registry import Registry

POLICIES = Registry()
register = POLICIES.register
# Who asked for a replacement, as logged per minibatch (``asked_by``).
ASKERS = {"": 0, "timer": 1, "agent": 2, "classifier": 3, "replay": 4, "policy": 5}


@dataclass
class PolicyContext:
    """What a policy may use of the trainer it steers, fixed once the trainer is built."""
    facts: dict  # rudder.agent.protocol.trainer_facts
    log: object  # the trainer's log (``append`` rows of the tables the policy declared)
    trainer_rank: int
    phases: object  # rudder.sampling.phases.RunPhases: (epoch, step) <-> minibatch counter
    open_agent_link: Callable[[int, int], DecisionLink] | None = None  # (window, latency) -> link


class Policy:
    name = "?"
    asker = "policy"  # what ``asked_by`` records when this policy asks for a replacement
    buffer_class: type[PrefetchBuffer] | None = ScoredBuffer  # None: no buffer
    lookahead = 0  # minibatches the sampler must run ahead
    needs_agent = False  # an agent rank per node serves this policy's decisions
    # The options (flat names) that change the CPU its buffer costs a minibatch: a simulator profile
    # keeps a buffer's CPU per policy and these settings (``rudder.sim.simulate.buffer_work``).
    work_settings: tuple[str, ...] = ("buffer_fraction", "buffer_scope", "buffer_sharing", "buffer_split")

    def __init__(self, cfg):
        self.cfg = cfg

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        """Before anyone trains, on every rank: the files, servers or runs this policy needs are
        there (a one-line ValueError if not)."""

    def log_tables(self) -> dict:
        """Tables this policy adds to the trainer's log (name: row dtype)."""
        return {}

    def start(self, ctx: PolicyContext) -> None:
        """Once the trainer is built, before the first minibatch."""

    def wants_replacement(self, view: MinibatchView) -> bool:
        return False

    def refill_budget(self) -> int | None:
        """The most slots the replacement just asked for may take (None: no bound)."""
        return None

    def lookahead_now(self) -> int:
        """Minibatches ahead a lookahead buffer ranks by on this minibatch (at most ``lookahead``)."""
        return self.lookahead

    def capacity_claim(self) -> int | None:
        """This trainer's claim on a split node buffer from this minibatch on (None: unchanged)."""
        return None

    def action_limits(self, buffer: PrefetchBuffer | None) -> ActionLimits:
        """The bounds of an agent's action on ``buffer``: it refills up to its capacity if it is a
        scored buffer, looks ahead up to ``lookahead`` if it is a window buffer, claims up to
        ``SHARE_SCALE`` of a split node buffer."""
        scored = isinstance(buffer, ScoredBuffer)
        return ActionLimits(buffer.capacity if scored else 0, self.lookahead if isinstance(buffer, WindowBuffer) else 0,
                            SHARE_SCALE if scored and buffer.claims is not None else 0)

    def arrived_decision(self) -> tuple[int, int, int]:
        """(request, minibatches since it, fallback code) of an agent decision that arrived on this
        minibatch; (-1, -1, 0): none did."""
        return (-1, -1, 0)

    def observe(self, view: MinibatchView, refills: int) -> None:
        """After the minibatch was served (``refills``: rows a replacement brought in)."""

    def observe_step(self, waited: float, seconds: float) -> None:
        """From the training thread, after each step: the seconds it waited for the minibatch's
        inputs and the step's seconds (while the pipeline thread prepares later minibatches)."""

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
    buffer_class = None
    work_settings = ()


@register("static")
class Static(Policy):
    pass


@register("fixed")
class Fixed(Policy):
    asker = "timer"
    work_settings = Policy.work_settings + ("delta", "refill_budget")
    collector = None

    def log_tables(self) -> dict:
        return {"classifier_trace": CLASSIFIER_TRACE_ROW} if self.cfg.buffer.collect_traces else {}

    budget = None  # most slots a replacement may take (--refill-budget; None: no bound)

    def start(self, ctx: PolicyContext) -> None:
        if self.cfg.buffer.collect_traces:
            self.collector = TraceCollector(ctx.facts, self.cfg.agent.window, ctx.log)
        if self.cfg.buffer.refill_budget < 1:  # bounded as an agent's structured budget is, by the same buffer code
            self.budget = int(self.cfg.buffer.refill_budget * ctx.facts["capacity"])

    def wants_replacement(self, view: MinibatchView) -> bool:
        return view.counter % self.cfg.buffer.delta == 0

    def refill_budget(self) -> int | None:
        return self.budget

    def observe(self, view: MinibatchView, refills: int) -> None:
        if self.collector is not None:
            self.collector.observe(view, self.wants_replacement(view), refills)

    def state_dict(self) -> dict:
        return self.collector.state_dict() if self.collector is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.collector is not None:
            self.collector.load_state_dict(state)


def use_agent_buffer(policy: Policy, cfg) -> None:
    """An agent policy's buffer (``--agent-buffer``): the scored one, or the lookahead window buffer."""
    if cfg.agent.buffer == "window":
        policy.buffer_class, policy.lookahead = WindowBuffer, cfg.buffer.lookahead


@register("replay")
class Replay(Policy):
    """The replacements of an earlier run at the same minibatches, with their refill budgets and
    windows (and its agent's buffer, ``--agent-buffer``, when it had one)."""
    asker = "replay"
    work_settings = Policy.work_settings + ("agent_buffer", "lookahead")

    def __init__(self, cfg):
        super().__init__(cfg)
        use_agent_buffer(self, cfg)
        self.counter = 0

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        try:
            trainer_table(cfg.buffer.replay, 0)
        except LogError as e:
            raise ValueError(f"--replay {e}") from None

    def start(self, ctx: PolicyContext) -> None:
        self.at, self.windows = replacement_minibatches(self.cfg.buffer.replay, ctx.trainer_rank, ctx.phases)

    def wants_replacement(self, view: MinibatchView) -> bool:
        self.counter = view.counter
        return view.counter in self.at

    def refill_budget(self) -> int | None:
        budget = self.at.get(self.counter, -1)
        return None if budget < 0 else budget

    def lookahead_now(self) -> int:
        return int(self.windows[self.counter]) if self.counter < self.windows.size else self.lookahead


@register("lookahead")
class Lookahead(Policy):
    buffer_class = WindowBuffer
    work_settings = Policy.work_settings + ("lookahead",)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lookahead = cfg.buffer.lookahead


class AgentPolicy(Policy):
    """Act when the node's agent says so (``rudder.agent``): each minibatch, look for its answer
    (``DecisionLink.poll``), apply its action on this minibatch if it is fresh and within this
    trainer's limits (``rudder.agent.protocol.accept``: a replacement of at most its refill
    budget, its window from now on), and send a fresh window of metrics whenever no decision is
    outstanding."""
    asker = "agent"
    needs_agent = True
    work_settings = Policy.work_settings + ("agent_buffer", "lookahead", "agent_action", "agent_window")

    def __init__(self, cfg):
        super().__init__(cfg)
        use_agent_buffer(self, cfg)
        self.steps: deque = deque()  # (waited, step seconds) from the training thread, not yet in a window entry

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        DECIDERS[cls.name].check_inputs(cfg, is_agent)  # the decider of the same name serves it

    def start(self, ctx: PolicyContext) -> None:
        self.link = ctx.open_agent_link(self.cfg.agent.window, self.cfg.agent.latency)
        self.phases, self.total = ctx.phases, ctx.facts["total_minibatches"]
        self.limits = ActionLimits.of(ctx.facts)
        self.window, self.budget, self.claim = self.limits.window, None, None  # the latest applied action's
        self.applying = None  # (request id, evict?, age, fallback code) of the answer found on this minibatch

    def wants_replacement(self, view: MinibatchView) -> bool:
        answer = self.link.poll()
        self.applying = None
        if answer is None:
            return False
        self.link.drop_stale()  # metrics gathered while the agent thought
        age = view.counter - self.link.requested_at
        action, code = accept(answer, age, self.limits, self.cfg.agent.stale_after)
        self.applying = (int(answer[0]), action.evict, age, code)
        self.window, self.budget = action.window, action.refill
        self.claim = action.share if code == "none" and self.limits.share else None
        return action.evict

    def refill_budget(self) -> int | None:
        return self.budget

    def lookahead_now(self) -> int:
        return self.window

    def capacity_claim(self) -> int | None:
        return self.claim

    def arrived_decision(self) -> tuple[int, int, int]:
        a = self.applying
        return (-1, -1, 0) if a is None else (a[0], a[2], FALLBACKS.index(a[3]))

    def observe_step(self, waited: float, seconds: float) -> None:
        self.steps.append((waited, seconds))  # deque.append: safe beside the pipeline thread's popleft

    def observe(self, view: MinibatchView, refills: int) -> None:
        if refills:  # its rows came in the minibatch's one request: their seconds by their share of its RMA rows
            self.link.record_refill(refills, view.fetch_seconds * refills / max(1, view.rows_rma))
        if self.applying is not None:
            self.link.record_outcome(self.applying[0], view.counter, refills, view.candidates, self.applying[2],
                                     self.applying[3])
        # A minibatch that acted on "evict" observes nothing (its stats are stale), so it sends
        # no request; it still joins a window due there (collective transport).
        if self.applying is None or not self.applying[1]:
            waited = stepped = 0.0
            while self.steps:
                w, t = self.steps.popleft()
                waited, stepped = waited + w, stepped + t
            self.link.observe(window_metrics(view, refills, waited, stepped))
        epoch, step = self.phases.position(view.counter)
        self.link.maybe_request(view.counter, epoch, step, self.total - view.counter - 1)

    def state_dict(self) -> dict:
        return {**self.link.state_dict(), "action_window": self.window}

    def load_state_dict(self, state: dict) -> None:
        self.link.load_state_dict(state)
        self.window = state.get("action_window", self.limits.window)

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


@register("tuner")
class TunerAgent(AgentPolicy):
    pass


def replacement_minibatches(run_dir: str, trainer_rank: int, phases) -> tuple[dict[int, int], np.ndarray]:
    """The minibatch counters at which trainer ``trainer_rank`` of an earlier run replaced, each
    with its refill budget (-1: no bound), and the window of every minibatch."""
    try:
        run, mb = trainer_table(run_dir, trainer_rank)
    except LogError as e:
        raise ValueError(f"--replay {e}") from None
    theirs = [(p["first_epoch"], p["steps_per_epoch"])
              for p in run.get("phases", [{"first_epoch": 0, "steps_per_epoch": run["steps_per_epoch"]}])]
    ours = [(p.first_epoch, p.steps_per_epoch) for p in phases.phases]
    if theirs != ours:
        raise ValueError(f"--replay {run_dir}: (first epoch, steps per epoch) of its phases {theirs} there, {ours} here "
                         "(replay needs the same data, batch size, shift and ranks)")
    replaced = mb[mb["replaced"] == 1]
    counters = phases.counter(replaced["epoch"].astype(np.int64), replaced["step"].astype(np.int64))
    order = np.argsort(phases.counter(mb["epoch"].astype(np.int64), mb["step"].astype(np.int64)), kind="stable")
    return dict(zip(counters.tolist(), replaced["refill_budget"].tolist())), mb["lookahead_window"][order]


def make_policy(cfg) -> Policy:
    return POLICIES[cfg.buffer.policy](cfg)
