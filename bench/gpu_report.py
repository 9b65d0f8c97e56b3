"""The GPU check's report (bench/gpu_check.sh): its runs side by side, and how they agree.

    python bench/gpu_report.py RUN_DIR [RUN_DIR ...] [--json FILE]

Per run (``rudder.analysis.summary``, the figures of ``rudder.analyze``): device, policy, the
gradient allreduce's path, final test accuracy, epoch time (the slowest trainer's, median over
the steady epochs, rudder.logs.metrics) and its breakdown in seconds per epoch, trainer mean: sample, fetch (feature
assembly), copy (blocks and inputs onto the device), compute (forward and backward), allreduce
(with the part spent staging gradients through host memory), update; and the share of the epoch
the training thread, and with it the GPU, waited for inputs. Then, per dataset: whether each
buffer policy trained bit-identically to no buffer on the same device, and how far the CUDA run
is from the CPU run with the same policy (the losses at the first minibatch and over the first
epoch, final accuracy, epoch time). Dropout masks come from each device's own generator: the
losses agree to float tolerance only with ``--dropout 0``, and at the first minibatch only then.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rudder.analysis.summary import summarize  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402

BREAKDOWN = (("sample", "t_sample"), ("fetch", "t_fetch"), ("copy", "t_copy"), ("compute", "t_forward_backward"),
             ("allreduce", "t_allreduce"), ("grad copy", "t_grad_copy"), ("update", "t_update"))


def describe(path: str) -> dict:
    run = load_run(path)
    s = summarize(run)
    cfg, record = run.config, run.ranks[0].run
    mean_epoch = s["epochs"]["mean_seconds"]
    wait = s["time_breakdown"]["t_wait"]
    return {"run": os.path.basename(os.path.normpath(path)), "dataset": os.path.basename(cfg["data"]),
            "device": cfg["device"], "policy": cfg["policy"], "allreduce": record.get("allreduce", "host"),
            "status": s["status"], "test_acc": s["accuracy"]["test"], "epoch_s": s["epochs"]["median_seconds"],
            "breakdown": {name: s["time_breakdown"][column] for name, column in BREAKDOWN},
            "wait_share": wait / mean_epoch if wait is not None and mean_epoch else None,
            "losses": [r.minibatches["loss"] for r in run.ranks],
            "first_epoch": [r.minibatches["epoch"] == r.minibatches["epoch"].min() for r in run.ranks]}


def agreement(runs: list[dict]) -> list[str]:
    lines = []
    by_key = {(r["dataset"], r["device"], r["policy"]): r for r in runs}
    for (dataset, device, policy), r in sorted(by_key.items()):
        base = by_key.get((dataset, device, "none"))
        if policy != "none" and base is not None:
            same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(r["losses"], base["losses"]))
            lines.append(f"{dataset} {device}: losses with --policy {policy} "
                         f"{'bit-identical to' if same else 'DIFFER from'} no buffer")
        cpu = by_key.get((dataset, "cpu", policy))
        if device == "cuda" and cpu is not None:
            first_step = relative_gap(r["losses"], cpu["losses"], [np.arange(m.size) == 0 for m in cpu["first_epoch"]])
            first_epoch = relative_gap(r["losses"], cpu["losses"], cpu["first_epoch"])
            acc = (r["test_acc"] - cpu["test_acc"]) if None not in (r["test_acc"], cpu["test_acc"]) else float("nan")
            speed = cpu["epoch_s"] / r["epoch_s"] if r["epoch_s"] and cpu["epoch_s"] else float("nan")
            lines.append(f"{dataset} --policy {policy}: cuda vs cpu: losses within {first_step:.1e} (relative) at the "
                         f"first minibatch, {first_epoch:.1e} over the first epoch; test accuracy {acc:+.4f}; "
                         f"epoch time cpu / cuda {speed:.2f}x")
    return lines


def relative_gap(losses: list, reference: list, masks: list) -> float:
    """The largest relative difference of the masked losses from the reference's, over the ranks
    (both runs' trainers take the same minibatches, so their losses align by step)."""
    gaps = [np.abs(a[:m.size][m] - b[:m.size][m]) / np.maximum(np.abs(b[:m.size][m]), 1e-12)
            for a, b, m in zip(losses, reference, masks)]
    return max((float(np.nanmax(g)) for g in gaps if g.size), default=float("nan"))


def table(runs: list[dict]) -> str:
    names = [name for name, _ in BREAKDOWN]
    head = f"{'run':28s} {'allreduce':9s} {'status':10s} {'test acc':>8s} {'epoch s':>8s} " + " ".join(
        f"{n:>9s}" for n in names) + f" {'wait %':>7s}"
    out = [head, "-" * len(head)]
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    for r in runs:
        out.append(f"{r['run']:28s} {r['allreduce']:9s} {r['status']:10s} {fmt(r['test_acc'], '8.4f')} "
                   f"{fmt(r['epoch_s'], '8.3f')} " + " ".join(f"{fmt(r['breakdown'][n], '9.4f')}" for n in names)
                   + f" {fmt(r['wait_share'] and 100 * r['wait_share'], '7.1f')}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", help="also write the figures (losses left out) to this file")
    a = ap.parse_args()
    runs, failed = [], []
    for path in a.runs:
        try:
            runs.append(describe(path))
        except Exception as e:  # a run that failed leaves no readable logs: report it, go on
            failed.append(f"{path}: no report ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    print("seconds per epoch, trainer mean (grad copy: the part of allreduce staging gradients through host memory); "
          "wait %: share of the epoch the training thread waited for its inputs")
    print(table(runs))
    for line in agreement(runs) + failed:
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k not in ("losses", "first_epoch")} for r in runs], f, indent=1)


if __name__ == "__main__":
    main()
