"""Rank 0's view of a run while it trains: a progress bar over all minibatches on a terminal, plain
lines where the output goes to a file or a pipe (a bar's redraws would fill a log with carriage
returns), and the end-of-run summary (its figures as ``rudder.logs.metrics`` defines them)."""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from rudder.logs import metrics

LINE_SECONDS = 30.0  # within an epoch longer than this, a plain line says how far it got


def resolve_mode(mode: str, stream) -> str:
    """``auto``: a bar where ``stream`` is a terminal, lines elsewhere; other modes as they are."""
    if mode != "auto":
        return mode
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


class Progress:
    def __init__(self, mode: str, epochs: int, minibatches: int, stream=None):
        self.stream = stream or sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.epochs, self.bar = epochs, None
        self.epoch_now, self.step_now, self.last_line = 0, 0, time.monotonic()
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=minibatches, unit="mb", desc="epoch 1", file=self.stream,
                            mininterval=0.5, dynamic_ncols=True)

    def step(self, loss: float) -> None:
        self.step_now += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif self.mode == "lines" and time.monotonic() - self.last_line >= LINE_SECONDS:
            print(f"epoch {self.epoch_now + 1}/{self.epochs}: {self.step_now} minibatches, loss {loss:.4f}",
                  file=self.stream, flush=True)
            self.last_line = time.monotonic()

    def epoch(self, rows: np.ndarray) -> None:
        """``rows``: every trainer's epoch row."""
        e = int(rows["epoch"][0])
        self.epoch_now, self.step_now, self.last_line = e + 1, 0, time.monotonic()
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
    timed = metrics.run_timed_epochs(tables)
    seconds = metrics.slowest_seconds(tables, timed)
    epoch_seconds = metrics.epoch_time(seconds, metrics.epoch_phases(tables, timed))

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
            "epoch_seconds": float("nan") if epoch_seconds is None else epoch_seconds,
            "epoch_seconds_mean": float(seconds.mean()) if seconds.size else float("nan"),
            "timed_epochs": timed, "epoch_spread": metrics.spread(seconds),
            "too_short": metrics.run_too_short(tables) if tables else "no complete epoch",
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


UNSTEADY = "none without a steady epoch (the training time line says why)"


def format_summary(s: dict) -> str:
    lines = [
        f"Run {'stopped early' if s['stopped'] else 'done'}: {s['epochs']} epochs on {s['trainers']} trainers, "
        f"{s['steps_per_epoch']} minibatches/epoch of {s['batch_size']} seeds per trainer",
        f"  training time   {s['train_seconds']:.2f} s ({epoch_time_text(s)})",
        # shares and per-epoch counts are over the steady epochs (rudder.logs.metrics), as
        # rudder.analyze reports them: a shorter run has none, and says so instead of "nan"
        "  time shares     " + (UNSTEADY if not s["timed_epochs"] else
        f"training thread waiting for inputs {100 * s['share_wait']:.1f}%; feature assembly "
        f"{100 * s['share_fetch']:.1f}% and remote RMA gets {100 * s['share_rma']:.1f}% (overlapped when pipelined)"),
        "  remote inputs   " + (UNSTEADY if not s["timed_epochs"] else
        f"{s['input_remote_per_epoch']:,.0f} of {s['input_nodes_per_epoch']:,.0f} rows/epoch; "
        f"{s['remote_rows_fetched_per_epoch']:,.0f} remote rows fetched/epoch, {s['mib_rma_per_epoch']:.1f} MiB by RMA"),
        f"  buffer          policy {s['policy']}" + ("" if s["policy"] == "none" else
        f": {s['hit_percent']:.1f}% hits" + ("" if not s["timed_epochs"] else
        f", communication volume {s['comm_volume_per_epoch']:,.0f} rows/epoch (cacheable misses + refills)")),
        "  accuracy        " + ("none: no evaluation ran" if math.isnan(s["val_acc"]) else
        f"val {s['val_acc']:.4f}, test {s['test_acc']:.4f}")
        + ("" if math.isnan(s["final_loss"]) else f" (final loss {s['final_loss']:.4f})"),
        f"  logs            {s['run_dir']}/rank-*.h5",
    ]
    return "\n".join(lines)


def epoch_time_text(s: dict) -> str:
    """The epoch time with the steady epochs it came from and their spread, or why there is none."""
    if s["too_short"]:
        return f"no epoch time: {s['too_short']}"
    timed, (low, high) = s["timed_epochs"], s["epoch_spread"]
    return (f"epoch time {s['epoch_seconds']:.3f} s: the slowest trainer's, median over the steady epochs "
            f"{timed[0] + 1}..{timed[-1] + 1}, which spread {low:.3f}-{high:.3f} s")
