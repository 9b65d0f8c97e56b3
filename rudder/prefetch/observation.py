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
    # Known once the minibatch's rows were read (set before ``Policy.observe``):
    rows_rma: int = 0  # feature rows read by RMA (misses and refills)
    bytes_rma: int = 0  # their bytes
    fetch_seconds: float = 0.0  # seconds reading them
    headroom: int = 0  # free buffer slots after the minibatch


def window_metrics(view: MinibatchView, refills: int, waited: float = 0.0, stepped: float = 0.0) -> dict:
    """One minibatch's entry in an agent window (``rudder.agent.protocol.WINDOW_METRICS``), once
    it was served (``refills``: rows a replacement brought in; ``waited``, ``stepped``: the
    training thread's seconds waiting for inputs and stepping, measured since the previous entry);
    the same for the agent and the classifiers' collection mode."""
    return {"hitrate": view.hit_percent, "comm_volume": metrics.comm_volume(view.misses, refills),
            "candidates": view.candidates, "refetched": view.refetched, "bytes_rma": view.bytes_rma,
            "fetch_seconds": view.fetch_seconds, "wait_seconds": waited, "step_seconds": stepped,
            "headroom": view.headroom}
