"""The classifier baselines' input features, one definition for collection (the trainer's
``fixed --collect-traces`` rows), offline training and the decider at runtime, so that training
and serving agree (the reference's train/serve skew, spec 3.4, cannot happen here): static facts
of the trainer (graph-size features instead of a dataset one-hot, so a model runs on a graph it
never saw), the latest window's means and the size of the most recent replacement."""
from __future__ import annotations

import numpy as np

from rudder.logs.schema import CLASSIFIER_FEATURES as FEATURES


def features(facts: dict, latest: dict, last_evicted: float) -> np.ndarray:
    """``FEATURES`` of a trainer (``facts``: rudder.agent.protocol.trainer_facts; ``latest``:
    the minibatch counter plus the window means of ``WINDOW_METRICS``)."""
    capacity, batch = max(facts["capacity"], 1), max(facts["batch_size"], 1)
    return np.array([
        np.log1p(facts["num_nodes"]), np.log1p(facts["num_edges"]), facts["num_parts"], np.log1p(facts["batch_size"]),
        np.log1p(facts["halo"]), facts["capacity"] / max(facts["halo"], 1),
        latest["counter"] / max(facts["total_minibatches"], 1),
        latest["hitrate"], latest["comm_volume"] / batch, latest["candidates"] / capacity,
        latest["refetched"] / batch, last_evicted / capacity,
    ], dtype=np.float64)


__all__ = ["FEATURES", "features"]
