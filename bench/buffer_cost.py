"""Benchmark (not a test): what the prefetch buffers cost, this tree against an earlier revision,
side by side in one run.

    python bench/buffer_cost.py [--halo 300000] [--inputs 30000] [--minibatches 100] [--baseline 789f7f5]
    python bench/buffer_cost.py --e2e PARTS [--baseline-repo DIR] [--ranks 4] [--epochs 1] [--reps 1]

Per minibatch (one process, no MPI): a synthetic partition (a halo of --halo nodes whose
popularity follows a power law like in-degrees, minibatches of about --inputs distinct input
nodes, a third of them the partition's own) is assembled through ``CachedFeatures`` over an
in-memory feature store by the buffer of each policy (static, fixed every --delta minibatches,
lookahead with a window of --lookahead), once with this tree's buffers and once with those of
git revision --baseline (its ``rudder/prefetch`` buffer modules and ``assembly`` loaded from git
into this process), minibatch by minibatch in alternating order so that machine noise hits both
alike, and beside them ``none`` (every row read from the store). Prints the buffer's own time per
minibatch (lookup + replace + settle), the whole assembly's, after/before ratios and the ratios
to none, in CPU seconds of the one thread doing it all (torch limited to it), which other jobs on
a shared machine disturb far less than wall time; before, after and none must assemble identical
rows, with identical counts.

End to end (--e2e PARTS): ``mpiexec -n RANKS drivers/train.py`` of this tree (and of
--baseline-repo when given, alternating), for none, static, fixed and lookahead (batch
--batch-size, f = --fraction), --reps times in alternating order, printing each tree's median
epoch time against the same tree's ``none``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import types

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import train_job  # noqa: E402
from rudder.comm.dist_array import DistributedArray  # noqa: E402
from rudder.logs.metrics import remote_rows_per_epoch, run_epoch_time, run_timed_epochs  # noqa: E402
from rudder.logs.reader import load_run  # noqa: E402
from rudder.prefetch import assembly, buffers, scored_buffer, window_buffer  # noqa: E402
from rudder.prefetch.policies import make_policy  # noqa: E402
from rudder.train.config import TrainConfig  # noqa: E402

PREFETCH = ("buffers", "scored_buffer", "window_buffer", "assembly")  # in import order
POLICIES = ("static", "fixed", "lookahead")


def load_revision(rev: str) -> dict:
    """The buffer modules and ``assembly`` of git revision ``rev``, as module objects of their
    own: each is executed with the others of ``rev`` standing in for this tree's in sys.modules,
    which are put back afterwards."""
    mods, saved = {}, {name: sys.modules[f"rudder.prefetch.{name}"] for name in PREFETCH}
    try:
        for name in PREFETCH:
            path = f"rudder/prefetch/{name}.py"
            src = subprocess.run(["git", "-C", REPO, "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
            mod = types.ModuleType(f"rudder.prefetch.{name}")
            sys.modules[mod.__name__] = mod
            exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
            mods[name] = mod
    finally:
        sys.modules.update({f"rudder.prefetch.{name}": mod for name, mod in saved.items()})
    return mods


class MemoryStore:
    """The feature store of a trainer whose node holds all four partitions (as with
    ``mpiexec -n 4`` on one host): partition 0 its own, rows read by ``DistributedArray.read``
    itself, whose copies from the own segment and same-node peers are all this store does."""

    def __init__(self, part, dim: int):
        rng = np.random.default_rng(1)
        self.dim, self.offsets = dim, np.arange(5, dtype=np.int64) * part.node_end
        tables = [rng.standard_normal((part.node_end, dim), dtype=np.float32) for _ in range(4)]
        self.rows = types.SimpleNamespace(row_shape=(dim,), dtype=np.dtype(np.float32), exposer=np.arange(4),
                                          own_part=0, own=tables[0], views=dict(enumerate(tables)))

    def in_shared_memory(self, gids):
        return np.ones(np.asarray(gids).size, dtype=bool)

    def gather(self, gids, out=None, at=None, spare=False, while_fetching=None):
        gids = np.asarray(gids, dtype=np.int64)
        parts = np.searchsorted(self.offsets, gids, side="right") - 1
        return DistributedArray.read(self.rows, parts, gids - self.offsets[parts], out, at, spare, while_fetching)


class Partition:
    def __init__(self, a):
        rng = np.random.default_rng(a.seed)
        self.node_start, self.node_end = 0, a.halo  # the partition owns as many nodes as its halo has
        self.num_nodes = 4 * a.halo
        self.halo_nodes = np.sort(rng.choice(np.arange(self.node_end, self.num_nodes), size=a.halo, replace=False))
        self.halo_in_degree = (rng.pareto(1.2, size=a.halo) * 4 + 1).astype(np.int64)
        self.own_weight = rng.pareto(1.2, size=self.node_end) + 1


def minibatches(part: Partition, a) -> list[np.ndarray]:
    """Distinct input nodes, drawn in proportion to degree (Gumbel top-k), in random order."""
    rng = np.random.default_rng(a.seed + 1)
    remote, own = int(a.inputs * 2 / 3), a.inputs - int(a.inputs * 2 / 3)
    log_halo, log_own = np.log(part.halo_in_degree), np.log(part.own_weight)
    out = []
    for _ in range(a.minibatches):
        r = np.argpartition(-(log_halo + rng.gumbel(size=log_halo.size)), remote)[:remote]
        o = np.argpartition(-(log_own + rng.gumbel(size=log_own.size)), own)[:own]
        out.append(rng.permutation(np.concatenate([part.halo_nodes[r], part.node_start + o])))
    return out


class Timed:
    """A buffer's protocol calls, timed: seconds per call, by name."""

    def __init__(self, buffer):
        self.seconds = {name: [] for name in ("lookup", "replace", "settle")}
        for name in self.seconds:
            setattr(buffer, name, self._wrap(getattr(buffer, name), self.seconds[name]))

    @staticmethod
    def _wrap(call, log):
        def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                log.append(time.thread_time() - t)
        return timed

    def per_minibatch(self) -> np.ndarray:
        return np.sum([self.seconds[name] for name in self.seconds], axis=0)


def source(mods: dict, policy: str, part: Partition, store: MemoryStore, a):
    cfg = TrainConfig.from_flat({"policy": policy, "delta": a.delta, "lookahead": a.lookahead, "buffer_fraction": a.fraction})
    pol = make_policy(cfg)
    if pol.buffer_class is None:
        return mods["assembly"].UncachedFeatures(store), None
    cls = getattr(mods[pol.buffer_class.__module__.rsplit(".", 1)[1]], pol.buffer_class.__name__)
    settings = mods["buffers"].BufferSettings.of(cfg.buffer)
    buffer = cls.build(settings, part, part.num_nodes, a.dim, np.random.default_rng(0))
    features = mods["assembly"].CachedFeatures(store, buffer, pol, settings.compat)
    features.fill()
    return features, Timed(buffer)


COUNTS = ("hits", "misses", "refills", "evictions", "candidates", "refetched")


def per_minibatch(a) -> None:
    torch.set_num_threads(1)
    part = Partition(a)
    trace, store = minibatches(part, a), MemoryStore(part, a.dim)
    this = {"buffers": buffers, "scored_buffer": scored_buffer, "window_buffer": window_buffer, "assembly": assembly}
    trees = {"before": load_revision(a.baseline), "after": this}
    print(f"halo {part.halo_nodes.size:,}, buffer {int(a.fraction * part.halo_nodes.size):,} rows of {a.dim} floats, "
          f"{len(trace)} minibatches of {np.mean([t.size for t in trace]):,.0f} inputs; before = {a.baseline}, "
          f"load {os.getloadavg()[0]:.2f}")
    print("CPU ms per minibatch: the buffer's own (lookup + replace + settle), and the whole assembly (with the store's "
          "reads and the copies), against none's assembly run alongside")
    print(f"{'policy':<10} {'buffer before':>13} {'after':>7} {'ratio':>6}   {'assembly before':>15} {'after':>7} {'ratio':>6} "
          f"{'none':>6} {'before/none':>11} {'after/none':>10}   {'hits':>5}   after: lookup, replace (worst), settle")
    for policy in POLICIES:
        runs = {tree: source(mods, policy, part, store, a) for tree, mods in trees.items()}
        runs["none"] = source(this, "none", part, store, a)
        total = dict.fromkeys(runs, 0.0)
        hits = 0
        for i, nodes in enumerate(trace):
            future = trace[i + 1:i + 1 + a.lookahead]
            out = {}
            for name in (list(runs) if i % 2 else list(runs)[::-1]):
                t = time.thread_time()
                out[name] = runs[name][0].assemble(nodes, future)
                total[name] += time.thread_time() - t
            (xb, sb), (xa, sa), (xn, _) = out["before"], out["after"], out["none"]
            if [getattr(sb, c) for c in COUNTS] != [getattr(sa, c) for c in COUNTS] or sb.fetch != sa.fetch \
                    or xb.tobytes() != xa.tobytes() or xa.tobytes() != xn.tobytes():
                raise SystemExit(f"{policy}: minibatch {i} differs between {a.baseline} and this tree")
            hits += sa.hits
        n = len(trace)
        buf = {tree: 1e3 * runs[tree][1].per_minibatch().mean() for tree in trees}
        whole = {name: 1e3 * total[name] / n for name in runs}
        after = {k: 1e3 * np.array(v) for k, v in runs["after"][1].seconds.items()}
        print(f"{policy:<10} {buf['before']:>13.2f} {buf['after']:>7.2f} {buf['after'] / buf['before']:>6.3f}   "
              f"{whole['before']:>15.2f} {whole['after']:>7.2f} {whole['after'] / whole['before']:>6.3f} {whole['none']:>6.2f} "
              f"{whole['before'] / whole['none']:>11.3f} {whole['after'] / whole['none']:>10.3f}   "
              f"{hits / sum(t.size for t in trace):>5.1%}   {after['lookup'].mean():.2f}, {after['replace'].mean():.2f} "
              f"({after['replace'].max():.2f}), {after['settle'].mean():.2f}", flush=True)


def end_to_end(a) -> None:
    compared = bool(a.baseline_repo)
    repos = {"before": os.path.abspath(a.baseline_repo), "after": REPO} if compared else {"after": REPO}
    flags = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--buffer-fraction", str(a.fraction)]
    print(f"{a.e2e}: {a.ranks} ranks on one node, {a.epochs} epoch(s), batch {a.batch_size}, f={a.fraction}; "
          f"trees {repos}, load {os.getloadavg()[0]:.2f}")
    policies = ("none", *POLICIES)
    times: dict = {}
    for rep in range(a.reps):
        # Alternate the order within each repetition, so that a drift in the machine's load
        # falls on every policy and tree alike rather than on whichever always runs last.
        order = [(tree, policy) for policy in policies for tree in repos]
        for tree, policy in (order if rep % 2 == 0 else order[::-1]):
            run_dir = os.path.join(a.work, f"{tree}-{policy}")
            train_job(a.e2e, run_dir, a.ranks, 1, ["--policy", policy, *flags], repo=repos[tree])
            run = load_run(run_dir)
            tables = [r.epochs for r in run.ranks]
            rows = remote_rows_per_epoch([r.minibatches for r in run.ranks], run_timed_epochs(tables))
            times.setdefault((tree, policy), []).append((run_epoch_time(tables), rows))
            print(f"  rep {rep} {tree:<6} {policy:<10} {times[tree, policy][-1][0]:8.2f} s  "
                  f"{rows:>12,.0f} remote rows/epoch  (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"medians of {a.reps} repetition(s); x none = against the same tree's none")
    print(f"{'policy':<10} " + " ".join(f"{tree + ' s':>9} {'x none':>7}" for tree in repos)
          + (f" {'after/before':>13}" if compared else "") + f" {'rows x none':>12}")
    for policy in policies:
        med = {tree: float(np.median([t for t, _ in times[tree, policy]])) for tree in repos}
        base = {tree: float(np.median([t for t, _ in times[tree, "none"]])) for tree in repos}
        rows = times["after", policy][0][1] / times["after", "none"][0][1]
        print(f"{policy:<10} " + " ".join(f"{med[tree]:>9.2f} {med[tree] / base[tree]:>7.3f}" for tree in repos)
              + (f" {med['after'] / med['before']:>13.3f}" if compared else "") + f" {rows:>12.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--halo", type=int, default=300_000)
    ap.add_argument("--inputs", type=int, default=30_000)
    ap.add_argument("--minibatches", type=int, default=100)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--delta", type=int, default=25)
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default="789f7f5", help="git revision the buffers are compared with")
    ap.add_argument("--e2e", metavar="PARTS", help="partitions to train on end to end instead")
    ap.add_argument("--baseline-repo", help="with --e2e: a checkout of a revision to compare with (default: this tree alone)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-buffer-cost"))
    a = ap.parse_args()
    if a.e2e:
        end_to_end(a)
    else:
        per_minibatch(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
