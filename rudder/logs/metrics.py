"""The figures of a run, each defined once, over the log's rows (``rudder.logs.schema``).

The trainer's end-of-run summary, ``rudder.analyze``, the evaluation harness and the simulator
all compute their figures with these functions, so a number means the same wherever it appears:

* **epoch time**: the run's steady state. Per epoch the slowest trainer's ``seconds``; the figure
  is the median over the *timed* (steady) epochs: every epoch but the first ``reach`` (warm-up,
  and the pipeline filling) and the last ``reach``, where ``reach`` is how many epochs the
  minibatch pipeline's run-ahead spans (``pipeline_reach``: 1 unless it prepares more than an
  epoch ahead; 0 without run-ahead, where only the first is dropped). An epoch in the middle
  starts with the run-ahead the epoch before prepared for it and prepares as much for the next;
  the last starts with that credit and pays for nothing after it, so it runs short, below its
  own bandwidth floor where the wire binds (docs/logs.md, "Epoch time"). A run with fewer than
  ``MIN_STEADY_EPOCHS`` steady epochs has no epoch time (``too_short`` says why). A run with
  phases (``--shift``) takes the median within each phase, weighted by the phase's timed epochs:
  one median across phases would be the longest phase's alone. Every per-epoch figure (rows,
  bytes, floors) is taken over the same epochs;
* **remote rows fetched**: remote input rows the buffer did not hold, plus the rows refills
  brought in: ``input_remote - hits + refills`` (every remote feature row that crossed to a trainer);
* **communication volume** (the paper's): cacheable misses plus refills, ``misses + refills``;
  it leaves out remote inputs a buffer may not hold (with the halo scope, those beyond one hop);
* **share correct with its 95% interval** (Pass@1): the Wilson score interval of ``correct`` in
  ``n``, which stays inside [0, 1] and is not empty at 0 or n correct (the normal approximation is);
* **a median with its interval** (paired benchmark ratios): the distribution-free interval of a
  median from the order statistics x(k) and x(n+1-k) of n values, k the largest whose coverage
  ``1 - 2 P(Binomial(n, 1/2) < k)`` is still at least the level asked (the sign test's interval);
* **hit %**: hits over cacheable lookups, ``100 hits / (hits + misses)``; the paper's per-minibatch
  figure is the same ratio, cumulative and rounded to an integer.

Functions take structured arrays (or rows) with the schema's field names, so they work on
minibatch rows, epoch rows (which carry the same sums) and the simulator's columns alike.
"""
from __future__ import annotations

import math

import numpy as np


def remote_rows_fetched(rows) -> np.ndarray:
    """Remote feature rows each row (minibatch or epoch) fetched: misses of any remote input plus refills."""
    return rows["input_remote"] - rows["hits"] + rows["refills"]


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of the share ``correct / n`` (z = 1.96: 95%); n > 0."""
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def median_interval(values, level: float = 0.90) -> tuple[float, float, float] | None:
    """(low, high, coverage) of the median of ``values``: order statistics x(k) and x(n+1-k),
    k the largest with coverage >= ``level``; None where even x(1), x(n) cover less."""
    x, n = np.sort(np.asarray(values, dtype=float)), len(values)
    below, best = 0.0, None
    for k in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n  # P(Binomial(n, 1/2) < k)
        coverage = 1 - 2 * below
        if coverage < level:
            break
        best = (float(x[k - 1]), float(x[n - k]), coverage)
    return best


def comm_volume(misses, refills):
    """The paper's communication volume: cacheable misses plus refills."""
    return misses + refills


def hit_percent(hits: int, misses: int) -> float:
    """Hits over cacheable lookups, in percent (0 with no lookup)."""
    looked = hits + misses
    return 100.0 * hits / looked if looked else 0.0


def paper_hit_percent(hits: int, misses: int) -> int:
    """The paper's per-minibatch figure: cumulative %-hits rounded to an integer."""
    looked = hits + misses
    return int(round(100 * hits / looked)) if looked else 0


def complete_epochs(epoch_tables: list[np.ndarray]) -> list[int]:
    """Epochs every trainer completed, in order (``epoch_tables``: each trainer's epoch rows)."""
    if not epoch_tables:
        return []
    done = [set(t["epoch"][t["complete"] == 1].tolist()) for t in epoch_tables]
    return sorted(set.intersection(*done))


MIN_STEADY_EPOCHS = 2  # a median of one epoch has no spread to show whether the run was steady
UNKNOWN_RUN_AHEAD = -1  # epoch rows from before the ``run_ahead`` column: one epoch's reach is assumed


def run_ahead(prefetch_depth: int, lookahead: int) -> int:
    """Minibatches the pipeline may have prepared before the training thread asks for them: the
    ``prefetch_depth`` queued plus the one its thread holds, and the sampler's ``lookahead``
    beyond (sampled, adjacency read); without a pipeline thread, the lookahead alone."""
    return (prefetch_depth + 1 if prefetch_depth > 0 else 0) + lookahead


def pipeline_reach(ahead: int, steps_per_epoch: int) -> int:
    """Epochs at either end of a run that ``ahead`` minibatches of run-ahead reach into."""
    if ahead == UNKNOWN_RUN_AHEAD:
        return 1
    return -(-ahead // max(1, steps_per_epoch)) if ahead > 0 else 0


def timed_epochs(epochs: list[int], reach: int = 1) -> list[int]:
    """The steady epochs of ``epochs`` (a run's complete epochs, in order): all but the first
    ``max(1, reach)`` and the last ``reach``; none where fewer than ``MIN_STEADY_EPOCHS`` remain."""
    steady = list(epochs[max(1, reach):len(epochs) - reach])
    return steady if len(steady) >= MIN_STEADY_EPOCHS else []


def epochs_needed(reach: int = 1) -> int:
    """The fewest complete epochs with an epoch time at this ``reach``."""
    return max(1, reach) + reach + MIN_STEADY_EPOCHS


def too_short(epochs: list[int], reach: int = 1) -> str | None:
    """Why a run with these complete ``epochs`` has no epoch time (None where it has one)."""
    if timed_epochs(epochs, reach):
        return None
    return (f"too short for an epoch time: {len(epochs)} complete epochs, the steady state needs at least "
            f"{epochs_needed(reach)} (the first {max(1, reach)} and the last {reach} are not steady)")


def steady_text(epochs: list[int], reach: int = 1) -> str:
    """Which epochs an epoch time is taken over ("2..4", counted from 1), or why there is none."""
    timed = timed_epochs(epochs, reach)
    return f"{timed[0] + 1}..{timed[-1] + 1}" if timed else too_short(epochs, reach)


def run_reach(epoch_tables: list[np.ndarray]) -> int:
    """``pipeline_reach`` of a run from its trainers' epoch rows (their ``run_ahead`` and ``steps``)."""
    rows = [t for t in epoch_tables if t.size]
    if not rows:
        return 1
    ahead = max(int(t["run_ahead"].max()) for t in rows)
    return pipeline_reach(ahead, min(int(t["steps"][t["complete"] == 1].min(initial=2**31 - 1)) for t in rows))


def run_timed_epochs(epoch_tables: list[np.ndarray]) -> list[int]:
    """The steady epochs of a run from its trainers' epoch rows."""
    return timed_epochs(complete_epochs(epoch_tables), run_reach(epoch_tables))


def run_too_short(epoch_tables: list[np.ndarray]) -> str | None:
    """``too_short`` for a run from its trainers' epoch rows."""
    return too_short(complete_epochs(epoch_tables), run_reach(epoch_tables))


def run_steady_text(epoch_tables: list[np.ndarray]) -> str:
    """``steady_text`` for a run from its trainers' epoch rows."""
    return steady_text(complete_epochs(epoch_tables), run_reach(epoch_tables))


def slowest_seconds(epoch_tables: list[np.ndarray], epochs: list[int]) -> np.ndarray:
    """Per epoch, the slowest trainer's seconds (an epoch ends when its last trainer does)."""
    return np.array([max(float(t["seconds"][t["epoch"] == e][0]) for t in epoch_tables) for e in epochs])


def epoch_time(seconds, phases=None) -> float | None:
    """THE epoch time: the median of per-epoch (slowest-trainer) seconds over the timed epochs
    (None without any: the run was too short);
    with ``phases`` (each of those epochs' phase), the median within each phase, weighted by the
    phase's epochs."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if not seconds.size:
        return None
    if phases is None:
        return float(np.median(seconds))
    phases = np.asarray(phases)
    if phases.shape != seconds.shape:
        raise ValueError(f"epoch_time: {seconds.size} epochs' seconds against {phases.size} phases")
    return float(sum(np.median(seconds[phases == p]) * np.count_nonzero(phases == p) for p in np.unique(phases))
                 / seconds.size)


def epoch_phases(epoch_tables: list[np.ndarray], epochs: list[int]) -> np.ndarray:
    """Per epoch, the run's phase in it (every trainer has the same)."""
    if not epochs:  # also a run stopped before its first epoch, with no rows
        return np.zeros(0, dtype=np.int64)
    table = epoch_tables[0]
    return np.array([int(table["phase"][table["epoch"] == e][0]) for e in epochs], dtype=np.int64)


def run_epoch_time(epoch_tables: list[np.ndarray]) -> float | None:
    """The epoch time of a run from its trainers' epoch rows (None: too short, ``run_too_short``)."""
    epochs = run_timed_epochs(epoch_tables)
    return epoch_time(slowest_seconds(epoch_tables, epochs), epoch_phases(epoch_tables, epochs))


def spread(seconds) -> tuple[float, float] | None:
    """The least and the most of the epoch seconds an epoch time was taken from (None without any)."""
    seconds = np.asarray(seconds, dtype=np.float64)
    return (float(seconds.min()), float(seconds.max())) if seconds.size else None


def per_epoch(tables: list[np.ndarray], column, epochs: list[int]) -> np.ndarray:
    """Per epoch: ``column`` (a field name, or a function of the rows) summed over every trainer's
    rows of that epoch (``tables``: each trainer's minibatch or epoch rows)."""
    values = column if callable(column) else (lambda rows: rows[column])
    return np.array([sum(float(values(t)[t["epoch"] == e].sum()) for t in tables) for e in epochs], dtype=np.float64)


def per_epoch_mean(tables: list[np.ndarray], column, epochs: list[int]) -> float | None:
    """``per_epoch`` averaged over ``epochs`` (None without any)."""
    sums = per_epoch(tables, column, epochs)
    return float(sums.mean()) if sums.size else None


def remote_rows_per_epoch(tables: list[np.ndarray], epochs: list[int]) -> float | None:
    """Remote rows fetched per epoch, all trainers, averaged over ``epochs`` (use ``timed_epochs``)."""
    return per_epoch_mean(tables, remote_rows_fetched, epochs)


# Start-up phases that load code (rudder.train.footprint's ``startup`` rows): "imports aside"
# leaves them out, the rest is the work a rank's start-up does and the waits it meets
IMPORT_PHASES = ("imports", "trainer imports")


def startup_cpu(startup: np.ndarray, imports: bool = True) -> float:
    """A trainer's start-up CPU seconds, process start to its first minibatch (``imports`` False:
    the code-loading phases aside)."""
    keep = np.ones(startup.size, dtype=bool) if imports else ~np.isin(startup["phase"], [p.encode() for p in IMPORT_PHASES])
    return float(startup["cpu_seconds"][keep].sum())
