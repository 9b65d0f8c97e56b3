"""Reading a run directory's logs: one reader for analysis, the evaluation harness, the
simulator's validation, ``--policy replay`` and the tests.

A killed run (missing ranks, a rank still "running", an unreadable file) is read with warnings
naming what is missing; a directory without logs or a log of another format is a one-line
``LogError``. Tables written by an older version come back with the current columns
(``rudder.logs.schema.upgrade``).
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

import numpy as np

from rudder.logs.schema import (
    AGENT,
    AGENT_RAGGED,
    AGENT_TABLES,
    CLASSIFIER_TRACE_ROW,
    FORMAT_NAME,
    FORMAT_VERSION,
    TRACE,
    TRAINER,
    TRAINER_TABLES,
    upgrade,
)
from rudder.logs.writer import log_path, open_log


class LogError(Exception):
    """A path that is not a run directory, or a log this version cannot read (one line)."""


@dataclass
class RankLog:
    rank: int
    path: str
    role: str  # TRAINER or AGENT
    status: str  # running | completed | interrupted | failed
    error: str
    attrs: dict  # every attribute, JSON ones parsed
    tables: dict[str, np.ndarray]  # minibatches, epochs[, classifier_trace] | decisions, outcomes
    trace: list[np.ndarray] | None = None  # trainers run with --trace: remote input IDs per minibatch
    texts: dict[str, list[str]] = field(default_factory=dict)  # agents: prompt, answer, fallback_reason per decision

    @property
    def config(self) -> dict:
        return self.attrs["config"]

    @property
    def layout(self) -> dict:
        return self.attrs["layout"]

    @property
    def run(self) -> dict:
        return self.attrs["run"]

    @property
    def minibatches(self) -> np.ndarray | None:
        return self.tables.get("minibatches")

    @property
    def epochs(self) -> np.ndarray | None:
        return self.tables.get("epochs")

    @property
    def classifier_trace(self) -> np.ndarray | None:
        return self.tables.get("classifier_trace")

    @property
    def decisions(self) -> np.ndarray | None:
        return self.tables.get("decisions")

    @property
    def outcomes(self) -> np.ndarray | None:
        return self.tables.get("outcomes")


@dataclass
class Run:
    path: str
    ranks: list[RankLog]  # trainers
    warnings: list[str] = field(default_factory=list)
    agents: list[RankLog] = field(default_factory=list)

    @property
    def config(self) -> dict:
        return self.ranks[0].config


JSON_ATTRS = ("config", "versions", "layout", "run", "data", "resumed")


def _attrs(f) -> dict:
    out = {}
    for k, v in f.attrs.items():
        v = v.decode() if isinstance(v, bytes) else v
        out[k] = json.loads(v) if k in JSON_ATTRS and isinstance(v, str) and v else v
    return out


def _texts(f, name: str) -> list[str]:
    offsets, text = f[f"{name}/offsets"][()], f[f"{name}/values"][()].tobytes()
    return [text[i:j].decode(errors="replace") for i, j in zip(offsets[:-1], offsets[1:])]


def read_rank(path: str) -> RankLog:
    """One rank's log, read into memory and closed again (without HDF5's file lock, as a live log must be)."""
    with open_log(path) as f:
        a = f.attrs
        if a.get("format") != FORMAT_NAME:
            raise LogError(f"{path}: not a Rudder run log (format {a.get('format')!r})")
        if int(a.get("format_version", -1)) != FORMAT_VERSION:
            raise LogError(f"{path}: run log version {a.get('format_version')} is not supported "
                           f"(this version reads {FORMAT_VERSION})")
        attrs = _attrs(f)
        role = attrs.get("role", TRAINER)
        schema = AGENT_TABLES if role == AGENT else {**TRAINER_TABLES, "classifier_trace": CLASSIFIER_TRACE_ROW}
        tables = {name: upgrade(f[name][()], dtype) for name, dtype in schema.items() if name in f}
        log = RankLog(attrs["layout"]["world_rank"], path, role, str(attrs["status"]), str(attrs["error"]), attrs, tables)
        if role == AGENT:
            log.texts = {name: _texts(f, name) for name in AGENT_RAGGED if name in f}
        elif TRACE in f:
            offsets, values = f[f"{TRACE}/offsets"][()], f[f"{TRACE}/values"][()]
            log.trace = [values[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)]
        return log


def log_files(path: str) -> list[str]:
    if not os.path.isdir(path):
        raise LogError(f"{path}: not a directory")
    files = sorted(glob.glob(os.path.join(path, "rank-*.h5")))
    if not files:
        raise LogError(f"{path}: no rank-NNNNN.h5 logs here (not a run directory of drivers/train.py)")
    return files


def load_run(path: str) -> Run:
    files = log_files(path)
    ranks, warnings = [], []
    for p in files:
        try:
            ranks.append(read_rank(p))
        except LogError:
            raise
        except (OSError, KeyError, ValueError) as e:
            warnings.append(f"{os.path.basename(p)}: unreadable, left out ({str(e).splitlines()[0][:120]})")
    agents = [r for r in ranks if r.role == AGENT]
    ranks = [r for r in ranks if r.role != AGENT]
    if not ranks:
        raise LogError(f"{path}: none of the {len(files)} rank logs is a readable trainer log")
    world = ranks[0].layout["world_size"]
    missing = sorted(set(range(world)) - {r.rank for r in ranks + agents})
    if missing:
        warnings.append(f"ranks {', '.join(map(str, missing))} of {world} missing: figures cover {len(ranks)} ranks")
    for r in sorted(ranks + agents, key=lambda r: r.rank):
        if r.status != "completed":
            warnings.append(f"rank {r.rank}: status {r.status}" + (f" ({r.error})" if r.error else
                            " (the job was killed or is still running)"))
    return Run(path, ranks, warnings, agents)


def trainer_world_rank(trainer_rank: int, agent_ranks) -> int:
    """The world rank of trainer ``trainer_rank`` in a job whose agents had ``agent_ranks``: the
    trainers are the other world ranks, in order."""
    world = trainer_rank
    for agent in sorted(agent_ranks):
        world += agent <= world
    return world


def _layout_of(name: str, trainer_rank: int) -> dict:
    """The layout record of the log ``name``, opened for trainer ``trainer_rank``: a missing or
    foreign file is a one-line LogError naming it."""
    if not os.path.isfile(name):
        raise LogError(f"{name}: missing (trainer {trainer_rank}'s log would be there)")
    try:
        with open_log(name) as f:
            if f.attrs.get("format") != FORMAT_NAME:
                raise LogError(f"{name}: not a Rudder run log (format {f.attrs.get('format')!r})")
            return json.loads(f.attrs["layout"])
    except (OSError, KeyError, ValueError) as e:
        raise LogError(f"{name}: unreadable ({str(e).splitlines()[0][:120]})") from None


def _is_trainer(layout: dict, trainer_rank: int) -> bool:
    return not layout.get("is_agent") and layout["trainer_rank"] == trainer_rank


def trainer_log_path(path: str, trainer_rank: int) -> str:
    """The log file of trainer ``trainer_rank`` of the run in ``path``, found by opening that file
    alone (``rank-NNNNN.h5`` of its world rank; one more open where agent ranks came before it in
    the world), not by scanning the run: every trainer of a ``--policy replay`` job looks for its
    own, which a scan makes P^2 opens on the shared file system. Only a log written before layouts
    named their ``agent_ranks`` is looked for by a scan."""
    if not os.path.isdir(path):
        raise LogError(f"{path}: not a directory")
    name = log_path(path, trainer_rank)  # its world rank when no agent came before it
    layout = _layout_of(name, trainer_rank)
    if "agent_ranks" in layout:
        world = trainer_world_rank(trainer_rank, layout["agent_ranks"])
        if world != trainer_rank:
            name = log_path(path, world)
            layout = _layout_of(name, trainer_rank)
    elif not _is_trainer(layout, trainer_rank):
        for other in log_files(path):
            if _is_trainer(_layout_of(other, trainer_rank), trainer_rank):
                return other
    if not _is_trainer(layout, trainer_rank):
        whose = "an agent's" if layout.get("is_agent") else f"trainer {layout['trainer_rank']}'s"
        raise LogError(f"{name}: {whose} log, not trainer {trainer_rank}'s (a run with fewer trainers?)")
    return name


def trainer_table(path: str, trainer_rank: int) -> tuple[dict, np.ndarray]:
    """One trainer's run record and minibatch table, from its own log alone (what ``--policy
    replay`` needs on every trainer)."""
    name = trainer_log_path(path, trainer_rank)
    try:
        with open_log(name) as f:
            return json.loads(f.attrs["run"]), upgrade(f["minibatches"][()], TRAINER_TABLES["minibatches"])
    except (OSError, KeyError, ValueError) as e:
        raise LogError(f"{name}: unreadable ({str(e).splitlines()[0][:120]})") from None
