"""Rank 0's view of a run while it trains: a progress bar over all minibatches (or one line per
epoch for batch logs), and the end-of-run summary (its figures as ``rudder.logs.metrics`` defines them)."""
from __future__ import annotations

import sys

import numpy as np

from rudder.logs import metrics


class Progress:
    def __init__(self, mode: str, epochs: int, minibatches: int, stream=None):
        self.mode, self.stream = mode, stream or sys.stderr
        self.epochs, self.bar = epochs, None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=minibatches, unit="mb", desc="epoch 1", file=self.stream,
                            mininterval=0.5, dynamic_ncols=True)

    def step(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def epoch(self, rows: np.ndarray) -> None:
        """``rows``: every trainer's epoch row."""
        e = int(rows["epoch"][0])
        text = f"epoch {e + 1}/{self.epochs}: {rows['seconds'].max():.3f} s, loss {rows['loss'][0]:.4f}"
        if not np.isnan(rows["val_acc"][0]):
            text += f", val {rows['val_acc'][0]:.4f}, test {rows['test_acc'][0]:.4f}"
        if self.bar is not None:
            self.bar.set_description(f"epoch {min(e + 2, self.epochs)}", refresh=False)
            if not np.isnan(rows["val_acc"][0]):
                self.bar.write(text, file=self.stream)
        elif self.mode == "lines":
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_summary(per_epoch: list[np.ndarray], stopped: bool, *, trainers: int, steps_per_epoch: int, batch_size: int,
                policy: str, last_eval: dict, run_dir: str) -> dict:
    """The run's figures from every trainer's epoch rows (``per_epoch``: one [trainers] array per
    epoch since this job started)."""
    tables = list(np.stack(per_epoch, axis=1)) if per_epoch else []  # one epoch table per trainer
    complete = metrics.complete_epochs(tables)
    timed = metrics.timed_epochs(complete)
    seconds = metrics.slowest_seconds(tables, timed)

    def share(field):  # the trainers' mean time in ``field`` over the epoch's time
        return float(np.mean([np.mean([float(t[field][t["epoch"] == e][0]) for t in tables]) / s
                              for e, s in zip(timed, seconds)])) if timed else float("nan")

    def per_epoch_mean(column):
        value = metrics.per_epoch_mean(tables, column, timed)
        return float("nan") if value is None else value

    hits, misses = (sum(int(t[k].sum()) for t in tables) for k in ("hits", "misses"))
    last = [t[t["epoch"] == complete[-1]][0] for t in tables] if complete else []
    return {"epochs": len(complete), "stopped": stopped, "trainers": trainers, "steps_per_epoch": steps_per_epoch,
            "batch_size": batch_size, "train_seconds": float(sum(e["seconds"].max() for e in per_epoch)),
            "epoch_seconds": metrics.epoch_time(seconds, metrics.epoch_phases(tables, timed)) or float("nan"),
            "epoch_seconds_mean": float(seconds.mean()) if seconds.size else float("nan"),
            "share_fetch": share("t_fetch"), "share_rma": share("t_rma"), "share_wait": share("t_wait"),
            "input_remote_per_epoch": per_epoch_mean("input_remote"),
            "input_nodes_per_epoch": per_epoch_mean("input_nodes"),
            "remote_rows_fetched_per_epoch": per_epoch_mean(metrics.remote_rows_fetched),
            "mib_rma_per_epoch": per_epoch_mean("bytes_rma") / 2**20,
            "policy": policy, "comm_volume_per_epoch": per_epoch_mean("comm_volume"),
            "hit_percent": metrics.hit_percent(hits, misses),
            "final_loss": float(last[0]["loss"]) if last else float("nan"),
            "val_acc": last_eval.get("val", float("nan")), "test_acc": last_eval.get("test", float("nan")),
            "run_dir": run_dir}


def format_summary(s: dict) -> str:
    lines = [
        f"Run {'stopped early' if s['stopped'] else 'done'}: {s['epochs']} epochs on {s['trainers']} trainers, "
        f"{s['steps_per_epoch']} minibatches/epoch of {s['batch_size']} seeds per trainer",
        f"  training time   {s['train_seconds']:.2f} s (epoch time {s['epoch_seconds']:.3f} s: the slowest trainer's, "
        f"median over epochs 2..E; mean {s['epoch_seconds_mean']:.3f} s)",
        f"  time shares     training thread waiting for inputs {100 * s['share_wait']:.1f}%; feature assembly "
        f"{100 * s['share_fetch']:.1f}% and remote RMA gets {100 * s['share_rma']:.1f}% (overlapped when pipelined)",
        f"  remote inputs   {s['input_remote_per_epoch']:,.0f} of {s['input_nodes_per_epoch']:,.0f} rows/epoch; "
        f"{s['remote_rows_fetched_per_epoch']:,.0f} remote rows fetched/epoch, {s['mib_rma_per_epoch']:.1f} MiB by RMA",
        f"  buffer          policy {s['policy']}" + ("" if s["policy"] == "none" else
        f": {s['hit_percent']:.1f}% hits, communication volume {s['comm_volume_per_epoch']:,.0f} rows/epoch "
        f"(cacheable misses + refills)"),
        f"  accuracy        val {s['val_acc']:.4f}, test {s['test_acc']:.4f} (final loss {s['final_loss']:.4f})",
        f"  logs            {s['run_dir']}/rank-*.h5",
    ]
    return "\n".join(lines)
