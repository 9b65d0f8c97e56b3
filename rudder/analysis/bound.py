"""Offline replay of a remote-access trace: the physical limit of any buffer (Belady's MIN).

A trace is, per minibatch, the remote input IDs one trainer needed (``--trace`` logs it). The
cost model is the batched one of the policy simulation: at minibatch b, rows of R_b held in the
buffer are hits and every other row costs one fetch; after serving b, the buffer may keep any
``capacity`` rows of (buffer | admissible rows of R_b). MIN keeps those whose next use is
nearest; rows never used again are worth nothing. No policy that fetches only what it needs,
or prefetches at one fetch per row, can do better (field-notes section 4).
"""
from __future__ import annotations

import numpy as np

from rudder.data.partition_store import PartitionFormatError, PartitionMeta, read_partition
from rudder.logs.reader import Run

NEVER = np.iinfo(np.int64).max


def next_uses(trace: list[np.ndarray]) -> list[np.ndarray]:
    """For each minibatch b and each ID in trace[b]: the next minibatch using it (NEVER if none)."""
    sizes = np.array([t.size for t in trace], dtype=np.int64)
    ids = np.concatenate(trace) if trace else np.zeros(0, np.int64)
    when = np.repeat(np.arange(len(trace), dtype=np.int64), sizes)
    order = np.lexsort((when, ids))
    nxt = np.full(ids.size, NEVER, dtype=np.int64)
    same = ids[order][1:] == ids[order][:-1]
    nxt[order[:-1][same]] = when[order][1:][same]
    return np.split(nxt, np.cumsum(sizes)[:-1])


def belady_min(trace: list[np.ndarray], admissible: np.ndarray | None, capacity: int) -> dict:
    """Rows fetched per minibatch under MIN; ``admissible``: sorted IDs the buffer may hold
    (None = any). Returns totals: rows (fetched), hits, accesses."""
    nexts = next_uses(trace)
    held = np.zeros(0, np.int64)
    held_next = np.zeros(0, np.int64)
    fetched = np.zeros(len(trace), dtype=np.int64)
    hits_total = 0
    for b, (ids, nxt) in enumerate(zip(trace, nexts)):
        hit = np.isin(ids, held, assume_unique=True)
        hits_total += int(hit.sum())
        fetched[b] = ids.size - int(hit.sum())
        ok = np.ones(ids.size, bool) if admissible is None else np.isin(ids, admissible, assume_unique=True)
        # Candidates: held rows not used now keep their next use; rows used now get their new one.
        keep_old = ~np.isin(held, ids[ok], assume_unique=True)
        cand = np.concatenate([held[keep_old], ids[ok]])
        cand_next = np.concatenate([held_next[keep_old], nxt[ok]])
        useful = cand_next != NEVER
        cand, cand_next = cand[useful], cand_next[useful]
        if cand.size > capacity:
            pick = np.argpartition(cand_next, capacity - 1)[:capacity]
            cand, cand_next = cand[pick], cand_next[pick]
        order = np.argsort(cand)
        held, held_next = cand[order], cand_next[order]
    return {"rows": int(fetched.sum()), "hits": hits_total, "accesses": int(sum(t.size for t in trace)),
            "per_minibatch": fetched}


def optimal_bound(run: Run, data_dir: str | None, achieved: int) -> dict | None:
    """Belady MIN and the infinite buffer on the recorded trace, per rank, with the run's
    capacity and admissible set; None without a trace."""
    if any(r.trace is None for r in run.ranks):
        return None
    cfg = run.config
    data_dir = data_dir or cfg["data"]
    try:
        meta = PartitionMeta.load(data_dir)
    except PartitionFormatError as e:
        run.warnings.append(f"no optimal bound: the run's partitions are not readable ({e}); pass --data DIR")
        return None
    best = infinite = 0
    for r in run.ranks:
        if len(r.trace) != r.minibatches.size:
            run.warnings.append(f"rank {r.rank}: trace has {len(r.trace)} minibatches, the log {r.minibatches.size}")
        halo = np.sort(read_partition(data_dir, r.layout["partition_id"], meta, structure=False).halo_nodes)
        admissible = None if cfg.get("buffer_scope") == "remote" else halo
        capacity = r.run.get("buffer_capacity") or int(np.floor(cfg.get("buffer_fraction", 0.25) * halo.size))
        best += belady_min(r.trace, admissible, capacity)["rows"]
        infinite += belady_min(r.trace, admissible, 1 << 62)["rows"]
    return {"achieved_rows": achieved, "min_rows": best, "infinite_rows": infinite,
            "achieved_over_min": achieved / best if best else None}
