"""A training job from start to end, on every rank (``drivers/train.py`` is its entry point).

Start-up runs every check that can fail on bad input, in order, agreed on by all ranks before any
work (each rank's error is gathered, so every rank stops with the same one line, printed once by
rank 0): the config, the partitions, the layout, the threads, the device, the policy's inputs
(model file, server, earlier run), a resume's checkpoint and each exposed partition's checksum;
then rank 0 alone prepares the run directory. Then an agent rank serves its node's decisions and
a trainer trains; an exception on any rank aborts the whole job, a signal stops it cleanly.
Exit status: 0 done, 2 bad input, 128 + signal when stopped by one.

Start-up and the agent's role import no torch: a rank imports the trainer (and with it torch, about
2.4 s of CPU a rank here, and on a cluster every rank reading its files from the shared file
system at once) only once it knows it trains. So an agent rank, and every rank of a job that a
check stops, starts in a fraction of that.
"""
from __future__ import annotations

import contextlib
import gc
import glob
import io
import os
import sys

from mpi4py import MPI

from rudder.agent.server import run_agent
from rudder.comm import gate
from rudder.comm.layout import LayoutError, build_layout, exposer_table
from rudder.comm.runtime import StopRequest, abort_job, agree_on_error, require_thread_multiple
from rudder.data import dgl_bridge
from rudder.data.partition_store import PartitionFormatError, PartitionMeta, sha256_file
from rudder.logs import checkpoints
from rudder.prefetch.policies import POLICIES
from rudder.train.config import ConfigError, parse_config
from rudder.train.footprint import StartupClock
from rudder.train.progress import Progress, format_summary

BAD_INPUT = (ConfigError, PartitionFormatError, LayoutError)


def checked(world, step):
    """Run ``step()`` on every rank and agree on its error: (value, error message or None)."""
    value, error = None, None
    try:
        value = step()
    except BAD_INPUT as e:
        error = str(e)
    return value, agree_on_error(world, error)


def check_threads() -> None:
    try:
        require_thread_multiple()
    except RuntimeError as e:
        raise ConfigError(str(e)) from None


def prepare_run_dir(cfg) -> None:
    if cfg.checkpoint.resume:  # the logs go on where the checkpoint left them
        return
    run_dir = cfg.output.run_dir
    existing = sorted(glob.glob(os.path.join(run_dir, "rank-*.h5")))
    if existing and not cfg.output.overwrite:
        raise ConfigError(f"--run-dir {run_dir}: already holds the logs of a run ({os.path.basename(existing[0])}, ...); "
                          f"choose another directory or pass --overwrite")
    try:
        os.makedirs(run_dir, exist_ok=True)
        for path in existing:
            os.remove(path)
    except OSError as e:
        raise ConfigError(f"--run-dir {run_dir}: cannot create ({e.strerror})") from None


def verify_own_partition(cfg, layout, meta) -> None:
    """Each partition's exposing rank checks its file against the metadata checksum."""
    if layout.is_agent:
        return
    exposer = exposer_table(layout, meta.num_parts)
    if cfg.data.verify_data and exposer[layout.partition_id] == layout.trainer_rank:
        info = meta.parts[layout.partition_id]
        path = os.path.join(cfg.data.path, info.file)
        if not os.path.isfile(path):
            raise PartitionFormatError(f"--data {path}: partition file missing")
        if sha256_file(path) != info.sha256:
            raise PartitionFormatError(f"--data {path}: checksum differs from metadata.json (file changed or corrupt; "
                                       f"re-run python -m partitioning, or --no-verify-data to skip the check)")


def check_policy_inputs(cfg, layout) -> None:
    """The model, server or earlier run a policy needs must be there before anyone trains."""
    try:
        POLICIES[cfg.buffer.policy].check_inputs(cfg, layout.is_agent)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_resume(cfg, layout) -> None:
    """--resume RUN: a checkpoint of a job shaped like this one, with epochs left to train."""
    if not cfg.checkpoint.resume:
        return
    run_dir = cfg.output.run_dir
    try:
        record = checkpoints.latest(run_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume {run_dir}: {e}") from None
    if record["world_size"] != layout.world.size:
        raise ConfigError(f"--resume {run_dir}: the checkpoint is of a {record['world_size']}-rank job; "
                          f"launch {record['world_size']} ranks (this job has {layout.world.size})")
    if cfg.training.epochs <= record["epoch"]:
        raise ConfigError(f"--epochs {cfg.training.epochs}: the checkpoint is in epoch {record['epoch']}; "
                          f"resume with more epochs")


def check_injection(cfg, layout) -> None:
    """--inject-divergence names a trainer of this job."""
    if any(trainer >= layout.num_trainers for _, trainer in cfg.testing.divergences):
        raise ConfigError(f"--inject-divergence {cfg.testing.inject_divergence}: expected a trainer below "
                          f"{layout.num_trainers} (this job's trainers)")


def cuda_available() -> bool:
    import torch  # only a trainer asked for CUDA pays torch's import before the checks are through

    return torch.cuda.is_available()


def check_device(cfg, layout) -> None:
    if layout.is_agent:  # an agent rank computes nothing on a device
        return
    if cfg.model.device == "cuda" and not cuda_available():
        raise ConfigError("--device cuda: this rank sees no CUDA device (torch.cuda.is_available() is False; "
                          "a CPU build of torch, or no GPU allocated to the job)")
    if cfg.model.impl != "dgl":
        return
    try:
        dgl_bridge.load_dgl()
    except ImportError as e:
        raise ConfigError(f"--model-impl dgl: DGL cannot be imported ({e}); use --model-impl torch") from None
    if cfg.model.device == "cuda" and not dgl_bridge.runs_on_cuda():
        raise ConfigError("--model-impl dgl: this DGL build cannot run on CUDA (PyPI's dgl is CPU-only); "
                          "use --model-impl torch")


def share_cores(layout) -> None:
    """Oversubscribed ranks must not each start one thread per core (set before a trainer imports
    torch, whose OpenMP reads them then; the trainer sets torch's own count)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(layout.threads_per_rank)


def start_up(world, argv, clock: StartupClock):
    """Every check that can fail on bad input, agreed on by all ranks before any work: returns
    (cfg, meta, layout, None) or (..., the one-line error)."""
    state = {}
    quiet = contextlib.redirect_stdout(io.StringIO()) if world.rank else contextlib.nullcontext()
    with quiet:  # --help once, not once per rank (it raises SystemExit)
        state["cfg"], error = checked(world, lambda: parse_config(argv))
    clock.mark("config")
    steps = [  # (what it makes, the step, its errors' prefix, its start-up phase)
        (None, check_threads, "", "checks"),
        ("meta", lambda: PartitionMeta.load(state["cfg"].data.path), "--data ", "metadata"),
        ("layout", lambda: build_layout(state["meta"].num_parts, partition_mode=state["cfg"].data.partition_mode,
                                        agent_per_node=POLICIES[state["cfg"].buffer.policy].needs_agent,
                                        agent_cores=state["cfg"].agent.cores,
                                        mpi_wait=state["cfg"].training.mpi_wait, comm=world), "", "layout"),
        (None, lambda: share_cores(state["layout"]), "", "checks"),
        (None, lambda: check_device(state["cfg"], state["layout"]), "", "checks"),
        (None, lambda: check_policy_inputs(state["cfg"], state["layout"]), "", "checks"),
        (None, lambda: check_resume(state["cfg"], state["layout"]), "", "checks"),
        (None, lambda: check_injection(state["cfg"], state["layout"]), "", "checks"),
        (None, lambda: verify_own_partition(state["cfg"], state["layout"], state["meta"]), "", "partition checksum"),
    ]
    for name, step, prefix, phase in steps:
        if error:
            break
        value, error = checked(world, step)
        error = error and prefix + error
        if name:
            state[name] = value
        clock.mark(phase)
    if not error:  # rank 0 alone touches the run directory (a shared file system)
        error = checked(MPI.COMM_SELF, lambda: prepare_run_dir(state["cfg"]))[1] if world.rank == 0 else None
        error = gate.collective(world, world.bcast, error)  # the others sleep while rank 0 works
        clock.mark("run directory")
    return state.get("cfg"), state.get("meta"), state.get("layout"), error


def train(cfg, layout, meta, clock: StartupClock) -> int:
    """A trainer rank's whole job; returns the exit status."""
    trainer, summary = None, None
    stop = StopRequest(lambda why: abort_job(None, why, log=trainer.log if trainer else None, code=130),
                       grace=120.0 if cfg.checkpoint.every else 15.0).install()  # a checkpoint comes first
    try:
        # The one import of the library made inside a function, on purpose: the trainer role's own
        # (module docstring), listed in tests/test_architecture.py. Inside the try: a rank that
        # cannot import it ends the job, not leaves the others waiting in their first collective.
        from rudder.train.trainer import Trainer

        clock.mark("trainer imports")
        gc.enable()  # the entry points turn it off for the imports (drivers/train.py)
        trainer = Trainer(cfg, layout, meta, stop, clock)
        progress = (Progress(cfg.output.progress, cfg.training.epochs, trainer.phases.total)
                    if layout.world.rank == 0 else None)
        summary = trainer.run(progress)
        if progress is not None:
            progress.close()
        if trainer.stop_signal:
            trainer.log.close("interrupted", f"stopped by {stop.signame}" if stop() else "stopped: another rank got a signal")
        else:
            trainer.log.close("completed")
        trainer.close()
        stop.stopped_cleanly()
    except Exception as e:
        abort_job(e, log=trainer.log if trainer is not None else None)
    if summary is not None:
        print(format_summary(summary), flush=True)
    return 128 + trainer.stop_signal if trainer.stop_signal else 0


def main(argv=None, world=None) -> int:
    """The job on ``world`` (default COMM_WORLD; a test harness may run a job on part of its ranks)."""
    world = world if world is not None else MPI.COMM_WORLD
    clock = StartupClock()  # its first phase, the imports, ends here
    try:
        cfg, meta, layout, error = start_up(world, argv, clock)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    if error:
        if world.rank == 0:
            print(f"train.py: error: {error}", file=sys.stderr, flush=True)
        return 2
    if layout.is_agent:  # this node's agent: serve the trainers' decisions, then leave
        gc.enable()
        try:
            run_agent(cfg, layout, meta)
        except Exception as e:
            abort_job(e)
        return 0
    return train(cfg, layout, meta, clock)
