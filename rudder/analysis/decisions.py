"""The agents' decisions in a run (spec 2.9): counts, fallbacks by reason, latency, the gap from
a request to the minibatch its answer arrived on (mean, p50, p95), the answers not applied
there (stale, or refused by the trainer), the mean refill budget of the replacements, and
Pass@1: whether each predicted direction of hit rate (and communication volume) matches the sign
of its change by the trainer's next decision, with the evaluation scripts' 95% binomial interval."""
from __future__ import annotations

import math

import numpy as np

from rudder.logs.reader import Run
from rudder.logs.schema import FALLBACKS

PREDICTED_SIGN = {0: 0, 1: 1, 2: -1}  # rudder.agent.protocol.IMPACTS: stagnant, increase, decrease


def accuracy(correct: int, n: int) -> dict:
    """Share correct with the 95% binomial interval, p +- 1.96 sqrt(p(1-p)/n)."""
    if not n:
        return {"value": None, "ci95": None, "n": 0}
    p = correct / n
    return {"value": p, "ci95": 1.96 * math.sqrt(p * (1 - p) / n), "n": n}


def decision_table(run: Run) -> np.ndarray:
    return np.concatenate([a.decisions for a in run.agents])


def decision_quality(run: Run) -> dict:
    d = decision_table(run)
    o = np.concatenate([a.outcomes for a in run.agents])
    valid = d[d["fallback"] == 0]
    scores = {"hitrate": [0, 0], "comm_volume": [0, 0]}
    intervals = []
    for trainer in np.unique(valid["trainer"]):
        mine = np.sort(valid[valid["trainer"] == trainer], order="request")
        intervals += np.diff(mine["minibatch"]).tolist()
        for metric, impact in (("hitrate", "hitrate_impact"), ("comm_volume", "comm_impact")):
            realised = np.sign(np.diff(mine[metric].astype(np.float64)))
            predicted = np.array([PREDICTED_SIGN[int(i)] for i in mine[impact][:-1]])
            scores[metric][0] += int((predicted == realised).sum())
            scores[metric][1] += int(realised.size)
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
            "pass_at_1_hitrate": accuracy(*scores["hitrate"]), "pass_at_1_comm": accuracy(*scores["comm_volume"])}


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
