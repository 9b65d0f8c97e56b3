"""Running the grid: every policy's training job on every configuration (reused when it already
finished with the same flags and code) and, for a shaped one, its compute-only run on one node
(for its floor), the figures the report shows of each run, the classifiers
trained in between, the DistDGL peer, the simulator checked against every run and pushed to
partition counts beyond this machine."""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from bench import distdgl_peer
from bench.evaluation.floor import floor
from bench.evaluation.grid import FRACTION_FREE, REPO, Network, configurations, policy_flags, shift_flags, steered
from bench.evaluation.sweep import settings
from bench.mpi_job import train_job, train_jobs
from partitioning.partition import partition_graph
from partitioning.sources import load_spec
from rudder.agent import classifier_training
from rudder.agent.deciders.classifier import MODELS, ClassifierError
from rudder.analysis.decisions import decision_quality, fallback_counts
from rudder.analysis.summary import summarize
from rudder.data.partition_store import METADATA_FILE, PartitionFormatError, PartitionMeta
from rudder.logs import metrics
from rudder.logs.reader import load_run
from rudder.sim.validate import validate


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

    def partition(self, name: str, spec: str, parts: int, feature_dtype: str = "auto") -> str:
        """``spec`` in ``parts`` partitions, its features stored as ``feature_dtype`` (the partition
        tool's choice with ``auto``; a directory of its own otherwise), reused when already there."""
        out = os.path.join(self.out, "parts", f"{name}-{parts}" if feature_dtype == "auto" else f"{name}-{feature_dtype}-{parts}")
        try:
            meta = PartitionMeta.load(out)
            with open(os.path.join(out, METADATA_FILE)) as f:
                chosen = json.load(f).get("feature_dtype")
            if (meta.num_parts == parts and meta.source == spec and meta.seed == self.seed
                    and feature_dtype in ("auto", chosen)):
                return out
        except PartitionFormatError:
            pass
        t = time.time()
        partition_graph(load_spec(spec), parts, out, method="metis", seed=self.seed, force=True, feature_dtype=feature_dtype)
        self.say(f"partitioned {name} into {parts} ({time.time() - t:.0f} s)")
        return out

    def train_all(self, runs: list[Run]) -> dict[str, str | None]:
        """Each run a drivers/train.py job, reused when it already finished with the same flags,
        network and code: {run directory: itself once finished, None if it failed or was not run}.
        With the grid's ``share_launches``, the unshaped runs of one layout (trainers and nodes)
        run one after another in one launch (drivers/train_jobs.py; where some are steered, the
        others run on the trainer slots while the agents sit them out): start-up is paid once per
        layout, not once per run. A launch that fails runs its unfinished runs again, one launch
        each, so a failure is the failing run's alone."""
        done: dict[str, str | None] = {}
        groups: dict = {}
        for run in runs:
            job = self.job(run)
            if os.path.exists(job.stamp) and json.load(open(job.stamp)) == job.record:
                done[run.run_dir] = run.run_dir
            elif self.out_of_time(os.path.relpath(run.run_dir, self.out)):
                done[run.run_dir] = None
            else:
                shared = self.grid["share_launches"] and run.network is None
                groups.setdefault((run.trainers, job.nodes) if shared else run.run_dir, []).append(job)
        for group in groups.values():
            while len(group) > 1:
                finished, error = self.launch_shared(group)
                done.update({job.run.run_dir: job.run.run_dir for job in group[:finished]})
                group = group[finished:]
                if error:
                    self.say(f"a shared launch stopped after {finished} runs; the other {len(group)} run one launch each")
                    break
            for job in group:
                done[job.run.run_dir] = self.launch_alone(job)
        return done

    def job(self, run: Run) -> Job:
        nodes = run.nodes or run.trainers
        agents = nodes if steered(self.grid, run.policy) else 0
        argv = ["--epochs", str(self.grid["epochs"]), "--hidden", str(self.grid["hidden"]), "--seed", str(self.seed),
                *run.flags, *self.grid["policy_flags"].get(run.policy, [])]
        record = {"parts": run.parts, "ranks": run.trainers + agents, "cliques": nodes, "argv": argv, "code": self.code}
        if run.network is not None:
            record["network"] = dataclasses.asdict(run.network)
        return Job(run, argv, agents, nodes, record, os.path.join(run.run_dir, "harness.json"))

    def launch_alone(self, job: Job) -> str | None:
        run, t = job.run, time.time()
        try:
            os.makedirs(run.run_dir, exist_ok=True)  # the network's --stats land there
            wrapper = run.network.wrapper(job.nodes, os.path.join(run.run_dir, "netem.json")) if run.network else ()
            train_job(run.parts, run.run_dir, run.trainers + job.agents, job.nodes, job.argv, wrapper)
        except SystemExit as e:  # train_job's way of failing: keep going, and say so in the results
            self.failed.append(f"{os.path.relpath(run.run_dir, self.out)}: {str(e).strip().splitlines()[-1][:200]}")
            self.say(f"FAILED {self.failed[-1]}")
            return None
        json.dump(job.record, open(job.stamp, "w"))
        self.say(f"ran {os.path.relpath(run.run_dir, self.out)} ({time.time() - t:.0f} s)")
        return run.run_dir

    def launch_shared(self, group: list[Job]) -> tuple[int, str]:
        """The jobs of one layout in one launch: (how many finished, the error if one failed)."""
        t, agents = time.time(), max(job.agents for job in group)
        for job in group:
            os.makedirs(job.run.run_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.out) as work:
            finished, error = train_jobs([(job.run.parts, job.run.run_dir, job.argv, agents > job.agents) for job in group],
                                         group[0].run.trainers + agents, group[0].nodes, work)
        for job in group[:finished]:
            json.dump(job.record, open(job.stamp, "w"))
            self.say(f"ran {os.path.relpath(job.run.run_dir, self.out)} (in a launch of {len(group)} runs, "
                     f"{time.time() - t:.0f} s for them all)")
        return finished, error


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the grid: its partitions, run directory, trainers, policy label and
    flags, shaped network (None: unshaped) and emulated nodes (None: a node a trainer)."""
    parts: str
    run_dir: str
    trainers: int
    policy: str
    flags: tuple
    network: Network | None = None
    nodes: int | None = None


@dataclasses.dataclass(frozen=True)
class Job:
    """A run as launched: its drivers/train.py arguments, agent ranks, nodes, and the record its
    stamp (``harness.json``) holds once it finished, which a rerun compares to reuse it."""
    run: Run
    argv: list
    agents: int
    nodes: int
    record: dict
    stamp: str


# Options that record or report a run without changing what it does: runs equal in every other
# option are one setting run twice (the oracle states their spread as the noise of one run)
BOOKKEEPING = ("run_dir", "trace", "collect_traces", "progress", "overwrite", "log_flush_seconds")


def setting_of(config: dict) -> str:
    """A short key of what a run does: equal keys, the same setting."""
    doing = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    return hashlib.sha256(json.dumps(doing, sort_keys=True, default=str).encode()).hexdigest()[:16]


def figures(run_dir: str, data_dir: str) -> dict:
    """What the results tables show of one run: remote rows fetched per epoch (all trainers) and
    the epoch time with the spread of the steady epochs it came from, as ``rudder.logs.metrics``
    defines them (the DistDGL peer's over the same epochs), and the analysis tool's hit %, accuracy
    and decision figures."""
    run = load_run(run_dir)
    s = summarize(run, data_dir)
    wait, mean = s["time_breakdown"]["t_wait"], s["epochs"]["mean_seconds"]
    row = {"run": os.path.abspath(run_dir), "rows_per_epoch": s["traffic"]["remote_rows_fetched_per_epoch"],
           "wait_share": wait / mean if wait is not None and mean else None,
           "epoch_seconds": s["epochs"]["median_seconds"], "steady_epochs": s["epochs"]["steady"],
           "epoch_spread": [s["epochs"]["min_seconds"], s["epochs"]["max_seconds"]],
           "hit_percent": s["buffer"]["hit_percent"],
           "test_acc": s["accuracy"]["test"], "over_min": (s.get("bound") or {}).get("achieved_over_min"),
           # every epoch's rows, for the bound: MIN is least over the whole run, not over the steady epochs
           "rows_all_epochs": sum(int(metrics.remote_rows_fetched(r.minibatches).sum()) for r in run.ranks),
           "min_rows": (s.get("bound") or {}).get("min_rows"), "setting": setting_of(run.config)}
    if run.agents:
        q = decision_quality(run)
        reasons = fallback_counts(run)
        # a decision cut off because its trainer had finished is not the decider's fault
        invalid = sum(n for reason, n in reasons.items() if reason != "trainer_finished")
        row["decisions"] = {"count": q["count"], "answered": q["count"] - sum(reasons.values()), "evict": q["evict"],
                            "latency_mean": q["latency_mean"], "latency_p50": q["latency_p50"],
                            # each Pass@1 as its share, and with its 95% interval and count
                            **{f"pass_at_1_{m}": q[f"pass_at_1_{m}"]["value"] for m in ("hitrate", "comm", "wait")},
                            "pass_at_1": {m: q[f"pass_at_1_{m}"] for m in ("hitrate", "comm", "wait")},
                            "invalid_rate": invalid / q["count"] if q["count"] else None, "fallbacks": reasons}
    return row


def repeated(run_dir: str, repeats: int) -> list[str]:
    """The directories of a run repeated ``repeats`` times: its own, then ``<run_dir>.rep2``, ..."""
    return [run_dir] + [f"{run_dir}.rep{k}" for k in range(2, repeats + 1)]


def round_of(run_dir: str) -> int:
    """The round (1, 2, ...) of a directory that ``repeated`` named."""
    head, _, k = run_dir.rpartition(".rep")
    return int(k) if head and k.isdigit() else 1


def median_figures(run_dirs: list[str], data_dir: str) -> dict:
    """``figures`` of one setting run once or more: those of the run with the median epoch time
    (the lower one of an even count), so every figure comes from one real run; with more than one,
    ``repeats`` holds every run and its epoch time (their spread is the noise of a single run)."""
    figs = [figures(d, data_dir) for d in run_dirs]
    if len(figs) == 1:
        return figs[0]
    by_time = sorted(range(len(figs)), key=lambda i: (figs[i]["epoch_seconds"] is None, figs[i]["epoch_seconds"] or 0.0))
    median = dict(figs[by_time[(len(figs) - 1) // 2]])
    median["repeats"] = {"runs": [f["run"] for f in figs], "rounds": [round_of(d) for d in run_dirs],
                         "epoch_seconds": [f["epoch_seconds"] for f in figs]}
    return median


def run_grid(h: Harness, datasets: dict) -> dict:
    """Every policy on every configuration, then the [oracle] sweep, in rounds of the grid's
    ``repeats`` (so a drift of the host's speed spreads over every setting, not over one setting's
    repetitions); the classifiers after (trained on the seen datasets' fixed runs before any
    classifier run)."""
    g = h.grid["grid"]
    policies = g["policies"]
    results: dict = {}
    parts_of = {}
    for cfg in configurations(h.grid, datasets):
        parts_of[cfg] = h.partition(cfg.dataset, datasets[cfg.dataset], cfg.ranks,
                                    h.grid["datasets"][cfg.dataset].get("feature_dtype", "auto"))
    base = lambda cfg: [*(["--batch-size", str(cfg.batch_size)] if cfg.batch_size else []), "--fanouts", cfg.fanouts,  # noqa: E731
                        *shift_flags(cfg.shift)]
    finished: dict = {}  # (configuration, label): the run directories that finished, in order
    compute_only: dict = {}  # (configuration, label): its compute-only run, for the floor
    queued: list = []  # ((configuration, label), its run, the shaped run whose floor it is or None)

    def train(cfg, label, name, flags, rep) -> None:
        run_dir = repeated(os.path.join(h.out, "runs", cfg.key, label), h.grid["repeats"])[rep]
        queued.append(((cfg, label), Run(parts_of[cfg], run_dir, cfg.ranks, name, tuple(flags), cfg.network), None))

    def run(cfg, policy, fraction, model=None, rep=0):
        if cfg.ranks not in h.grid["policy_ranks"].get(policy, [cfg.ranks]):
            return
        label = policy if fraction is None else f"{policy}-f{fraction}"
        flags = [*base(cfg), *policy_flags(h.grid, policy, fraction, model)]
        train(cfg, label, policy, flags, rep)
        if cfg.network and rep == 0:
            # its floor needs its compute-only run (once): unshaped, every partition on one node
            plain = dataclasses.replace(cfg, network=None)
            alone = Run(parts_of[cfg], os.path.join(h.out, "runs", f"{plain.key}-1node", label), cfg.ranks, policy,
                        tuple(flags), nodes=1)
            queued.append(((cfg, label), alone, queued[-1][1].run_dir))

    def launch():
        """The queued runs (those of one layout in one launch where the grid shares launches)."""
        done = h.train_all([r for _, r, _ in queued])
        for key, r, shaped in queued:
            if done[r.run_dir] and shaped is None:
                finished.setdefault(key, []).append(r.run_dir)
            elif done[r.run_dir] and done[shaped]:
                compute_only[key] = r.run_dir
        queued.clear()

    def collect():
        """Each finished setting's figures, once: its median run's, with its floor."""
        for (cfg, label), dirs in finished.items():
            runs = results.setdefault(cfg.key, {"config": dataclasses.asdict(cfg), "parts": parts_of[cfg], "runs": {}})["runs"]
            if label in runs:  # collected before the classifier runs
                continue
            fig = runs[label] = median_figures(dirs, parts_of[cfg])
            if (cfg, label) in compute_only:
                fig["floor"] = floor(fig["run"], compute_only[(cfg, label)], cfg.network.links)

    for rep in range(h.grid["repeats"]):
        for cfg in configurations(h.grid, datasets):  # every policy but the classifier first
            for policy in (p for p in policies if p in FRACTION_FREE):
                run(cfg, policy, None, rep=rep)
            for fraction in g["fractions"]:
                for policy in (p for p in policies if p not in FRACTION_FREE and p != "classifier"):
                    run(cfg, policy, fraction, rep=rep)
        for cfg in configurations(h.grid, datasets):  # the [oracle] sweep, once every policy ran (no floor:
            for fraction in g["fractions"]:  # the oracle compares epoch times)
                for setting in settings(h.grid):
                    train(cfg, setting.label(fraction), setting.name, [*base(cfg), *setting.flags(fraction)], rep)
        launch()
    collect()
    classifiers = None
    if "classifier" in policies:
        classifiers = train_classifiers(h, results)
        if classifiers.get("model"):
            for rep in range(h.grid["repeats"]):
                for cfg in configurations(h.grid, datasets):
                    for fraction in g["fractions"]:
                        run(cfg, "classifier", fraction, classifiers["model"], rep)
                launch()
            collect()
    return {"configs": results, "classifiers": classifiers}


def train_classifiers(h: Harness, results: dict) -> dict:
    """Train on the seen datasets' collection (fixed) runs; score on held-out seen rows and on
    every unseen dataset's rows."""
    seen_names = set(h.grid.get("classifier", {}).get("seen", []))
    kind = h.grid.get("classifier", {}).get("model", "xgb")
    seen, unseen = [], []
    for r in results.values():
        for label, fig in r["runs"].items():
            if label.startswith("fixed-"):
                (seen if r["config"]["dataset"] in seen_names else unseen).append(fig["run"])
    out = os.path.join(h.out, "classifiers")
    if not seen:
        h.say("classifiers: no fixed run of a seen dataset; classifier runs skipped")
        return {"error": "no collection runs of the seen datasets"}
    try:
        report = classifier_training.train(seen, out, list(MODELS), seed=h.seed)
    except ClassifierError as e:
        h.say(f"classifiers not trained: {e}")
        return {"error": str(e)}
    result = {"seen_datasets": sorted(seen_names), "model": os.path.join(out, MODELS[kind]), "kind": kind,
              "seen": {k: v["test_accuracy"] for k, v in report["models"].items()}, "seen_rows": report["rows"],
              "unseen": None, "unseen_rows": 0}
    if unseen:
        ev = classifier_training.evaluate(out, unseen)
        result["unseen"] = {k: v["accuracy"] for k, v in ev["models"].items()}
        result["unseen_rows"] = ev["rows"]
    h.say(f"classifiers trained on {report['rows']} rows of {', '.join(sorted(seen_names))}; runtime model {kind}")
    return result


def run_distdgl(h: Harness, datasets: dict, grid_results: dict) -> dict:
    """DistDGL on the same partitions and hyperparameters as our runs of the chosen configs."""

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
        if c.get("shift"):  # the peer trains steady runs only
            continue
        none = r["runs"].get("none")
        if none is None:
            continue
        ours = load_run(none["run"])
        batch = ours.ranks[0].run["batch_size"]
        t = time.time()
        run_dir = os.path.join(h.out, "distdgl", key, "run")
        flags = {"epochs": h.grid["epochs"], "batch_size": batch, "fanouts": c["fanouts"], "hidden": h.grid["hidden"],
                 "lr": ours.config["lr"], "dropout": ours.config["dropout"], "seed": h.seed, "parts": r["parts"]}
        # under the configuration's rate, on the shared link: DistDGL's launcher is not mpiexec, so
        # its processes cannot be moved into per-node namespaces (docs/network.md)
        network = Network(**c["network"]) if c.get("network") else None
        wrapper = network.wrapper(c["ranks"], os.path.join(run_dir, "netem.json"), links="shared") if network else []
        os.makedirs(run_dir, exist_ok=True)
        stamp = os.path.join(run_dir, "harness.json")
        if os.path.exists(stamp) and json.load(open(stamp)) == {**flags, "wrapper": wrapper}:
            s = json.load(open(os.path.join(run_dir, "summary.json")))
        elif h.out_of_time(f"distdgl/{key}"):
            continue
        else:
            try:
                config = distdgl_peer.prepare(r["parts"], os.path.join(h.out, "distdgl", key, "parts"))
                s = distdgl_peer.run(config, c["ranks"], run_dir, wrapper=wrapper,
                                     **{k: v for k, v in flags.items() if k != "parts"})
            except RuntimeError as e:
                h.say(f"DistDGL {key}: {e}")
                out[key] = {"error": str(e)}
                continue
            json.dump({**flags, "wrapper": wrapper}, open(stamp, "w"))
            h.say(f"ran DistDGL {key} ({time.time() - t:.0f} s)")
        # the peer's epoch time as ours is defined: its slowest trainer per epoch, the median over
        # the same steady epochs as our runs with a pipeline one epoch deep (its own loader
        # prefetches within an epoch; whether across epochs is not known, so its last is dropped too)
        seconds = [e["time_max"] for e in metrics.timed_epochs(s["per_epoch"])]
        out[key] = {"epoch_seconds": metrics.epoch_time(seconds), "epoch_spread": metrics.spread(seconds),
                    "steady_epochs": metrics.steady_text(list(range(len(s["per_epoch"])))),
                    "rows_per_epoch": s["remote_rows_per_epoch"],
                    "test_acc": s["test_acc"], "batch_size": batch, "run": run_dir}
    return out


def validate_simulator(h: Harness, grid_results: dict) -> dict:
    """``python -m rudder.simulate --validate`` on every run: rows must match exactly."""
    checked, mismatched = 0, []
    for r in grid_results["configs"].values():
        for fig in r["runs"].values():
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
        argv = ["--data", data, "--epochs", str(spec.get("epochs", 3)),
                "--policies", spec.get("policies", "none,static,fixed,lookahead,heuristic"),
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


def run_all(h: Harness, datasets: dict, validate: bool) -> dict:
    """The grid, the DistDGL peer, the simulator's check of every run (unless not ``validate``)
    and its scale runs, in that order: results.json's grid, distdgl, simulator and scale."""
    grid = run_grid(h, datasets)
    distdgl = run_distdgl(h, datasets, grid)
    simulator = validate_simulator(h, grid) if validate else {"minibatches": 0, "runs": 0, "mismatches": [], "skipped": True}
    return {"grid": grid, "distdgl": distdgl, "simulator": simulator, "scale": simulate_scale(h)}


def commit_text() -> str:
    """The short hash of the repository's HEAD, or "?"."""
    git = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return git.stdout.strip() or "?"


def machine_text(load_at_start: float | None = None) -> str:
    """The host, its cores and its load average (1 min) at the start, if given, and at the end."""
    start = "" if load_at_start is None else f"{load_at_start:.2f} at start, "
    return (f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"load {start}{os.getloadavg()[0]:.2f} at end)")
