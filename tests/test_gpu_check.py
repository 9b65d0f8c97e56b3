"""bench/gpu_check.sh as far as it runs without a GPU: its preparation of the carried partitions,
then its runs on Cora (4 ranks, with and without a buffer policy) and their report; the CUDA half
is skipped with its reason where torch sees no GPU, and runs where it does."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile

import torch
from conftest import REPO, mpiexec


def test_prepare_and_run_on_cora(tmp_path):
    mpiexec()  # skips without an MPI launcher
    env = dict(os.environ, GPU_CHECK_DIR=str(tmp_path / "check"), PYTHONPATH=REPO)

    def script(*args):
        return subprocess.run(["bash", os.path.join(REPO, "bench", "gpu_check.sh"), "--datasets", "cora4", *args],
                              capture_output=True, text=True, timeout=900, env=env)

    prepared = script("--prepare-data")
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert os.path.isfile(tmp_path / "check" / "parts" / "cora4" / "metadata.json")
    out = tmp_path / "out"
    proc = script("--epochs", "4", "--out", str(out), "--runs", str(tmp_path / "runs"))  # 4: an epoch time (2 steady)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    if devices == ["cpu"]:
        assert "skipping the CUDA half: torch.cuda.is_available() is False" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert [(r["device"], r["policy"]) for r in report] == [(d, p) for d in devices for p in ("none", "fixed")]
    for r in report:
        assert r["status"] == "completed" and 0 < r["test_acc"] <= 1 and r["epoch_s"] > 0, r
        assert r["allreduce"] in (("host",) if r["device"] == "cpu" else ("staged", "device"))
        assert all(r["breakdown"][k] >= 0 for k in ("sample", "fetch", "copy", "compute", "allreduce", "update"))
        assert 0 <= r["wait_share"] < 1
    text = (out / "report.txt").read_text()
    assert "cora4-cpu-none" in text and "cora4 cpu: losses with --policy fixed bit-identical to no buffer" in text
    with tarfile.open(out / "runs.tar.gz") as tar:
        assert {"./cora4-cpu-none/rank-00000.h5", "./cora4-cpu-fixed.log"} <= set(tar.getnames())
