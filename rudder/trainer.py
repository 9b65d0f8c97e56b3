"""Data-parallel GraphSAGE training over partitioned data: the DistDGL-without-prefetch baseline.

Every trainer rank, each step: sample its minibatch's L-hop blocks (remote adjacency read
one-sidedly), gather the input features (own and same-node rows by shared memory, the rest by one
indexed RMA Get per owner), run forward and backward, and join the gradient Allreduce. Steps per
epoch are equal on all trainers (each splits its seeds into the largest trainer's number of
minibatches), so no rank waits in a collective another will never enter. Evaluation (layer-wise,
full neighbours) runs after the epoch's timer stops.

Everything a run measures goes into the rank's HDF5 log (``rudder.run_log``): one row per
minibatch, one per epoch, and with ``trace`` the remote input IDs of every minibatch.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from rudder import checkpoint
from rudder.agent import trainer_facts
from rudder.assembly import FeatureAssembler
from rudder.buffer import BufferSettings
from rudder.config import TrainConfig
from rudder.data_parallel import GradientAllreduce, broadcast_parameters, parameter_digest
from rudder.dgl_bridge import to_blocks
from rudder.evaluation import evaluate, my_share
from rudder.feature_store import FeatureStore
from rudder.layout import exposer_table
from rudder.model import GraphSAGE
from rudder.partition_store import read_partition
from rudder.pipeline import MinibatchPipeline
from rudder.policies import make_policy
from rudder.run_log import RunLog, log_path
from rudder.sampler import Adjacency, NeighborSampler, minibatch_schedule
from rudder.shared_memory import NodeSharedArrays

MINIBATCH_ROW = np.dtype([
    ("epoch", "i4"), ("step", "i4"), ("seeds", "i4"), ("input_nodes", "i8"),
    ("input_remote", "i8"),  # input nodes owned by another partition (DistDGL's "remote rows")
    ("input_halo", "i8"),  # ... of which in this partition's 1-hop halo (what a buffer may cache)
    ("rows_local", "i8"), ("rows_shared", "i8"), ("rows_rma", "i8"),  # feature rows by path
    ("bytes_rma", "i8"), ("owners_rma", "i4"),  # feature bytes fetched by RMA, owners read
    ("adjacency_rows_rma", "i8"), ("adjacency_bytes_rma", "i8"),  # sampling's remote CSR reads
    # the prefetch buffer (zeros without one): spec 1.10's metrics
    ("hits", "i8"), ("misses", "i8"),  # cacheable inputs found / not found in the buffer
    ("refills", "i8"), ("evictions", "i8"), ("candidates", "i8"),
    ("refetched", "i8"),  # misses the last replacement had evicted (its regret)
    ("replaced", "i1"),
    ("asked_by", "i1"),  # who asked for the replacement (rudder.policies.ASKERS)
    ("occupancy", "i8"),
    ("comm_volume", "i8"),  # the paper's: misses + refills
    ("hit_percent", "i2"),  # cumulative integer %-hits, as the paper reports it
    ("hit_ratio", "f8"),  # cumulative exact ratio
    ("t_sample", "f8"), ("t_fetch", "f8"),  # t_fetch: whole feature assembly (lookup, replacement, fetch)
    ("t_lookup", "f8"), ("t_replace", "f8"), ("t_rma", "f8"),
    ("t_wait", "f8"),  # the training thread blocked on this minibatch's inputs
    ("t_forward_backward", "f8"), ("t_allreduce", "f8"), ("t_update", "f8"),
    ("loss", "f4"),  # this trainer's mean loss (NaN for an empty minibatch)
    ("global_loss", "f4"),  # mean loss over all trainers' seeds
])
EPOCH_ROW = np.dtype([
    ("epoch", "i4"), ("steps", "i4"), ("complete", "i1"), ("seconds", "f8"),
    ("t_sample", "f8"), ("t_fetch", "f8"), ("t_rma", "f8"), ("t_wait", "f8"),
    ("t_forward_backward", "f8"), ("t_allreduce", "f8"), ("t_update", "f8"),
    ("input_nodes", "i8"), ("input_remote", "i8"), ("bytes_rma", "i8"),
    ("hits", "i8"), ("misses", "i8"), ("refills", "i8"), ("comm_volume", "i8"),
    ("loss", "f4"), ("val_acc", "f4"), ("test_acc", "f4"), ("eval_seconds", "f8"), ("param_digest", "i8"),
])
TIMERS = ("t_sample", "t_fetch", "t_rma", "t_wait", "t_forward_backward", "t_allreduce", "t_update")


def library_versions() -> dict:
    import h5py
    import mpi4py

    import rudder
    from rudder.dgl_bridge import load_dgl

    return {"rudder": rudder.__version__, "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "dgl": load_dgl().__version__, "mpi4py": mpi4py.__version__,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(), "h5py": h5py.__version__,
            "hdf5": h5py.version.hdf5_version}


@dataclass
class EpochResult:
    row: np.void
    stopped: bool


class Trainer:
    def __init__(self, cfg: TrainConfig, layout, meta, stop):
        """Collective over the trainers: reads this rank's partition, opens the RMA windows,
        builds and broadcasts the model, creates the rank's log."""
        self.cfg, self.layout, self.meta, self.stop = cfg, layout, meta, stop
        self.device = torch.device(cfg.device)
        if cfg.device == "cuda":
            torch.cuda.set_device(layout.node_trainers.rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        exposer = exposer_table(layout, meta.num_parts)
        self.exposer = exposer
        exposes = exposer[layout.partition_id] == layout.trainer_rank
        self.partition = part = read_partition(cfg.data, layout.partition_id, meta, structure=bool(exposes))
        self.features = FeatureStore(layout, meta, cfg.data, exposer, gets=cfg.rma_gets)
        self.adjacency = Adjacency(layout, meta, part, exposer)
        self.sampler = NeighborSampler(self.adjacency, cfg.fanouts, seed=[cfg.seed, layout.trainer_rank])

        start = part.node_start
        self.train_nodes = start + np.flatnonzero(part.train_mask)  # the partition's; split per epoch
        self.eval_sets = {name: my_share(start + np.flatnonzero(mask), layout)
                          for name, mask in (("val", part.val_mask), ("test", part.test_mask))}
        # Equal steps on every trainer: the busiest trainer's seed count sets the count.
        my_train = my_share(self.train_nodes, layout).size
        most = layout.trainers.allreduce(my_train, op=MPI.MAX)
        self.batch_size, self.steps_per_epoch = cfg.minibatch_shape(most)
        # Resuming: this trainer's state at the latest checkpoint, and the first minibatch to run.
        self.resumed = checkpoint.latest(cfg.run_dir) if cfg.resume else None
        mine = checkpoint.load(os.path.join(checkpoint.folder(cfg.run_dir, self.resumed["counter"]),
                                            f"rank-{layout.world.rank:05d}.pt")) if self.resumed else None
        self.start = self.resumed["counter"] + 1 if self.resumed else 0

        torch.manual_seed(cfg.seed)
        self.model = GraphSAGE(meta.feat_dim, cfg.hidden, meta.num_classes, len(cfg.fanouts), cfg.dropout).to(self.device)
        broadcast_parameters(layout.trainers, self.model)
        torch.manual_seed(cfg.seed * 1_000_003 + layout.trainer_rank + 1)  # dropout differs per rank, as in DDP
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        if mine is not None:
            saved = checkpoint.load(os.path.join(checkpoint.folder(cfg.run_dir, self.resumed["counter"]), "model.pt"))
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            torch.set_rng_state(mine["torch_rng"])
        self.allreduce = GradientAllreduce(layout.trainers, self.model)
        self.halo = np.sort(part.halo_nodes)

        self.policy = make_policy(cfg)
        settings = BufferSettings(cfg.buffer_fraction, cfg.buffer_init, cfg.alpha, cfg.delta, cfg.compat == "massivegnn",
                                  cfg.buffer_scope)
        self.shared = NodeSharedArrays(layout.node_trainers) if cfg.buffer_sharing == "node" else None
        self.assembler = FeatureAssembler(self.features, self.policy, settings, part, meta.num_nodes,
                                          np.random.default_rng([cfg.seed, 2, layout.partition_id]), self.shared)
        fill = self.assembler.fill()
        if mine is not None:
            self.assembler.load_state_dict(mine["assembly"])
        # What the agent (and a classifier's features) know of this trainer, fixed for the run.
        self.facts = trainer_facts(meta, layout.world.rank, layout.trainer_rank, self.batch_size,
                                   self.steps_per_epoch * cfg.epochs, part.halo_nodes.size,
                                   self.assembler.buffer.capacity if self.assembler.buffer is not None else 0)
        self.last_eval: dict[str, float] = {}
        self.stop_signal = 0  # after a stop: the signal that caused it (the same on every rank)

        buffer = self.assembler.buffer
        run = {"batch_size": self.batch_size, "steps_per_epoch": self.steps_per_epoch, "train_seeds": int(my_train),
               "device": str(self.device), "partition_exposed_here": bool(exposes), "halo_nodes": int(part.halo_nodes.size),
               "buffer_capacity": buffer.capacity if buffer is not None else 0,
               "buffer_fill_rows": fill.rows_local + fill.rows_shared + fill.rows_remote, "buffer_fill_bytes_rma": fill.bytes_remote}
        data = {"dir": cfg.data, "dataset": meta.dataset, "source": meta.source, "num_parts": meta.num_parts,
                "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "feat_dim": meta.feat_dim,
                "created": meta.created, "edge_hash": meta.edge_hash}
        self.log = RunLog(log_path(cfg.run_dir, layout.world.rank),
                          {"role": "trainer", "config": cfg.to_json(), "versions": json.dumps(library_versions()),
                           "layout": json.dumps(layout.describe()), "run": json.dumps(run), "data": json.dumps(data)},
                          {"minibatches": MINIBATCH_ROW, "epochs": EPOCH_ROW, **self.policy.log_tables(cfg)},
                          {"trace_remote_inputs": np.int64} if cfg.trace else None, flush_seconds=cfg.log_flush_seconds,
                          resume_rows=mine["log_rows"] if mine is not None else None)
        self.policy.start(self)  # before the pipeline thread first asks it
        if mine is not None:
            self.policy.load_state_dict(mine["policy"])
        # Checkpoints: every N minibatches (known ahead), or at a target set collectively when
        # N seconds passed or a stop was asked for (then the run stops right after it).
        self.period = cfg.checkpoint_period
        self.snapshot_target: int | None = None
        self.stop_at: int | None = None
        self.deferred = None  # a checkpoint waiting for the end of its epoch
        self.pinned: torch.Tensor | None = None  # --device cuda: the staging buffer of input features
        self.last_checkpoint = time.monotonic()
        self.resumed_rows = self._resumed_epoch_rows() if mine is not None else None
        if cfg.prefetch_depth and layout.threads_per_rank >= 2:  # the pipeline thread gets a core of its own
            torch.set_num_threads(layout.threads_per_rank - 1)
        self.pipeline = MinibatchPipeline(self.schedule(self.start), self.sampler, self.assembler, cfg.prefetch_depth,
                                          self.policy.lookahead, snapshot=self.snapshot_if_due if self.period else None)

    def schedule(self, start: int = 0):
        """(epoch, step, seeds) of this trainer from minibatch ``start`` on."""
        return minibatch_schedule(self.cfg.seed, self.layout.partition_id, self.train_nodes,
                                  lambda order: my_share(order, self.layout), self.steps_per_epoch, self.cfg.epochs, start)

    def connect_agent(self, window: int):
        from rudder.agent import AgentLink

        link = AgentLink(self.layout, self.facts, window)  # returns once the agent is ready
        self.log.flush(agent_wait_s=link.waited_for_agent)
        return link

    def to_device(self, x: np.ndarray) -> torch.Tensor:
        """Input features on the model's device: on a GPU through a reused pinned host buffer,
        so the copy is a DMA that does not wait for pageable memory to be staged. Reusing it is
        safe: the step reads its loss back (``float(loss)``), which waits for the GPU, before the
        next minibatch is staged."""
        if self.device.type != "cuda":
            return torch.from_numpy(x)
        if self.pinned is None or self.pinned.shape[0] < x.shape[0]:
            self.pinned = torch.empty((max(x.shape[0], 2 * (self.pinned.shape[0] if self.pinned is not None else 0)),
                                       x.shape[1]), dtype=torch.float32, pin_memory=True)
        staged = self.pinned[:x.shape[0]]
        staged.numpy()[...] = x
        return staged.to(self.device, non_blocking=True)

    # -- checkpoints ---------------------------------------------------------------------------
    def snapshot_if_due(self, epoch: int, step: int) -> dict | None:
        """Called by the pipeline right after assembling minibatch (epoch, step)."""
        counter = epoch * self.steps_per_epoch + step
        kind, n = self.period
        if not ((kind == "minibatches" and (counter + 1) % n == 0) or counter == self.snapshot_target):
            return None
        self.policy.on_checkpoint(counter)
        return {"assembly": self.assembler.state_dict(), "policy": self.policy.state_dict()}

    def save_checkpoint(self, epoch: int, step: int, snapshot: dict) -> None:
        """Collective over the trainers, after minibatch (epoch, step) was trained on."""
        counter = epoch * self.steps_per_epoch + step
        where = checkpoint.folder(self.cfg.run_dir, counter)
        t = time.perf_counter()
        self.log.flush()  # every row up to here on disk: a resumed run continues right after them
        if self.layout.trainers.rank == 0:
            checkpoint.save(os.path.join(where, "model.pt"), {"model": self.model.state_dict(),
                                                              "optimizer": self.optimizer.state_dict()})
        checkpoint.save(os.path.join(where, f"rank-{self.layout.world.rank:05d}.pt"),
                        {"counter": counter, **snapshot, "torch_rng": torch.get_rng_state(), "log_rows": dict(self.log.written)})
        self.layout.trainers.Barrier()
        if self.layout.trainers.rank == 0:
            checkpoint.commit(self.cfg.run_dir, {"counter": counter, "epoch": epoch, "step": step,
                                                 "world_size": self.layout.world.size, "save_seconds": time.perf_counter() - t,
                                                 "config": json.loads(self.cfg.to_json())})
        self.snapshot_target, self.last_checkpoint = None, time.monotonic()

    def _resumed_epoch_rows(self) -> list:
        """The resumed epoch's minibatch rows logged before the checkpoint (for its epoch row)."""
        import h5py

        with h5py.File(self.log.path, "r", locking=False) as f:
            rows = f["minibatches"][()]
        return [r for r in rows if r["epoch"] == self.start // self.steps_per_epoch]

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> tuple[np.void, bool]:
        item, waited = self.pipeline.next()
        mb, seeds, a = item.minibatch, item.seeds, item.assembly
        t2 = time.perf_counter()
        owner = self.meta.owner_of(mb.input_nodes)
        remote = mb.input_nodes[owner != self.layout.partition_id]
        halo = int(np.isin(remote, self.halo, assume_unique=True).sum()) if self.halo.size else 0
        if self.cfg.trace:
            self.log.append_ragged("trace_remote_inputs", remote)

        loss_sum = 0.0
        if seeds.size:
            blocks = to_blocks(mb.layers, self.device)
            labels = torch.from_numpy(self.partition.labels[seeds - self.partition.node_start]).to(self.device)
            logits = self.model(blocks, self.to_device(item.x))
            loss = F.cross_entropy(logits, labels, reduction="sum")
            self.optimizer.zero_grad(set_to_none=False)
            loss.backward()
            loss_sum = float(loss.detach())
        t3 = time.perf_counter()
        due = (self.period is not None and self.period[0] == "seconds" and self.layout.trainers.rank == 0
               and time.monotonic() - self.last_checkpoint >= self.period[1])  # rank 0's clock decides
        totals = self.allreduce.allreduce(int(seeds.size), loss_sum, self.stop(), due)
        t4 = time.perf_counter()
        if totals.seeds:
            self.optimizer.step()
        t5 = time.perf_counter()
        fetch = a.fetch
        looked = a.hit_total + a.miss_total
        row = (item.epoch, item.step, seeds.size, mb.input_nodes.size, remote.size, halo,
               fetch.rows_local, fetch.rows_shared, fetch.rows_remote, fetch.bytes_remote, fetch.owners_touched,
               mb.stats.rows_remote, mb.stats.bytes_remote,
               a.hits, a.misses, a.refills, a.evictions, a.candidates, a.refetched, a.replaced, a.asked_by, a.occupancy, a.comm_volume,
               a.hit_percent, a.hit_total / looked if looked else 0.0,
               item.t_sample, item.t_assemble, a.t_lookup, a.t_replace, fetch.seconds_remote + mb.stats.seconds_remote,
               waited, t3 - t2, t4 - t3, t5 - t4,
               loss_sum / seeds.size if seeds.size else np.nan,
               totals.loss_sum / totals.seeds if totals.seeds else np.nan)
        self.log.append("minibatches", row)
        self.log.maybe_flush()
        return np.array(row, dtype=MINIBATCH_ROW)[()], self._after_step(item, totals)

    def _after_step(self, item, totals) -> bool:
        """Checkpoint if this minibatch's snapshot was taken; whether to stop now. With
        checkpoints on, a stop request first sets a checkpoint a few minibatches on (past
        every minibatch already prepared), and the run stops right after saving it."""
        counter = item.epoch * self.steps_per_epoch + item.step
        if item.snapshot is not None and item.step == self.steps_per_epoch - 1:
            self.deferred = (item.epoch, item.step, item.snapshot)  # saved once the epoch's row is logged
        elif item.snapshot is not None:
            self.save_checkpoint(item.epoch, item.step, item.snapshot)
        if self.period is None:
            return totals.stop
        if totals.checkpoint or totals.stop:
            if self.snapshot_target is not None:
                coming = self.snapshot_target
            elif self.deferred is not None:
                coming = self.deferred[0] * self.steps_per_epoch + self.deferred[1]
            else:  # past every minibatch any trainer has prepared by now
                coming = self.snapshot_target = counter + self.cfg.prefetch_depth + 2
            if totals.stop and self.stop_at is None:
                self.stop_at = coming
        return self.stop_at is not None and counter >= self.stop_at

    # -- one epoch -----------------------------------------------------------------------------
    def epoch(self, epoch: int, progress) -> EpochResult:
        rows, stopped = [], False
        start = time.perf_counter()
        earlier = []  # a resumed epoch: the rows logged before the checkpoint
        if self.resumed_rows is not None and epoch == self.start // self.steps_per_epoch:
            earlier, self.resumed_rows = self.resumed_rows, None
        for _ in range(self.steps_per_epoch - len(earlier)):
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
        complete = len(table) == self.steps_per_epoch  # a stop after the last step still completes it
        result = {"epoch": epoch, "steps": len(table), "complete": complete, "seconds": seconds,
                  **{t: float(table[t].sum()) for t in TIMERS},
                  "input_nodes": int(table["input_nodes"].sum()), "input_remote": int(table["input_remote"].sum()),
                  "bytes_rma": int(table["bytes_rma"].sum()),
                  **{k: int(table[k].sum()) for k in ("hits", "misses", "refills", "comm_volume")}, "loss": float(np.nanmean(table["global_loss"])),
                  "val_acc": np.nan, "test_acc": np.nan, "eval_seconds": 0.0}
        last = epoch == self.cfg.epochs - 1
        every = self.cfg.eval_every
        if complete and (last or (every and (epoch + 1) % every == 0)):
            t = time.perf_counter()
            self.last_eval = evaluate(self.model, self.layout, self.meta, self.partition, self.features,
                                      self.adjacency, self.exposer, self.eval_sets, self.cfg.eval_batch_size, self.device)
            result.update(val_acc=self.last_eval["val"], test_acc=self.last_eval["test"],
                          eval_seconds=time.perf_counter() - t)
        digests = self.layout.trainers.allgather(parameter_digest(self.model))
        if len(set(digests)) != 1:
            raise RuntimeError(f"model replicas diverged after epoch {epoch}: parameter digests {digests}")
        result["param_digest"] = digests[0]
        row = np.array(tuple(result[name] for name in EPOCH_ROW.names), dtype=EPOCH_ROW)[()]
        self.log.append("epochs", tuple(row.tolist()))
        self.log.maybe_flush()
        if self.deferred is not None:  # a checkpoint after an epoch's last minibatch includes its epoch row
            self.save_checkpoint(*self.deferred)
            self.deferred = None
        return EpochResult(row, stopped)

    # -- the run -------------------------------------------------------------------------------
    def run(self, progress=None) -> dict | None:
        """Train ``cfg.epochs`` epochs (or until a stop request); returns rank 0's summary of
        all trainers (None elsewhere)."""
        per_epoch = []  # rank 0: every trainer's epoch rows (since this job started)
        stopped = False
        for epoch in range(self.start // self.steps_per_epoch, self.cfg.epochs):
            result = self.epoch(epoch, progress)
            rows = self.layout.trainers.gather(result.row, root=0)
            if rows is not None:
                per_epoch.append(np.array(rows, dtype=EPOCH_ROW))
                if progress is not None:
                    progress.epoch(per_epoch[-1])
            if result.stopped:
                stopped = True
                self.stop_signal = self.layout.trainers.allreduce(self.stop.signum, op=MPI.MAX)
                break
        return summarize(per_epoch, self, stopped) if self.layout.trainers.rank == 0 else None

    def close(self) -> None:
        """Collective over the trainers: stops the pipeline, frees the RMA windows."""
        self.pipeline.close()
        self.policy.close()
        if self.shared is not None:
            self.shared.close()
        self.adjacency.close()
        self.features.close()


def summarize(per_epoch: list[np.ndarray], trainer: Trainer, stopped: bool) -> dict:
    """Run summary from every trainer's epoch rows (one [trainers] array per epoch). Epoch time
    is the slowest trainer's; the first epoch (warm-up) is left out of the means when there are
    more; remote rows and bytes are summed over trainers."""
    complete = [e for e in per_epoch if e["complete"].all()]
    timed = complete[1:] if len(complete) > 1 else complete
    seconds = np.array([e["seconds"].max() for e in timed]) if timed else np.zeros(0)

    def share(field):
        return float(np.mean([e[field].mean() / e["seconds"].max() for e in timed])) if timed else float("nan")

    return {"epochs": len(complete), "stopped": stopped, "trainers": trainer.layout.num_trainers,
            "steps_per_epoch": trainer.steps_per_epoch, "batch_size": trainer.batch_size,
            "train_seconds": float(sum(e["seconds"].max() for e in per_epoch)),
            "epoch_seconds_mean": float(seconds.mean()) if seconds.size else float("nan"),
            "epoch_seconds_median": float(np.median(seconds)) if seconds.size else float("nan"),
            "share_fetch": share("t_fetch"), "share_rma": share("t_rma"), "share_wait": share("t_wait"),
            "input_remote_per_epoch": float(np.mean([e["input_remote"].sum() for e in timed])) if timed else float("nan"),
            "input_nodes_per_epoch": float(np.mean([e["input_nodes"].sum() for e in timed])) if timed else float("nan"),
            "mib_rma_per_epoch": float(np.mean([e["bytes_rma"].sum() for e in timed]) / 2**20) if timed else float("nan"),
            "policy": trainer.cfg.policy,
            "comm_volume_per_epoch": float(np.mean([e["comm_volume"].sum() for e in timed])) if timed else float("nan"),
            "hit_percent": _hit_percent(per_epoch),
            "final_loss": float(complete[-1]["loss"][0]) if complete else float("nan"),
            "val_acc": trainer.last_eval.get("val", float("nan")), "test_acc": trainer.last_eval.get("test", float("nan")),
            "run_dir": trainer.cfg.run_dir}


def _hit_percent(per_epoch) -> float:
    """Cumulative hits over all cacheable lookups of all trainers, in percent."""
    hits = sum(int(e["hits"].sum()) for e in per_epoch)
    looked = hits + sum(int(e["misses"].sum()) for e in per_epoch)
    return 100.0 * hits / looked if looked else 0.0
