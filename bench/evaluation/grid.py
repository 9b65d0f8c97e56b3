"""The grid file (``bench/grids/*.toml``): loading and checking it, the datasets present here,
the configurations it spans and the flags each policy runs with."""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import tomllib
import zlib

from bench.evaluation.sweep import SWEEP, check_sweep
from partitioning.partition import FEATURE_DTYPES
from rudder.sampling.phases import parse_shifts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(REPO, "..", "shared", "data")
SHARED_SPECS = {"shared:facebook": ("musae", "musae:{d}/musae:facebook", "musae/facebook_edges.csv"),
                "shared:cora": ("planetoid", "planetoid:{d}/planetoid:cora", "planetoid/ind.cora.graph"),
                "shared:citeseer": ("planetoid", "planetoid:{d}/planetoid:citeseer", "planetoid/ind.citeseer.graph")}
AGENT_POLICIES = ("heuristic", "classifier", "llm", "tuner")
FRACTION_FREE = ("none-serial", "none")  # no buffer: the same run at every fraction
BASE_POLICIES = ("none-serial", "none", "static", "fixed", "lookahead", *AGENT_POLICIES)
# Policy labels of their own, each (its policy, its flags): these, and a grid's [variants] table
# (label = { policy = "tuner", flags = ["--agent-buffer", "window"] }).
VARIANTS = {"static-vip": ("static", ["--buffer-init", "vip"])}


class GridError(Exception):
    pass


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
    grid["variants"] = {**VARIANTS, **check_variants(grid.get("variants", {}), path)}
    known = {*BASE_POLICIES, *grid["variants"]}
    bad = [p for p in g["policies"] if p not in known]
    if bad:
        raise GridError(f"--grid {path}: policy {bad[0]!r} is not one of {', '.join(sorted(known))}")
    g.setdefault("batch_sizes", [0])
    g.setdefault("fanouts", ["10,25"])
    grid.setdefault("epochs", 5)
    grid.setdefault("hidden", 16)
    repeats = grid.setdefault("repeats", 1)  # runs of every policy and setting; figures of the median one
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise GridError(f"--grid {path}: repeats must be a whole number of runs >= 1, not {repeats!r}")
    # the unshaped runs of one layout in one launch (drivers/train_jobs.py): start-up paid once per
    # layout; off by default, so each published run is a launch of its own, as a user runs it
    if not isinstance(grid.setdefault("share_launches", False), bool):
        raise GridError(f"--grid {path}: share_launches must be true or false, not {grid['share_launches']!r}")
    grid.setdefault("policy_flags", {})
    grid.setdefault("policy_ranks", {})
    check_network(grid.get("network"), path)
    why = check_sweep(grid)
    if why:
        raise GridError(f"--grid {path}: {why}")
    for name, entry in grid["datasets"].items():  # "spec", or {spec = "...", ranks = [...], batch_sizes = [...], ...}
        entry = {"spec": entry} if isinstance(entry, str) else dict(entry)
        if not isinstance(entry.get("spec"), str):
            raise GridError(f"--grid {path}: dataset {name!r} needs a spec string")
        extra = set(entry) - {"spec", "ranks", "batch_sizes", "fanouts", "rates", "feature_dtype", "shifts"}
        if extra:
            raise GridError(f"--grid {path}: dataset {name!r}: unknown key {sorted(extra)[0]!r} "
                            "(spec, ranks, batch_sizes, fanouts, rates, feature_dtype, shifts)")
        if entry.get("feature_dtype", "auto") not in FEATURE_DTYPES:
            raise GridError(f"--grid {path}: dataset {name!r}: feature_dtype must be one of {', '.join(FEATURE_DTYPES)}")
        if "rates" in entry:  # this dataset's own [network] rates
            if "network" not in grid:
                raise GridError(f"--grid {path}: dataset {name!r} has rates but the grid no [network] table")
            check_network({**grid["network"], "rates": entry["rates"]}, path)
        grid["datasets"][name] = entry
    check_shifts(grid, path)
    return grid


def check_variants(table, path: str) -> dict:
    """A grid's ``[variants]``, checked: {label: (policy, flags)}. A label names a run of its own
    (not a policy, a built-in variant or a sweep setting); its policy is one that takes a buffer
    fraction, the classifier excepted; flags are its extra drivers/train.py arguments."""
    if not isinstance(table, dict):
        raise GridError(f"--grid {path}: [variants] must be a table of label = {{ policy = ..., flags = [...] }}")
    # a variant takes a buffer fraction; no classifier: its model is trained mid-grid
    allowed = [p for p in BASE_POLICIES if p not in FRACTION_FREE and p != "classifier"]
    out = {}
    for label, entry in table.items():
        where = f"--grid {path}: [variants] {label!r}"
        if label in BASE_POLICIES or label in VARIANTS or label.startswith(SWEEP) or not re.fullmatch(r"[a-z][a-z0-9-]*", label):
            raise GridError(f"{where}: a label of lowercase letters, digits and dashes that names no policy, "
                            f"built-in variant ({', '.join(VARIANTS)}) or sweep run ({SWEEP}...)")
        if not isinstance(entry, dict) or set(entry) - {"policy", "flags"}:
            raise GridError(f"{where}: must be {{ policy = ..., flags = [...] }}")
        policy, flags = entry.get("policy"), entry.get("flags", [])
        if policy not in allowed:
            raise GridError(f"{where}: policy must be one of {', '.join(allowed)}")
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise GridError(f"{where}: flags must be a list of strings")
        out[label] = (policy, list(flags))
    return out


def resolve_label(grid: dict, label: str) -> tuple[str, list[str]]:
    """(the policy run ``label`` trains with, the variant's flags): a variant's own, else the label
    itself and no flags."""
    return grid["variants"].get(label, (label, []))


def steered(grid: dict, label: str) -> bool:
    """Whether run ``label`` is steered by an agent rank (an agent policy or a variant of one)."""
    return resolve_label(grid, label)[0] in AGENT_POLICIES


def check_shifts(grid: dict, path: str) -> None:
    """``shifts``: a list of ``--shift`` values ("" for the steady run), in [grid] or a dataset's
    entry (which replaces the grid's); each configuration runs once per shift (docs/training.md)."""
    grid["grid"].setdefault("shifts", [""])
    for where, table in [("[grid]", grid["grid"])] + [(f"dataset {n!r}", e) for n, e in grid["datasets"].items()]:
        shifts = table.get("shifts", [""])
        if not isinstance(shifts, list) or not shifts or not all(isinstance(t, str) for t in shifts):
            raise GridError(f"--grid {path}: {where} shifts must be a non-empty list of --shift strings (\"\": none)")
        for text in filter(None, shifts):
            try:
                parse_shifts(text)
            except ValueError as e:
                raise GridError(f"--grid {path}: {where} shift {text!r}: {e}") from None
            if max(p.epoch for p in parse_shifts(text)) >= grid["epochs"]:
                raise GridError(f"--grid {path}: {where} shift {text!r}: an epoch past the grid's {grid['epochs']} epochs")


def shift_key(shift: str) -> str:
    """A configuration name's part for its shift: "2:fanouts=5,5;seeds=0.5" -> "-s2-fanouts5_5-seeds0.5"."""
    if not shift:
        return ""
    return "-s" + shift.replace(":", "-").replace(";", "-").replace("=", "").replace(",", "_").replace(" ", "+")


def shift_flags(shift: str) -> list[str]:
    return ["--shift", shift] if shift else []


RATE = re.compile(r"[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)")


def check_network(net: dict | None, path: str) -> None:
    """[network]: rates = ["1gbit", ...] ("none": unshaped), links = ["shared"|"per-node", ...],
    congestion = ["none" | a netem profile, ...]."""
    if net is None:
        return
    extra = set(net) - {"rates", "links", "congestion"}
    if extra:
        raise GridError(f"--grid {path}: [network] unknown key {sorted(extra)[0]!r} (rates, links, congestion)")
    rates = net.get("rates")
    if not isinstance(rates, list) or not rates or not all(r == "none" or RATE.fullmatch(str(r)) for r in rates):
        raise GridError(f"--grid {path}: [network] rates must be a list of tc rates like \"1gbit\" or \"none\"")
    links = net.get("links", ["shared"])
    if not isinstance(links, list) or not links or not set(links) <= {"shared", "per-node"}:
        raise GridError(f"--grid {path}: [network] links must be a list of \"shared\" and \"per-node\"")
    if not isinstance(net.get("congestion", ["none"]), list):
        raise GridError(f"--grid {path}: [network] congestion must be a list of profiles (or \"none\")")


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
class Network:
    """The shaping a configuration's jobs run under (``python -m rudder.netem``, docs/network.md)."""
    rate: str  # tc rate, e.g. "1gbit"
    links: str  # shared | per-node
    congestion: str = "none"  # a netem --congestion profile, or none

    @property
    def key(self) -> str:
        congestion = "" if self.congestion == "none" else f"-c{zlib.crc32(self.congestion.encode()):08x}"
        return f"r{self.rate}-{self.links}{congestion}"

    def describe(self) -> str:
        links = "one link shared by every rank" if self.links == "shared" else "a link per emulated node"
        return f"{self.rate}, {links}" + ("" if self.congestion == "none" else f", competing flow {self.congestion}")

    def wrapper(self, nodes: int, stats: str, links: str | None = None) -> list[str]:
        """The netem command line a job runs behind (``links``: another topology, e.g. for DistDGL)."""
        cmd = [sys.executable, "-m", "rudder.netem", "--rate", self.rate, "--links", links or self.links,
               "--nodes", str(nodes), "--stats", stats]
        return cmd + (["--congestion", self.congestion] if self.congestion != "none" else []) + ["--"]


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str
    ranks: int
    batch_size: int
    fanouts: str
    network: Network | None = None  # None: unshaped (loopback)
    shift: str = ""  # a --shift value ("": steady)

    @property
    def key(self) -> str:
        key = f"{self.dataset}-p{self.ranks}-b{self.batch_size or 'auto'}-f{self.fanouts.replace(',', '_')}"
        return key + shift_key(self.shift) + (f"-{self.network.key}" if self.network else "")


def networks(grid: dict, dataset: str | None = None) -> list[Network | None]:
    """The [network] table's shapings (rates x links x congestion profiles; ``dataset``'s own rates
    where it has them); [None] without one. A rate of "none" is the unshaped run."""
    net = grid.get("network")
    if not net:
        return [None]
    rates = grid["datasets"][dataset].get("rates", net["rates"]) if dataset else net["rates"]
    return [None if rate == "none" else Network(rate, links, congestion)
            for rate in rates for links in net.get("links", ["shared"]) for congestion in net.get("congestion", ["none"])
            if rate != "none" or (links, congestion) == (net.get("links", ["shared"])[0], net.get("congestion", ["none"])[0])]


def configurations(grid: dict, datasets: dict) -> list[Config]:
    """The cartesian grid, each dataset's own ranks, batch sizes or fanouts replacing the grid's,
    under each network of the [network] table."""
    out = []
    for d in datasets:
        axis = {k: grid["datasets"][d].get(k, grid["grid"][k]) for k in ("ranks", "batch_sizes", "fanouts", "shifts")}
        out += [Config(d, int(r), int(b), str(f), n, s) for r in axis["ranks"] for b in axis["batch_sizes"]
                for f in axis["fanouts"] for s in axis["shifts"] for n in networks(grid, d)]
    return out


def policy_flags(grid: dict, label: str, fraction: float | None, classifier_model: str | None) -> list[str]:
    """The drivers/train.py flags of run ``label`` (a policy or a variant of ``grid``) at ``fraction``."""
    if label == "none-serial":
        return ["--policy", "none", "--no-overlap"]
    policy, variant = resolve_label(grid, label)
    flags = ["--policy", policy, *variant]
    if fraction is not None:
        flags += ["--buffer-fraction", str(fraction)]
    if policy == "fixed":
        flags += ["--collect-traces"]
    if policy == "lookahead":
        flags += ["--trace"]  # for the MIN bound in the analysis
    if policy == "classifier":
        flags += ["--classifier-model", classifier_model]
    return flags
