"""A run log killed at random moments, then resumed and read: how often each step fails.

A forked child writes an agent's log (``AGENT_TABLES`` and the compressed ``AGENT_RAGGED`` texts,
pieces of up to ``--piece`` bytes) and flushes after every few rows, in a tight loop, reporting
each flush as it starts and its row counts as it ends; the parent SIGKILLs it after a random
delay (most of a child's time is spent inside a flush). The parent then reads the killed log
with ``rudder.logs.reader.read_rank``:

    unopenable   read_rank raises
    lost         it reads, but a row of the last flush the child finished is missing or differs

``--generations G``: G children in turn on one log, each after the first reopening it with
``resume_rows`` set to the counts of a flush its predecessor finished (picked at random: what a
checkpoint could hold), and killed likewise (inside the reopen too). Then the parent resumes the
log in the same way, appends and flushes more rows and closes it; the resume's first failure:

    reopen       RunLog(..., resume_rows=...) raises
    flush        a flush (or the close) after the reopen raises
    unreadable   the resumed log does not read (read_rank raises)
    wrong        it reads, but not as the kept rows and the new ones

    python bench/log_kills.py [--kills 300] [--generations 1] [--piece 20000] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from rudder.logs.reader import read_rank  # noqa: E402
from rudder.logs.schema import AGENT, AGENT_RAGGED, AGENT_TABLES, TEXTS  # noqa: E402
from rudder.logs.writer import RunLog  # noqa: E402

WORDS = np.array([w.encode() for w in "the buffer hit rate evict keep window share refill comm volume wait "
                  "trainer minibatch 0.73 1.25 42 {\"decision\": 1} arms means None".split()], dtype=object)
ATTRS = {"role": AGENT, "config": json.dumps({"x": list(range(300))}),
         "layout": json.dumps({"world_rank": 2, "world_size": 3, "is_agent": True, "trainer_rank": -1})}


def text(i: int, name: str, piece: int) -> bytes:
    """Row ``i``'s ``name`` text: its own length and words (some compress well, some do not)."""
    rng = np.random.default_rng([i, TEXTS.index(name)])
    n = int(rng.integers(0, piece))
    if rng.random() < 0.3:
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    return b" ".join(rng.choice(WORDS, n // 5 + 1))[:n]


def append(log: RunLog, i: int, piece: int) -> None:
    for table, dtype in AGENT_TABLES.items():
        row = np.zeros(1, dtype)[0]
        row["request"] = i
        log.append(table, dict(zip(dtype.names, row.tolist())))
    for name in AGENT_RAGGED:
        log.append_ragged(name, np.frombuffer(text(i, name, piece), dtype=np.uint8))


def writer(path: str, piece: int, out: int, seed: int, resume: dict | None) -> None:
    """The child: create the log (or reopen it at ``resume``), then append and flush until killed,
    writing "f" to ``out`` as each flush starts and its row counts as it ends."""
    rng = np.random.default_rng(seed)
    log = RunLog(path, ATTRS, AGENT_TABLES, AGENT_RAGGED, flush_seconds=0, resume_rows=resume)
    os.write(out, (json.dumps(log.written) + "\n").encode())
    i = log.written["decisions"]
    while True:
        for _ in range(int(rng.integers(1, 8))):
            append(log, i, piece)
            i += 1
        os.write(out, b"f\n")
        log.flush(status="running")
        os.write(out, (json.dumps(log.written) + "\n").encode())


def intact(path: str, rows: dict) -> bool:
    """The log reads (``read_rank``) with at least ``rows`` rows of every set, each as written."""
    log = read_rank(path)
    for table in AGENT_TABLES:
        got = log.tables[table]["request"]
        if got.size < rows[table] or not (got[:rows[table]] == np.arange(rows[table])).all():
            return False
    return all(len(log.texts[name]) >= rows[name]
               and all(log.texts[name][i] == text(i, name, PIECE).decode(errors="replace") for i in range(rows[name]))
               for name in TEXTS)


def kill(path: str, rng, piece: int, resume: dict | None) -> tuple[list[dict], bool]:
    """One writer, killed after a random delay (a first one once it has created the log): the row
    counts of the flushes it finished, and whether it was killed inside a flush."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            writer(path, piece, w, int(rng.integers(1 << 30)), resume)
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r) as lines:
        first = lines.readline() if resume is None else ""
        time.sleep(float(rng.uniform(0.0, 0.4)))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        said = [first.strip(), *lines.read().splitlines()]
    return [json.loads(x) for x in said if x.endswith("}")], said[-1] == "f"


def one_chain(folder: str, rng, piece: int, generations: int, tally: Counter) -> str:
    """``generations`` writers on one log, each killed, each after the first resuming it from the
    counts of a flush its predecessor finished; then a resume that runs to the end."""
    path = os.path.join(folder, "rank-00002.h5")
    rows = None
    for _ in range(generations):
        finished, mid_flush = kill(path, rng, piece, rows)
        tally["kills"] += 1
        tally["mid-flush"] += mid_flush
        rows = finished[int(rng.integers(len(finished)))] if finished else rows  # what a checkpoint could hold
        try:
            tally["lost" if not intact(path, finished[-1] if finished else rows) else "read ok"] += 1
        except Exception:
            tally["unopenable"] += 1
    try:
        log = RunLog(path, ATTRS, AGENT_TABLES, AGENT_RAGGED, flush_seconds=0, resume_rows=rows)
    except Exception:
        return "reopen"
    n = rows["decisions"]
    try:
        for i in range(n, n + 20):
            append(log, i, piece)
            if i % 7 == 0:
                log.flush()
        log.close("completed")
    except Exception:
        return "flush"
    try:
        resumed = read_rank(path)
    except Exception:
        return "unreadable"
    ok = intact(path, dict.fromkeys(rows, n + 20)) and all(
        len(resumed.tables[t]) == n + 20 for t in AGENT_TABLES) and all(len(resumed.texts[t]) == n + 20 for t in TEXTS)
    return "ok" if ok else "wrong"


PIECE = 20000


def main() -> None:
    global PIECE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=300)
    ap.add_argument("--piece", type=int, default=20000, help="most bytes of one text")
    ap.add_argument("--generations", type=int, default=1, help="writers killed in turn on one log")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    PIECE = a.piece
    rng = np.random.default_rng(a.seed)
    tally: Counter = Counter()
    resumes: Counter = Counter()
    t = time.perf_counter()
    for _ in range(a.kills // a.generations):
        folder = tempfile.mkdtemp(prefix="log-kills-")
        try:
            resumes[one_chain(folder, rng, a.piece, a.generations, tally)] += 1
        finally:
            shutil.rmtree(folder)
    print(f"{tally.pop('kills')} kills ({tally.pop('mid-flush')} inside a flush) in {time.perf_counter() - t:.0f} s; "
          "the killed log read: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
          + "; resumed: " + ", ".join(f"{k} {v}" for k, v in sorted(resumes.items())))


if __name__ == "__main__":
    main()
