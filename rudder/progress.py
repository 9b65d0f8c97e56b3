"""Rank 0's view of a run while it trains: a progress bar over all minibatches (or one line per
epoch for batch logs), and the end-of-run summary."""
from __future__ import annotations

import sys

import numpy as np


class Progress:
    def __init__(self, mode: str, epochs: int, steps_per_epoch: int, stream=None):
        self.mode, self.stream = mode, stream or sys.stderr
        self.epochs, self.bar = epochs, None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=epochs * steps_per_epoch, unit="mb", desc="epoch 1", file=self.stream,
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


def format_summary(s: dict) -> str:
    lines = [
        f"Run {'stopped early' if s['stopped'] else 'done'}: {s['epochs']} epochs on {s['trainers']} trainers, "
        f"{s['steps_per_epoch']} minibatches/epoch of {s['batch_size']} seeds per trainer",
        f"  training time   {s['train_seconds']:.2f} s (epoch mean {s['epoch_seconds_mean']:.3f} s, "
        f"median {s['epoch_seconds_median']:.3f} s, first epoch excluded)",
        f"  time shares     training thread waiting for inputs {100 * s['share_wait']:.1f}%; feature assembly "
        f"{100 * s['share_fetch']:.1f}% and remote RMA gets {100 * s['share_rma']:.1f}% (overlapped when pipelined)",
        f"  remote inputs   {s['input_remote_per_epoch']:,.0f} of {s['input_nodes_per_epoch']:,.0f} rows/epoch, "
        f"{s['mib_rma_per_epoch']:.1f} MiB/epoch fetched by RMA",
        f"  buffer          policy {s['policy']}" + ("" if s["policy"] == "none" else
        f": {s['hit_percent']:.1f}% hits, communication volume {s['comm_volume_per_epoch']:,.0f} rows/epoch "
        f"(cacheable misses + refills)"),
        f"  accuracy        val {s['val_acc']:.4f}, test {s['test_acc']:.4f} (final loss {s['final_loss']:.4f})",
        f"  logs            {s['run_dir']}/rank-*.h5",
    ]
    return "\n".join(lines)
