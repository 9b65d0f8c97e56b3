"""Distributed GraphSAGE training on a partitioned graph, one MPI rank per trainer.

    srun -n N python drivers/train.py --data PARTS --run-dir RUN [options]     (cluster)
    mpiexec -n N python drivers/train.py --data PARTS --run-dir RUN [options]  (locally)

PARTS comes from ``python -m partitioning``; with ``--partition-mode trainer`` (default) it holds
one partition per rank, with ``node`` one per node. Each rank writes RUN/rank-NNNNN.h5; rank 0
shows progress and prints a summary. ``--help`` lists every option; ``--config FILE`` takes them
from a TOML or JSON file. Exit status: 0 done, 2 bad input, 130/143 stopped by SIGINT/SIGTERM.
"""
from __future__ import annotations

import contextlib
import glob
import io
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rudder.config import ConfigError, parse_config  # noqa: E402
from rudder.layout import LayoutError, build_layout, exposer_table  # noqa: E402
from rudder.partition_store import PartitionFormatError, PartitionMeta, sha256_file  # noqa: E402
from rudder.policies import POLICIES  # noqa: E402
from rudder.runtime import StopRequest, abort_job, agree_on_error  # noqa: E402


def checked(world, step):
    """Run ``step()`` on every rank and agree on its error: (value, error message or None)."""
    value, error = None, None
    try:
        value = step()
    except (ConfigError, PartitionFormatError, LayoutError) as e:
        error = str(e)
    return value, agree_on_error(world, error)


def prepare_run_dir(cfg) -> None:
    if cfg.resume:  # the logs go on where the checkpoint left them
        return
    existing = sorted(glob.glob(os.path.join(cfg.run_dir, "rank-*.h5")))
    if existing and not cfg.overwrite:
        raise ConfigError(f"--run-dir {cfg.run_dir}: already holds the logs of a run ({os.path.basename(existing[0])}, ...); "
                          f"choose another directory or pass --overwrite")
    try:
        os.makedirs(cfg.run_dir, exist_ok=True)
        for path in existing:
            os.remove(path)
    except OSError as e:
        raise ConfigError(f"--run-dir {cfg.run_dir}: cannot create ({e.strerror})") from None


def verify_own_partition(cfg, layout, meta) -> None:
    """Each partition's exposing rank checks its file against the metadata checksum."""
    if layout.is_agent:
        return
    exposer = exposer_table(layout, meta.num_parts)
    if cfg.verify_data and exposer[layout.partition_id] == layout.trainer_rank:
        info = meta.parts[layout.partition_id]
        path = os.path.join(cfg.data, info.file)
        if not os.path.isfile(path):
            raise PartitionFormatError(f"--data {path}: partition file missing")
        if sha256_file(path) != info.sha256:
            raise PartitionFormatError(f"--data {path}: checksum differs from metadata.json (file changed or corrupt; "
                                       f"re-run python -m partitioning, or --no-verify-data to skip the check)")


def check_policy_inputs(cfg, layout) -> None:
    """The model, server or earlier run a policy needs must be there before anyone trains (a
    server only from the agent ranks, which will use it: it may serve its own node only)."""
    if cfg.policy == "llm":
        from rudder.llm import ModelNotFound, probe_server, resolve_model

        try:
            if not cfg.llm_url:
                resolve_model(cfg.llm_model)
            elif layout.is_agent:
                probe_server(cfg.llm_url)
        except ModelNotFound as e:
            raise ConfigError(str(e)) from None
    elif cfg.policy == "classifier":
        from rudder.classifier import ClassifierError, check_model_file

        try:
            check_model_file(cfg.classifier_model)
        except ClassifierError as e:
            raise ConfigError(str(e)) from None
    elif cfg.policy == "replay":
        from rudder.analyze import AnalysisError, trainer_table

        try:
            trainer_table(cfg.replay, 0)
        except AnalysisError as e:
            raise ConfigError(f"--replay {e}") from None


def check_resume(cfg, layout) -> None:
    """--resume RUN: a checkpoint of a job shaped like this one, with epochs left to train."""
    if not cfg.resume:
        return
    from rudder import checkpoint

    try:
        record = checkpoint.latest(cfg.run_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume {cfg.run_dir}: {e}") from None
    if record["world_size"] != layout.world.size:
        raise ConfigError(f"--resume {cfg.run_dir}: the checkpoint is of a {record['world_size']}-rank job; "
                          f"launch {record['world_size']} ranks (this job has {layout.world.size})")
    if cfg.epochs <= record["epoch"]:
        raise ConfigError(f"--epochs {cfg.epochs}: the checkpoint is in epoch {record['epoch']}; resume with more epochs")


def check_device(cfg) -> None:
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this rank sees no CUDA device (torch.cuda.is_available() is False; "
                          "a CPU build of torch, or no GPU allocated to the job)")


def share_cores(layout) -> None:
    """Oversubscribed ranks must not each start one thread per core."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(layout.threads_per_rank)
    import torch

    torch.set_num_threads(layout.threads_per_rank)


def start_up(world, argv):
    """Every check that can fail on bad input, in order, agreed on by all ranks before any work:
    returns (cfg, meta, layout, None) or (..., the one-line error)."""
    from mpi4py import MPI

    state = {}
    quiet = contextlib.redirect_stdout(io.StringIO()) if world.rank else contextlib.nullcontext()
    with quiet:  # --help once, not once per rank (it raises SystemExit)
        state["cfg"], error = checked(world, lambda: parse_config(argv))
    steps = [
        ("meta", lambda: PartitionMeta.load(state["cfg"].data), "--data "),
        ("layout", lambda: build_layout(state["meta"].num_parts, partition_mode=state["cfg"].partition_mode,
                                        agent_per_node=POLICIES[state["cfg"].policy].needs_agent,
                                        agent_cores=state["cfg"].agent_cores), ""),
        (None, lambda: share_cores(state["layout"]), ""),
        (None, lambda: check_device(state["cfg"]), ""),
        (None, lambda: check_policy_inputs(state["cfg"], state["layout"]), ""),
        (None, lambda: check_resume(state["cfg"], state["layout"]), ""),
        (None, lambda: verify_own_partition(state["cfg"], state["layout"], state["meta"]), ""),
    ]
    for name, step, prefix in steps:
        if error:
            break
        value, error = checked(world, step)
        error = error and prefix + error
        if name:
            state[name] = value
    if not error:  # rank 0 alone touches the run directory (a shared file system)
        error = world.bcast(checked(MPI.COMM_SELF, lambda: prepare_run_dir(state["cfg"]))[1] if world.rank == 0 else None)
    return state.get("cfg"), state.get("meta"), state.get("layout"), error


def main(argv=None) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        cfg, meta, layout, error = start_up(world, argv)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    if error:
        if world.rank == 0:
            print(f"train.py: error: {error}", file=sys.stderr, flush=True)
        return 2

    from rudder.progress import Progress, format_summary
    from rudder.trainer import Trainer

    if layout.is_agent:  # this node's agent: serve the trainers' decisions, then leave
        from rudder.agent import run_agent

        try:
            run_agent(cfg, layout, meta)
        except Exception as e:
            abort_job(e)
        return 0

    trainer = None
    stop = StopRequest(lambda why: abort_job(None, why, log=trainer.log if trainer else None, code=130),
                       grace=120.0 if cfg.checkpoint_every else 15.0).install()  # a checkpoint comes first
    try:
        trainer = Trainer(cfg, layout, meta, stop)
        progress = Progress(cfg.progress, cfg.epochs, trainer.steps_per_epoch) if world.rank == 0 else None
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


if __name__ == "__main__":
    sys.exit(main())
