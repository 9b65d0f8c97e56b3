"""Data-parallel GraphSAGE training over partitioned data.

Every trainer rank, each step: take the next prepared minibatch from the pipeline (its L-hop
blocks sampled with remote adjacency read one-sidedly, its input features assembled through the
buffer policy's cache), run forward and backward, and join the gradient Allreduce. Steps per
epoch are equal on all trainers (each splits its seeds into the largest trainer's number of
minibatches), so no rank waits in a collective another will never enter. Evaluation (full
neighbours, ``rudder.train.evaluation``) runs after the epoch's timer stops.

Everything a run measures goes into the rank's HDF5 log (``rudder.logs``): one row per
minibatch, one per epoch, and with ``--trace`` the remote input IDs of every minibatch.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from rudder.agent.link import AgentLink, CollectiveLink
from rudder.agent.protocol import trainer_facts
from rudder.comm import gate
from rudder.comm.dist_array import ReadStats
from rudder.comm.layout import exposer_table
from rudder.comm.progress import ProgressThread, wake_interval
from rudder.comm.progress import resolve as resolve_rma_progress
from rudder.comm.runtime import abort_job, library_versions, mpi_cuda_support
from rudder.comm.shared_memory import NodeSharedArrays
from rudder.comm.watchdog import Watchdog
from rudder.data.adjacency import open_adjacency, resolve_topology
from rudder.data.feature_store import FeatureStore
from rudder.data.partition_store import halo_count, read_partition
from rudder.logs import metrics
from rudder.logs.schema import CPU_TIMERS, EPOCH_ROW, EPOCH_TIMERS, MINIBATCH_ROW, TRACE, TRAINER, TRAINER_TABLES, record, upgrade
from rudder.logs.writer import RunLog, log_path, open_log
from rudder.prefetch.assembly import feature_source
from rudder.prefetch.buffers import BufferSettings
from rudder.prefetch.node_pool import gather_node_pool
from rudder.prefetch.pipeline import MinibatchPipeline, Prepared, matrices_in_flight
from rudder.prefetch.policies import PolicyContext, make_policy
from rudder.prefetch.vip import fill_ranking
from rudder.sampling.neighbors import NeighborSampler
from rudder.sampling.phases import phase_sampler_fanouts, phase_seeds
from rudder.sampling.schedule import minibatch_schedule, my_share
from rudder.train.checkpointing import CheckpointCoordinator, Resumed, load_resumed
from rudder.train.config import TrainConfig
from rudder.train.data_parallel import GradientAllreduce, broadcast_parameters, parameter_digest
from rudder.train.evaluation import EVAL_INFERENCES, Evaluator
from rudder.train.footprint import StartupClock, owner_bytes, sample
from rudder.train.model import GraphSAGE
from rudder.train.optimizer import Adam
from rudder.train.progress import run_summary
from rudder.train.replicas import ReplicaRepair
from rudder.train.staging import InputStager


@dataclass
class EpochResult:
    row: np.void
    stopped: bool


class Trainer:
    def __init__(self, cfg: TrainConfig, layout, meta, stop, clock: StartupClock | None = None):
        """Collective over the trainers: reads this rank's partition, opens the RMA windows,
        builds and broadcasts the model, builds the buffer and its policy, creates the rank's log."""
        self.cfg, self.layout, self.meta, self.stop = cfg, layout, meta, stop
        gate.enable(cfg.training.mpi_lock == "on")  # before the pipeline thread (and the agent link) start
        torch.set_num_threads(layout.threads_per_rank)  # oversubscribed ranks: not one thread per core each
        self.log = None
        self.clock = clock or StartupClock()  # start-up phases, to the first minibatch (rudder.train.footprint)
        self.watchdog = Watchdog(cfg.training.stall_timeout, self._stalled)
        self.watchdog.doing("training thread", "building the trainer")
        self.resumed: Resumed | None = load_resumed(cfg.output.run_dir, layout.world.rank) if cfg.checkpoint.resume else None
        self.start = self.resumed.start if self.resumed else 0
        self.device = self._device()
        # Each finished start-up step is progress: a slow but moving start-up (a loaded host, a
        # large partition) is not a stall, a step that never ends is.
        for what, build, phase in (("its partition and RMA windows", self._build_data, "seeds and sampler"),
                                   ("its model", self._build_model, "model"),
                                   ("its buffer", self._build_prefetch, "buffer fill"), ("its log", self._build_log, "log")):
            self.watchdog.doing("training thread", f"building the trainer: {what}")
            build()
            self.clock.mark(phase)
            self.watchdog.progress()
        self.policy.start(PolicyContext(self.facts, self.log, layout.trainer_rank, self.phases,
                                        self._open_agent_link))  # before the pipeline thread first asks it
        self.clock.mark("agent start")
        if self.resumed:
            self.policy.load_state_dict(self.resumed.rank_state["policy"])
        self.checkpoints = CheckpointCoordinator(cfg, layout.trainers, layout.world.rank, layout.world.size,
                                                 self.phases, self.log, self._snapshot, self._model_state,
                                                 self.policy.on_checkpoint)
        self.last_eval: dict[str, float] = {}
        self.stop_signal = 0  # after a stop: the signal that caused it (the same on every rank)
        self.resumed_rows = self._resumed_epoch_rows() if self.resumed else None
        if cfg.sampling.prefetch_depth and layout.threads_per_rank >= 2:  # the pipeline thread gets a core of its own
            torch.set_num_threads(layout.threads_per_rank - 1)
        gate.started()  # from here on a peer may be reading this rank's rows for a minibatch
        self.pipeline = MinibatchPipeline(self.schedule(self.start), self.sampler, self.features,
                                          cfg.sampling.prefetch_depth, self.policy.lookahead,
                                          snapshot=self.checkpoints.snapshot_if_due if self.checkpoints.enabled else None,
                                          stage=self.stager,
                                          watch=lambda what: self.watchdog.doing("pipeline thread", what))
        self.clock.mark("pipeline start")
        self.watchdog.progress()

    def _stalled(self, message: str) -> None:
        """The watchdog saw no progress: end the job (from the watchdog's thread)."""
        abort_job(None, message, log=self.log)

    # -- building ------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        if self.cfg.model.device != "cuda":
            return torch.device("cpu")
        torch.cuda.set_device(self.layout.node_trainers.rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())

    def _build_data(self) -> None:
        """The partition, the RMA windows of features and adjacency, the sampler, the seeds."""
        cfg, layout, meta = self.cfg, self.layout, self.meta
        self.exposer = exposer_table(layout, meta.num_parts)
        self.exposes = bool(self.exposer[layout.partition_id] == layout.trainer_rank)
        self.rma_progress = resolve_rma_progress(cfg.training.rma_progress, layout.num_nodes, self.exposes,
                                                 layout.threads_per_rank)
        # the partition's CSR only where this rank exposes it in an RMA window (a replicated CSR is
        # read from every partition file by the node's first trainer)
        distributed = resolve_topology(cfg.data.topology, meta) == "distributed"
        self.partition = part = read_partition(cfg.data.path, layout.partition_id, meta,
                                               structure=self.exposes and distributed)
        self.clock.mark("partition read")
        self.store = FeatureStore(layout, meta, cfg.data.path, self.exposer, gets=cfg.data.rma_gets)
        # serves other nodes' Gets of this rank's rows while its threads compute (rudder.comm.progress),
        # from the moment they can read them: peers fill their buffers while this rank still starts
        # up. From here on every MPI call of the rank goes through the MPI lock, as the thread's does.
        self.progress_thread = (ProgressThread(layout.trainers, wake_interval(layout.ranks_per_core))
                                if self.rma_progress == "thread" else None)
        self.clock.mark("feature windows")
        self.adjacency = open_adjacency(cfg.data.topology, layout, meta, part, self.exposer, cfg.data.path)
        self.clock.mark("adjacency")
        self.halo = np.sort(part.halo_nodes)
        start = part.node_start
        self.train_nodes = start + np.flatnonzero(part.train_mask)  # the partition's; split per epoch
        self.eval_sets = {name: my_share(start + np.flatnonzero(mask), layout)
                          for name, mask in (("val", part.val_mask), ("test", part.test_mask))}
        self.evaluator = Evaluator(layout, meta, part, self.store, self.adjacency, self.exposer, self.eval_sets,
                                   cfg.training.eval_batch_size, self.device, cfg.training.eval_inference,
                                   seed=cfg.training.seed)
        # Equal steps on every trainer: the busiest trainer's seed count in each phase sets its count.
        mine = [my_share(phase_seeds(cfg.training.seed, layout.partition_id, self.train_nodes, p.seed_fraction),
                         layout).size for p in cfg.phase_settings()]
        self.phases = cfg.run_phases([gate.collective(layout.trainers, layout.trainers.allreduce, n, op=MPI.MAX)
                                      for n in mine])
        self.my_train = mine[0]
        self.batch_size, self.steps_per_epoch = self.phases.phases[0].batch_size, self.phases.phases[0].steps_per_epoch
        self.sampler = NeighborSampler(self.adjacency, cfg.sampling.fanouts, seed=[cfg.training.seed, layout.trainer_rank],
                                       fanouts_of=phase_sampler_fanouts(self.phases))

    def _build_model(self) -> None:
        """Replicas equal on every trainer (broadcast from trainer 0), or the checkpoint's."""
        cfg, meta = self.cfg, self.meta
        seed = cfg.training.seed
        torch.manual_seed(seed)
        self.model = GraphSAGE(meta.feat_dim, cfg.model.hidden, meta.num_classes, len(cfg.sampling.fanouts),
                               cfg.model.dropout, cfg.model.impl).to(self.device)
        broadcast_parameters(self.layout.trainers, self.model)
        torch.manual_seed(seed * 1_000_003 + self.layout.trainer_rank + 1)  # dropout differs per rank, as in DDP
        self.optimizer = Adam(self.model.parameters(), lr=cfg.model.lr)
        if self.resumed:
            self.model.load_state_dict(self.resumed.model_state["model"])
            self.optimizer.load_state_dict(self.resumed.model_state["optimizer"])
            torch.set_rng_state(self.resumed.rank_state["torch_rng"])
        # Every trainer must pick the same path: one rank's answer decides (they share one MPI library).
        with gate.held():  # a query, but an MPI call beside the progress thread's
            self.mpi_cuda_support = mpi_cuda_support() if self.device.type == "cuda" else None
        choice = cfg.model.gpu_allreduce
        device_buffer = choice == "device" or (choice == "auto" and bool(self.mpi_cuda_support))
        device_buffer = gate.collective(self.layout.trainers, self.layout.trainers.bcast, device_buffer, root=0)
        self.allreduce = GradientAllreduce(self.layout.trainers, self.model, device_buffer, wait=self.layout.mpi_wait,
                                           check=cfg.training.on_divergence != "off")
        self.injections = set(cfg.testing.divergences)  # (minibatch, trainer) of each --inject-divergence
        start = self.partition.node_start
        self.stager = InputStager(self.model, self.device, lambda seeds: self.partition.labels[seeds - start])

    def _build_prefetch(self) -> None:
        """The policy, its buffer around the feature store (filled once), and the trainer's facts."""
        cfg, layout, part = self.cfg, self.layout, self.partition
        self.policy = make_policy(cfg)
        self.shared = NodeSharedArrays(layout.node_trainers) if cfg.buffer.sharing == "node" else None
        settings, self.vip_reads, t = BufferSettings.of(cfg.buffer), ReadStats(), time.perf_counter()
        # a node's trainers of one partition share its buffer; of their own partitions, a pool over their halos
        pooled = self.shared is not None and layout.partition_mode == "trainer"
        filler = self.shared is None or self.shared.comm.rank == 0  # a shared buffer's filler ranks for the node
        ranking = fill_ranking(settings, self.policy, self.adjacency, self.train_nodes, self.my_train / self.steps_per_epoch,
                               cfg.sampling.fanouts, self.vip_reads) if filler or pooled else None
        self.vip_seconds = time.perf_counter() - t if ranking is not None else 0.0
        buffered = part
        if pooled and self.policy.buffer_class is not None:
            buffered, ranking = gather_node_pool(self.shared.comm, part, self.store.in_shared_memory, settings.fraction,
                                                 ranking)
        self.features = feature_source(self.store, self.policy, settings, buffered, self.meta.num_nodes,
                                       np.random.default_rng([cfg.training.seed, 2, layout.partition_id]), self.shared,
                                       ranking, in_flight=matrices_in_flight(cfg.sampling.prefetch_depth))
        if self.resumed:  # the checkpoint holds the buffer's IDs and scores; its rows are read again
            self.features.load_state_dict(self.resumed.rank_state["assembly"])
        self.fill = self.features.fill()
        capacity = self.features.buffer.capacity if self.features.buffer is not None else 0
        # What the agent (and a classifier's features) know of this trainer, fixed for the run.
        self.facts = trainer_facts(self.meta, layout.world.rank, layout.trainer_rank, self.batch_size,
                                   self.phases.total, part.halo_nodes.size, capacity,
                                   self.policy.action_limits(self.features.buffer))

    def _build_log(self) -> None:
        cfg, meta, layout, fill = self.cfg, self.meta, self.layout, self.fill
        run = {"batch_size": self.batch_size, "steps_per_epoch": self.steps_per_epoch, "train_seeds": int(self.my_train),
               "phases": self.phases.describe(),
               "device": str(self.device), "model_impl": cfg.model.impl, "allreduce": self.allreduce.path,
               "mpi_cuda_support": self.mpi_cuda_support, "partition_exposed_here": self.exposes,
               "rma_progress": self.rma_progress,
               "rma_progress_interval_s": wake_interval(layout.ranks_per_core) if self.rma_progress == "thread" else 0.0,
               "halo_nodes": int(self.partition.halo_nodes.size), "buffer_capacity": self.facts["capacity"],
               "buffer_fill_rows": fill.rows_local + fill.rows_shared + fill.rows_remote,
               "buffer_fill_bytes_rma": fill.bytes_remote, "buffer_vip_seconds": self.vip_seconds,
               "buffer_vip_adjacency_rows_rma": self.vip_reads.rows_remote,
               "buffer_vip_adjacency_bytes_rma": self.vip_reads.bytes_remote}
        data = {"dir": cfg.data.path, "dataset": meta.dataset, "source": meta.source, "num_parts": meta.num_parts,
                "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "feat_dim": meta.feat_dim,
                "feature_dtype": meta.feature_dtype, "feature_row_bytes": meta.feature_encoding.row_bytes,
                "created": meta.created, "edge_hash": meta.edge_hash}
        self.log = RunLog(log_path(cfg.output.run_dir, layout.world.rank),
                          {"role": TRAINER, "config": cfg.to_json(), "versions": json.dumps(library_versions()),
                           "layout": json.dumps(layout.describe()), "run": json.dumps(run), "data": json.dumps(data)},
                          {**TRAINER_TABLES, **self.policy.log_tables()}, {TRACE: np.int64} if cfg.output.trace else None,
                          flush_seconds=cfg.output.log_flush_seconds,
                          resume_rows=self.resumed.rank_state["log_rows"] if self.resumed else None)
        mode = cfg.training.on_divergence  # off: no step's check, and the epoch's check ends the job
        self.replicas = ReplicaRepair(layout.trainers, self.model, self.optimizer, mode, self.log) if mode != "off" else None

    def _open_agent_link(self, window: int, latency: int) -> AgentLink:
        self.watchdog.doing("training thread", "waiting for the node's agent to be ready (its decider loading)")
        link_class = CollectiveLink if self.cfg.agent.transport == "collective" else AgentLink
        link = link_class(self.layout.node, self.facts, window, latency, self.start)  # returns once the agent is ready
        self.watchdog.progress()
        self.log.flush(agent_wait_s=link.waited_for_agent)
        return link

    def schedule(self, start: int = 0):
        """(epoch, step, seeds) of this trainer from minibatch ``start`` on."""
        return minibatch_schedule(self.cfg.training.seed, self.layout.partition_id, self.train_nodes,
                                  lambda order: my_share(order, self.layout), self.phases, start)

    # -- checkpoint state ----------------------------------------------------------------------
    def _snapshot(self) -> dict:
        """The pipeline-side state a checkpoint keeps (taken between two minibatches)."""
        return {"assembly": self.features.state_dict(), "policy": self.policy.state_dict()}

    def _model_state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _resumed_epoch_rows(self) -> list:
        """The resumed epoch's minibatch rows logged before the checkpoint (for its epoch row), in
        this version's columns (a log begun by an older version has fewer)."""
        with open_log(self.log.path) as f:
            rows = upgrade(f["minibatches"][()], MINIBATCH_ROW)
        return [r for r in rows if r["epoch"] == self.phases.position(self.start)[0]]

    # -- one step ------------------------------------------------------------------------------
    def _finish_device_work(self) -> None:
        """On a GPU, wait for the queued kernels, so that each timer holds its own work (the
        allreduce needs the gradients and the next step the updated weights anyway)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _forward_backward(self, inputs) -> float:
        """The minibatch's summed loss, its gradients in ``.grad`` (0.0 and no gradients without seeds)."""
        if inputs is None:
            return 0.0
        logits = self.model(inputs.blocks, inputs.x)
        loss = F.cross_entropy(logits, inputs.labels, reduction="sum")
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self._finish_device_work()
        return float(loss.detach())

    def _rng_state(self) -> tuple:
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    def _set_rng_state(self, state: tuple) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    @torch.no_grad()
    def _flip_lowest_bit(self) -> None:
        """--inject-divergence: this replica's first parameter element, its lowest bit flipped."""
        first = next(self.model.parameters()).view(-1)[:1]
        first.copy_(first.view(torch.int32).bitwise_xor(1).view(first.dtype))

    def step(self) -> tuple[np.void, bool]:
        self.watchdog.doing("training thread", "waiting for the next minibatch's inputs")
        item, waited = self.pipeline.next()
        if self.clock is not None:  # the first minibatch: start-up ends here
            self.clock.mark("first minibatch")
            self.clock.write(self.log)
            self.clock = None
            sample(self.log, "startup", -1, owner_bytes(self))
        mb, seeds = item.minibatch, item.seeds
        self.watchdog.doing("training thread", f"computing minibatch {item.epoch}:{item.step}")
        t2, c2 = time.perf_counter(), time.thread_time()
        remote = mb.input_nodes[self.meta.owner_of(mb.input_nodes) != self.layout.partition_id]
        if self.cfg.output.trace:
            self.log.append_ragged(TRACE, remote)
        counter = self.phases.counter(item.epoch, item.step)
        rng = self._rng_state() if self.replicas is not None else None  # dropout's draws, should the step be recomputed
        inputs = self.stager.claim(item.inputs) if seeds.size else None
        loss_sum = self._forward_backward(inputs)
        t3, c3 = time.perf_counter(), time.thread_time()
        self.watchdog.doing("training thread", f"in the gradient Allreduce of minibatch {item.epoch}:{item.step}")
        totals = self.allreduce.allreduce(int(seeds.size), loss_sum, self.stop(), self.checkpoints.due_by_clock())
        if not totals.replicas_agree:  # the replicas entered the step unequal: repair them, then the step again
            self.watchdog.doing("training thread", f"repairing the replicas at minibatch {item.epoch}:{item.step}")
            self.replicas.handle(counter, item.epoch, "step")
            self._set_rng_state(rng)
            loss_sum = self._forward_backward(inputs)
            totals = self.allreduce.allreduce(int(seeds.size), loss_sum, self.stop(), self.checkpoints.due_by_clock())
            if not totals.replicas_agree:
                raise RuntimeError(f"model replicas still differ at minibatch {counter} after their repair")
        t4, c4 = time.perf_counter(), time.thread_time()
        if totals.seeds:
            self.optimizer.step()
            self._finish_device_work()
        if (counter, self.layout.trainer_rank) in self.injections:
            self._flip_lowest_bit()
        t5, c5 = time.perf_counter(), time.thread_time()
        row = record(MINIBATCH_ROW, self._minibatch_fields(item, remote, waited, loss_sum, totals,
                                                           (t3 - t2, t4 - t3, t5 - t4), c3 - c2 + c5 - c4))
        self.log.append("minibatches", dict(zip(MINIBATCH_ROW.names, row)))
        self.policy.observe_step(waited, waited + t5 - t2)  # an agent's wait share
        self.log.maybe_flush()
        stop = self.checkpoints.after_step(item.epoch, item.step, item.snapshot, totals.checkpoint, totals.stop)
        self.watchdog.progress()
        return np.array(row, dtype=MINIBATCH_ROW)[()], stop

    def _minibatch_fields(self, item: Prepared, remote: np.ndarray, waited: float, loss_sum: float, totals,
                          step_times: tuple[float, float, float], cpu_compute: float) -> dict:
        mb, a, seeds = item.minibatch, item.assembly, item.seeds
        fetch = a.fetch
        looked = a.hit_total + a.miss_total
        t_compute, t_allreduce, t_update = step_times
        return {
            "epoch": item.epoch, "step": item.step, "phase": self.phases.of_epoch(item.epoch).index,
            "seeds": seeds.size, "input_nodes": mb.input_nodes.size,
            "input_remote": remote.size,
            "input_halo": halo_count(remote, self.halo),
            "rows_local": fetch.rows_local, "rows_shared": fetch.rows_shared, "rows_rma": fetch.rows_remote,
            "bytes_rma": fetch.bytes_remote, "owners_rma": fetch.owners_touched,
            "adjacency_rows_rma": mb.stats.rows_remote, "adjacency_bytes_rma": mb.stats.bytes_remote,
            "hits": a.hits, "misses": a.misses, "refills": a.refills, "evictions": a.evictions,
            "candidates": a.candidates, "refetched": a.refetched, "replaced": a.replaced, "asked_by": a.asked_by,
            "occupancy": a.occupancy, "refill_budget": a.refill_budget, "lookahead_window": a.lookahead_window,
            "slots_held": a.slots_held,
            "decision_request": a.decision[0], "decision_age": a.decision[1], "action_fallback": a.decision[2],
            "comm_volume": a.comm_volume, "hit_percent": a.hit_percent,
            "hit_ratio": a.hit_total / looked if looked else 0.0,
            "t_sample": item.t_sample, "t_fetch": item.t_assemble, "t_copy": item.t_stage,
            "t_lookup": a.t_lookup, "t_replace": a.t_replace,
            "t_rma": fetch.seconds_remote + mb.stats.seconds_remote, "t_rma_features": fetch.seconds_remote,
            "t_wait": waited,
            "t_forward_backward": t_compute, "t_allreduce": t_allreduce, "t_grad_copy": self.allreduce.seconds_staging,
            "t_update": t_update,
            "cpu_sample": item.cpu_sample, "cpu_fetch": item.cpu_assemble, "cpu_copy": item.cpu_stage,
            "cpu_compute": cpu_compute,
            "loss": loss_sum / seeds.size if seeds.size else np.nan,
            "global_loss": totals.loss_sum / totals.seeds if totals.seeds else np.nan,
        }

    # -- one epoch -----------------------------------------------------------------------------
    def epoch(self, epoch: int, progress) -> EpochResult:
        rows, stopped = [], False
        start = time.perf_counter()
        earlier = []  # a resumed epoch: the rows logged before the checkpoint
        if self.resumed_rows is not None and epoch == self.phases.position(self.start)[0]:
            earlier, self.resumed_rows = self.resumed_rows, None
        for _ in range(self.phases.steps(epoch) - len(earlier)):
            row, stopped = self.step()
            rows.append(row)
            if progress is not None:
                progress.step(float(row["global_loss"]))
            if stopped:
                break
        seconds = time.perf_counter() - start
        table = np.array(earlier + rows, dtype=MINIBATCH_ROW)
        # A resumed epoch's time before the checkpoint: its logged step times (no wall clock survives)
        seconds += float(sum(r["t_wait"] + r["t_forward_backward"] + r["t_allreduce"] + r["t_update"] for r in earlier))
        complete = len(table) == self.phases.steps(epoch)  # a stop after the last step still completes it
        result = {"epoch": epoch, "phase": self.phases.of_epoch(epoch).index,
                  "steps": len(table), "complete": complete, "seconds": seconds,
                  "run_ahead": metrics.run_ahead(self.cfg.sampling.prefetch_depth, self.policy.lookahead),
                  **{t: float(table[t].sum()) for t in EPOCH_TIMERS + CPU_TIMERS},
                  **{k: int(table[k].sum()) for k in ("input_nodes", "input_remote", "bytes_rma", "hits", "misses",
                                                      "refills", "comm_volume")},
                  "loss": float(np.nanmean(table["global_loss"])), "val_acc": np.nan, "test_acc": np.nan,
                  "eval_seconds": 0.0, "eval_inference": -1, "eval_rows_shared": 0, "eval_rows_rma": 0,
                  "eval_bytes_rma": 0, "eval_adjacency_rows_rma": 0}
        result["param_digest"] = self._epoch_digest(epoch, self.phases.counter(epoch, 0) + len(table))
        sample(self.log, "epoch", epoch, owner_bytes(self))  # before the evaluation: its memory and calls apart
        every = self.cfg.training.eval_every
        if complete and (epoch == self.cfg.training.epochs - 1 or (every and (epoch + 1) % every == 0)):
            t = time.perf_counter()
            self.watchdog.doing("training thread", f"evaluating after epoch {epoch}")
            self.features.release_idle()  # the evaluation's own peak comes on top of what stays
            done = self.evaluator.evaluate(self.model, self.phases.of_epoch(epoch).fanouts, progress=self.watchdog.progress)
            self.last_eval = done.accuracy
            result.update(val_acc=self.last_eval["val"], test_acc=self.last_eval["test"],
                          eval_seconds=time.perf_counter() - t, eval_inference=EVAL_INFERENCES.index(done.inference),
                          eval_rows_shared=done.reads.rows_shared, eval_rows_rma=done.reads.rows_remote,
                          eval_bytes_rma=done.reads.bytes_remote, eval_adjacency_rows_rma=done.adjacency.rows_remote)
            sample(self.log, "evaluation", epoch, owner_bytes(self))
        self.log.append("epochs", result)
        self.log.maybe_flush()
        self.watchdog.doing("training thread", f"after epoch {epoch} (digests, checkpoint)")
        self.checkpoints.after_epoch()
        self.watchdog.progress()
        return EpochResult(np.array(record(EPOCH_ROW, result), dtype=EPOCH_ROW)[()], stopped)

    def _epoch_digest(self, epoch: int, trained: int) -> int:
        """The last defence, before the epoch's evaluation: every trainer's parameter digest
        compared. A divergence the steps' checks missed (one after the epoch's last update) is
        repaired here too, or ends the job (``--on-divergence abort``, or ``off``: no repair)."""
        trainers = self.layout.trainers  # collectives beside the pipeline thread: through the MPI lock (rudder.comm.gate)
        digests = gate.collective(trainers, trainers.allgather, parameter_digest(self.model))
        if len(set(digests)) != 1 and self.replicas is not None:
            self.replicas.handle(trained, epoch, "epoch")
            digests = gate.collective(trainers, trainers.allgather, parameter_digest(self.model))
        if len(set(digests)) != 1:
            raise RuntimeError(f"model replicas diverged after epoch {epoch}: parameter digests {digests}")
        return digests[0]

    # -- the run -------------------------------------------------------------------------------
    def run(self, progress=None) -> dict | None:
        """Train the configured epochs (or until a stop request); returns trainer 0's summary of
        all trainers (None elsewhere)."""
        self.log.flush(training_started_at=time.time())
        per_epoch = []  # trainer 0: every trainer's epoch rows (since this job started)
        stopped = False
        for epoch in range(self.phases.position(self.start)[0], self.cfg.training.epochs):
            result = self.epoch(epoch, progress)
            rows = gate.collective(self.layout.trainers, self.layout.trainers.gather, result.row, root=0)
            if rows is not None:
                per_epoch.append(np.array(rows, dtype=EPOCH_ROW))
                if progress is not None:
                    progress.epoch(per_epoch[-1])
            if result.stopped:
                stopped = True
                self.stop_signal = gate.collective(self.layout.trainers, self.layout.trainers.allreduce, self.stop.signum,
                                                   op=MPI.MAX)
                break
        if self.progress_thread is not None:  # its progress calls so far (what it did for other nodes' readers)
            self.log.flush(rma_progress_polls=self.progress_thread.polls)
        if self.layout.trainers.rank:
            return None
        return run_summary(per_epoch, stopped, trainers=self.layout.num_trainers, steps_per_epoch=self.steps_per_epoch,
                           batch_size=self.batch_size, policy=self.cfg.buffer.policy, last_eval=self.last_eval,
                           run_dir=self.cfg.output.run_dir)

    def close(self) -> None:
        """Collective over the trainers: stops the pipeline, frees the RMA windows."""
        self.watchdog.doing("training thread", "closing (RMA windows freed together)")
        self.pipeline.close()
        if self.progress_thread is not None:
            self.progress_thread.close()
        self.policy.close()
        if self.shared is not None:
            self.shared.close()
        self.adjacency.close()
        self.store.close()
        if self.replicas is not None:
            self.replicas.close()
        self.watchdog.close()


__all__ = ["Trainer", "metrics"]
