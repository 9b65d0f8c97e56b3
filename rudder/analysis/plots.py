"""PNG plots of runs: cumulative hit % and remote rows per minibatch, the time breakdown, and
for agent runs the decision timeline (each decision on its trainer's hit rate, coloured by
whether its predicted hit-rate direction came true)."""
from __future__ import annotations

import os

import numpy as np

from rudder.analysis.decisions import PREDICTED_SIGN
from rudder.analysis.summary import TIMERS
from rudder.logs import metrics
from rudder.logs.reader import Run


def _save(fig, directory: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(directory, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(runs: list[Run], summaries: list[dict], directory: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    fig, (ax_hit, ax_comm) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for run, s in zip(runs, summaries):
        name = os.path.basename(s["run"])
        steps = max(r.minibatches.size for r in run.ranks)
        hit = np.nanmean([np.pad(r.minibatches["hit_ratio"].astype(float), (0, steps - r.minibatches.size),
                                 constant_values=np.nan) for r in run.ranks], axis=0)
        comm = np.nansum([np.pad(metrics.remote_rows_fetched(r.minibatches).astype(float),
                                 (0, steps - r.minibatches.size), constant_values=np.nan) for r in run.ranks], axis=0)
        ax_hit.plot(100 * hit, label=name)
        ax_comm.plot(comm, label=name)
    ax_hit.set_ylabel("cumulative hit % (rank mean)")
    ax_comm.set_ylabel("remote rows fetched (all ranks)")
    ax_comm.set_xlabel("minibatch")
    ax_hit.legend(fontsize="small")
    written.append(_save(fig, directory, "hits_and_traffic.png"))

    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = np.zeros(len(summaries))
    for t in (t for t in TIMERS if t != "t_grad_copy"):  # a part of t_allreduce
        values = np.array([s["time_breakdown"][t] or 0.0 for s in summaries])
        ax.bar([os.path.basename(s["run"]) for s in summaries], values, bottom=bottom, label=t[2:])
        bottom += values
    ax.set_ylabel("seconds per epoch (rank mean; overlapped phases stack)")
    ax.legend(fontsize="small")
    written.append(_save(fig, directory, "time_breakdown.png"))

    agent_runs = [(run, s) for run, s in zip(runs, summaries) if run.agents]
    if agent_runs:  # decision timeline: when each trainer was told what, and the hit rate it then saw
        fig, axes = plt.subplots(len(agent_runs), 1, figsize=(9, 3 * len(agent_runs)), squeeze=False)
        for ax, (run, s) in zip(axes[:, 0], agent_runs):
            d = np.concatenate([a.decisions for a in run.agents])
            for trainer in np.unique(d["trainer"]):
                mine = np.sort(d[d["trainer"] == trainer], order="request")
                ax.plot(mine["minibatch"], mine["hitrate"], lw=0.8, color="0.6")
                # predicted hit-rate direction vs the sign of its change by the next decision
                realised = np.append(np.sign(np.diff(mine["hitrate"].astype(float))), np.nan)
                predicted = np.array([PREDICTED_SIGN[int(i)] for i in mine["hitrate_impact"]])
                colour = np.where(np.isnan(realised), "0.5", np.where(predicted == realised, "tab:green", "tab:red"))
                for marker, chosen in (("v", mine["decision"] == 1), ("o", mine["decision"] == 0)):
                    ax.scatter(mine["minibatch"][chosen], mine["hitrate"][chosen], marker=marker, c=colour[chosen], s=18)
            ax.set_title(f"{os.path.basename(s['run'])}: decisions (v evict, o keep) on the window hit rate; "
                         "green: predicted hit-rate direction came true, red: it did not", fontsize="small")
            ax.set_ylabel("hit %")
            ax.set_xlabel("minibatch")
        written.append(_save(fig, directory, "decisions.png"))
    return written
