"""DistDGL itself as a side-by-side peer: the same graph, split, partitioning and hyperparameters
as one of our partition directories, trained by the single-host DistDGL runner of
``../shared/tools/distdgl`` (one server + one trainer per partition, each partition in its own
user+mount namespace; ``../shared/reference/distdgl-baseline.md``).

Same partitioning: our partition directory is turned back into one DGL graph (our global IDs,
features, labels, masks) and cut by ``dgl.distributed.partition_graph`` into exactly our
partitions. DGL 2.1's ``partition_graph`` takes no assignment of its own: its ``random`` method
draws one from ``dgl.distributed.partition.random_choice``, which this adapter replaces, for
that one call, by our owner array (then checked: every DGL partition must own our nodes).

    python bench/distdgl_peer.py PARTS --out DIR [--epochs 5 --batch-size B --fanouts 10,25 --hidden 16]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RUNNER = os.environ.get("RUDDER_DISTDGL_DIR", os.path.join(REPO, "..", "shared", "tools", "distdgl"))


def unavailable() -> str | None:
    """Why the peer cannot run here (None when it can)."""
    if not os.path.isfile(os.path.join(RUNNER, "launch_local.py")):
        return f"the DistDGL runner is not at {os.path.abspath(RUNNER)} (set RUDDER_DISTDGL_DIR)"
    try:
        probe = subprocess.run(["unshare", "-Urm", "--", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare is not usable ({e})"
    if probe.returncode:
        return f"unprivileged user namespaces are not allowed here (unshare -Urm: {probe.stderr.decode().strip()[:100]})"
    return None


def prepare(parts: str, out: str) -> str:
    """DGL partitions of ``parts`` (ours, exactly) under ``out``; returns the partition config
    JSON (reused when already made from the same partition directory)."""
    from rudder.data.dgl_bridge import load_dgl
    from rudder.data.partition_store import PartitionMeta, global_csr, read_features, read_partition

    meta = PartitionMeta.load(parts)
    name = "g"
    config = os.path.join(out, f"{name}.json")
    stamp = os.path.join(out, "source.json")
    source = {"parts": os.path.abspath(parts), "edge_hash": meta.edge_hash, "created": meta.created}
    if os.path.exists(config) and os.path.exists(stamp) and json.load(open(stamp)) == source:
        return config
    dgl = load_dgl()
    import torch

    dgl_partition = dgl.distributed.partition  # the module whose random_choice is replaced below

    ps = [read_partition(parts, p, meta) for p in range(meta.num_parts)]
    indptr, indices = global_csr(ps)
    dst = np.repeat(np.arange(meta.num_nodes, dtype=np.int64), np.diff(indptr))
    g = dgl.graph((torch.from_numpy(indices), torch.from_numpy(dst)), num_nodes=meta.num_nodes)
    g.ndata["feat"] = torch.from_numpy(np.concatenate([read_features(parts, p, meta) for p in range(meta.num_parts)]))
    g.ndata["label"] = torch.from_numpy(np.concatenate([p.labels for p in ps]).astype(np.int64))
    for mask in ("train_mask", "val_mask", "test_mask"):
        g.ndata[mask] = torch.from_numpy(np.concatenate([getattr(p, mask) for p in ps]).astype(bool))
    owners = torch.from_numpy(meta.owner_of(np.arange(meta.num_nodes)).astype(np.int64))
    drawn = dgl_partition.random_choice
    dgl_partition.random_choice = lambda num_parts, n: owners  # our assignment, for this one call
    try:
        orig_nids, _ = dgl.distributed.partition_graph(g, name, meta.num_parts, out, part_method="random", num_hops=1,
                                                       return_mapping=True)
    finally:
        dgl_partition.random_choice = drawn
    orig = orig_nids.numpy()
    node_map = json.load(open(config))["node_map"]["_N"]
    for p, (start, end) in enumerate(node_map):  # DGL relabels; each of its parts must hold exactly ours
        owned = np.sort(orig[start:end])
        if not np.array_equal(owned, np.arange(meta.offsets[p], meta.offsets[p + 1])):
            raise RuntimeError(f"{out}: DGL partition {p} does not own our partition {p}'s nodes")
    torch.save(orig_nids, os.path.join(out, "orig_nids.pt"))
    json.dump(source, open(stamp, "w"))
    return config


def free_port_base(span: int) -> int:
    """A port P with P..P+span free on 127.0.0.1 (the runner uses P + partition and P + 100)."""
    for base in range(36000, 60000, 250):
        try:
            for port in (*range(base, base + span), base + 100):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range on 127.0.0.1")


def run(config: str, nparts: int, run_dir: str, *, epochs: int, batch_size: int, fanouts: str, hidden: int,
        lr: float, dropout: float, seed: int, timeout: int = 1800, wrapper: list[str] = ()) -> dict:
    """One DistDGL training run (behind ``wrapper``, e.g. a shaped network); returns the runner's
    summary (epoch times, rows, accuracy)."""
    os.makedirs(run_dir, exist_ok=True)
    cmd = [*wrapper, sys.executable, os.path.join(RUNNER, "launch_local.py"), "--graph-name", "g", "--part-config", config,
           "--nparts", str(nparts), "--timeout", str(timeout), "--port-base", str(free_port_base(nparts)),
           "--run-dir", run_dir, "--", "--epochs", str(epochs), "--batch-size", str(batch_size), "--fanouts", fanouts,
           "--hidden", str(hidden), "--lr", str(lr), "--dropout", str(dropout), "--seed", str(seed),
           "--eval-batch-size", "100000"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 200)
    with open(os.path.join(run_dir, "launcher.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    summary = os.path.join(run_dir, "summary.json")
    if proc.returncode or not os.path.exists(summary):
        raise RuntimeError(f"DistDGL run failed (rc {proc.returncode}); see {run_dir}/launcher.log: "
                           f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    return json.load(open(summary))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    why = unavailable()
    if why:
        print(f"DistDGL peer skipped: {why}")
        return 0
    from rudder.data.partition_store import PartitionMeta

    config = prepare(a.parts, os.path.join(a.out, "parts"))
    s = run(config, PartitionMeta.load(a.parts).num_parts, os.path.join(a.out, "run"), epochs=a.epochs,
            batch_size=a.batch_size, fanouts=a.fanouts, hidden=a.hidden, lr=a.lr, dropout=a.dropout, seed=a.seed)
    print(json.dumps({k: v for k, v in s.items() if k != "per_epoch"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
