"""Synthetic trainer contexts: what a decider is benchmarked on (bench/agent.py) and tested on
when no run is at hand, with facts, a latest window and a history drawn at random."""
from __future__ import annotations

from collections import deque

import numpy as np

from rudder.agent.deciders.base import TrainerContext
from rudder.agent.protocol import conditions

STATUSES = ("triggered", "skipped", "decision_no_evict")


def random_context(rng: np.random.Generator, max_window: int = 0, max_share: int = 0) -> TrainerContext:
    facts = {"world_rank": 0, "num_nodes": 2708, "num_edges": 10556, "partition": 1, "num_parts": 4, "batch_size": 16,
             "total_minibatches": 300, "halo": 200, "capacity": 50, "max_refill": 50, "max_window": max_window,
             "max_share": max_share}
    history = [{"status": str(rng.choice(STATUSES)), "evicted": int(rng.integers(0, 20)),
                "hitrate_delta": float(rng.normal()), "comm_delta": float(rng.normal()),
                "wait_delta": float(rng.normal(0, 0.002))} for _ in range(rng.integers(0, 6))]
    latest = {"counter": int(rng.integers(0, 300)), "epoch": 1, "step": 2, "remaining": int(rng.integers(0, 300)),
              "hitrate": float(rng.integers(0, 100)), "comm_volume": float(rng.uniform(0, 100)),
              "candidates": float(rng.integers(0, 50)), "refetched": float(rng.integers(0, 10)),
              "bytes_rma": float(rng.integers(0, 10**6)), "fetch_seconds": float(rng.uniform(0, 0.01)),
              "wait_seconds": float(rng.uniform(0, 0.01)), "step_seconds": float(rng.uniform(0.01, 0.02)),
              "headroom": float(rng.integers(0, 50)), "refill_rows": float(rng.integers(0, 50)),
              "refill_seconds": float(rng.uniform(0, 0.005))}
    return TrainerContext(facts, {**latest, **conditions(latest)}, deque(history, maxlen=5))
