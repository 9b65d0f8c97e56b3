"""The classifier baselines' collection mode (``--policy fixed --collect-traces``): fed every
minibatch of a fixed-policy run, it logs one ``classifier_trace`` row per replacement interval
once the interval's post phase ends (at the next replacement; the run's last, unfinished interval
is not logged): the features as the agent would have seen them just before the replacement, the
rows it evicted, and the interval's mean hit rate, communication volume and re-fetch regret
before ("pre") and after ("post") it (an interval's post is the next one's pre, as in the
reference). ``rudder.agent.classifier_training`` trains on these rows."""
from __future__ import annotations

import numpy as np

from rudder.agent.features import features
from rudder.agent.protocol import window_means
from rudder.logs.schema import CLASSIFIER_TRACE_ROW, TRACE_PHASE
from rudder.prefetch.observation import MinibatchView, window_metrics


class TraceCollector:
    def __init__(self, facts: dict, window: int, log):
        self.facts, self.window, self.log = facts, window, log
        self.metrics: list[dict] = []  # since the last replacement (its interval's post phase)
        self.recent: list[dict] = []  # the last ``window`` minibatches
        self.open: dict | None = None  # the interval awaiting its post phase
        self.interval, self.last_evicted = 0, 0

    def observe(self, view: MinibatchView, replaced: bool, refills: int) -> None:
        m = window_metrics(view, refills)
        self.metrics.append(m)
        self.recent = (self.recent + [m])[-self.window:]
        if not replaced:
            return
        phase = {k: float(np.mean([x[k] for x in self.metrics])) for k in TRACE_PHASE}
        if self.open is not None:
            self.log.append("classifier_trace", {**self.open, **{f"post_{k}": phase[k] for k in TRACE_PHASE}})
        latest = {"counter": view.counter, **window_means(self.recent)}
        x = features(self.facts, latest, self.last_evicted)
        self.open = {"interval": self.interval, "minibatch": view.counter,
                     **dict(zip(CLASSIFIER_TRACE_ROW.names[2:2 + x.size], x.tolist())), "evicted": refills,
                     **{f"pre_{k}": phase[k] for k in TRACE_PHASE}}
        self.interval += 1
        self.last_evicted = refills or self.last_evicted  # as the agent keeps it
        self.metrics = []

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "log"}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)
