"""The evaluation harness: every policy side by side over a grid of configurations, classifiers
tested on configurations they were not trained on, DistDGL itself as a peer, the simulator
checked against every run, and the simulator pushed to partition counts this machine cannot run.

    python bench/evaluate.py --grid bench/grids/tiny.toml --seed 0 --out runs/eval-tiny
    python bench/evaluate.py --grid bench/grids/full.toml --seed 0 --out runs/eval --publish docs/results.md

A grid is a TOML file (``bench/grids/``): datasets (partition-tool specs; ``shared:facebook``,
``shared:cora``, ``shared:citeseer`` read ``../shared/data`` and are skipped with a reason when
it is absent; ``bundled:cora`` is ``data/cora``), and the cartesian grid of ranks, batch sizes,
fanouts and buffer fractions every policy runs on. The seed (``--seed``) seeds partitioning,
model, sampling and shuffling, so anyone can run configurations and seeds we never tuned on.

Per configuration (dataset, ranks, batch size, fanouts) the policies ``none-serial`` (no overlap)
and ``none`` run once; per buffer fraction ``static``, ``fixed``, ``lookahead`` and the agent
policies. Each trainer is an emulated node of its own (``MPIR_CVAR_NUM_CLIQUES``), so every remote
row crosses RMA as between cluster nodes; agent policies add an agent rank per node. The fixed
runs also collect the classifiers' traces (``--collect-traces``): the classifiers train on the
``classifier.seen`` datasets' traces and are scored on the other datasets' (unseen) traces too.

Everything lands under ``--out``: ``parts/``, ``runs/``, ``classifiers/``, ``distdgl/``,
``simulator/``, ``plots/``, ``results.json`` and ``results.md``; a rerun reuses every finished
run with the same flags. ``--budget-minutes`` stops starting runs once spent (the rest is listed
as not run).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SHARED = os.path.join(REPO, "..", "shared", "data")
SHARED_SPECS = {"shared:facebook": ("musae", "musae:{d}/musae:facebook", "musae/facebook_edges.csv"),
                "shared:cora": ("planetoid", "planetoid:{d}/planetoid:cora", "planetoid/ind.cora.graph"),
                "shared:citeseer": ("planetoid", "planetoid:{d}/planetoid:citeseer", "planetoid/ind.citeseer.graph")}
AGENT_POLICIES = ("heuristic", "classifier", "llm")
FRACTION_FREE = ("none-serial", "none")  # no buffer: the same run at every fraction


class GridError(Exception):
    pass


# -- the grid ------------------------------------------------------------------------------------


def load_grid(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            grid = tomllib.load(f)
    except OSError as e:
        raise GridError(f"--grid {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"--grid {path}: not valid TOML ({e})") from None
    for key in ("datasets", "grid"):
        if key not in grid:
            raise GridError(f"--grid {path}: no [{key}] table")
    g = grid["grid"]
    for key in ("ranks", "fractions", "policies"):
        if not isinstance(g.get(key), list) or not g[key]:
            raise GridError(f"--grid {path}: [grid] {key} must be a non-empty list")
    known = {"none-serial", "none", "static", "fixed", "lookahead", *AGENT_POLICIES}
    bad = [p for p in g["policies"] if p not in known]
    if bad:
        raise GridError(f"--grid {path}: policy {bad[0]!r} is not one of {', '.join(sorted(known))}")
    g.setdefault("batch_sizes", [0])
    g.setdefault("fanouts", ["10,25"])
    grid.setdefault("epochs", 5)
    grid.setdefault("hidden", 16)
    grid.setdefault("policy_flags", {})
    grid.setdefault("policy_ranks", {})
    for name, entry in grid["datasets"].items():  # "spec", or {spec = "...", ranks = [...], batch_sizes = [...], fanouts = [...]}
        entry = {"spec": entry} if isinstance(entry, str) else dict(entry)
        if not isinstance(entry.get("spec"), str):
            raise GridError(f"--grid {path}: dataset {name!r} needs a spec string")
        extra = set(entry) - {"spec", "ranks", "batch_sizes", "fanouts"}
        if extra:
            raise GridError(f"--grid {path}: dataset {name!r}: unknown key {sorted(extra)[0]!r} (spec, ranks, batch_sizes, fanouts)")
        grid["datasets"][name] = entry
    return grid


def resolve_datasets(grid: dict) -> tuple[dict, list[str]]:
    """{name: partition-tool spec} of the datasets present here, and why others were skipped."""
    found, skipped = {}, []
    for name, entry in grid["datasets"].items():
        spec = entry["spec"]
        if spec in SHARED_SPECS:
            _, template, probe = SHARED_SPECS[spec]
            if not os.path.exists(os.path.join(SHARED, probe)):
                skipped.append(f"{name}: {os.path.abspath(os.path.join(SHARED, probe))} absent")
                continue
            spec = template.format(d=os.path.abspath(SHARED))
        elif spec == "bundled:cora":
            spec = f"planetoid:{os.path.join(REPO, 'data', 'cora')}:cora"
        found[name] = spec
    return found, skipped


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str
    ranks: int
    batch_size: int
    fanouts: str

    @property
    def key(self) -> str:
        return f"{self.dataset}-p{self.ranks}-b{self.batch_size or 'auto'}-f{self.fanouts.replace(',', '_')}"


def configurations(grid: dict, datasets: dict) -> list[Config]:
    """The cartesian grid, each dataset's own ranks, batch sizes or fanouts replacing the grid's."""
    out = []
    for d in datasets:
        axis = {k: grid["datasets"][d].get(k, grid["grid"][k]) for k in ("ranks", "batch_sizes", "fanouts")}
        out += [Config(d, int(r), int(b), str(f)) for r in axis["ranks"] for b in axis["batch_sizes"] for f in axis["fanouts"]]
    return out


# -- running -------------------------------------------------------------------------------------


def code_fingerprint() -> str:
    """A hash of the code a run executes (the library and the drivers): a finished run is reused
    only by the same code, so a grid resumed after a change measures the change."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(REPO, "rudder", "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(REPO, "drivers", "*.py"))):
        digest.update(os.path.relpath(path, REPO).encode() + b"\0" + open(path, "rb").read())
    return digest.hexdigest()[:16]


class Harness:
    def __init__(self, grid: dict, out: str, seed: int, budget_minutes: float):
        self.grid, self.out, self.seed = grid, os.path.abspath(out), seed
        self.code = code_fingerprint()
        self.deadline = time.time() + 60 * budget_minutes
        self.not_run: list[str] = []
        self.failed: list[str] = []
        self.log = open(os.path.join(self.out, "harness.log"), "a")

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def out_of_time(self, what: str) -> bool:
        if time.time() < self.deadline:
            return False
        self.not_run.append(what)
        return True

    def partition(self, name: str, spec: str, parts: int) -> str:
        from partitioning.partition import partition_graph
        from partitioning.sources import load_spec
        from rudder.partition_store import PartitionFormatError, PartitionMeta

        out = os.path.join(self.out, "parts", f"{name}-{parts}")
        try:
            meta = PartitionMeta.load(out)
            if meta.num_parts == parts and meta.source == spec and meta.seed == self.seed:
                return out
        except PartitionFormatError:
            pass
        t = time.time()
        partition_graph(load_spec(spec), parts, out, method="metis", seed=self.seed, force=True)
        self.say(f"partitioned {name} into {parts} ({time.time() - t:.0f} s)")
        return out

    def train(self, parts: str, run_dir: str, trainers: int, policy: str, flags: list[str]) -> str | None:
        """One drivers/train.py job (reused when it already finished with the same flags)."""
        from bench.mpi_job import train_job

        nodes = trainers  # every trainer an emulated node of its own
        agents = nodes if policy in AGENT_POLICIES else 0
        argv = ["--epochs", str(self.grid["epochs"]), "--hidden", str(self.grid["hidden"]), "--seed", str(self.seed),
                *flags, *self.grid["policy_flags"].get(policy, [])]
        stamp = os.path.join(run_dir, "harness.json")
        record = {"parts": parts, "ranks": trainers + agents, "cliques": nodes, "argv": argv, "code": self.code}
        if os.path.exists(stamp) and json.load(open(stamp)) == record:
            return run_dir
        if self.out_of_time(os.path.relpath(run_dir, self.out)):
            return None
        t = time.time()
        try:
            train_job(parts, run_dir, trainers + agents, nodes, argv)
        except SystemExit as e:  # train_job's way of failing: keep going, and say so in the results
            self.failed.append(f"{os.path.relpath(run_dir, self.out)}: {str(e).strip().splitlines()[-1][:200]}")
            self.say(f"FAILED {self.failed[-1]}")
            return None
        json.dump(record, open(stamp, "w"))
        self.say(f"ran {os.path.relpath(run_dir, self.out)} ({time.time() - t:.0f} s)")
        return run_dir


def policy_flags(policy: str, fraction: float | None, classifier_model: str | None) -> list[str]:
    if policy == "none-serial":
        return ["--policy", "none", "--no-overlap"]
    flags = ["--policy", policy]
    if fraction is not None:
        flags += ["--buffer-fraction", str(fraction)]
    if policy == "fixed":
        flags += ["--collect-traces"]
    if policy == "lookahead":
        flags += ["--trace"]  # for the MIN bound in the analysis
    if policy == "classifier":
        flags += ["--classifier-model", classifier_model]
    return flags


def figures(run_dir: str, data_dir: str) -> dict:
    """What the results tables show of one run: remote rows fetched per epoch (summed over
    trainers) and the slowest trainer's epoch time, over epochs 2..E as for the DistDGL peer
    (the first epoch warms up), and the analysis tool's hit %, accuracy and decision figures."""
    from rudder.analyze import decision_quality, fallback_counts, load_run, remote_rows_fetched, summarize

    run = load_run(run_dir)
    s = summarize(run, data_dir)
    epochs = sorted(set.intersection(*(set(r.epochs["epoch"][r.epochs["complete"] == 1].tolist()) for r in run.ranks)))
    later = epochs[1:] or epochs
    rows = sum(int(remote_rows_fetched(r.minibatches)[np.isin(r.minibatches["epoch"], later)].sum()) for r in run.ranks)
    seconds = [max(float(r.epochs["seconds"][r.epochs["epoch"] == e][0]) for r in run.ranks) for e in later]
    row = {"run": os.path.abspath(run_dir), "rows_per_epoch": rows / len(later) if later else None,
           "epoch_seconds": float(np.median(seconds)) if seconds else None, "hit_percent": s["buffer"]["hit_percent"],
           "test_acc": s["accuracy"]["test"], "over_min": (s.get("bound") or {}).get("achieved_over_min")}
    if run.agents:
        q = decision_quality(run)
        reasons = fallback_counts(run)
        cut = [text for a in run.agents for text in (a.fallback_reasons or []) if "trainer finished" in text]
        invalid = sum(reasons.values()) - len(cut)  # a decision cut off because its trainer had finished is not the model's fault
        row["decisions"] = {"count": q["count"], "answered": q["count"] - sum(reasons.values()), "evict": q["evict"],
                            "latency_mean": q["latency_mean"], "pass_at_1_hitrate": q["pass_at_1_hitrate"]["value"],
                            "pass_at_1_comm": q["pass_at_1_comm"]["value"],
                            "invalid_rate": invalid / q["count"] if q["count"] else None, "fallbacks": reasons}
    return row


def run_grid(h: Harness, datasets: dict) -> dict:
    """Every policy on every configuration; the classifiers in between (trained on the seen
    datasets' fixed runs before any classifier run)."""
    g = h.grid["grid"]
    policies = g["policies"]
    results: dict = {}
    parts_of = {}
    for cfg in configurations(h.grid, datasets):
        parts_of[cfg] = h.partition(cfg.dataset, datasets[cfg.dataset], cfg.ranks)
    base = lambda cfg: [*(["--batch-size", str(cfg.batch_size)] if cfg.batch_size else []), "--fanouts", cfg.fanouts]  # noqa: E731

    def run(cfg, policy, fraction, model=None):
        if cfg.ranks not in h.grid["policy_ranks"].get(policy, [cfg.ranks]):
            return
        label = policy if fraction is None else f"{policy}-f{fraction}"
        run_dir = os.path.join(h.out, "runs", cfg.key, label)
        done = h.train(parts_of[cfg], run_dir, cfg.ranks, policy, [*base(cfg), *policy_flags(policy, fraction, model)])
        if done:
            results.setdefault(cfg.key, {"config": dataclasses.asdict(cfg), "parts": parts_of[cfg], "runs": {}})
            results[cfg.key]["runs"][label] = figures(done, parts_of[cfg])

    for cfg in configurations(h.grid, datasets):  # every policy but the classifier first
        for policy in (p for p in policies if p in FRACTION_FREE):
            run(cfg, policy, None)
        for fraction in g["fractions"]:
            for policy in (p for p in policies if p not in FRACTION_FREE and p != "classifier"):
                run(cfg, policy, fraction)
    classifiers = None
    if "classifier" in policies:
        classifiers = train_classifiers(h, results)
        if classifiers.get("model"):
            for cfg in configurations(h.grid, datasets):
                for fraction in g["fractions"]:
                    run(cfg, "classifier", fraction, classifiers["model"])
    return {"configs": results, "classifiers": classifiers}


def train_classifiers(h: Harness, results: dict) -> dict:
    """Train on the seen datasets' collection (fixed) runs; score on held-out seen rows and on
    every unseen dataset's rows."""
    from rudder import classifier

    seen_names = set(h.grid.get("classifier", {}).get("seen", []))
    kind = h.grid.get("classifier", {}).get("model", "xgb")
    seen, unseen = [], []
    for key, r in results.items():
        for label, fig in r["runs"].items():
            if label.startswith("fixed-"):
                (seen if r["config"]["dataset"] in seen_names else unseen).append(fig["run"])
    out = os.path.join(h.out, "classifiers")
    if not seen:
        h.say("classifiers: no fixed run of a seen dataset; classifier runs skipped")
        return {"error": "no collection runs of the seen datasets"}
    try:
        report = classifier.train(seen, out, list(classifier.MODELS), seed=h.seed)
    except classifier.ClassifierError as e:
        h.say(f"classifiers not trained: {e}")
        return {"error": str(e)}
    result = {"seen_datasets": sorted(seen_names), "model": os.path.join(out, classifier.MODELS[kind]), "kind": kind,
              "seen": {k: v["test_accuracy"] for k, v in report["models"].items()}, "seen_rows": report["rows"],
              "unseen": None, "unseen_rows": 0}
    if unseen:
        ev = classifier.evaluate(out, unseen)
        result["unseen"] = {k: v["accuracy"] for k, v in ev["models"].items()}
        result["unseen_rows"] = ev["rows"]
    h.say(f"classifiers trained on {report['rows']} rows of {', '.join(sorted(seen_names))}; runtime model {kind}")
    return result


def run_distdgl(h: Harness, datasets: dict, grid_results: dict) -> dict:
    """DistDGL on the same partitions and hyperparameters as our runs of the chosen configs."""
    from bench import distdgl_peer

    spec = h.grid.get("distdgl")
    if not spec:
        return {"skipped": "no [distdgl] table in the grid"}
    why = distdgl_peer.unavailable()
    if why:
        h.say(f"DistDGL peer skipped: {why}")
        return {"skipped": why}
    out = {}
    for key, r in grid_results["configs"].items():
        c = r["config"]
        if c["dataset"] not in spec.get("datasets", []) or c["ranks"] not in spec.get("ranks", [c["ranks"]]):
            continue
        none = r["runs"].get("none")
        if none is None:
            continue
        from rudder.analyze import load_run

        ours = load_run(none["run"])
        batch = ours.ranks[0].run["batch_size"]
        if h.out_of_time(f"distdgl/{key}"):
            continue
        t = time.time()
        run_dir = os.path.join(h.out, "distdgl", key, "run")
        flags = {"epochs": h.grid["epochs"], "batch_size": batch, "fanouts": c["fanouts"], "hidden": h.grid["hidden"],
                 "lr": ours.config["lr"], "dropout": ours.config["dropout"], "seed": h.seed, "parts": r["parts"]}
        stamp = os.path.join(run_dir, "harness.json")
        if os.path.exists(stamp) and json.load(open(stamp)) == flags:
            s = json.load(open(os.path.join(run_dir, "summary.json")))
        else:
            try:
                config = distdgl_peer.prepare(r["parts"], os.path.join(h.out, "distdgl", key, "parts"))
                s = distdgl_peer.run(config, c["ranks"], run_dir, **{k: v for k, v in flags.items() if k != "parts"})
            except RuntimeError as e:
                h.say(f"DistDGL {key}: {e}")
                out[key] = {"error": str(e)}
                continue
            json.dump(flags, open(stamp, "w"))
            h.say(f"ran DistDGL {key} ({time.time() - t:.0f} s)")
        out[key] = {"epoch_seconds": s["mean_epoch_s_excl_first"], "rows_per_epoch": s["remote_rows_per_epoch"],
                    "test_acc": s["test_acc"], "batch_size": batch, "run": run_dir}
    return out


def validate_simulator(h: Harness, grid_results: dict) -> dict:
    """``python -m rudder.simulate --validate`` on every run: rows must match exactly."""
    from rudder.simulate import validate

    checked, mismatched = 0, []
    for r in grid_results["configs"].values():
        for label, fig in r["runs"].items():
            n, bad = validate(fig["run"])
            checked += n
            if bad:
                mismatched.append(f"{os.path.relpath(fig['run'], h.out)}: {bad[0]}")
    h.say(f"simulator: {checked} minibatches of {sum(len(r['runs']) for r in grid_results['configs'].values())} runs "
          f"compared, {len(mismatched)} runs differ")
    return {"minibatches": checked, "runs": sum(len(r["runs"]) for r in grid_results["configs"].values()),
            "mismatches": mismatched}


def simulate_scale(h: Harness) -> dict | None:
    """The simulator on partition counts beyond this machine ([simulator.scale] of the grid)."""
    spec = h.grid.get("simulator", {}).get("scale")
    if not spec:
        return None
    out = {}
    for parts in spec["parts"]:
        if h.out_of_time(f"simulator/{parts}"):
            continue
        data = h.partition(spec.get("name", "scale"), spec["spec"], parts)
        json_path = os.path.join(h.out, "simulator", f"{spec.get('name', 'scale')}-{parts}.json")
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
        t = time.time()
        argv = ["--data", data, "--epochs", str(spec.get("epochs", 3)), "--policies", spec.get("policies", "none,static,fixed,lookahead,heuristic"),
                "--buffer-fraction", str(spec.get("fraction", 0.25)), "--seed", str(h.seed), "--out", json_path,
                "--machine", spec.get("machine", "perlmutter-gpu"), *map(str, spec.get("flags", []))]
        stamp, record = json_path + ".argv", {"argv": argv, "code": h.code}
        if not (os.path.exists(stamp) and json.load(open(stamp)) == record and os.path.exists(json_path)):
            proc = subprocess.run([sys.executable, "-m", "rudder.simulate", *argv], capture_output=True, text=True, cwd=REPO)
            if proc.returncode:
                h.say(f"simulator at {parts} partitions failed: {proc.stderr.strip()[-300:]}")
                continue
            json.dump(record, open(stamp, "w"))
            h.say(f"simulated {parts} partitions ({time.time() - t:.0f} s)")
        out[parts] = json.load(open(json_path))
    return out


# -- reporting -----------------------------------------------------------------------------------


def ratio(a, b) -> str:
    return f"{a / b:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def policy_table(r: dict, fractions: list) -> list[str]:
    runs = r["runs"]
    none = runs.get("none", {})
    lines = ["| policy | f | remote rows/epoch | x none | x fixed | epoch s | x none | x fixed | hits % | test acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, fig in runs.items():
        policy, _, f = label.partition("-f") if label not in FRACTION_FREE else (label, "", "")
        fixed = runs.get(f"fixed-f{f}", {}) if f else {}
        lines.append(f"| {policy} | {f or '-'} | {fmt(fig['rows_per_epoch'], ',.0f')} | {ratio(fig['rows_per_epoch'], none.get('rows_per_epoch'))} "
                     f"| {ratio(fig['rows_per_epoch'], fixed.get('rows_per_epoch'))} | {fmt(fig['epoch_seconds'], '.3f')} "
                     f"| {ratio(fig['epoch_seconds'], none.get('epoch_seconds'))} | {ratio(fig['epoch_seconds'], fixed.get('epoch_seconds'))} "
                     f"| {fmt(fig['hit_percent'], '.1f')} | {fmt(fig['test_acc'], '.3f')} |")
    return lines


def decisions_table(configs: dict) -> list[str]:
    lines = ["| configuration | policy | decisions | answered | evict | latency s | Pass@1 hit rate | Pass@1 comm | invalid rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, r in configs.items():
        for label, fig in r["runs"].items():
            d = fig.get("decisions")
            if d:
                lines.append(f"| {key} | {label} | {d['count']} | {d.get('answered', '-')} | {d['evict']} | {fmt(d['latency_mean'], '.3f')} "
                             f"| {fmt(d['pass_at_1_hitrate'], '.3f')} | {fmt(d['pass_at_1_comm'], '.3f')} | {fmt(d['invalid_rate'], '.3f')} |")
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
    lines = [f"# Evaluation results: grid `{g.get('name', '?')}`, seed {h.seed}", "",
             f"Produced by `{command}`, finished {results['finished']}, "
             f"commit {results['commit']}, on {results['machine']}. Every number below comes from this run's logs "
             f"(`{os.path.relpath(h.out, REPO) if h.out.startswith(REPO) else h.out}/results.json`).", "",
             f"Each configuration: GraphSAGE, {g['epochs']} epochs, hidden {g['hidden']}; every trainer an emulated node "
             f"(its remote rows cross RMA), agent policies with an agent rank per node. Rows = remote feature rows "
             f"fetched per epoch (misses + refills, all trainers, epochs 2..E); epoch s = slowest trainer, median of "
             f"epochs 2..E. Ratios: to `none` (no buffer, with overlap) and to `fixed` at the same buffer fraction f.", "",
             "What these numbers show, and what they do not:", "",
             "- Remote rows are exact counts and reproducible from the seed; the simulator section checks every run against them.",
             f"- Epoch times come from {os.cpu_count()} cores running every trainer, agent and (for DistDGL) server of a "
             "configuration at once, with emulated nodes on one host: RMA crosses MPICH's loopback, not a network. They "
             "rank policies on this machine; they do not predict a cluster. Runs follow one another, so background load "
             "shifts single ratios by a few percent.",
             "- Agent ranks share those cores with the trainers: the agent policies' epoch times include that contention, "
             "which a cluster node (a core of its own for the agent) would not have. The llm policy runs at 2 trainers "
             "only, and its model answers every few seconds, i.e. every tens to hundreds of minibatches here.",
             "- Accuracy after this few epochs is not converged; it shows that every policy trains the same model "
             "(caching is exact: the loss trajectories are bit-identical across policies).",
             "- The scale section is modelled (docs/simulator.md), from exact simulated row counts.", ""]
    if results["skipped_datasets"]:
        lines += ["Datasets skipped: " + "; ".join(results["skipped_datasets"]), ""]
    for key, r in results["grid"]["configs"].items():
        lines += [f"## {key}", "", *policy_table(r, g["grid"]["fractions"]), ""]
    dec = decisions_table(results["grid"]["configs"])
    if len(dec) > 2:
        lines += ["## Agent decisions", "", "Pass@1: share of predicted hit-rate / comm-volume directions that the "
                  "next window confirmed; answered: decisions the decider made itself (the rest fell back); invalid rate: "
                  "fallbacks for any reason but the trainer having finished (time-outs and out-of-format answers).",
                  "", *dec, ""]
    v = verdicts(results["grid"]["configs"])
    if v:
        lines += ["## Where the llm policy does not win", "", *v, ""]
    c = results["grid"].get("classifiers")
    if c and not c.get("error"):
        lines += ["## Classifiers: seen vs unseen configurations", "",
                  f"Trained on the fixed-policy traces of {', '.join(c['seen_datasets'])} ({c['seen_rows']} rows; seen = "
                  f"held-out 20% of those rows), scored on the other datasets' traces ({c['unseen_rows']} rows, unseen). "
                  f"The classifier policy runs used `{c['kind']}`.", "", "| model | seen accuracy | unseen accuracy |", "|---|---|---|"]
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
        lines += ["Same partitions (ours, given to DGL), split, batch size, fanouts, hidden size, lr, dropout, epochs. "
                  "Targets: our none <= 0.7x DistDGL's epoch time, our best policy <= 0.35x.", "",
                  "| configuration | DistDGL epoch s | our none x | best policy | its x | DistDGL rows/epoch | our none x | best x | DistDGL acc | our none acc |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for key, p in d.items():
            if "error" in p:
                lines.append(f"| {key} | failed: {p['error'][:80]} |||||||||")
                continue
            runs = results["grid"]["configs"][key]["runs"]
            none = runs["none"]
            best_label, best = min(((k, v) for k, v in runs.items() if v["epoch_seconds"]), key=lambda kv: kv[1]["epoch_seconds"])
            lines.append(f"| {key} | {p['epoch_seconds']:.3f} | {ratio(none['epoch_seconds'], p['epoch_seconds'])} | {best_label} "
                         f"| {ratio(best['epoch_seconds'], p['epoch_seconds'])} | {p['rows_per_epoch']:,.0f} "
                         f"| {ratio(none['rows_per_epoch'], p['rows_per_epoch'])} | {ratio(best['rows_per_epoch'], p['rows_per_epoch'])} "
                         f"| {fmt(p['test_acc'], '.3f')} | {fmt(none['test_acc'], '.3f')} |")
        lines.append("")
    s = results["simulator"]
    lines += ["## Simulator", "", f"Validation: `python -m rudder.simulate --validate` re-simulated all {s['runs']} runs above "
              f"({s['minibatches']} trainer-minibatches): {len(s['mismatches'])} differ (agent runs are checked by replaying "
              "their replacements).", ""]
    for m in s["mismatches"][:10]:
        lines.append(f"- {m}")
    scale = results.get("scale")
    if scale:
        lines += ["", "Scale (modelled; docs/simulator.md): remote rows per epoch (exact, simulated) and modelled epoch "
                  "seconds without and with overlap, on Perlmutter GPU nodes, 4 trainers per node.", "",
                  "| partitions | policy | rows/epoch | x none | x fixed | hits % | epoch s | x none | epoch s (overlap) | x none |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for parts, summ in scale.items():
            pol = summ["policies"]
            none = pol.get("none", {})
            for label, r in pol.items():
                lines.append(f"| {parts} | {label} | {r['rows_per_epoch']:,.0f} | {ratio(r['rows_per_epoch'], none.get('rows_per_epoch'))} "
                             f"| {ratio(r['rows_per_epoch'], pol.get('fixed', {}).get('rows_per_epoch'))} | {r['hit_percent']:.1f} "
                             f"| {fmt(r.get('epoch_seconds'), '.4f')} | {ratio(r.get('epoch_seconds'), none.get('epoch_seconds'))} "
                             f"| {fmt(r.get('epoch_seconds_overlap'), '.4f')} | {ratio(r.get('epoch_seconds_overlap'), none.get('epoch_seconds_overlap'))} |")
    if h.failed:
        lines += ["", "Failed runs: " + "; ".join(h.failed)]
    if h.not_run:
        lines += ["", f"Not run (budget of {results['budget_minutes']} min spent): " + ", ".join(h.not_run)]
    if results.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"`{os.path.relpath(p, REPO) if p.startswith(REPO) else p}`" for p in results["plots"])]
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
            r["runs"][label] = figures(fig["run"], r["parts"])
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


def machine_text() -> str:
    load = os.getloadavg()[0]
    return f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}, load {load:.2f} at end)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", required=True, help="a grid file (bench/grids/tiny.toml, full.toml, or your own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="directory for everything the harness makes")
    ap.add_argument("--budget-minutes", type=float, default=120.0)
    ap.add_argument("--publish", metavar="FILE", help="also copy results.md here (e.g. docs/results.md)")
    ap.add_argument("--no-validate", action="store_true", help="skip the simulator check of every run")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild results.md from --out's results.json and the runs' logs, running nothing")
    a = ap.parse_args(argv)
    command = "python bench/evaluate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        grid = load_grid(a.grid)
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    h = Harness(grid, a.out, a.seed, a.budget_minutes)
    if a.report_only:
        return rebuild_report(h, a.publish)
    datasets, skipped = resolve_datasets(grid)
    for s in skipped:
        h.say(f"dataset skipped: {s}")
    json.dump({"grid": grid, "seed": a.seed, "command": command}, open(os.path.join(h.out, "grid.json"), "w"), indent=1)
    t = time.time()
    results = {"seed": a.seed, "grid_file": os.path.abspath(a.grid), "skipped_datasets": skipped, "command": command,
               "budget_minutes": a.budget_minutes,
               "commit": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip() or "?"}
    results["grid"] = run_grid(h, datasets)
    results["distdgl"] = run_distdgl(h, datasets, results["grid"])
    results["simulator"] = ({"minibatches": 0, "runs": 0, "mismatches": [], "skipped": True} if a.no_validate
                            else validate_simulator(h, results["grid"]))
    results["scale"] = simulate_scale(h)
    results["plots"] = plots(h, results["grid"]["configs"])
    results["not_run"], results["failed"] = h.not_run, h.failed
    results["seconds"] = time.time() - t
    results["machine"] = machine_text()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_results(h, results, command, a.publish)
    h.say(f"done in {time.time() - t:.0f} s: {os.path.join(h.out, 'results.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
