"""The cluster path under a real Slurm: Debian's slurm-wlm and munge, installed if missing and
started by hand on this machine (two Slurm nodes, each a slurmd of its own on this host, no
cgroups, PMI2 for MPICH), then ``srun -n 5 python drivers/train.py ... --policy llm`` (4 trainers
+ the node's agent) and ``sbatch -N 2 jobscripts/generic.sbatch`` (2 nodes of 4 trainers + 1
agent); the daemons are stopped by PID afterwards. Skipped, with the reason, where Slurm cannot
be installed or started (not root, no apt, no network)."""
from __future__ import annotations

import json
import os
import random
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
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmdSpoolDir={dir}/spool-%n
StateSaveLocation={dir}/state
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ReturnToService=2
SchedulerType=sched/builtin
# a job submitted while the last one's nodes are still completing starts at the next pass over
# pending jobs: every 60 s by default, which made a 25 s test take 90
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=5
FirstJobId={first_job}
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1_port} CPUs=8 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2_port} CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


# Every job and step the tests start ends within this many minutes by Slurm's own limit (they take
# 15-60 s), so one that hangs frees its nodes for the next test instead of holding them until the
# test's own timeout has killed only the waiting client. Set once, in the fixture's environment
# (sbatch and srun read it before the job script's own --time).
JOB_MINUTES = 4


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
    for sub in ("spool-n1", "spool-n2", "state"):
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
            f.write(SLURM_CONF.format(host=host, dir=d, ctld_port=_free_port(), d_port=_free_port(),
                                      n1_port=_free_port(), n2_port=_free_port(),
                                      # MPICH names a job's shared-memory segment after its PMI job id ("1.0" for
                                      # each new slurmctld's first step): a segment a killed job left in /dev/shm
                                      # under that name made the next session's first srun wait in MPI_Init
                                      first_job=random.randint(10**4, 10**7))  # below MaxJobId (67,043,328)
                    + f"AuthInfo=socket={socket_path}\n")
        env = dict(os.environ, SLURM_CONF=conf, SBATCH_TIMELIMIT=str(JOB_MINUTES), SLURM_TIMELIMIT=str(JOB_MINUTES))
        # two nodes on this one host (each slurmd with a port of its own): a job script's 2-node case
        for cmd in (["slurmctld"], ["slurmd", "-N", "n1"], ["slurmd", "-N", "n2"]):
            daemons.append(subprocess.Popen(cmd + ["-D", "-f", conf], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env=env))
        state = ""
        for _ in range(150):  # the nodes register and turn idle
            state = subprocess.run(["sinfo", "-h", "-o", "%D %T"], capture_output=True, text=True, env=env).stdout.strip()
            if state == "2 idle":
                break
            time.sleep(0.2)
        else:
            raise OSError(f"its nodes stayed {state!r}: {open(os.path.join(d, 'slurmd-n1.log')).read()[-300:]}")
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        stop_all()
        pytest.skip(f"no Slurm: could not start the daemons ({e})")
    yield env
    stop_all()


def _parts(tmp_path_factory, num_parts: int) -> str:
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("slurm-data") / f"parts{num_parts}")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), num_parts, out, method="metis", seed=0)
    return out


@pytest.fixture(scope="module")
def parts4(tmp_path_factory):
    return _parts(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def parts8(tmp_path_factory):
    return _parts(tmp_path_factory, 8)


def test_the_launch_plan_fits_whole_cores_and_asks_the_registry():
    """What rudder-job.sh launches a node: an agent rank for every policy the registry says needs
    one (tuner, one registered later), and CPUs a task in whole cores (Slurm's CR_Core rounding)."""
    from rudder.prefetch.policies import POLICIES, Policy, register
    from rudder.train.launch import launch_plan, main

    # 128 threads on 64 two-thread cores, 5 tasks: 12 cores (24 CPUs) each, not 25 CPUs (13 cores, 65 > 64)
    assert launch_plan("tuner", 4, 128, 2) == {"agents": 1, "tasks_per_node": 5, "cpus_per_task": 24}
    assert launch_plan("fixed", 4, 128, 2) == {"agents": 0, "tasks_per_node": 4, "cpus_per_task": 32}
    assert launch_plan("llm", 4, 8, 1)["cpus_per_task"] == 1 and launch_plan("llm", 4, 4, 1)["cpus_per_task"] == 0
    try:
        @register("agent_of_its_own")
        class Custom(Policy):
            needs_agent = True

        assert launch_plan("agent_of_its_own", 4, 8, 1)["agents"] == 1
    finally:
        POLICIES.pop("agent_of_its_own", None)
    assert main(["--policy", "nonesuch", "--trainers-per-node", "4", "--cpus", "8"]) == 2


def test_srun_trains_with_the_llm_policy(slurm, parts4, tmp_path):
    model = write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    run = tmp_path / "run"
    proc = subprocess.run(["srun", "-N", "1", "-n", "5", "--kill-on-bad-exit=1", sys.executable,
                           os.path.join(REPO, "drivers", "train.py"),
                           "--data", parts4, "--run-dir", str(run), "--policy", "llm", "--llm-model", model, "--epochs", "3",
                           "--batch-size", "8", "--eval-every", "0", "--progress", "none"],
                          capture_output=True, text=True, timeout=600, env=slurm)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = read_logs(run)
    assert [r["role"] for r in logs] == ["trainer"] * 4 + ["agent"] and all(r["status"] == "completed" for r in logs)
    assert logs[4]["decisions"].size >= 1
    assert {(r["attrs"]["versions"]["mpi_netmod"], r["attrs"]["versions"]["fi_provider"]) for r in logs} \
        == {("default", "default")}  # one node: MPICH's own choice
    assert "Run done: 3 epochs on 4 trainers" in proc.stdout


def test_sbatch_runs_the_generic_jobscript(slurm, parts8, tmp_path):
    """2 nodes of 4 trainers + 1 agent, with the tuner policy: its agent ranks come from the policy
    registry, not from a list in the script."""
    run, out = tmp_path / "run", tmp_path / "job.out"
    env = dict(slurm, RUDDER_DATA=parts8, RUDDER_RUN_DIR=str(run), RUDDER_POLICY="tuner", RUDDER_EPOCHS="2",
               RUDDER_TRAINERS_PER_NODE="4", RUDDER_ARGS="--batch-size 8 --eval-every 0",
               RUDDER_VENV=os.path.dirname(os.path.dirname(sys.executable)))
    proc = subprocess.run(["sbatch", "--wait", "-N", "2", f"--output={out}", f"--chdir={REPO}",
                           os.path.join(REPO, "jobscripts", "generic.sbatch")],
                          capture_output=True, text=True, timeout=600, env=env)
    text = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, proc.stderr + text[-3000:]
    logs = read_logs(run)
    assert len(logs) == 10 and all(r["status"] == "completed" for r in logs)
    assert [r["layout"]["world_rank"] for r in logs if r["role"] == "agent"] == [4, 9]  # the last rank of each node
    assert {r["layout"]["num_nodes"] for r in logs} == {2}
    # the PyPI MPICH across Slurm nodes: OFI, not UCX's 4 KB PMI card that Slurm may cut, and not
    # libfabric's sockets provider, on which MPI_Init could hang (rudder.comm.mpi_env)
    assert {(r["attrs"]["versions"]["mpi_netmod"], r["attrs"]["versions"]["fi_provider"]) for r in logs} \
        == {("ofi", "^sockets")}
    assert "srun --ntasks=10 --ntasks-per-node=5 --distribution=block:block --cpus-per-task=1" in text  # 8 CPUs, 5 tasks
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
