"""Per-rank HDF5 logs: rows and ragged rows round-trip, and a writer killed with SIGKILL at any
moment, inside a flush too, leaves a log that reads with every row it had finished flushing and
that a resume continues."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from rudder.logs.reader import read_rank
from rudder.logs.schema import AGENT, AGENT_RAGGED, AGENT_TABLES
from rudder.logs.writer import UNDO, RunLog, open_log

ROW = np.dtype([("step", "i4"), ("loss", "f4")])


def test_round_trip(tmp_path):
    path = str(tmp_path / "rank-00000.h5")
    log = RunLog(path, {"config": '{"a": 1}'}, {"rows": ROW}, {"ids": np.int64}, flush_seconds=3600)
    for i in range(5):
        log.append("rows", {"step": i, "loss": i / 2})
        log.append_ragged("ids", np.arange(i))
    log.maybe_flush()  # too early: nothing written yet
    with h5py.File(path, "r") as f:
        assert f["rows"].shape == (0,) and f.attrs["status"] == "running" and f.attrs["config"] == '{"a": 1}'
    log.flush()
    log.append("rows", {"loss": 2.5, "step": 5})  # by name, in any order
    log.append_ragged("ids", np.array([7, 8]))
    log.close("completed")
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["finished"]
        np.testing.assert_array_equal(f["rows"]["step"], np.arange(6))
        offsets, values = f["ids/offsets"][()], f["ids/values"][()]
        rows = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(offsets.size - 1)]
        assert rows == [[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [7, 8]]
        assert f["ids/values"].compression == "gzip"


def test_rows_are_built_by_field_name(tmp_path):
    log = RunLog(str(tmp_path / "rank-00000.h5"), {}, {"rows": ROW}, flush_seconds=3600)
    with pytest.raises(KeyError, match="missing \\['loss'\\]"):
        log.append("rows", {"step": 1})
    with pytest.raises(KeyError, match="unknown \\['los'\\]"):
        log.append("rows", {"step": 1, "los": 0.0})
    log.close("completed")
    with h5py.File(tmp_path / "rank-00000.h5", "r") as f:
        assert f["rows"].shape == (0,)  # nothing half-written


def test_killed_writer_leaves_a_readable_file(tmp_path):
    path = tmp_path / "rank-00000.h5"
    script = textwrap.dedent(f"""
        import numpy as np, sys, time
        from rudder.logs.writer import RunLog
        log = RunLog({str(path)!r}, {{}}, {{"rows": np.dtype([("step", "i4"), ("loss", "f4")])}}, flush_seconds=0.05)
        i = 0
        while True:
            log.append("rows", {{"step": i, "loss": 0.0}}); log.maybe_flush(); i += 1
            if i == 200: print("ready", flush=True)
            time.sleep(0.001)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    with open_log(str(path)) as f:
        steps = f["rows"]["step"]
        assert steps.size >= 150 and (steps == np.arange(steps.size)).all()


AGENT_ATTRS = {"role": AGENT, "layout": json.dumps({"world_rank": 0, "world_size": 1, "is_agent": True})}


def agent_text(i: int, name: str) -> bytes:
    """Row ``i``'s ``name`` text: up to 30 KB, from 1 to 95 letters (compressing from ~1000x to ~1.2x)."""
    rng = np.random.default_rng([i, list(AGENT_RAGGED).index(name)])
    return rng.integers(32, 32 + rng.choice([1, 4, 26, 95]), int(rng.integers(0, 30000)), dtype=np.uint8).tobytes()


def agent_rows(log: RunLog, start: int, stop: int) -> None:
    for i in range(start, stop):
        for table, dtype in AGENT_TABLES.items():
            log.append(table, {**dict.fromkeys(dtype.names, 0), "request": i})
        for name in AGENT_RAGGED:
            log.append_ragged(name, np.frombuffer(agent_text(i, name), dtype=np.uint8))


def killed_writer(path: str, resume: dict | None, delay: float) -> list[dict]:
    """A forked writer that creates the log (or resumes it from ``resume``) and flushes a few rows
    at a time in a tight loop, SIGKILLed ``delay`` s after it starts (a first one: after creating
    the log); the row counts of the flushes it finished."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer: never returns into pytest
        try:
            os.close(r)
            log = RunLog(path, AGENT_ATTRS, AGENT_TABLES, AGENT_RAGGED, flush_seconds=0, resume_rows=resume)
            while True:
                os.write(w, (json.dumps(log.written) + "\n").encode())
                agent_rows(log, log.written["decisions"], log.written["decisions"] + 3)
                log.flush()
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r) as lines:
        first = lines.readline() if resume is None else ""
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return [json.loads(x) for x in [first, *lines.read().splitlines()] if x.strip()]


def assert_rows(path: str, rows: dict, exactly: bool = False) -> None:
    """The log reads (rudder.logs.reader) with the first ``rows`` rows of every set as written."""
    log = read_rank(path)
    for table in AGENT_TABLES:
        got = log.tables[table]["request"]
        assert got.size == rows[table] if exactly else got.size >= rows[table]
        np.testing.assert_array_equal(got[:rows[table]], np.arange(rows[table]))
    for name in AGENT_RAGGED:
        texts = log.texts[name]
        assert len(texts) == rows[name] if exactly else len(texts) >= rows[name]
        assert all(texts[i] == agent_text(i, name).decode() for i in range(rows[name])), name


def test_a_writer_killed_inside_flushes_leaves_a_log_that_reads_and_resumes(tmp_path):
    """HDF5 rewrites its metadata in place when the file closes, and may write a grown compressed
    chunk where the metadata on disk still points: an agent's log (compressed texts) killed inside
    a flush was torn (rows it had flushed before lost, the file unreadable, a resume failing). Each
    writer here is killed at a random moment, most of them inside a flush (the reopen too), and
    the next one resumes from the counts of a flush its predecessor finished (what a checkpoint
    holds)."""
    path, rng, rows, inside = str(tmp_path / "rank-00000.h5"), np.random.default_rng(0), None, 0
    for _ in range(24):
        finished = killed_writer(path, rows, float(rng.uniform(0.0, 0.15)))
        inside += os.path.exists(path + UNDO)  # killed inside a flush: read through its journal
        assert_rows(path, finished[-1] if finished else rows)  # every finished flush's rows
        rows = finished[int(rng.integers(len(finished)))] if finished else rows
    assert inside >= 3, f"only {inside} of 24 kills came inside a flush"
    log = RunLog(path, AGENT_ATTRS, AGENT_TABLES, AGENT_RAGGED, flush_seconds=0, resume_rows=rows)
    assert not os.path.exists(path + UNDO)
    n = rows["decisions"]
    agent_rows(log, n, n + 5)
    log.close("completed")
    assert_rows(path, dict.fromkeys(rows, n + 5), exactly=True)
    with h5py.File(path, "r") as f:  # a whole HDF5 file again, for any reader
        assert f.attrs["status"] == "completed" and f["prompt/values"].compression == "gzip"


def assert_flush_undone(log: RunLog, path: str, before: bytes, table: str, rows: int, match: str | None = None) -> None:
    """The flush raises, and leaves the file's bytes as ``before``, ``rows`` rows of ``table``
    counted as written and no journal."""
    with pytest.raises(OSError, match=match):
        log.flush()
    with open(path, "rb") as f:
        assert f.read() == before
    assert log.written[table] == rows and not os.path.exists(path + UNDO)


def test_a_failed_flush_is_undone_and_its_rows_written_by_the_next(tmp_path, monkeypatch):
    """A flush that raises half-way leaves the file as the last one did, and keeps its rows for the next."""
    import rudder.logs.writer as writer

    path = str(tmp_path / "rank-00000.h5")
    log = RunLog(path, AGENT_ATTRS, AGENT_TABLES, AGENT_RAGGED, flush_seconds=0)
    agent_rows(log, 0, 4)
    log.flush()
    with open(path, "rb") as f:
        before = f.read()
    agent_rows(log, 4, 9)
    calls, extend = [], writer._extend

    def failing(dataset, rows):
        calls.append(dataset.name)
        if len(calls) == 5:  # the tables and a text's values extended
            raise OSError("disk full")
        extend(dataset, rows)

    monkeypatch.setattr(writer, "_extend", failing)
    assert_flush_undone(log, path, before, "decisions", 4, match="disk full")
    monkeypatch.setattr(writer, "_extend", extend)
    log.close("completed")
    assert_rows(path, dict.fromkeys(log.written, 9), exactly=True)


def test_a_write_failing_inside_hdf5_fails_the_flush_and_undoes_it(tmp_path, monkeypatch):
    """A journal write that fails (a full disk) is raised inside h5py's file driver, whose C code
    ignores an exception raised while it closes the file: the flush must still raise, leave the
    file as the last flush did, and keep its rows for the next."""
    import rudder.logs.writer as writer

    path = str(tmp_path / "rank-00000.h5")
    log = RunLog(path, {}, {"rows": ROW}, flush_seconds=0)
    for i in range(5000):
        log.append("rows", {"step": i, "loss": 0.5})
    log.flush()
    with open(path, "rb") as f:
        before = f.read()
    for i in range(5000, 9000):
        log.append("rows", {"step": i, "loss": 0.5})
    write_all, journal_writes = writer._write_all, []

    def full_disk(file, data):
        if file.name.endswith(UNDO):
            journal_writes.append(len(memoryview(data)))
            if len(journal_writes) == 3:  # the header, one page, then the disk is full
                raise OSError(28, "No space left on device")
        write_all(file, data)

    monkeypatch.setattr(writer, "_write_all", full_disk)
    assert_flush_undone(log, path, before, "rows", 5000)
    monkeypatch.setattr(writer, "_write_all", write_all)
    log.close("completed")
    with open_log(path) as f:
        steps = f["rows"]["step"]
        assert steps.size == 9000 and (steps == np.arange(9000)).all()


def test_docs_list_every_column_with_its_meaning():
    """docs/logs.md holds the tables made from the schema (python -m rudder.logs.schema)."""
    from conftest import REPO

    from rudder.logs.schema import MEANINGS, tables_markdown

    with open(f"{REPO}/docs/logs.md") as f:
        doc = f.read()
    assert tables_markdown() in doc, "regenerate the tables of docs/logs.md: python -m rudder.logs.schema"
    assert all(meaning for table in MEANINGS.values() for meaning in table.values())  # none left unexplained


def _fake_log(run, world, trainer, agents):
    from rudder.logs.schema import FORMAT_NAME, TRAINER_TABLES

    with h5py.File(run / f"rank-{world:05d}.h5", "w") as f:
        f.attrs.update({"format": FORMAT_NAME, "run": json.dumps({"world": world}),
                        "layout": json.dumps({"world_rank": world, "is_agent": trainer < 0, "trainer_rank": trainer,
                                              **({} if agents is None else {"agent_ranks": agents})})})
        f.create_dataset("minibatches", data=np.zeros(0, TRAINER_TABLES["minibatches"]))


def test_a_trainer_opens_only_its_own_log(tmp_path):
    """--policy replay: trainer t finds its log of the earlier run from its rank (and the agents'
    world ranks, which any log names), not by scanning the run's P files."""
    from rudder.logs.reader import LogError, trainer_table

    # srun's block layout, 2 nodes of 2 trainers + their agent: world ranks 2 and 5 are agents
    roles = [0, 1, -1, 2, 3, -1]
    for world, trainer in enumerate(roles):
        _fake_log(tmp_path, world, trainer, [2, 5])
    assert trainer_table(str(tmp_path), 3)[0] == {"world": 4}
    for world in (0, 1, 3, 5):  # trainer 2 reads rank-00002 (an agent's: it names the agents) and rank-00003
        (tmp_path / f"rank-{world:05d}.h5").rename(tmp_path / f"away-{world}")
    with pytest.raises(LogError, match=r"rank-00003\.h5: missing"):
        trainer_table(str(tmp_path), 2)
    _fake_log(tmp_path, 3, 7, [2, 5])
    with pytest.raises(LogError, match=r"rank-00003\.h5: trainer 7's log, not trainer 2's"):
        trainer_table(str(tmp_path), 2)
    _fake_log(tmp_path, 3, 2, [2, 5])
    assert trainer_table(str(tmp_path), 2)[0] == {"world": 3}
    old = tmp_path / "old"  # logs from before layouts named the agents: found by a scan
    old.mkdir()
    for world, trainer in enumerate(roles):
        _fake_log(old, world, trainer, None)
    assert trainer_table(str(old), 3)[0] == {"world": 4}
