"""The floor of a shaped run (issue 18): the shortest epoch it could have on its network, the larger
of its compute-only epoch (the same run unshaped with every partition on one node, so every remote
row is read through shared memory and nothing waits for a wire) and the bytes it moved divided by
the shaped rate.

The bytes are the RMA bytes its trainers logged (feature rows at their stored size plus sampling's
remote CSR, ``bytes_rma + adjacency_bytes_rma``), per timed epoch like the epoch time itself, and
the floor is the larger of the two per epoch, over the epochs as the epoch time is. The
byte counter of the shaping (``netem.json``'s ``crossed_bytes``) is not used: it counts the whole
job (start-up, the warm-up epoch, evaluation), so it cannot be split into epochs, and it adds what
is not the run's choice to move (TCP/IP and OFI headers, the gradient Allreduce). The report shows
it beside, as counted over logged bytes of the whole job. So the floor is a lower bound: a run at
1.0x its floor moves only the rows it fetched, at the full rate, with all compute hidden."""
from __future__ import annotations

import json
import os

import numpy as np

from rudder.logs import metrics
from rudder.logs.reader import load_run


def rma_bytes(rows):
    """What a minibatch (or its rows) read over RMA: feature rows and sampling's remote CSR."""
    return rows["bytes_rma"] + rows["adjacency_bytes_rma"]


def wire_bytes(run, links: str, epochs: list[int]) -> np.ndarray:
    """RMA bytes the wire had to carry in ``run`` (``load_run``'s), per epoch of ``epochs``: every
    trainer's on the shared link (one link carries them all), the most one trainer fetched on
    per-node links (its node's port carries that at the rate; every trainer is a node of its own)."""
    fetched = np.array([metrics.per_epoch([r.minibatches], rma_bytes, epochs) for r in run.ranks])
    return fetched.sum(axis=0) if links == "shared" else fetched.max(axis=0)


def counted_over_logged(run_dir: str, run) -> float | None:
    """The shaping's byte counter (the whole job) over the RMA bytes every trainer of ``run``
    (``load_run(run_dir)``) logged (all epochs)."""
    path = os.path.join(run_dir, "netem.json")
    if not os.path.exists(path):
        return None
    logged = sum(int(rma_bytes(r.minibatches).sum()) for r in run.ranks)
    return json.load(open(path))["crossed_bytes"] / logged if logged else None


def floor(run_dir: str, compute_only_dir: str, links: str, epochs: list[int] | None = None) -> dict:
    """The floor of the shaped run at ``run_dir`` (its rate from its ``netem.json``) and its parts;
    ``compute_only_dir``: the same run unshaped, on one node. Per timed epoch the larger of the
    two, then taken over the epochs as the epoch time is (``rudder.logs.metrics.epoch_time``): a
    run whose every epoch is at least its floor is at least its floor, also where the epochs
    differ (a ``--shift``). An epoch the compute-only run did not complete counts its wire alone.
    ``epochs``: other epochs than the steady ones (bench/restate_epoch_time.py's old definition)."""
    rate_bit = json.load(open(os.path.join(run_dir, "netem.json")))["rate_bit"]
    run = load_run(run_dir)
    tables = [r.epochs for r in run.ranks]
    epochs = metrics.run_timed_epochs(tables) if epochs is None else epochs
    phases = metrics.epoch_phases(tables, epochs)
    alone = [r.epochs for r in load_run(compute_only_dir).ranks]
    done = set(metrics.complete_epochs(alone))
    compute = np.array([metrics.slowest_seconds(alone, [e])[0] if e in done else 0.0 for e in epochs])
    wire = wire_bytes(run, links, epochs)
    bandwidth = 8 * wire / rate_bit
    return {"compute_only_run": os.path.abspath(compute_only_dir), "epochs": epochs,
            "compute_seconds": metrics.epoch_time(compute, phases),
            "wire_bytes_per_epoch": metrics.epoch_time(wire, phases), "rate_bit": rate_bit,
            "bandwidth_seconds": metrics.epoch_time(bandwidth, phases),
            "seconds": metrics.epoch_time(np.maximum(compute, bandwidth), phases),
            "counted_over_logged": counted_over_logged(run_dir, run)}
