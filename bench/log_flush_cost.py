"""What a run log's flush costs: seconds per flush and the file's bytes, for a trainer's log
with ``--trace`` (minibatch rows and each minibatch's remote input IDs, int64) and an agent's
(decision rows and texts), written by this tree's writer and by another one (``--old FILE``: an
earlier ``rudder/logs/writer.py``, e.g. ``git show REV:rudder/logs/writer.py > /tmp/w.py``),
in turns, so both see the same load.

A trace minibatch is ``--remote`` sorted distinct IDs of a graph of ``--nodes`` nodes (a
minibatch's remote inputs); ``--per-flush`` minibatches (or decisions) go into each flush, as a
flush every 2 s of ~0.2 s steps does. Figures: median and 90th percentile seconds of a flush,
the file's MB after ``--flushes`` flushes, and (this tree) the mean bytes its undo journal held.

    python bench/log_flush_cost.py [--old /tmp/w.py] [--flushes 100] [--per-flush 10] [--remote 20000]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import rudder.logs.writer as current  # noqa: E402
from rudder.logs.schema import AGENT_RAGGED, AGENT_TABLES, MINIBATCH_ROW, TRACE, TRAINER_TABLES  # noqa: E402


def load(path: str):
    spec = importlib.util.spec_from_file_location("old_writer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(writer, kind: str, folder: str, a, rng) -> tuple[list[float], int]:
    path = os.path.join(folder, f"{kind}.h5")
    if kind == "trainer":
        log = writer.RunLog(path, {}, TRAINER_TABLES, {TRACE: np.int64}, flush_seconds=3600)
    else:
        log = writer.RunLog(path, {}, AGENT_TABLES, AGENT_RAGGED, flush_seconds=3600)
    words = np.array("the hit rate window evict keep share refill wait 0.73 42 {} None".split(), dtype=object)
    seconds = []
    for _ in range(a.flushes):
        for _ in range(a.per_flush):
            if kind == "trainer":
                log.append("minibatches", dict.fromkeys(MINIBATCH_ROW.names, 0))
                log.append_ragged(TRACE, np.sort(rng.choice(a.nodes, a.remote, replace=False)))
            else:
                log.append("decisions", dict.fromkeys(AGENT_TABLES["decisions"].names, 0))
                log.append("outcomes", dict.fromkeys(AGENT_TABLES["outcomes"].names, 0))
                for name in AGENT_RAGGED:
                    text = " ".join(rng.choice(words, int(rng.integers(100, 600))))
                    log.append_ragged(name, np.frombuffer(text.encode(), dtype=np.uint8))
        t = time.perf_counter()
        log.flush()
        seconds.append(time.perf_counter() - t)
    log.close("completed")
    return seconds, os.path.getsize(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="an earlier writer.py to compare with")
    ap.add_argument("--flushes", type=int, default=100)
    ap.add_argument("--per-flush", type=int, default=10)
    ap.add_argument("--remote", type=int, default=20000, help="remote input IDs a minibatch")
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    writers = {"this tree": current, **({"old": load(a.old)} if a.old else {})}
    journal: list[int] = []
    enter = current._Journaled.__exit__

    def measured(self, kind, *rest):  # the journal's bytes at the commit
        if kind is None:
            journal.append(os.path.getsize(self.path + current.UNDO))
        return enter(self, kind, *rest)

    current._Journaled.__exit__ = measured
    for kind in ("trainer", "agent"):
        results = {name: ([], 0) for name in writers}
        journal.clear()
        for r in range(a.repeats):
            for name, writer in writers.items():
                folder = tempfile.mkdtemp(prefix="flush-cost-")
                try:
                    seconds, size = write(writer, kind, folder, a, np.random.default_rng(r))
                finally:
                    shutil.rmtree(folder)
                results[name] = (results[name][0] + seconds, size)
        for name, (seconds, size) in results.items():
            extra = f", undo journal {np.mean(journal) / 1e3:.0f} kB a flush" if name == "this tree" else ""
            print(f"{kind:8s} {name:10s} flush median {np.median(seconds) * 1e3:6.1f} ms, "
                  f"p90 {np.percentile(seconds, 90) * 1e3:6.1f} ms; file {size / 1e6:7.2f} MB{extra}")


if __name__ == "__main__":
    main()
