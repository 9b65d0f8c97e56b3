"""The cluster path under a real Slurm: Debian's slurm-wlm and munge, installed if missing and
started by hand on this machine (one node, no cgroups, PMI2 for MPICH), then
``srun -n 5 python drivers/train.py ... --policy llm`` (4 trainers + the node's agent) and
``sbatch jobscripts/generic.sbatch``; the daemons are stopped by PID afterwards. Skipped, with
the reason, where Slurm cannot be installed or started (not root, no apt, no network)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, read_logs

from rudder.agent.tiny_gguf import write_tiny_gguf

# MinJobAge=5: sbatch --wait sleeps 2 s, then 4x as long each time (to 32 s) while its sleep is
# under MinJobAge/2; with the default 300 it looks at 2, 10 and 42 s (a 12 s job took 42 s), with
# 5 every 2 s. A finished job stays listed 5 s or more: long enough for a look every 2 s.
SLURM_CONF = """\
ClusterName=rudder-test
SlurmctldHost={host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmdSpoolDir={dir}/spool
StateSaveLocation={dir}/state
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=5
NodeName={host} CPUs=8 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _install() -> str | None:
    """Install slurm-wlm and munge if missing; the reason they are not there, or None."""
    if shutil.which("slurmctld") and shutil.which("munged"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed, and installing it needs root and apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                                               "slurm-wlm", "slurm-client", "munge"]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} timed out"
        if proc.returncode:
            return f"{' '.join(cmd)} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None if shutil.which("slurmctld") else "slurm-wlm installed but slurmctld is not on PATH"


def _start_munge(d: str) -> tuple[str, int]:
    """A munged of our own (socket and pid in ``d``), run as user munge: (socket, PID). munged
    insists that every directory above its socket is executable by all."""
    key = "/etc/munge/munge.key"
    if not os.path.exists(key):
        subprocess.run(["mungekey", "--create", "--keyfile", key], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
        os.chmod(key, 0o400)
    shutil.chown(d, "munge", "munge")
    os.chmod(d, 0o755)
    socket_path, pid_file = os.path.join(d, "munge.socket"), os.path.join(d, "munged.pid")
    subprocess.run(["runuser", "-u", "munge", "--", "munged", "--socket", socket_path, "--pid-file", pid_file,
                    "--log-file", os.path.join(d, "munged.log"), "--seed-file", os.path.join(d, "munged.seed")],
                   check=True, capture_output=True, timeout=30)
    return socket_path, _read_pid(pid_file)


def _read_pid(path: str) -> int:
    """The PID a daemon writes once it runs (the file can exist empty for a moment)."""
    for _ in range(100):
        try:
            return int(open(path).read())
        except (OSError, ValueError):
            time.sleep(0.1)
    raise OSError(f"{path}: no PID written within 10 s")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = _install()
    if reason:
        pytest.skip(f"no Slurm: {reason}")
    d = str(tmp_path_factory.mktemp("slurm"))
    munge_dir = tempfile.mkdtemp(prefix="rudder-munge.", dir="/run" if os.access("/run", os.W_OK) else None)
    for sub in ("spool", "state"):
        os.makedirs(os.path.join(d, sub))
    host = socket.gethostname()
    conf = os.path.join(d, "slurm.conf")
    daemons, munge_pid = [], None

    def stop_all():  # by PID, never by name; the Slurm daemons run in the foreground, as our children
        for proc in reversed(daemons):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if munge_pid is not None:
            try:
                os.kill(munge_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        shutil.rmtree(munge_dir, ignore_errors=True)

    try:
        socket_path, munge_pid = _start_munge(munge_dir)
        with open(conf, "w") as f:
            f.write(SLURM_CONF.format(host=host, dir=d, ctld_port=_free_port(), d_port=_free_port())
                    + f"AuthInfo=socket={socket_path}\n")
        env = dict(os.environ, SLURM_CONF=conf)
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([daemon, "-D", "-f", conf], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env=env))
        state = ""
        for _ in range(150):  # the node registers and turns idle
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout.strip()
            if state.startswith("idle"):
                break
            time.sleep(0.2)
        else:
            raise OSError(f"its node stayed {state!r}: {open(os.path.join(d, 'slurmd.log')).read()[-300:]}")
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        stop_all()
        pytest.skip(f"no Slurm: could not start the daemons ({e})")
    yield env
    stop_all()


@pytest.fixture(scope="module")
def parts4(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("slurm-data") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 4, out, method="metis", seed=0)
    return out


def test_srun_trains_with_the_llm_policy(slurm, parts4, tmp_path):
    model = write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    run = tmp_path / "run"
    proc = subprocess.run(["srun", "-n", "5", "--kill-on-bad-exit=1", sys.executable, os.path.join(REPO, "drivers", "train.py"),
                           "--data", parts4, "--run-dir", str(run), "--policy", "llm", "--llm-model", model, "--epochs", "3",
                           "--batch-size", "8", "--eval-every", "0", "--progress", "none"],
                          capture_output=True, text=True, timeout=600, env=slurm)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = read_logs(run)
    assert [r["role"] for r in logs] == ["trainer"] * 4 + ["agent"] and all(r["status"] == "completed" for r in logs)
    assert logs[4]["decisions"].size >= 1
    assert "Run done: 3 epochs on 4 trainers" in proc.stdout


def test_sbatch_runs_the_generic_jobscript(slurm, parts4, tmp_path):
    run, out = tmp_path / "run", tmp_path / "job.out"
    env = dict(slurm, RUDDER_DATA=parts4, RUDDER_RUN_DIR=str(run), RUDDER_POLICY="heuristic", RUDDER_EPOCHS="2",
               RUDDER_TRAINERS_PER_NODE="4", RUDDER_ARGS="--batch-size 8 --eval-every 0",
               RUDDER_VENV=os.path.dirname(os.path.dirname(sys.executable)))
    proc = subprocess.run(["sbatch", "--wait", "-N", "1", f"--output={out}", f"--chdir={REPO}",
                           os.path.join(REPO, "jobscripts", "generic.sbatch")],
                          capture_output=True, text=True, timeout=600, env=env)
    text = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, proc.stderr + text[-3000:]
    logs = read_logs(run)
    assert len(logs) == 5 and logs[-1]["role"] == "agent" and all(r["status"] == "completed" for r in logs)
    assert "srun --ntasks=5 --ntasks-per-node=5" in text  # the line the script built
    # Bad input from the jobscript itself: one line, non-zero
    proc = subprocess.run(["sbatch", "--wait", "-N", "1", f"--output={tmp_path / 'bad.out'}", f"--chdir={REPO}",
                           os.path.join(REPO, "jobscripts", "generic.sbatch")],
                          capture_output=True, text=True, timeout=300, env=dict(env, RUDDER_DATA=str(tmp_path)))
    assert proc.returncode != 0 and "no metadata.json" in (tmp_path / "bad.out").read_text()


def test_scancel_term_checkpoints_and_a_resubmitted_job_resumes(slurm, parts4, tmp_path):
    """Slurm's warning before a time limit (or a preemption): SIGTERM to the job's tasks. The run
    checkpoints and stops; the same jobscript submitted again resumes it to the end."""
    run, out = tmp_path / "run", tmp_path / "job.out"
    env = dict(slurm, RUDDER_DATA=parts4, RUDDER_RUN_DIR=str(run), RUDDER_POLICY="fixed", RUDDER_EPOCHS="400",
               RUDDER_TRAINERS_PER_NODE="4", RUDDER_CHECKPOINT_EVERY="100000", RUDDER_ARGS="--batch-size 8 --eval-every 0",
               RUDDER_VENV=os.path.dirname(os.path.dirname(sys.executable)))
    submit = ["sbatch", "--parsable", "-N", "1", "--ntasks-per-node=4", f"--chdir={REPO}"]
    job = subprocess.run(submit + [f"--output={out}", os.path.join(REPO, "jobscripts", "generic.sbatch")],
                         capture_output=True, text=True, timeout=60, env=env).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # training under way: the first epochs are in the logs
        try:
            logs = read_logs(run)
            if len(logs) == 4 and all(r["epochs"].size >= 2 for r in logs):
                break
        except (OSError, KeyError):
            pass
        time.sleep(0.5)
    else:
        pytest.fail(f"the job did not start training: {out.read_text() if out.exists() else ''}")
    subprocess.run(["scancel", "--signal=TERM", job], check=True, env=env)
    while time.monotonic() < deadline + 120 and subprocess.run(
            ["squeue", "-h", "-j", job], capture_output=True, text=True, env=env).stdout.strip():
        time.sleep(0.5)
    logs = read_logs(run)
    assert all(r["status"] == "interrupted" for r in logs), out.read_text()[-2000:]
    with open(run / "checkpoint" / "latest.json") as f:
        stopped_in = json.load(f)["epoch"]  # how far the first job got depends on the machine's speed
    steps = logs[0]["minibatches"].size
    resumed = subprocess.run(submit + ["--wait", f"--output={tmp_path / 'job2.out'}",
                                       os.path.join(REPO, "jobscripts", "generic.sbatch")],
                             capture_output=True, text=True, timeout=900,
                             env=dict(env, RUDDER_EPOCHS=str(stopped_in + 3)))
    text = (tmp_path / "job2.out").read_text()
    assert resumed.returncode == 0 and "resuming" in text, text[-3000:]
    logs = read_logs(run)
    assert all(r["status"] == "completed" for r in logs) and logs[0]["minibatches"].size > steps
    mb = logs[0]["minibatches"]
    assert np.unique(mb["epoch"] * 1000 + mb["step"]).size == mb.size  # no minibatch twice
