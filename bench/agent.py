"""What the agent costs training: epoch time with an agent rank deciding (llm, heuristic) vs the
same run replaying the same decisions with no agent at all (``--policy replay``), and the LLM's
decision latency per model and thread count.

Both runs of a pair use the same data, seed and ``--agent-cores 1`` (the agent's core is kept
free in the replay run too), so they do identical buffer work at identical minibatches (checked:
the rows fetched must match) and differ only by the agent's presence: its messages, its
tests for answers, and whatever its model takes from the trainers' cores. Target: llm / replay
<= 1.03. Epoch time = slowest trainer, median over epochs (rudder.analyze). With 5 or more pairs a
policy's median ratio comes with a distribution-free interval (order statistics of the pairs'
ratios, ``rudder.logs.metrics.median_interval``, at least 90% coverage): it says whether the pairs
resolve 3%.

    python bench/agent.py [--parts 2] [--epochs 6] [--batch-size 256] [--decisions 6] [--agent-action structured] [--repeats 2]
                          [--pair-policies heuristic,llm] [--no-latency]
    python bench/agent.py --latency-only [--decisions 12]   (paper vs structured answers, side by side)
    python bench/agent.py --transports [--policy heuristic] [--repeats 2] [--agent-window 1]
    python bench/agent.py --batched 4 [--decisions 6]   (a pass of N decisions: one batched call vs N calls)
    python bench/agent.py --window-rounds 6 [--rate 1gbit] [--congestion PROFILE] [--epochs 6]   (steering the window)

``--transports``: the same run over ``--agent-transport p2p`` (a request and an answer per trainer
point-to-point) and ``collective`` (an Igather and an Iscatter per window on the node), repeated
alternately; epoch time (median over epochs, slowest trainer) and decisions answered of each, and
collective / p2p.

``--batched N``: the structured llm of the default model on one core decides passes of N
trainers' contexts (the collective transport's pass over a node), alternately one ``decide`` per
trainer and one ``decide_all`` (one batched llama.cpp call, ``BatchedDecoder``), on the same
contexts; it prints the median seconds per pass of each, their ratio and the fallbacks.

``--window-rounds N``: what steering lookahead's window costs when nothing changes, or what it
gains under ``--congestion``. RMAT-16 on 4 trainers, each an emulated node, behind one shared
``--rate`` link (``python -m rudder.netem``, with the competing flow if given),
batch 256, fanouts 10,25, f = 0.25; N rounds, each running in turn ``lookahead`` with windows 4
and 8, ``tuner`` steering the window (0-8, ``--agent-buffer window --lookahead 8``, an agent rank
per node sharing the trainers' cores, a request every ``--agent-window`` minibatches), and that
run's decisions replayed without an agent
(``--policy replay``). Prints each round's epoch seconds (median over epochs, slowest trainer),
and per setting the median over rounds of its epoch over the round's window-4 run, and the
steered run over its replay (the agent's presence).

``--latency-only`` loads the default model once per action mode and asks them in turn, one
decision each (so a change of the machine's load falls on both alike), on the same random
contexts; it prints p50, p95 and mean seconds per mode, the fallback share, and the tokens a
decision evaluates (the prompt beyond the cached prefix) and generates. Target (structured):
p50 <= 1 s, p95 <= 2 s on one core. The paper mode's answer is the published system's, kept as
it was (prompt version 3): it is the baseline the structured one is measured beside.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import llama_cpp  # noqa: E402

from bench.mpi_job import FACEBOOK, cached_partition, shaped, train_job  # noqa: E402
from rudder.agent.deciders.llm import LLM, PROMPT_VERSION  # noqa: E402
from rudder.agent.deciders.llm_backends import default_model  # noqa: E402
from rudder.agent.samples import random_context  # noqa: E402
from rudder.agent.tiny_gguf import write_tiny_gguf  # noqa: E402
from rudder.analysis.summary import summarize  # noqa: E402
from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402
from rudder.netem.namespaces import support_problem  # noqa: E402
from rudder.train.config import TrainConfig  # noqa: E402


def pair(parts: str, out: str, n: int, policy: str, flags: list[str]) -> dict:
    run, replay = os.path.join(out, policy), os.path.join(out, f"{policy}-replay")
    train_job(parts, run, n + 1, 1, ["--policy", policy, "--agent-cores", "1", *flags])
    train_job(parts, replay, n, 1, ["--policy", "replay", "--replay", run, "--agent-cores", "1", *flags])
    a, b = summarize(load_run(run)), summarize(load_run(replay))
    volume = [s["buffer"]["comm_volume"] for s in (a, b)]
    if volume[0] != volume[1]:
        raise SystemExit(f"{policy}: the replay's communication volume is {volume[1]} rows, the original's {volume[0]}: "
                         f"not the same work")
    return {"policy": policy, "epoch": a["epochs"]["median_seconds"], "replay": b["epochs"]["median_seconds"],
            "decisions": a["decisions"]["count"], "latency": a["decisions"]["latency_mean"],
            "rows": a["traffic"]["remote_rows_fetched_per_epoch"]}


RMAT16 = "synthetic:rmat:scale=16,edge_factor=16,feat_dim=128,classes=16,seed=1"


def window_rounds(out: str, rounds: int, epochs: int, rate: str, congestion: str, agent_window: int) -> None:
    problem = support_problem()
    if problem is not None:
        print(f"--window-rounds: skipped, no shaped network on this machine: {problem}")
        return
    parts = cached_partition(RMAT16, 4, os.path.join(out, "rmat16-4"), "float32")
    network = shaped(rate, "shared", 4, *(["--congestion", congestion] if congestion else []))
    base = ["--epochs", str(epochs), "--batch-size", "256", "--fanouts", "10,25", "--buffer-fraction", "0.25"]
    steered = ["--agent-action", "structured", "--agent-buffer", "window", "--lookahead", "8",
               "--agent-window", str(agent_window)]
    settings = {"lookahead-w4": (4, ["--policy", "lookahead", "--lookahead", "4"]),
                "lookahead-w8": (4, ["--policy", "lookahead", "--lookahead", "8"]),
                "tuner-window": (8, ["--policy", "tuner", *steered]),
                "replay": (4, ["--policy", "replay", "--replay", os.path.join(out, "tuner-window"), *steered])}
    print(f"RMAT-16, 4 trainers each an emulated node, one shared {rate} link"
          + (f" with a competing flow {congestion}" if congestion else "") + f", batch 256, f = 0.25, {epochs} epochs, "
          f"--agent-window {agent_window}, "
          f"{rounds} rounds; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"{'round':>5} " + " ".join(f"{label:>13}" for label in settings) + " (epoch s)")
    seconds: dict[str, list[float]] = {label: [] for label in settings}
    for r in range(rounds):
        rows = {}
        for label, (ranks, flags) in settings.items():
            run = os.path.join(out, label)
            train_job(parts, run, ranks, 4, base + flags, wrapper=network)
            s = summarize(load_run(run))
            seconds[label].append(s["epochs"]["median_seconds"])
            rows[label] = s["buffer"]["comm_volume"]
        if rows["replay"] != rows["tuner-window"]:
            raise SystemExit(f"round {r}: the replay fetched {rows['replay']} rows, the steered run {rows['tuner-window']}: "
                             "not the same work")
        print(f"{r:5d} " + " ".join(f"{seconds[label][-1]:13.3f}" for label in settings), flush=True)
    ratio = {label: np.median(np.array(v) / np.array(seconds["lookahead-w4"])) for label, v in seconds.items()}
    print("median over rounds, against the round's lookahead-w4: "
          + ", ".join(f"{label} {ratio[label]:.3f}" for label in settings if label != "lookahead-w4")
          + f"; tuner-window over its replay {np.median(np.array(seconds['tuner-window']) / np.array(seconds['replay'])):.3f}"
          + f"; load average {os.getloadavg()[0]:.2f}")


def transports(parts: str, out: str, n: int, policy: str, flags: list[str], repeats: int) -> None:
    print(f"{'transport':10} {'repeat':>6} {'epoch s':>8} {'decisions':>9} {'latency s':>9} {'gap p50':>7} {'stale':>5}")
    epochs: dict[str, list[float]] = {"p2p": [], "collective": []}
    for r in range(repeats):
        for transport in epochs:
            run = os.path.join(out, f"{policy}-{transport}")
            train_job(parts, run, n + 1, 1, ["--policy", policy, "--agent-cores", "1", "--agent-transport", transport,
                                             *flags])
            s = summarize(load_run(run))
            epochs[transport].append(s["epochs"]["median_seconds"])
            print(f"{transport:10} {r:6d} {epochs[transport][-1]:8.3f} {s['decisions']['count']:9d} "
                  f"{s['decisions']['latency_mean'] or 0:9.4f} {s['decisions']['gap_p50'] or 0:7.1f} "
                  f"{s['decisions']['stale']:5d}", flush=True)
    p2p, coll = float(np.median(epochs["p2p"])), float(np.median(epochs["collective"]))
    print(f"median epoch s: p2p {p2p:.3f}, collective {coll:.3f}; collective / p2p {coll / p2p:.3f}; "
          f"load average {os.getloadavg()[0]:.2f}")


def llm_of(model: str, threads: int, action: str = "paper") -> LLM:
    """The llm decider of ``model``, built and warm (its first answer given)."""
    return LLM(TrainConfig.from_flat({"data": "-", "run_dir": "-", "policy": "llm", "llm_model": model,
                                      "llm_threads": threads, "agent_action": action}).check())


def token_counts(llm: LLM) -> tuple[int, int]:
    """(prompt tokens evaluated, tokens generated) by the last decision of an in-process model:
    llama.cpp's own counters (the prompt's cached prefix is not evaluated again)."""
    perf = llama_cpp.llama_perf_context(llm.model.llm._ctx.ctx)
    return int(perf.n_p_eval), int(perf.n_eval)


def latencies(llms: dict[str, LLM], decisions: int) -> dict[str, dict]:
    """Per decider (by label): each decision's seconds, whether it fell back, and its tokens, the
    deciders asked in turn on the same contexts (trainers take turns, as on a node)."""
    rng, out = np.random.default_rng(0), {label: {"seconds": [], "fallbacks": 0, "tokens": []} for label in llms}
    for i in range(decisions):
        ctx = random_context(rng)
        ctx.facts["partition"] = i % 4
        for label, llm in llms.items():
            llama_cpp.llama_perf_context_reset(llm.model.llm._ctx.ctx)
            t = time.perf_counter()
            d = llm.decide(ctx)
            out[label]["seconds"].append(time.perf_counter() - t)
            out[label]["fallbacks"] += bool(d.fallback_reason)
            out[label]["tokens"].append(token_counts(llm))
    return out


def latency(model: str, threads: int, decisions: int, action: str = "paper") -> tuple[float, float]:
    """Mean decision seconds after the first (warm) one, and the share of fallbacks."""
    llm = llm_of(model, threads, action)
    try:
        r = latencies({action: llm}, decisions)[action]
    finally:
        llm.close()
    return float(np.mean(r["seconds"])), r["fallbacks"] / decisions


def batched_passes(n: int, passes: int) -> None:
    llm = llm_of(default_model(), 1, "structured")
    rng, seconds, fallbacks = np.random.default_rng(0), {"one call each": [], "one batched call": []}, {}
    try:
        llm.decide_all([random_context(rng) for _ in range(n)])  # the batched context's warm-up
        for _ in range(passes):
            contexts = [random_context(rng) for _ in range(n)]
            for i, ctx in enumerate(contexts):
                ctx.facts["partition"] = i
            for label, decide in (("one call each", lambda cs: [llm.decide(c) for c in cs]),
                                  ("one batched call", llm.decide_all)):
                t = time.perf_counter()
                decided = decide(contexts)
                seconds[label].append(time.perf_counter() - t)
                fallbacks[label] = fallbacks.get(label, 0) + sum(bool(d.fallback_reason) for d in decided)
    finally:
        llm.close()
    each, batched = (float(np.median(seconds[k])) for k in seconds)
    print(f"{'pass of ' + str(n):18} {'median s':>8} {'per decision s':>14} {'fallbacks':>9}")
    for label, sec in seconds.items():
        print(f"{label:18} {np.median(sec):8.2f} {np.median(sec) / n:14.2f} {fallbacks[label]:9d}")
    print(f"batched / one call each: {batched / each:.3f}")


def interval_text(values: list[float]) -> str:
    """' [lo, hi] (c%)': the median's interval (``metrics.median_interval``), or '' where there is none."""
    found = metrics.median_interval(values)
    return "" if found is None else f" [{found[0]:.3f}, {found[1]:.3f}] ({100 * found[2]:.0f}%)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, default=2, help="trainer ranks (one more rank is the agent)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--decisions", type=int, default=6, help="decisions per latency measurement")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "bench-agent"))
    ap.add_argument("--agent-action", default="paper", choices=("paper", "structured"))
    ap.add_argument("--latency-only", action="store_true", help="only the default model's latency, paper vs structured")
    ap.add_argument("--transports", action="store_true", help="only p2p vs collective agent transport, side by side")
    ap.add_argument("--policy", default="heuristic", help="with --transports: the agent policy")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each transport, or pairs of each policy and its replay")
    ap.add_argument("--agent-window", type=int, default=1)
    ap.add_argument("--pair-policies", default="heuristic,llm", help="the agent policies paired with their replays")
    ap.add_argument("--no-latency", action="store_true", help="after the pairs, skip the latency table")
    ap.add_argument("--batched", type=int, default=0, metavar="N",
                    help="only passes of N structured llm decisions: one batched call vs one call each")
    ap.add_argument("--window-rounds", type=int, default=0, metavar="N",
                    help="only rounds of lookahead windows 4 and 8, the tuner steering the window, and its replay")
    ap.add_argument("--rate", default="1gbit", help="with --window-rounds: the shared link's rate")
    ap.add_argument("--congestion", default="", metavar="PROFILE",
                    help="with --window-rounds: a competing flow (python -m rudder.netem --congestion)")
    a = ap.parse_args()
    if a.window_rounds:
        window_rounds(a.out, a.window_rounds, a.epochs, a.rate, a.congestion, a.agent_window)
        return 0
    if a.batched:
        print(f"structured llm, SmolLM2-135M-Instruct, 1 thread, prompt v{PROMPT_VERSION}, {a.decisions} passes of "
              f"{a.batched}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        batched_passes(a.batched, a.decisions)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    if a.latency_only:
        print(f"decision latency, SmolLM2-135M-Instruct, 1 thread, prompt v{PROMPT_VERSION}, {a.decisions} decisions "
              f"each (after a warm one), the modes in turn; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        llms = {action: llm_of(default_model(), 1, action) for action in ("paper", "structured")}
        try:
            results = latencies(llms, a.decisions)
        finally:
            for llm in llms.values():
                llm.close()
        print(f"{'action':10} {'p50 s':>6} {'p95 s':>6} {'mean s':>6} {'fallbacks':>9} {'prompt tok':>10} {'answer tok':>10}")
        for action, r in results.items():
            sec, tok = np.array(r["seconds"]), np.array(r["tokens"])
            print(f"{action:10} {np.percentile(sec, 50):6.2f} {np.percentile(sec, 95):6.2f} {sec.mean():6.2f} "
                  f"{r['fallbacks'] / a.decisions:9.2f} {tok[:, 0].mean():10.0f} {tok[:, 1].mean():10.0f}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    if os.path.isfile(os.path.join(FACEBOOK, "facebook_edges.csv")):
        name, spec = "facebook", f"musae:{FACEBOOK}:facebook"
    else:
        name, spec = "cora", f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"
    parts = cached_partition(spec, a.parts, os.path.join(a.out, f"{name}-{a.parts}"))
    flags = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--agent-window", str(a.agent_window),
             "--agent-action", a.agent_action]
    if a.transports:
        print(f"{name}, {a.parts} trainers + 1 agent (its own core), batch {a.batch_size}, {a.epochs} epochs, "
              f"--policy {a.policy}, window {a.agent_window}; {os.cpu_count()} cores")
        transports(parts, a.out, a.parts, a.policy, flags, a.repeats)
        return 0
    print(f"{name}, {a.parts} trainers + 1 agent (its own core), batch {a.batch_size}, {a.epochs} epochs; "
          f"{os.cpu_count()} cores")
    print(f"{'policy':10} {'repeat':>6} {'epoch s':>8} {'replay s':>8} {'ratio':>6} {'decisions':>9} {'latency s':>9} "
          f"{'rows/epoch':>10}")
    ratios: dict[str, list[float]] = {policy: [] for policy in a.pair_policies.split(",")}
    for r in range(a.repeats):
        for policy in list(ratios)[:: 1 if r % 2 == 0 else -1]:  # the policies in reversed order every other time
            p = pair(parts, a.out, a.parts, policy, flags)
            ratios[policy].append(p["epoch"] / p["replay"])
            print(f"{policy:10} {r:6d} {p['epoch']:8.3f} {p['replay']:8.3f} {ratios[policy][-1]:6.3f} {p['decisions']:9d} "
                  f"{p['latency'] or 0:9.3f} {p['rows']:10.0f}", flush=True)
    print("median agent / replay: " + ", ".join(f"{policy} {np.median(v):.3f}" + interval_text(v)
                                                for policy, v in ratios.items())
          + f"; load average {os.getloadavg()[0]:.2f}")
    if a.no_latency:
        return 0

    tiny = write_tiny_gguf(os.path.join(a.out, "tiny.gguf"))
    print(f"\ndecision latency, in-process llama.cpp, idle machine, --agent-action {a.agent_action}, {a.decisions} "
          f"decisions (first one warm)")
    print(f"{'model':28} {'threads':>7} {'mean s':>7} {'fallbacks':>9}")
    for label, model in (("SmolLM2-135M-Instruct Q4_1", default_model()), ("random-weight tiny (tests)", tiny)):
        for threads in (1, 2):
            mean, fb = latency(model, threads, a.decisions, a.agent_action)
            print(f"{label:28} {threads:7d} {mean:7.2f} {fb:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
