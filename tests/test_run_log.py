"""Per-rank HDF5 logs: rows and ragged rows round-trip, and a writer killed with SIGKILL between
flushes leaves a file h5py opens with every flushed row."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from rudder.logs.writer import RunLog

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
    with h5py.File(path, "r") as f:
        steps = f["rows"]["step"]
        assert steps.size >= 150 and (steps == np.arange(steps.size)).all()


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
