"""Every table of a run log, defined once: the trainer's ``minibatches`` and ``epochs`` (and, in
collection mode, ``classifier_trace``), the agent's ``decisions`` and ``outcomes``, and the
ragged sets beside them. Writers build rows by field name (``record``), readers bring a log
written by an older version up to the current columns (``upgrade``); analysis, the evaluation
harness, the simulator and the tests all read these names.

Each column is declared with its meaning (``table``), from which docs/logs.md lists them; the
figures computed from them (epoch time, remote rows, communication volume, hit %) are defined in
``rudder.logs.metrics``.
"""
from __future__ import annotations

import numpy as np

FORMAT_NAME = "rudder-run-log"
FORMAT_VERSION = 1  # columns added since are filled in by ``upgrade`` when an older log is read
TRAINER, AGENT = "trainer", "agent"  # the ``role`` attribute of a log

MEANINGS: dict[str, dict[str, str]] = {}  # table name: {column: what it holds} (docs/logs.md is made from these)


def table(name: str, *columns: tuple[str, str, str]) -> np.dtype:
    """A table's row type from (column, numpy type, meaning) triples."""
    MEANINGS[name] = {c: meaning for c, _, meaning in columns}
    return np.dtype([(c, kind) for c, kind, _ in columns])


MINIBATCH_ROW = table(
    "minibatches",
    ("epoch", "i4", "epoch of the step (0-based)"),
    ("step", "i4", "step within the epoch"),
    ("phase", "i2", "the run's phase the minibatch was sampled in: 0, or the index of the --shift in force"),
    ("seeds", "i4", "this trainer's seed (training) nodes in the minibatch"),
    ("input_nodes", "i8", "input nodes of the first layer"),
    ("input_remote", "i8", "input nodes owned by another partition (DistDGL's \"remote rows\")"),
    ("input_halo", "i8", "remote input nodes in this partition's 1-hop halo (what a halo buffer may hold)"),
    ("rows_local", "i8", "feature rows read from this rank's own segment"),
    ("rows_shared", "i8", "feature rows read from a same-node peer through shared memory"),
    ("rows_rma", "i8", "feature rows read by RMA Get"),
    ("bytes_rma", "i8", "feature bytes read by RMA Get, rows at their stored size (data's feature_row_bytes)"),
    ("owners_rma", "i4", "owners read by RMA"),
    ("adjacency_rows_rma", "i8", "sampling's remote CSR entries read by RMA"),
    ("adjacency_bytes_rma", "i8", "sampling's remote CSR bytes read by RMA"),
    ("hits", "i8", "cacheable inputs found in the buffer (0 without one)"),
    ("misses", "i8", "cacheable inputs not found, fetched on demand"),
    ("refills", "i8", "rows a replacement fetched into the buffer (extra traffic)"),
    ("evictions", "i8", "rows that entered the buffer, as many leaving (a replacement's, or lookahead's admissions)"),
    ("candidates", "i8", "slots a replacement could take when the policy decided"),
    ("refetched", "i8", "misses the last replacement had evicted (its regret)"),
    ("replaced", "i1", "1 if the policy asked for a replacement on this minibatch"),
    ("asked_by", "i1", "who asked (rudder.prefetch.policies.ASKERS)"),
    ("occupancy", "i8", "slots holding a real row after this minibatch"),
    ("refill_budget", "i8", "most rows the replacement asked for here could take (-1: no bound, the paper's)"),
    ("lookahead_window", "i4", "minibatches ahead the buffer ranked by (a lookahead buffer's window; else 0)"),
    ("slots_held", "i8", "slots of the node's split buffer this trainer holds after the minibatch (-1: no split)"),
    ("decision_request", "i4", "the agent decision that arrived on this minibatch: its request number (-1: none)"),
    ("decision_age", "i4", "minibatches between that decision's request and this minibatch (-1: none)"),
    ("action_fallback", "i1", "0 if that decision was applied, else why not (FALLBACKS: stale, out_of_range, ...)"),
    ("comm_volume", "i8", "the paper's communication volume: misses + refills"),
    ("hit_percent", "i2", "cumulative integer %-hits, as the paper reports it"),
    ("hit_ratio", "f8", "cumulative hits over cacheable lookups"),
    ("t_sample", "f8", "seconds sampling the minibatch (pipeline thread)"),
    ("t_fetch", "f8", "seconds of the whole feature assembly: lookup, decision, replacement, gather, settle"),
    ("t_copy", "f8", "seconds making the blocks and putting them, the features and labels on the model's device "
     "(pipeline thread; on CPU the blocks alone)"),
    ("t_lookup", "f8", "seconds of the buffer lookup and the policy's decision"),
    ("t_replace", "f8", "seconds of the buffer's bookkeeping, replacement and settling"),
    ("t_rma", "f8", "seconds inside RMA Get..Flush (sampling's CSR reads and feature rows)"),
    ("t_rma_features", "f8", "seconds of t_rma reading feature rows (misses and refills; what the fetch bandwidth "
     "an agent sees divides bytes_rma by)"),
    ("t_wait", "f8", "seconds the training thread waited for this minibatch's inputs"),
    ("t_forward_backward", "f8", "seconds of forward and backward"),
    ("t_allreduce", "f8", "seconds in the gradient Allreduce"),
    ("t_grad_copy", "f8", "seconds of t_allreduce copying gradients between GPU and host (the staged path; else 0)"),
    ("t_update", "f8", "seconds of the optimiser step"),
    ("cpu_sample", "f8", "CPU seconds its thread spent in t_sample (time.thread_time: less the time it waited for a "
     "core, for the lock or for MPI; NaN in logs from before these columns)"),
    ("cpu_fetch", "f8", "CPU seconds its thread spent in t_fetch"),
    ("cpu_copy", "f8", "CPU seconds its thread spent in t_copy"),
    ("cpu_compute", "f8", "CPU seconds the training thread spent in t_forward_backward and t_update (on a GPU, the "
     "host's side)"),
    ("loss", "f4", "this trainer's mean loss (NaN for an empty minibatch)"),
    ("global_loss", "f4", "mean loss over all trainers' seeds"),
)
# The threads' CPU seconds of the minibatch timers (NaN in logs from before them).
CPU_TIMERS = ("cpu_sample", "cpu_fetch", "cpu_copy", "cpu_compute")
EPOCH_ROW = table(
    "epochs",
    ("epoch", "i4", "the epoch (0-based)"),
    ("phase", "i2", "the run's phase in the epoch: 0, or the index of the --shift in force (run attribute `phases`)"),
    ("steps", "i4", "steps trained (the phase's steps per epoch unless stopped early)"),
    ("complete", "i1", "1 if every step of the epoch was trained"),
    ("seconds", "f8", "wall time of the epoch's steps on this trainer (evaluation excluded)"),
    ("run_ahead", "i4", "minibatches the pipeline may prepare before the training thread asks for them (prefetch "
     "depth + 1, plus the sampler's lookahead): how many epochs at each end of the run are not steady "
     "(rudder.logs.metrics; -1 in logs from before this column)"),
    *[(t, "f8", f"sum of the minibatches' {t}") for t in ("t_sample", "t_fetch", "t_copy", "t_rma", "t_wait",
                                                          "t_forward_backward", "t_allreduce", "t_grad_copy",
                                                          "t_update")],
    *[(c, "f8", f"sum of the minibatches' {c} (NaN in logs from before the threads' CPU columns)")
      for c in CPU_TIMERS],
    *[(c, "i8", f"sum of the minibatches' {c}") for c in ("input_nodes", "input_remote", "bytes_rma", "hits", "misses",
                                                          "refills", "comm_volume")],
    ("loss", "f4", "mean of the minibatches' global loss"),
    ("val_acc", "f4", "validation accuracy after the epoch (NaN when not evaluated)"),
    ("test_acc", "f4", "test accuracy after the epoch (NaN when not evaluated)"),
    ("eval_seconds", "f8", "seconds of the evaluation"),
    ("eval_inference", "i1", "how the evaluation ran: an index into EVAL_INFERENCES (khop, layerwise, sampled; "
     "-1: not evaluated, or a log from before this column)"),
    ("eval_rows_shared", "i8", "rows the evaluation read from a same-node peer through shared memory (features, and "
     "layerwise's hidden rows)"),
    ("eval_rows_rma", "i8", "rows the evaluation read by RMA Get (features, and layerwise's hidden rows)"),
    ("eval_bytes_rma", "i8", "bytes the evaluation read by RMA Get"),
    ("eval_adjacency_rows_rma", "i8", "remote CSR entries the evaluation read by RMA (its neighbourhoods)"),
    ("param_digest", "i8", "digest of the parameters, equal on every trainer: the replicas agree"),
)
# How an evaluation ran (rudder.train.evaluation; the epoch row's eval_inference indexes this).
EVAL_INFERENCES = ("khop", "layerwise", "sampled")
# Replicas found to differ (rudder.train.replicas): one row per event in every trainer's log.
# DIVERGENCE_CHECKS: which check found it; DIVERGENCE_ACTIONS: what was done.
DIVERGENCE_CHECKS = ("step", "epoch")
DIVERGENCE_ACTIONS = ("repaired", "recomputed", "aborted")
LISTED_CHARS = 256  # the text columns' width; a longer list ends in "..."
REPAIR_ROW = table(
    "repairs",
    ("minibatch", "i8", "minibatches from the start of the run before the check that found it (the step's check: "
     "the minibatch it recomputed; --inject-divergence STEP:T is found here at STEP + 1)"),
    ("epoch", "i4", "the epoch it was found in"),
    ("check", "i1", "which check found it (DIVERGENCE_CHECKS): 0 the step's check in the gradient allreduce, 1 the "
     "epoch's digest check"),
    ("action", "i1", "what was done (DIVERGENCE_ACTIONS): 0 every trainer restored from the source and the step "
     "recomputed, 1 the parameters agreed (the reduction did not): the step recomputed, 2 the job ended "
     "(--on-divergence abort)"),
    ("source", "i4", "the trainer whose state every trainer took (-1: none)"),
    ("majority", "i1", "1 if more than half the trainers agreed with the source (else the source is trainer 0)"),
    ("diverged_count", "i4", "trainers whose parameters differed from the source's"),
    ("diverged", f"S{LISTED_CHARS}", "those trainers (trainer ranks), comma-separated"),
    ("tensors", f"S{LISTED_CHARS}", "the parameters that differed, by name, comma-separated"),
    ("seconds", "f8", "seconds of the repair (digests gathered, state broadcast)"),
)
# What a trainer's start-up and memory cost (rudder.train.footprint): one row per start-up phase,
# from the process's start to its first minibatch, and one per memory sample.
PSS_COLUMNS = (
    ("pss_bytes", "i8", "proportional set size at the end (/proc/self/smaps_rollup; pages shared by n processes count 1/n)"),
    ("pss_anon_bytes", "i8", "its anonymous part (the heap: arrays, Python objects)"),
    ("pss_file_bytes", "i8", "its file-backed part (libraries, memory-mapped files)"),
    ("pss_shmem_bytes", "i8", "its shared-memory part (RMA windows, node-shared arrays, MPI's own segments)"),
)
STARTUP_ROW = table(
    "startup",
    ("phase", "S32", "the start-up phase, in order: imports (process start to the job's main: Python, the library, "
     "MPI_Init), config, checks, metadata, layout, partition checksum, run directory, trainer imports (torch), "
     "partition read, feature windows, adjacency, seeds and sampler, model, buffer fill, log, agent start, pipeline "
     "start, first minibatch (its inputs in the training thread's hands)"),
    ("seconds", "f8", "wall seconds of the phase"),
    ("cpu_seconds", "f8", "CPU seconds the process (all its threads) spent in the phase"),
    *PSS_COLUMNS,
)
MEMORY_ROW = table(
    "memory",
    ("point", "S16", "when the sample was taken: startup (the first minibatch), epoch (after its rows), evaluation "
     "(after it), checkpoint (after it)"),
    ("epoch", "i4", "the epoch it was taken in (-1: start-up)"),
    *PSS_COLUMNS,
    ("peak_rss_bytes", "i8", "the process's peak resident set so far (VmHWM; shared pages counted whole)"),
    ("graph_bytes", "i8", "the partition's arrays and the CSR this rank holds (a node-shared CSR: its share)"),
    ("features_bytes", "i8", "the rank's own segment of the feature window"),
    ("buffer_bytes", "i8", "the buffer's arrays (a node-shared buffer: its share)"),
    ("model_bytes", "i8", "the model's parameters, gradients and optimiser state"),
)
# Minibatch timers summed into the epoch row.
EPOCH_TIMERS = ("t_sample", "t_fetch", "t_copy", "t_rma", "t_wait", "t_forward_backward", "t_allreduce", "t_grad_copy",
                "t_update")

# Why a decision fell back to the configured default, as the ``fallback_code`` column records it.
# "invalid_action"/"out_of_range": the action failed ``rudder.agent.action.Action.validate``;
# "invalid_observation": the window a request carried was not finite and in range; "stale": the
# answer came more than --agent-stale-after minibatches after its request (not applied).
FALLBACKS = ("none", "error", "invalid_answer", "timeout", "trainer_finished", "unavailable", "invalid_action",
             "out_of_range", "invalid_observation", "stale")
# The structured action's fields (rudder.agent.action.Action), as logged beside the paper's decision.
ACTION_COLUMNS = (
    ("evict", "i1", "1: replace now (the paper's action)"),
    ("refill", "i8", "most rows the replacement may take (0..capacity; capacity: the paper's, unbounded)"),
    ("window", "i4", "lookahead window for the next interval (0..--lookahead; 0 where the buffer does not look ahead)"),
    ("share", "i4", "the trainer's claim on its node's shared buffer, 0..100 against the other trainers' claims "
                    "(--buffer-split quota; 0 where the buffer has no split)"),
)
ACTION_FIELDS = tuple(c for c, _, _ in ACTION_COLUMNS)
DECISION_ROW = table(
    "decisions",
    ("trainer", "i4", "the trainer's world rank"),
    ("request", "i4", "the trainer's request number"),
    ("minibatch", "i8", "the minibatch the request was sent after"),
    ("epoch", "i4", "its epoch"),
    ("remaining", "i8", "minibatches the trainer had left after it"),
    ("hitrate", "f4", "the window's mean cumulative %-hits"),
    ("comm_volume", "f4", "the window's mean communication volume per minibatch"),
    ("bandwidth", "f8", "the window's achieved RMA fetch bandwidth, bytes per second of feature reads (0: none read)"),
    ("wait_share", "f4", "the window's share of step time the training thread waited for its inputs"),
    ("wait_seconds", "f8", "the window's mean seconds per minibatch the training thread waited for its inputs"),
    ("headroom", "f8", "the window's mean free buffer slots (capacity - occupancy)"),
    ("decision", "i1", "0 keep, 1 evict (rudder.agent.protocol)"),
    *ACTION_COLUMNS,
    ("hitrate_impact", "i1", "predicted hit-rate direction: 0 stagnant, 1 increase, 2 decrease"),
    ("comm_impact", "i1", "predicted communication direction, likewise"),
    ("wait_impact", "i1", "predicted direction of the trainer's input wait, likewise (-1: none, the paper's action)"),
    ("latency", "f8", "seconds the decision took on the agent"),
    ("fallback", "i1", "1 if the configured fallback decision was used"),
    ("fallback_code", "i1", "why (FALLBACKS); its words are the ragged fallback_reason"),
)
OUTCOME_ROW = table(
    "outcomes",
    ("trainer", "i4", "the trainer's world rank"),
    ("request", "i4", "the request whose decision was applied"),
    ("applied_minibatch", "i8", "the minibatch that applied it"),
    ("evicted", "i8", "rows its replacement evicted"),
    ("candidates", "i8", "eviction candidates on that minibatch"),
    ("age", "i8", "minibatches between the request and the minibatch its answer arrived on"),
    ("action_fallback", "i1", "0 applied, else why the trainer did not apply it (FALLBACKS; e.g. stale)"),
)

# The classifier baselines' training rows (collection mode): the features as the agent would see
# them just before a replacement, the rows it evicted, and the interval's means before and after.
CLASSIFIER_FEATURES = ("log_nodes", "log_edges", "num_parts", "log_batch_size", "log_halo", "capacity_fraction",
                       "progress", "hitrate", "comm_per_seed", "candidate_fraction", "refetched_per_seed",
                       "last_evicted_fraction")
TRACE_PHASE = ("hitrate", "comm_volume", "refetched")  # what pre/post compare
CLASSIFIER_TRACE_ROW = table(
    "classifier_trace",
    ("interval", "i4", "the replacement interval"),
    ("minibatch", "i8", "the minibatch of the replacement that opened it"),
    *[(f, "f8", "feature (rudder.agent.features)") for f in CLASSIFIER_FEATURES],
    ("evicted", "i8", "rows the replacement evicted"),
    *[(f"pre_{m}", "f8", f"mean {m} over the interval before the replacement") for m in TRACE_PHASE],
    *[(f"post_{m}", "f8", f"mean {m} over the interval after it") for m in TRACE_PHASE],
)

# Ragged sets: one variable-length row per minibatch (trainers) or per decision (agents).
TRACE = "trace_remote_inputs"  # int64: a minibatch's remote input IDs (--trace)
TEXTS = ("prompt", "answer", "fallback_reason")  # uint8 UTF-8: each decision's prompt, answer and fallback reason

TRAINER_TABLES = {"minibatches": MINIBATCH_ROW, "epochs": EPOCH_ROW, "repairs": REPAIR_ROW, "startup": STARTUP_ROW,
                  "memory": MEMORY_ROW}
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
    # older logs: no bound, no decision recorded, no wait predicted (its wait not recorded: zero)
    for name in ("refill_budget", "decision_request", "decision_age", "wait_impact", "slots_held", "run_ahead",
                 "eval_inference"):
        if name in dtype.names and name not in table.dtype.names:
            out[name] = -1
    for name in CPU_TIMERS:  # not measured then
        if name in dtype.names and name not in table.dtype.names:
            out[name] = np.nan
    if "fallback_code" in dtype.names and "fallback_code" not in table.dtype.names and "fallback" in table.dtype.names:
        out["fallback_code"] = np.where(table["fallback"] != 0, FALLBACKS.index("error"), 0)
    return out


def tables_markdown() -> str:
    """The column tables of docs/logs.md."""
    out = []
    for name, meanings in MEANINGS.items():
        dtype = {**TRAINER_TABLES, **AGENT_TABLES, "classifier_trace": CLASSIFIER_TRACE_ROW}[name]
        out += [f"### `{name}`", "", "| column | type | |", "|---|---|---|"]
        out += [f"| `{c}` | {dtype[c].str.lstrip('<|=')} | {meanings[c]} |" for c in dtype.names] + [""]
    return "\n".join(out)


if __name__ == "__main__":
    print(tables_markdown(), end="")
