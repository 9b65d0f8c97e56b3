"""The report: results.json and results.md under --out, the latter's tables assembled here and
its fixed prose filled in from ``report_template.md``; the plots; the report rebuilt from a
finished run's results.json and logs (``--report-only``)."""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import string
import sys
import time

import numpy as np

from bench.evaluation.floor import floor
from bench.evaluation.grid import FRACTION_FREE, REPO, Network
from bench.evaluation.harness import Harness, median_figures
from bench.evaluation.network_report import floor_table, pass_cell, targets
from bench.evaluation.oracle import oracle_section, oracle_targets

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_template.md")


@functools.cache
def templates() -> dict[str, str]:
    """{name: text} of ``report_template.md``: each template from its ``<!-- template: NAME -->``
    line to the next, blank lines at either end dropped (the text before the first is a comment)."""
    with open(TEMPLATE) as f:
        parts = re.split(r"^<!-- template: (\w+) -->$", f.read(), flags=re.M)
    return {name: text.strip("\n") for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def fill(name: str, **values) -> list[str]:
    """The lines of template ``name`` with its ``${placeholders}`` filled in (every one required)."""
    return string.Template(templates()[name]).substitute(values).split("\n")


def ratio(a, b) -> str:
    return f"{a / b:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def epoch_cell(fig: dict) -> str:
    """The epoch time and the spread of the steady epochs it is the median of (a skewed run shows)."""
    low, high = fig.get("epoch_spread") or (None, None)
    if fig.get("epoch_seconds") is None:
        return "too short" if "too short" in (fig.get("steady_epochs") or "") else "-"
    return fmt(fig["epoch_seconds"], ".3f") + (f" ({low:.3f}-{high:.3f})" if low is not None else "")


def policy_table(r: dict, fractions: list) -> list[str]:
    runs = r["runs"]
    none = runs.get("none", {})
    lines = ["| policy | f | remote rows/epoch | x none | x fixed | epoch s (steady epochs' spread) | x none | x fixed "
             "| hits % | test acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, fig in runs.items():
        policy, _, f = label.rpartition("-f") if label not in FRACTION_FREE else (label, "", "")  # last: sweep-fixed-...
        fixed = runs.get(f"fixed-f{f}", {}) if f else {}
        lines.append(f"| {policy} | {f or '-'} | {fmt(fig['rows_per_epoch'], ',.0f')} "
                     f"| {ratio(fig['rows_per_epoch'], none.get('rows_per_epoch'))} "
                     f"| {ratio(fig['rows_per_epoch'], fixed.get('rows_per_epoch'))} | {epoch_cell(fig)} "
                     f"| {ratio(fig['epoch_seconds'], none.get('epoch_seconds'))} "
                     f"| {ratio(fig['epoch_seconds'], fixed.get('epoch_seconds'))} "
                     f"| {fmt(fig['hit_percent'], '.1f')} | {fmt(fig['test_acc'], '.3f')} |")
    return lines


def decisions_table(configs: dict) -> list[str]:
    lines = ["| configuration | policy | decisions | answered | evict | latency s | Pass@1 hit rate | Pass@1 comm "
             "| Pass@1 wait | invalid rate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in configs.items():
        for label, fig in r["runs"].items():
            d = fig.get("decisions")
            if d:
                lines.append(f"| {key} | {label} | {d['count']} | {d.get('answered', '-')} | {d['evict']} "
                             f"| {fmt(d['latency_mean'], '.3f')} | {pass_cell(d, 'hitrate')} | {pass_cell(d, 'comm')} "
                             f"| {pass_cell(d, 'wait')} | {fmt(d['invalid_rate'], '.3f')} |")
    return lines


def verdicts(configs: dict) -> list[str]:
    """Plain statements of where the llm policy does not beat the heuristic or lookahead."""
    out = []
    for key, r in configs.items():
        for label, fig in r["runs"].items():
            if not label.startswith("llm-"):
                continue
            f = label[len("llm-"):]
            answered = (fig.get("decisions") or {}).get("answered", 0)
            for other in ("heuristic", "lookahead"):
                o = r["runs"].get(f"{other}-{f}")
                if o and fig["rows_per_epoch"] is not None and o["rows_per_epoch"] is not None:
                    worse = fig["rows_per_epoch"] > o["rows_per_epoch"]
                    verdict = f"{'does NOT beat' if worse else 'beats or ties'} {other}"
                    if not answered:
                        verdict += "; the model answered no decision within the run, so it acted as static"
                    out.append(f"- {key}, {f}: llm fetches {fig['rows_per_epoch']:,.0f} rows/epoch vs {other} "
                               f"{o['rows_per_epoch']:,.0f} ({ratio(fig['rows_per_epoch'], o['rows_per_epoch'])}x): "
                               f"{verdict}.")
    return out


def report(h: Harness, results: dict, command: str) -> str:
    g = h.grid
    lines = [*fill("intro", grid=g.get("name", "?"), seed=h.seed, command=command, finished=results["finished"],
                   commit=results["commit"], machine=results["machine"],
                   out=os.path.relpath(h.out, REPO) if h.out.startswith(REPO) else h.out,
                   epochs=g["epochs"], hidden=g["hidden"], cores=os.cpu_count(),
                   repeated="" if g["repeats"] == 1 else (
                       f" Every policy and setting ran {g['repeats']} times; each row is the run with the median "
                       "epoch time (the lower one of an even count; every run's epoch time is in results.json, and "
                       "their spread under the hindsight oracle)."),
                   transport=fill("transport_shaped" if g.get("network") else "transport_loopback")[0]), ""]
    if results["skipped_datasets"]:
        lines += ["Datasets skipped: " + "; ".join(results["skipped_datasets"]), ""]
    for key, r in results["grid"]["configs"].items():
        lines += [f"## {key}", ""]
        if g.get("network"):
            net, serial = r["config"].get("network"), r["runs"].get("none-serial", {})
            lines += [*fill("network", network=Network(**net).describe() if net else "unshaped (loopback)",
                            wait=fmt(100 * serial["wait_share"], ".0f") + "%" if serial.get("wait_share") else "-"), ""]
        lines += [*policy_table(r, g["grid"]["fractions"]), ""]
        if r["config"].get("network"):
            lines += [*fill("floor"), "", *floor_table(r, results["distdgl"].get(key)), ""]
    dec = decisions_table(results["grid"]["configs"])
    if len(dec) > 2:
        lines += ["## Agent decisions", "", *fill("decisions"), "", *dec, ""]
    v = verdicts(results["grid"]["configs"])
    if v:
        lines += ["## Where the llm policy does not win", "", *v, ""]
    c = results["grid"].get("classifiers")
    if c and not c.get("error"):
        lines += ["## Classifiers: seen vs unseen configurations", "",
                  *fill("classifiers", seen_datasets=", ".join(c["seen_datasets"]), seen_rows=c["seen_rows"],
                        unseen_rows=c["unseen_rows"], kind=c["kind"]),
                  "", "| model | seen accuracy | unseen accuracy |", "|---|---|---|"]
        for k, acc in c["seen"].items():
            lines.append(f"| {k} | {acc:.3f} | {fmt((c['unseen'] or {}).get(k), '.3f')} |")
        lines.append("")
    elif c:
        lines += ["## Classifiers", "", f"Not trained: {c['error']}", ""]
    d = results["distdgl"]
    lines += ["## DistDGL peer", ""]
    if "skipped" in d:
        lines += [f"Skipped: {d['skipped']}.", ""]
    else:
        lines += [*fill("distdgl"), "",
                  "| configuration | DistDGL epoch s | our none x | best policy | its x | DistDGL rows/epoch | our none x "
                  "| best x | DistDGL acc | our none acc |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for key, p in d.items():
            if "error" in p:
                lines.append(f"| {key} | failed: {p['error'][:80]} |||||||||")
                continue
            runs = results["grid"]["configs"][key]["runs"]
            none = runs["none"]
            best_label, best = min(((k, v) for k, v in runs.items() if v["epoch_seconds"]), key=lambda kv: kv[1]["epoch_seconds"])
            lines.append(f"| {key} | {epoch_cell(p)} | {ratio(none['epoch_seconds'], p['epoch_seconds'])} "
                         f"| {best_label} | {ratio(best['epoch_seconds'], p['epoch_seconds'])} | {p['rows_per_epoch']:,.0f} "
                         f"| {ratio(none['rows_per_epoch'], p['rows_per_epoch'])} "
                         f"| {ratio(best['rows_per_epoch'], p['rows_per_epoch'])} "
                         f"| {fmt(p['test_acc'], '.3f')} | {fmt(none['test_acc'], '.3f')} |")
        lines.append("")
    s = results["simulator"]
    lines += ["## Simulator", "", *(["Validation skipped (`--no-validate`)."] if s.get("skipped") else
                                     fill("simulator", runs=s["runs"], minibatches=s["minibatches"],
                                          differ=len(s["mismatches"]))), ""]
    for m in s["mismatches"][:10]:
        lines.append(f"- {m}")
    scale = results.get("scale")
    if scale:
        lines += ["", *fill("scale"), "",
                  "| partitions | policy | rows/epoch | x none | x fixed | hits % | epoch s | x none | epoch s (overlap) "
                  "| x none |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for parts, summ in scale.items():
            pol = summ["policies"]
            none = pol.get("none", {})
            for label, r in pol.items():
                lines.append(f"| {parts} | {label} | {r['rows_per_epoch']:,.0f} "
                             f"| {ratio(r['rows_per_epoch'], none.get('rows_per_epoch'))} "
                             f"| {ratio(r['rows_per_epoch'], pol.get('fixed', {}).get('rows_per_epoch'))} "
                             f"| {r['hit_percent']:.1f} | {fmt(r.get('epoch_seconds'), '.4f')} "
                             f"| {ratio(r.get('epoch_seconds'), none.get('epoch_seconds'))} "
                             f"| {fmt(r.get('epoch_seconds_overlap'), '.4f')} "
                             f"| {ratio(r.get('epoch_seconds_overlap'), none.get('epoch_seconds_overlap'))} |")
    oracle = oracle_section(g, results["grid"]["configs"])
    if oracle:
        lines += ["", "## The hindsight oracle", "", *fill("oracle"), "", *oracle]
    met = targets(g, results["grid"]["configs"], results["distdgl"]) + oracle_targets(g, results["grid"]["configs"])
    if met:
        lines += ["", "## Targets", "", *fill("targets"), "", *met]
    if g.get("not_measured"):
        lines += ["", "## Not measured here", "", *(f"- {text}" for text in g["not_measured"])]
    if h.failed:
        lines += ["", "Failed runs: " + "; ".join(h.failed)]
    if h.not_run:
        lines += ["", f"Not run (budget of {results['budget_minutes']} min spent): " + ", ".join(h.not_run)]
    if results.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"`{os.path.relpath(p, REPO) if p.startswith(REPO) else p}`"
                                            for p in results["plots"])]
    return "\n".join(lines) + "\n"


def plots(h: Harness, configs: dict) -> list[str]:
    """Per configuration: remote rows and epoch time of each policy as ratios to none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(h.out, "plots"), exist_ok=True)
    written = []
    for key, r in configs.items():
        runs, none = r["runs"], r["runs"].get("none")
        if not none or not none["rows_per_epoch"]:
            continue
        labels = [k for k in runs if k != "none"]
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(labels)), 3.5))
        x = np.arange(len(labels))
        ax.bar(x - 0.2, [runs[k]["rows_per_epoch"] / none["rows_per_epoch"] for k in labels], 0.4, label="remote rows / none")
        ax.bar(x + 0.2, [runs[k]["epoch_seconds"] / none["epoch_seconds"] for k in labels], 0.4, label="epoch time / none")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
        ax.set_title(key, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(h.out, "plots", f"{key}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def rebuild_report(h: Harness, publish: str | None) -> int:
    """results.md again from results.json, each run's figures recomputed from its logs."""
    path = os.path.join(h.out, "results.json")
    try:
        results = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"error: --report-only: cannot read {path} ({e})", file=sys.stderr)
        return 2
    for r in results["grid"]["configs"].values():
        for label, fig in r["runs"].items():
            new = r["runs"][label] = median_figures((fig.get("repeats") or {}).get("runs") or [fig["run"]], r["parts"])
            if fig.get("floor"):
                new["floor"] = floor(new["run"], fig["floor"]["compute_only_run"], r["config"]["network"]["links"])
    h.not_run, h.failed, h.seed = results["not_run"], results["failed"], results["seed"]
    results.setdefault("finished", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(path))))
    results.setdefault("command", json.load(open(os.path.join(h.out, "grid.json")))["command"])
    results["plots"] = plots(h, results["grid"]["configs"])
    write_results(h, results, results.get("command", "?"), publish)
    return 0


def write_results(h: Harness, results: dict, command: str, publish: str | None) -> None:
    """results.json and results.md under --out (and a copy of results.md at ``publish``); prints the report."""
    with open(os.path.join(h.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    text = report(h, results, command)
    with open(os.path.join(h.out, "results.md"), "w") as f:
        f.write(text)
    if publish:
        shutil.copyfile(os.path.join(h.out, "results.md"), publish)
    print(text)
