"""Benchmark (not a test): what a rank costs as the job grows, P = 4 .. 64 trainers on P/4 emulated
nodes (issue 40; docs/results-scale.md).

    python bench/scale.py [--points 4,8,16,32,64] [--policies none,lookahead,heuristic] [--strong 4,8,16,32,64]
        [--nodes-per-trainer 1024] [--epochs 3] [--workdir DIR] [--out FILE.json] [--lock FILE] [--bind core]

Weak scaling: RMAT graphs (edge factor 16, 128 float32 features, 16 classes) of P x 1024 nodes, so
scale log2(P) + 10, the same nodes and edges a trainer at every P, in P METIS parts. Strong
scaling (``--strong``): the largest of them (RMAT-16) at every P, policy ``none``. Every job runs
over OFI/TCP between P/4 emulated nodes (``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp
MPIR_CVAR_NUM_CLIQUES=P/4``, no shaping), an agent rank a node for the agent policy, 128 seeds a
minibatch, with a checkpoint after the second epoch and the final evaluation after the last.

From each run's logs (rudder.logs: ``startup``, ``memory``, ``minibatches``, ``epochs``) and the
MPI counting shim (bench/mpi_counts.py) preloaded into every rank:

* start-up by phase, process start to the first minibatch, wall and CPU seconds a trainer;
* peak PSS a trainer, by owner, and the halo a trainer;
* a steady minibatch (epoch 1): owners read by RMA, RMA calls (Gets, Flushes, datatypes), bytes,
  read seconds; the epoch's collectives a rank joins and their bytes;
* the evaluation's Gets and bytes and seconds against an epoch's; a checkpoint's bytes a rank;
* ``python -m rudder.plan``'s memory a trainer against the measured PSS.

64 ranks share the host's 2 cores: counts and CPU seconds are the figures, wall times context.
Jobs of 32 trainers or more run under ``flock LOCK`` (big-memory jobs of the host take turns).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_counts  # noqa: E402
from mpi_job import MPIEXEC, cached_partition, cpu_ticks  # noqa: E402

from rudder.logs import metrics  # noqa: E402
from rudder.logs.reader import read_rank  # noqa: E402
from rudder.plan.cli import plan  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINERS_PER_NODE = 4
BATCH = 128
FEAT_DIM = 128
RMA = ("MPI_Get", "MPI_Rget")
FLUSH = ("MPI_Win_flush", "MPI_Win_flush_local", "MPI_Win_flush_all", "MPI_Win_flush_local_all")
DATATYPES = ("MPI_Type_indexed", "MPI_Type_create_indexed_block", "MPI_Type_create_hindexed",
             "MPI_Type_create_hindexed_block", "MPI_Type_contiguous", "MPI_Type_commit", "MPI_Type_free",
             "MPI_Type_vector", "MPI_Type_create_struct")
COLLECTIVES = ("MPI_Allreduce", "MPI_Iallreduce", "MPI_Ibarrier", "MPI_Allgather", "MPI_Allgatherv", "MPI_Gather", "MPI_Gatherv",
               "MPI_Bcast", "MPI_Barrier", "MPI_Reduce", "MPI_Alltoall", "MPI_Scatter", "MPI_Win_allocate",
               "MPI_Win_allocate_shared", "MPI_Win_free", "MPI_Comm_split", "MPI_Comm_split_type")
POLLS = ("MPI_Test", "MPI_Testall", "MPI_Testany", "MPI_Testsome", "MPI_Iprobe", "MPI_Wait", "MPI_Waitall")


def spec(scale: int) -> str:
    return f"synthetic:rmat:scale={scale},edge_factor=16,feat_dim={FEAT_DIM},classes=16,seed=1"


def run_job(parts: str, run_dir: str, trainers: int, policy: str, epochs: int, shim: str, lock: str | None,
            bind: str = "none") -> dict:
    """One training job; returns its wall seconds, the host's CPU seconds and the shim's log prefix."""
    from rudder.data.partition_store import PartitionMeta

    meta = PartitionMeta.load(parts)
    steps = -(-max(p.num_train for p in meta.parts) // BATCH)
    agents = trainers // TRAINERS_PER_NODE if policy == "heuristic" else 0
    counts = os.path.join(run_dir + "-mpi", "counts")
    os.makedirs(os.path.dirname(counts), exist_ok=True)
    for old in glob.glob(counts + ".*"):
        os.remove(old)
    binding = [] if bind == "none" else ["-bind-to", bind]  # hydra's: a core (or a hardware thread) a rank
    cmd = [MPIEXEC, *binding, "-n", str(trainers + agents), sys.executable,
           os.path.join(REPO, "drivers", "train.py"), "--data", parts, "--run-dir", run_dir, "--overwrite",
           "--epochs", str(epochs), "--eval-every", "0", "--progress", "none", "--policy", policy,
           "--batch-size", str(BATCH), "--checkpoint-every", str(2 * steps)]
    if lock and trainers >= 32:
        cmd = ["flock", lock, *cmd]
    env = dict(os.environ, MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp",
               MPIR_CVAR_NUM_CLIQUES=str(max(1, trainers // TRAINERS_PER_NODE)), **mpi_counts.env(shim, counts))
    ticks, t = cpu_ticks(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    wall, after = time.perf_counter() - t, cpu_ticks()
    busy = sum(a - b for a, b in zip(after, ticks)) - (after[3] - ticks[3])  # all but idle
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "host_cpu_s": busy / os.sysconf("SC_CLK_TCK"), "counts": counts, "steps": steps,
            "ranks": trainers + agents}


def mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def by_rank_marks(counts: str) -> dict[int, list[dict]]:
    out = {}
    for marks in mpi_counts.read(counts).values():
        ranks = [m["rank"] for m in marks if m["rank"] >= 0]
        if ranks:
            out[ranks[0]] = marks
    return out


def summed(calls: dict, names) -> int:
    return sum(calls.get(n, 0) for n in names)


def analyse(run_dir: str, job: dict, parts: str, policy: str) -> dict:
    logs = [read_rank(p) for p in sorted(glob.glob(os.path.join(run_dir, "rank-*.h5")))]
    trainers = [log for log in logs if log.role == "trainer"]
    marks = by_rank_marks(job["counts"])
    first_of_node = {}
    for log in trainers:  # a node's first trainer reads the replicated CSR for its node
        node, rank = log.attrs["layout"]["node_id"], log.attrs["layout"]["world_rank"]
        first_of_node[node] = min(first_of_node.get(node, rank), rank)
    per_rank = []
    for log in trainers:
        lay, run = log.attrs["layout"], log.attrs["run"]
        startup = log.tables["startup"]
        phases = {}
        for row in startup:
            name = row["phase"].decode()
            wall, cpu = phases.get(name, (0.0, 0.0))
            phases[name] = (wall + float(row["seconds"]), cpu + float(row["cpu_seconds"]))
        runtime = next(r for r in startup if r["phase"] == b"trainer imports")
        memory = log.tables["memory"]
        peak = memory[int(memory["pss_bytes"].argmax())]
        training = memory[memory["point"] != b"evaluation"]
        mb = log.tables["minibatches"]
        steady = mb[mb["epoch"] == 1]
        epochs = log.tables["epochs"]
        rank_marks = marks.get(lay["world_rank"], [])
        epoch_calls = mpi_counts.between(rank_marks, "epoch:0", "epoch:1") if rank_marks else None
        last = int(epochs["epoch"].max())
        eval_calls = (mpi_counts.between(rank_marks, f"epoch:{last}", f"evaluation:{last}") if rank_marks else None)
        startup_calls = (mpi_counts.between(rank_marks, "startup:imports", "startup:first minibatch")
                         if rank_marks else None)
        steps = len(steady)
        row = {"rank": lay["world_rank"], "node_first": first_of_node[lay["node_id"]] == lay["world_rank"],
               "halo": run["halo_nodes"], "phases": phases,
               "startup_cpu": metrics.startup_cpu(startup, imports=False),
               "startup_wall": sum(w for _, (w, _) in phases.items()),
               "imports_cpu": metrics.startup_cpu(startup) - metrics.startup_cpu(startup, imports=False),
               "runtime_anon": int(runtime["pss_anon_bytes"]), "runtime_file": int(runtime["pss_file_bytes"]),
               "runtime_shmem": int(runtime["pss_shmem_bytes"]),
               "peak_pss": int(peak["pss_bytes"]), "train_peak_pss": int(training["pss_bytes"].max()),
               "train_peak_anon": int(training["pss_anon_bytes"].max()),
               "train_peak_shmem": int(training["pss_shmem_bytes"].max()),
               "train_peak_file": int(training["pss_file_bytes"].max()), "peak_anon": int(peak["pss_anon_bytes"]),
               "peak_file": int(peak["pss_file_bytes"]), "peak_shmem": int(peak["pss_shmem_bytes"]),
               "peak_rss": int(memory["peak_rss_bytes"].max()),
               # the evaluation's high point beyond every earlier one (VmHWM): PSS samples, taken
               # after it, miss what it held while it ran
               "eval_rss_rise": int(max(0, memory["peak_rss_bytes"].max() - training["peak_rss_bytes"].max())),
               **{k: int(peak[k]) for k in ("graph_bytes", "features_bytes", "buffer_bytes", "model_bytes")},
               "owners_rma": float(steady["owners_rma"].mean()), "rows_rma": float(steady["rows_rma"].mean()),
               "bytes_rma": float((steady["bytes_rma"] + steady["adjacency_bytes_rma"]).mean()),
               "t_rma": float(steady["t_rma"].mean()), "input_nodes": float(steady["input_nodes"].mean()),
               "epoch_seconds": float(epochs["seconds"][epochs["epoch"] == 1][0]),
               "eval_seconds": float(epochs["eval_seconds"][epochs["epoch"] == last][0]),
               "steps": steps}
        if epoch_calls is not None:
            calls, nbytes = epoch_calls["calls"], epoch_calls["bytes"]
            row.update(gets=summed(calls, RMA) / steps, flushes=summed(calls, FLUSH) / steps,
                       datatypes=summed(calls, DATATYPES) / steps, polls=summed(calls, POLLS) / steps,
                       get_bytes=summed(nbytes, RMA) / steps,
                       collectives={n: calls[n] for n in COLLECTIVES if n in calls},
                       collective_bytes=summed(nbytes, COLLECTIVES), all_calls=sum(calls.values()) / steps)
        if eval_calls is not None:
            row.update(eval_gets=summed(eval_calls["calls"], RMA), eval_get_bytes=summed(eval_calls["bytes"], RMA),
                       eval_collectives=summed(eval_calls["calls"], COLLECTIVES))
        if startup_calls is not None:
            # start-up work outside MPI: the CPU the start-up spent (imports aside) less the CPU its
            # threads spent inside MPI calls, mostly polling in waits for other ranks
            in_mpi = startup_calls["inside_cpu_ns"] / 1e9
            row.update(startup_collectives=summed(startup_calls["calls"], COLLECTIVES),
                       startup_calls=sum(startup_calls["calls"].values()), startup_cpu_in_mpi=in_mpi,
                       startup_cpu_outside_mpi=row["startup_cpu"] - in_mpi)
        per_rank.append(row)
    checkpoint = {}
    for folder in sorted(glob.glob(os.path.join(run_dir, "checkpoint", "*")))[-1:]:
        for path in glob.glob(os.path.join(folder, "*")):
            checkpoint[os.path.basename(path)] = os.path.getsize(path)
    rank_files = [v for k, v in checkpoint.items() if k.startswith("rank")]
    agents = [log for log in logs if log.role == "agent"]
    return {"ranks": per_rank, "job": job, "policy": policy, "parts": parts,
            "checkpoint_rank_bytes": mean(rank_files), "checkpoint_model_bytes": checkpoint.get("model.pt", 0),
            "agent_build_s": mean(float(a.attrs.get("decider_build_seconds", float("nan"))) for a in agents),
            "agent_wait_s": mean(float(t.attrs.get("agent_wait_s", 0.0)) for t in trainers)}


def point_summary(result: dict) -> dict:
    ranks = result["ranks"]
    phases = sorted({p for r in ranks for p in r["phases"]}, key=lambda p: list(ranks[0]["phases"]).index(p)
                    if p in ranks[0]["phases"] else 99)
    out = {"trainers": len(ranks), "parts": result["parts"], "ranks": result["job"]["ranks"],
           "halo": mean(r["halo"] for r in ranks),
           "startup_cpu": mean(r["startup_cpu"] for r in ranks), "startup_cpu_max": max(r["startup_cpu"] for r in ranks),
           "startup_cpu_node_first": mean(r["startup_cpu"] for r in ranks if r["node_first"]),
           "startup_cpu_others": mean(r["startup_cpu"] for r in ranks if not r["node_first"]),
           "imports_cpu": mean(r["imports_cpu"] for r in ranks), "startup_wall": mean(r["startup_wall"] for r in ranks),
           "phases": {p: (mean(r["phases"].get(p, (0, 0))[0] for r in ranks), mean(r["phases"].get(p, (0, 0))[1]
                                                                                  for r in ranks)) for p in phases}}
    for key in ("peak_pss", "peak_anon", "peak_file", "peak_shmem", "peak_rss", "eval_rss_rise", "runtime_anon", "runtime_file",
                "runtime_shmem", "graph_bytes", "features_bytes", "buffer_bytes", "model_bytes", "owners_rma", "rows_rma",
                "bytes_rma", "t_rma", "input_nodes", "epoch_seconds", "eval_seconds", "gets", "flushes", "datatypes",
                "polls", "get_bytes", "collective_bytes", "all_calls", "eval_gets", "eval_get_bytes", "eval_collectives",
                "startup_collectives", "startup_calls", "startup_cpu_in_mpi", "startup_cpu_outside_mpi"):
        if key in ranks[0]:
            out[key] = mean(r[key] for r in ranks)
    out["peak_pss_max"] = max(r["peak_pss"] for r in ranks)
    out["pss_less_file"] = mean(r["peak_pss"] - r["peak_file"] for r in ranks)
    if "collectives" in ranks[0]:
        out["collectives"] = {n: mean(r["collectives"].get(n, 0) for r in ranks)
                              for n in sorted({n for r in ranks for n in r["collectives"]})}
        out["collectives_per_epoch"] = sum(out["collectives"].values())
        # the steps' gradient Iallreduce aside: what an epoch adds (digests, its rows to trainer 0, the MPI lock's Ibarriers)
        out["epoch_collectives"] = out["collectives_per_epoch"] - out["collectives"].get("MPI_Iallreduce", 0)
        out["rma_calls_per_owner"] = ((out["gets"] + out["flushes"] + out["datatypes"]) / out["owners_rma"]
                                      if out["owners_rma"] else float("nan"))
    out.update({k: result[k] for k in ("checkpoint_rank_bytes", "checkpoint_model_bytes", "agent_build_s", "agent_wait_s")})
    out.update(wall_s=result["job"]["wall_s"], host_cpu_s=result["job"]["host_cpu_s"])
    return out


MB = 1 << 20


def print_tables(series: dict) -> None:
    for label, points in series.items():
        print(f"\n== {label}")
        print(f"{'P':>3} {'halo':>6} {'start CPU':>9} {'(max)':>6} {'imports':>7} {'start wall':>10} {'peak PSS':>8} "
              f"{'-file':>7} {'anon':>6} {'shmem':>6} {'graph':>6} {'feat':>5} {'buf':>5} {'plan':>6} {'plan/PSS':>11} "
              f"{'owners':>6} {'gets':>5} {'flush':>5} {'types':>5} {'/owner':>6} {'polls':>6} {'coll/ep':>7} {'+epoch':>6} "
              f"{'KB/mb':>6} {'rma s':>6} {'ckpt KB':>7} {'eval MB':>7} {'eval s':>6} {'ep s':>5} {'wall':>5}")
        for p, s in sorted(points.items(), key=lambda kv: int(kv[0])):
            print(f"{p:>3} {s['halo']:>6.0f} {s['startup_cpu']:>9.2f} {s['startup_cpu_max']:>6.2f} {s['imports_cpu']:>7.2f} "
                  f"{s['startup_wall']:>10.1f} {s['peak_pss'] / MB:>8.1f} {s['pss_less_file'] / MB:>7.1f} "
                  f"{s['peak_anon'] / MB:>6.1f} {s['peak_shmem'] / MB:>6.1f} {s['graph_bytes'] / MB:>6.2f} "
                  f"{s['features_bytes'] / MB:>5.2f} {s['buffer_bytes'] / MB:>5.2f} {s.get('planned', 0) / MB:>6.1f} "
                  f"{s.get('plan_ratio_min', 0):>5.2f}-{s.get('plan_ratio_max', 0):<5.2f} "
                  f"{s['owners_rma']:>6.1f} {s.get('gets', 0):>5.1f} {s.get('flushes', 0):>5.1f} {s.get('datatypes', 0):>5.1f} "
                  f"{s.get('rma_calls_per_owner', 0):>6.2f} {s.get('polls', 0):>6.0f} "
                  f"{s.get('collectives_per_epoch', 0):>7.1f} {s.get('epoch_collectives', 0):>6.1f} "
                  f"{s['bytes_rma'] / 1024:>6.0f} {s['t_rma']:>6.3f} {s['checkpoint_rank_bytes'] / 1024:>7.1f} "
                  f"{s.get('eval_get_bytes', 0) / MB:>7.2f} {s['eval_seconds']:>6.2f} {s['epoch_seconds']:>5.2f} "
                  f"{s['wall_s']:>5.0f}")
        first = min(points, key=int)
        for p, s in sorted(points.items(), key=lambda kv: int(kv[0])):
            phases = "  ".join(f"{k} {w:.2f}/{c:.2f}" for k, (w, c) in s["phases"].items())
            coll = ", ".join(f"{k[4:]} {v:.1f}" for k, v in s.get("collectives", {}).items())
            print(f"  P={p}: phases wall/CPU s: {phases}; a node's first trainer {s['startup_cpu_node_first']:.2f} CPU s "
                  f"(imports aside), the rest {s['startup_cpu_others']:.2f}; peak PSS max {s['peak_pss_max'] / MB:.1f} MB, "
                  f"peak RSS {s['peak_rss'] / MB:.1f} MB (the evaluation's {s.get('eval_rss_rise', 0) / MB:.1f} MB "
                  f"above training's); start-up collectives {s.get('startup_collectives', 0):.0f}, "
                  f"start-up CPU inside MPI {s.get('startup_cpu_in_mpi', float('nan')):.2f} s, outside "
                  f"{s.get('startup_cpu_outside_mpi', float('nan')):.2f} s (imports aside), "
                  f"agent build {s['agent_build_s']:.2f} s, trainers waited {s['agent_wait_s']:.2f} s for it")
            print(f"        collectives in epoch 1 ({s.get('collective_bytes', 0):.0f} B): {coll}")
        last = max(points, key=int)
        a, b = points[first], points[last]
        outside = (b["startup_cpu_outside_mpi"] / a["startup_cpu_outside_mpi"]
                   if a.get("startup_cpu_outside_mpi") and "startup_cpu_outside_mpi" in b else float("nan"))
        print(f"  P={last} / P={first}: start-up CPU (imports aside) {b['startup_cpu'] / a['startup_cpu']:.2f}x, "
              f"outside MPI {outside:.2f}x, "
              f"peak PSS {b['peak_pss'] / a['peak_pss']:.2f}x, "
              f"PSS less file-backed {b['pss_less_file'] / a['pss_less_file']:.2f}x, "
              f"halo {b['halo'] / a['halo']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="4,8,16,32,64")
    ap.add_argument("--policies", default="none,lookahead,heuristic")
    ap.add_argument("--strong", default="", help="trainer counts of the strong-scaling series (RMAT of the largest point)")
    ap.add_argument("--nodes-per-trainer", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/rudder-scale")
    ap.add_argument("--lock", default=None,
                    help="run jobs of 32 trainers or more under flock FILE (a shared host's big jobs take turns)")
    ap.add_argument("--bind", default="none", choices=("none", "core", "hwthread"),
                    help="pin each rank to a core (mpiexec -bind-to core): a core a rank, where the host has enough")
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", metavar="FILE.json", help="print the tables of an earlier series (its plan figures redone)")
    ap.add_argument("--markdown", action="store_true", help="with --report: the tables as docs/results-scale.md has them")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            results = json.load(f)
        report(results, a.report)
        if a.markdown:
            print(markdown(results))
        return
    os.makedirs(a.workdir, exist_ok=True)
    shim = mpi_counts.build(os.path.join(a.workdir, "shim"))
    if shim is None:
        raise SystemExit("the MPI counting shim cannot be built here (bench/mpi_counts.py)")
    points = [int(p) for p in a.points.split(",") if p]
    policies = [p for p in a.policies.split(",") if p]
    out = a.out or os.path.join(a.workdir, "scale.json")
    results = {"weak": {}, "strong": {}}
    if os.path.isfile(out):  # a series cut short goes on: the points it has are kept
        with open(out) as f:
            results = json.load(f)
    jobs = [("weak", p, pol) for p in points for pol in policies]
    top = int(math.log2(max(points + [int(s) for s in a.strong.split(",") if s]) * a.nodes_per_trainer))
    jobs += [("strong", int(p), "none") for p in a.strong.split(",") if p]
    for series, p, policy in jobs:
        scale = int(math.log2(p * a.nodes_per_trainer)) if series == "weak" else top
        parts = cached_partition(spec(scale), p, os.path.join(a.workdir, f"rmat{scale}-p{p}"))
        if str(p) in results[series].get(policy, {}):
            continue
        same = results["weak"].get(policy, {}).get(str(p))
        if series == "strong" and same is not None and same["parts"] == parts:  # the weak series ran this job
            results[series].setdefault(policy, {})[str(p)] = same
            continue
        run_dir = os.path.join(a.workdir, "runs", f"{series}-p{p}-{policy}")
        print(f"{series} P={p} {policy}: RMAT-{scale}{'' if a.bind == 'none' else ', ranks bound to a ' + a.bind} ...",
              flush=True)
        job = run_job(parts, run_dir, p, policy, a.epochs, shim, a.lock, a.bind)
        result = analyse(run_dir, job, parts, policy)
        results[series].setdefault(policy, {})[str(p)] = point_summary(result)
        results[series][policy][str(p)].update(per_rank=result["ranks"], bind=a.bind)
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=float)
        print(f"  {job['wall_s']:.0f} s wall, {job['host_cpu_s']:.0f} s host CPU", flush=True)
    report(results, out)


def training_peaks(run_dir: str) -> dict[int, dict]:
    """Per world rank: the PSS and its parts at the highest sample before any evaluation's."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, "rank-*.h5")):
        log = read_rank(path)
        if log.role == "trainer":
            training = log.tables["memory"][log.tables["memory"]["point"] != b"evaluation"]
            out[log.attrs["layout"]["world_rank"]] = {
                "train_peak_pss": int(training["pss_bytes"].max()),
                **{f"train_peak_{k}": int(training[f"pss_{k}_bytes"].max()) for k in ("anon", "shmem", "file")}}
    return out


def report(results: dict, out: str) -> None:
    """rudder.plan's prediction beside each point's measured PSS, then the tables."""
    for name, series in results.items():
        for policy, points in series.items():
            for p, s in points.items():
                if "train_peak_pss" not in s["per_rank"][0]:  # a series from before these columns: from its logs
                    runs = [os.path.join(os.path.dirname(out), "runs", f"{kind}-p{p}-{policy}") for kind in (name, "weak")]
                    peaks = training_peaks(next(r for r in runs if os.path.isdir(r)))
                    for r in s["per_rank"]:
                        r.update(peaks[r["rank"]])
                p = plan(["--data", s["parts"], "--policy", policy, "--batch-size", str(BATCH), "--ranks-per-host",
                          str(s["ranks"])])
                train = [r["memory_total"] for r in p["ranks"]]
                whole = [r["memory_total"] + r["memory"]["evaluation"] for r in p["ranks"]]
                ratios = [a / r["train_peak_pss"] for a, r in zip(train, s["per_rank"])]
                with_eval = [a / r["peak_pss"] for a, r in zip(whole, s["per_rank"])]
                s.update(planned=mean(train), plan_ratio_min=min(ratios), plan_ratio_max=max(ratios),
                         train_peak_pss=mean(r["train_peak_pss"] for r in s["per_rank"]),
                         planned_with_eval=mean(whole), plan_eval_ratio_min=min(with_eval),
                         plan_eval_ratio_max=max(with_eval))
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=float)
    runtime_at_smallest(results)
    for series in results:
        print_tables({f"{series} {pol}": {p: {k: v for k, v in s.items() if k != "per_rank"} for p, s in pts.items()}
                      for pol, pts in results[series].items()})
    print(f"\n(results: {out})")


def markdown(results: dict) -> str:
    """The tables of docs/results-scale.md, from a series' JSON."""
    lines = []
    for series, policies in results.items():
        for policy, points in policies.items():
            order = sorted(points, key=int)
            lines += [f"#### {series} scaling, `--policy {policy}`", "",
                      "| P | halo | start-up CPU s (max) | imports CPU s | start-up wall s | peak PSS MB | training peak "
                      "| less file-backed | anon | shmem "
                      "| graph | features | buffer | plan MB (plan/training peak) | owners | Gets | Flushes | datatype "
                      "calls | calls/owner | polls | collectives/epoch (+epoch's own) | KB/minibatch | read s | eval Gets "
                      "MB | eval s | epoch s | ckpt KB/rank |",
                      "|" + "---|" * 27]
            for p in order:
                s = points[p]
                lines.append(
                    f"| {p} | {s['halo']:.0f} | {s['startup_cpu']:.2f} ({s['startup_cpu_max']:.2f}) | {s['imports_cpu']:.2f} "
                    f"| {s['startup_wall']:.1f} | {s['peak_pss'] / MB:.1f} | {s.get('train_peak_pss', 0) / MB:.1f} "
                    f"| {s['pss_less_file'] / MB:.1f} "
                    f"| {s['peak_anon'] / MB:.1f} | {s['peak_shmem'] / MB:.1f} | {s['graph_bytes'] / MB:.2f} "
                    f"| {s['features_bytes'] / MB:.2f} | {s['buffer_bytes'] / MB:.2f} "
                    f"| {s.get('planned', 0) / MB:.1f} ({s.get('plan_ratio_min', 0):.2f}-{s.get('plan_ratio_max', 0):.2f}) "
                    f"| {s['owners_rma']:.1f} | {s.get('gets', 0):.1f} | {s.get('flushes', 0):.1f} | {s.get('datatypes', 0):.1f} "
                    f"| {s.get('rma_calls_per_owner', float('nan')):.2f} | {s.get('polls', 0):.0f} "
                    f"| {s.get('collectives_per_epoch', 0):.0f} (+{s.get('epoch_collectives', 0):.0f}) "
                    f"| {s['bytes_rma'] / 1024:.0f} | {s['t_rma']:.3f} | {s.get('eval_get_bytes', 0) / MB:.2f} "
                    f"| {s['eval_seconds']:.2f} | {s['epoch_seconds']:.2f} | {s['checkpoint_rank_bytes'] / 1024:.1f} |")
            lines += ["", "Start-up phases, CPU seconds a trainer (wall in brackets):", "",
                      "| phase | " + " | ".join(f"P={p}" for p in order) + " |", "|---|" + "---|" * len(order)]
            for phase in points[order[-1]]["phases"]:
                lines.append(f"| {phase} | " + " | ".join(
                    f"{points[p]['phases'].get(phase, (0, 0))[1]:.3f} ({points[p]['phases'].get(phase, (0, 0))[0]:.2f})"
                    for p in order) + " |")
            lines.append("")
    return "\n".join(lines)


def runtime_at_smallest(results: dict) -> None:
    """The runtime rudder.plan assumes (rudder.plan.estimate.RUNTIME), from the smallest weak point
    of policy none: its training peak PSS (the evaluation's aside) less the owners the plan models,
    by part (anonymous, file-backed times the torch-loading ranks of the host, shared memory)."""
    points = results["weak"].get("none")
    if not points:
        return
    s = points[min(points, key=int)]
    p = plan(["--data", s["parts"], "--policy", "none", "--batch-size", str(BATCH), "--ranks-per-host", "1"])
    anon, shmem, file, csr = [], [], [], csr_share(p)
    for r, planned_rank in zip(s["per_rank"], p["ranks"]):
        m = planned_rank["memory"]  # the CSR share and the features are shared memory, the rest the heap
        anon.append(r["train_peak_anon"] - m["model"] - m["minibatches"] - m["buffer"] - (m["graph"] - csr))
        shmem.append(r["train_peak_shmem"] - m["features"] - csr)
        file.append(r["train_peak_file"] * int(s["trainers"]))
    print(f"runtime at P={min(points, key=int)} (rudder.plan.estimate.RUNTIME): anon_bytes={int(mean(anon))}, "
          f"file_bytes={int(mean(file))}, shmem_bytes={int(mean(shmem))}")


def csr_share(p: dict) -> int:
    """A trainer's share of its node's replicated CSR in a plan (0 where the CSR is distributed: it is anonymous)."""
    return p["graph"]["csr_bytes"] // p["layout"]["trainers_per_node"] if p["topology"] == "replicated" else 0


if __name__ == "__main__":
    main()
