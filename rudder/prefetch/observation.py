"""What a policy sees of one minibatch, and the per-minibatch metrics an agent window carries."""
from __future__ import annotations

from dataclasses import dataclass

from rudder.logs import metrics


@dataclass
class MinibatchView:
    """What a policy may look at before deciding (the minibatch's own lookup is already done)."""
    counter: int  # minibatches served so far, across epochs
    hits: int
    misses: int  # cacheable (admissible) misses
    candidates: int  # slots a replacement could take right now
    hit_percent: int = 0  # the paper's cumulative integer %-hits, this minibatch included
    refetched: int = 0  # misses the last replacement had evicted (its regret)


def window_metrics(view: MinibatchView, refills: int) -> dict:
    """One minibatch's entry in an agent window (``rudder.agent.protocol.WINDOW_METRICS``), once
    it was served (``refills``: rows a replacement brought in); the same for the agent and the
    classifiers' collection mode."""
    return {"hitrate": view.hit_percent, "comm_volume": metrics.comm_volume(view.misses, refills),
            "candidates": view.candidates, "refetched": view.refetched}
