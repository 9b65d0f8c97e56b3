"""Every table of a run log, defined once: the trainer's ``minibatches`` and ``epochs`` (and, in
collection mode, ``classifier_trace``), the agent's ``decisions`` and ``outcomes``, and the
ragged sets beside them. Writers build rows by field name (``record``), readers bring a log
written by an older version up to the current columns (``upgrade``); analysis, the evaluation
harness, the simulator and the tests all read these names.

Column meanings are the comments below; the figures computed from them (epoch time, remote rows,
communication volume, hit %) are defined in ``rudder.logs.metrics``.
"""
from __future__ import annotations

import numpy as np

FORMAT_NAME = "rudder-run-log"
FORMAT_VERSION = 1  # columns added since are filled in by ``upgrade`` when an older log is read
TRAINER, AGENT = "trainer", "agent"  # the ``role`` attribute of a log

MINIBATCH_ROW = np.dtype([
    ("epoch", "i4"), ("step", "i4"), ("seeds", "i4"), ("input_nodes", "i8"),
    ("input_remote", "i8"),  # input nodes owned by another partition (DistDGL's "remote rows")
    ("input_halo", "i8"),  # ... of which in this partition's 1-hop halo (what a halo buffer may cache)
    ("rows_local", "i8"), ("rows_shared", "i8"), ("rows_rma", "i8"),  # feature rows read, by path
    ("bytes_rma", "i8"), ("owners_rma", "i4"),  # feature bytes read by RMA, owners read
    ("adjacency_rows_rma", "i8"), ("adjacency_bytes_rma", "i8"),  # sampling's remote CSR reads
    # the prefetch buffer (zeros without one)
    ("hits", "i8"),  # cacheable inputs found in the buffer
    ("misses", "i8"),  # cacheable inputs not found (fetched on demand)
    ("refills", "i8"),  # rows a replacement fetched into the buffer (or lookahead admitted)
    ("evictions", "i8"), ("candidates", "i8"),  # rows evicted; slots below the eviction threshold
    ("refetched", "i8"),  # misses the last replacement had evicted (its regret)
    ("replaced", "i1"),  # a replacement was asked for on this minibatch
    ("asked_by", "i1"),  # who asked (rudder.prefetch.policies.ASKERS)
    ("occupancy", "i8"),  # slots holding a real row after this minibatch
    ("comm_volume", "i8"),  # the paper's communication volume: misses + refills
    ("hit_percent", "i2"),  # cumulative integer %-hits, as the paper reports it
    ("hit_ratio", "f8"),  # cumulative exact ratio
    ("t_sample", "f8"),
    ("t_fetch", "f8"),  # the whole feature assembly: lookup, decision, replacement, gather, settle
    ("t_lookup", "f8"), ("t_replace", "f8"),
    ("t_rma", "f8"),  # inside RMA Get..Flush (sampling's CSR reads and feature rows)
    ("t_wait", "f8"),  # the training thread blocked on this minibatch's inputs
    ("t_forward_backward", "f8"), ("t_allreduce", "f8"), ("t_update", "f8"),
    ("loss", "f4"),  # this trainer's mean loss (NaN for an empty minibatch)
    ("global_loss", "f4"),  # mean loss over all trainers' seeds
])
EPOCH_ROW = np.dtype([
    ("epoch", "i4"), ("steps", "i4"), ("complete", "i1"),
    ("seconds", "f8"),  # wall time of the epoch's steps on this trainer (evaluation excluded)
    ("t_sample", "f8"), ("t_fetch", "f8"), ("t_rma", "f8"), ("t_wait", "f8"),  # sums of the minibatch timers
    ("t_forward_backward", "f8"), ("t_allreduce", "f8"), ("t_update", "f8"),
    ("input_nodes", "i8"), ("input_remote", "i8"), ("bytes_rma", "i8"),
    ("hits", "i8"), ("misses", "i8"), ("refills", "i8"), ("comm_volume", "i8"),
    ("loss", "f4"), ("val_acc", "f4"), ("test_acc", "f4"), ("eval_seconds", "f8"),
    ("param_digest", "i8"),  # equal on every trainer: the replicas agree
])
# Minibatch timers summed into the epoch row.
EPOCH_TIMERS = ("t_sample", "t_fetch", "t_rma", "t_wait", "t_forward_backward", "t_allreduce", "t_update")

# Why a decision fell back to the configured default, as the ``fallback_code`` column records it.
FALLBACKS = ("none", "error", "invalid_answer", "timeout", "trainer_finished", "unavailable")
DECISION_ROW = np.dtype([
    ("trainer", "i4"),  # the trainer's world rank
    ("request", "i4"), ("minibatch", "i8"),  # the trainer's request number, and the minibatch it was sent after
    ("epoch", "i4"), ("remaining", "i8"),
    ("hitrate", "f4"),  # the window's mean cumulative %-hits
    ("comm_volume", "f4"),  # the window's mean communication volume per minibatch
    ("decision", "i1"),  # rudder.agent.protocol: KEEP or EVICT
    ("hitrate_impact", "i1"), ("comm_impact", "i1"),  # predicted direction (rudder.agent.protocol.IMPACTS)
    ("latency", "f8"),  # seconds the decision took on the agent
    ("fallback", "i1"),  # 1 if the fallback decision was used
    ("fallback_code", "i1"),  # why (FALLBACKS); its text is the ragged ``fallback_reason``
])
OUTCOME_ROW = np.dtype([("trainer", "i4"), ("request", "i4"), ("applied_minibatch", "i8"), ("evicted", "i8"),
                        ("candidates", "i8")])

# The classifier baselines' training rows (collection mode): the features as the agent would see
# them just before a replacement, the rows it evicted, and the interval's means before and after.
CLASSIFIER_FEATURES = ("log_nodes", "log_edges", "num_parts", "log_batch_size", "log_halo", "capacity_fraction",
                       "progress", "hitrate", "comm_per_seed", "candidate_fraction", "refetched_per_seed",
                       "last_evicted_fraction")
TRACE_PHASE = ("hitrate", "comm_volume", "refetched")  # what pre/post compare
CLASSIFIER_TRACE_ROW = np.dtype([("interval", "i4"), ("minibatch", "i8"), *[(f, "f8") for f in CLASSIFIER_FEATURES],
                                 ("evicted", "i8"), *[(f"pre_{m}", "f8") for m in TRACE_PHASE],
                                 *[(f"post_{m}", "f8") for m in TRACE_PHASE]])

# Ragged sets: one variable-length row per minibatch (trainers) or per decision (agents).
TRACE = "trace_remote_inputs"  # int64: a minibatch's remote input IDs (--trace)
TEXTS = ("prompt", "answer", "fallback_reason")  # uint8 UTF-8: each decision's prompt, answer and fallback reason

TRAINER_TABLES = {"minibatches": MINIBATCH_ROW, "epochs": EPOCH_ROW}
AGENT_TABLES = {"decisions": DECISION_ROW, "outcomes": OUTCOME_ROW}
AGENT_RAGGED = dict.fromkeys(TEXTS, np.uint8)


def record(dtype: np.dtype, fields: dict) -> tuple:
    """A row of ``dtype`` from its fields by name; a missing or unknown name is a KeyError."""
    names = dtype.names
    try:
        if len(fields) == len(names):
            return tuple(fields[name] for name in names)
    except KeyError:
        pass
    unknown = sorted(set(fields) - set(names))
    missing = [n for n in names if n not in fields]
    raise KeyError(f"row of {len(names)} fields: unknown {unknown}, missing {missing}")


def upgrade(table: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A table written by an older version with the current columns: columns it lacks are derived
    where they can be (``fallback_code`` from ``fallback``), zero otherwise."""
    if table.dtype == dtype:
        return table
    out = np.zeros(table.shape, dtype=dtype)
    for name in dtype.names:
        if name in table.dtype.names:
            out[name] = table[name]
    if "fallback_code" in dtype.names and "fallback_code" not in table.dtype.names and "fallback" in table.dtype.names:
        out["fallback_code"] = np.where(table["fallback"] != 0, FALLBACKS.index("error"), 0)
    return out
