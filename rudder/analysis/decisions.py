"""The agents' decisions in a run (spec 2.9): counts, fallbacks by reason, latency, the gap from
a request to the minibatch its answer arrived on (mean, p50, p95), the answers not applied
there (stale, or refused by the trainer), the mean refill budget of the replacements, and
Pass@1: whether each predicted direction of hit rate, communication volume (rows) and, for the
structured action, the trainer's input wait matches the direction of its change by the trainer's
next decision (the next window's mean), with its 95% Wilson interval (``rudder.logs.metrics``).
Hit rate and rows are scored by the sign of the change, as the published system's scripts do (its
hit rate is a whole percentage, often unchanged); the wait, a timed mean that is never exactly
the same twice, counts as flat within ``WAIT_FLAT`` of its previous value."""
from __future__ import annotations

import numpy as np

from rudder.logs.metrics import hit_percent, remote_rows_fetched, wilson_interval
from rudder.logs.reader import Run
from rudder.logs.schema import FALLBACKS

PREDICTED_SIGN = {0: 0, 1: 1, 2: -1}  # rudder.agent.protocol.IMPACTS: stagnant, increase, decrease
WAIT_FLAT = 0.05  # a relative change of the wait under 5% is no change
# What is scored: (log column of the window's mean, of the prediction, relative change that is still flat)
SCORED = {"hitrate": ("hitrate", "hitrate_impact", 0.0), "comm": ("comm_volume", "comm_impact", 0.0),
          "wait": ("wait_seconds", "wait_impact", WAIT_FLAT)}


def accuracy(correct: int, n: int) -> dict:
    """Share correct with its 95% Wilson interval [low, high]."""
    if not n:
        return {"value": None, "low": None, "high": None, "n": 0}
    low, high = wilson_interval(correct, n)
    return {"value": correct / n, "low": low, "high": high, "n": n}


def realised_direction(before: np.ndarray, after: np.ndarray, flat: float) -> np.ndarray:
    """-1, 0 or 1 per change from ``before`` to ``after``: 0 within ``flat`` x |before| (0: unchanged)."""
    change = after - before
    return np.where(np.abs(change) <= flat * np.abs(before), 0, np.sign(change)).astype(np.int64)


def pass_at_1(mine: np.ndarray, metric: str, impact: str, flat: float) -> tuple[int, int]:
    """(correct, scored) of one trainer's decisions in request order: each prediction against what
    the next decision's window showed; predictions of ``NO_IMPACT`` (-1) are not scored."""
    values = mine[metric].astype(np.float64)
    realised = realised_direction(values[:-1], values[1:], flat)
    codes = mine[impact][:-1].astype(np.int64)
    scored = codes >= 0
    predicted = np.array([PREDICTED_SIGN.get(int(c), 0) for c in codes[scored]], dtype=np.int64)
    return int((predicted == realised[scored]).sum()), int(scored.sum())


def decision_table(run: Run) -> np.ndarray:
    return np.concatenate([a.decisions for a in run.agents])


def decision_quality(run: Run) -> dict:
    d = decision_table(run)
    o = np.concatenate([a.outcomes for a in run.agents])
    valid = d[d["fallback"] == 0]
    scores = {name: [0, 0] for name in SCORED}
    intervals = []
    for trainer in np.unique(valid["trainer"]):
        mine = np.sort(valid[valid["trainer"] == trainer], order="request")
        intervals += np.diff(mine["minibatch"]).tolist()
        for name, (metric, impact, flat) in SCORED.items():
            correct, n = pass_at_1(mine, metric, impact, flat)
            scores[name][0] += correct
            scores[name][1] += n
    requested = {(int(t), int(r)): int(m) for t, r, m in zip(d["trainer"], d["request"], d["minibatch"])}
    gaps = [int(a) - requested[(int(t), int(r))] for t, r, a in zip(o["trainer"], o["request"], o["applied_minibatch"])
            if (int(t), int(r)) in requested]
    refused = o["action_fallback"] != 0
    latency = d["latency"].astype(np.float64)
    return {"decider": run.agents[0].run.get("decider", "?"), "count": int(d.size),
            "evict": int((d["decision"] == 1).sum()), "keep": int((d["decision"] == 0).sum()),
            "fallback_rate": float((d["fallback"] != 0).mean()) if d.size else 0.0,
            "latency_mean": float(latency.mean()) if d.size else None,
            "latency_p50": float(np.percentile(latency, 50)) if d.size else None,
            "latency_p95": float(np.percentile(latency, 95)) if d.size else None,
            "gap_mean": float(np.mean(gaps)) if gaps else None,
            "gap_p50": float(np.percentile(gaps, 50)) if gaps else None,
            "gap_p95": float(np.percentile(gaps, 95)) if gaps else None,
            "stale": int((o["action_fallback"] == FALLBACKS.index("stale")).sum()),
            "not_applied": int(refused.sum()),
            "refill_mean": float(d["refill"][d["evict"] == 1].mean()) if (d["evict"] == 1).any() else None,
            "interval_mean": float(np.mean(intervals)) if intervals else None,
            **{f"pass_at_1_{name}": accuracy(*scores[name]) for name in SCORED}}


def fallback_counts(run: Run) -> dict[str, int]:
    """How many decisions fell back, by reason (``rudder.logs.schema.FALLBACKS``)."""
    codes = decision_table(run)["fallback_code"] if run.agents else np.zeros(0, np.int8)
    return {FALLBACKS[c]: int(n) for c, n in zip(*np.unique(codes[codes != 0], return_counts=True))}


def decision_lines(run: Run, last: int = 4, answered_only: bool = False) -> list[str]:
    """The last ``last`` decisions of each agent (or of those not fallen back), one line each:
    who, when, what, how fast, and the answer (or the fallback's reason)."""
    lines = []
    for agent in run.agents:
        d = agent.decisions
        rows = [i for i in range(d.size) if not (answered_only and d["fallback"][i])][-last:]
        for i in rows:
            what = "evict" if d["decision"][i] == 1 else "keep"
            answer = agent.texts["fallback_reason"][i] if d["fallback"][i] else agent.texts["answer"][i]
            lines.append(f"agent {agent.rank} -> trainer {d['trainer'][i]} after minibatch {d['minibatch'][i]}: {what:5} "
                         f"({d['latency'][i]:.2f} s{', fallback' if d['fallback'][i] else ''}) {answer[:150]}")
    return lines


def applied_decisions(run: Run) -> int:
    """Decisions the trainers applied, as their own logs record them (every answer that arrived and
    was not refused: the agent learns of the last ones' outcomes only with a next request)."""
    return sum(int(((r.minibatches["decision_request"] >= 0) & (r.minibatches["action_fallback"] == 0)).sum())
               for r in run.ranks)


def decision_effects(run: Run, span: int) -> dict:
    """What the applied decisions did on their trainers: for the decisions that replaced rows and
    for those that kept the buffer, the count and, averaged over them, the hit % and the remote rows
    fetched a minibatch over the ``span`` minibatches before the one that applied the decision and
    over the ``span`` from it on (its refills included), from the trainers' own logs. Decisions too
    near either end of the run for a full span are left out."""
    groups: dict[str, list] = {"replaced": [], "kept": []}
    for r in run.ranks:
        mb = r.minibatches
        for at in np.flatnonzero((mb["decision_request"] >= 0) & (mb["action_fallback"] == 0)):
            if at < span or at + span > mb.size:
                continue
            before, after = mb[at - span:at], mb[at:at + span]
            groups["replaced" if mb["refills"][at] > 0 else "kept"].append(
                [hit_percent(int(before["hits"].sum()), int(before["misses"].sum())),
                 hit_percent(int(after["hits"].sum()), int(after["misses"].sum())),
                 float(remote_rows_fetched(before).mean()), float(remote_rows_fetched(after).mean())])
    out = {}
    for name, rows in groups.items():
        means = np.mean(rows, axis=0).tolist() if rows else [None] * 4
        out[name] = {"count": len(rows), "hit_percent_before": means[0], "hit_percent_after": means[1],
                     "rows_before": means[2], "rows_after": means[3]}
    return out
