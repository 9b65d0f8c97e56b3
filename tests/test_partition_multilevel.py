"""The partitioning path for graphs beyond METIS's 32-bit indices (partitioning/multilevel.py),
run on small graphs by lowering the limit, and ``--method auto``'s choice between it and METIS."""
from __future__ import annotations

import inspect
import json
import os
import subprocess

import numpy as np
import pytest
from conftest import BUNDLED_CORA, run_cli

from partitioning import metis, multilevel
from partitioning.cli import partition_parser
from partitioning.graph import InputError
from partitioning.partition import partition_graph
from partitioning.sources import load_spec
from partitioning.verify import verify
from rudder.data.partition_store import METADATA_FILE, PartitionMeta

SBM = "synthetic:sbm:nodes=3000,blocks=6,avg_degree=8,feat_dim=8,seed=2"


def csr_and_weights(graph):
    """The undirected CSR and the three balance weights a node (node-major) that the partitioner
    gives METIS, for symmetrised inputs."""
    n = graph.num_nodes
    xadj = np.concatenate([[0], np.cumsum(np.bincount(graph.dst, minlength=n))]).astype(np.int64)
    train = graph.train_mask.astype(np.int64)
    return xadj, graph.src, np.stack([1 - train, train, np.diff(xadj)], axis=1).reshape(-1)


def imbalance(meta) -> np.ndarray:
    """Heaviest part over the average for each constraint: other nodes, training nodes, degree."""
    w = np.array([[p.num_owned - p.num_train, p.num_train, p.num_in_edges] for p in meta.parts], dtype=float)
    return w.max(axis=0) / w.mean(axis=0)


def test_auto_takes_multilevel_above_the_limit(tmp_path):
    """With the limit at half the SBM's edges, the CLI's auto coarsens below it: verify accepts
    the result, the console and metadata.json say what ran and why, the three constraints stay
    balanced and the cut stays within 1.15x METIS's on the same graph."""
    graph = load_spec(SBM)
    limit = graph.num_edges // 2
    out = tmp_path / "parts"
    proc = run_cli("--input", SBM, "--num-parts", 3, "--out", out, env={multilevel.EDGE_LIMIT_ENV: str(limit)})
    assert proc.returncode == 0, proc.stderr
    assert f"partitioned with multilevel (auto: {graph.num_edges} directed edges > METIS's limit {limit}" in proc.stdout
    assert verify(str(out))["num_edges"] == graph.num_edges  # what `python -m partitioning verify` runs
    with open(out / METADATA_FILE) as f:
        record = json.load(f)
    assert record["method"] == "multilevel" and record["partitioner"]["requested_method"] == "auto"
    levels = record["partitioner"]["levels"]
    assert levels[0] == [graph.num_nodes, graph.num_edges] and len(levels) >= 2 and levels[-1][1] <= limit
    assert (imbalance(PartitionMeta.load(str(out))) <= 1.05).all()
    xadj, adjncy, vweights = csr_and_weights(graph)
    metis_cut, _ = metis.part_graph_kway(xadj, adjncy, vweights, 3, 3, 0)
    assert record["partitioner"]["edge_cut"] <= 1.15 * metis_cut


def test_auto_is_metis_below_the_limit(tmp_path):
    """Under the limit auto runs METIS: the same part files, bit for bit, as --method metis. auto is
    the default of the library call as of the CLI."""
    graph = load_spec(f"planetoid:{BUNDLED_CORA}:cora")
    assert partition_parser().get_default("method") == inspect.signature(partition_graph).parameters["method"].default
    auto, _ = partition_graph(graph, 3, str(tmp_path / "auto"))
    plain, _ = partition_graph(graph, 3, str(tmp_path / "metis"), method="metis")
    assert [p.sha256 for p in auto.parts] == [p.sha256 for p in plain.parts]
    assert auto.method == "metis" and auto.partitioner["requested_method"] == "auto"
    assert auto.partitioner["reason"] == f"auto: 10556 directed edges <= METIS's limit {metis.index_limit()}"


def test_metis_spills_into_a_directory_of_its_own_and_leaves_nothing(tmp_path):
    """``spill_dir``: METIS runs in a fresh directory under it (its ``ONDISK`` levels are named
    relative to the working directory), returns the parts it returns without, and the working
    directory and the spill directory are as before, also when the call fails. (Levels under
    128 MB stay in memory, so the spill itself is measured by bench/partition_memory.py.)"""
    graph = load_spec(SBM)
    xadj, adjncy, vweights = csr_and_weights(graph)
    home = os.getcwd()
    plain = metis.part_graph_kway(xadj, adjncy, vweights, 3, 4, 0)
    spilled = metis.part_graph_kway(xadj, adjncy, vweights, 3, 4, 0, spill_dir=str(tmp_path))
    assert spilled[0] == plain[0] and np.array_equal(spilled[1], plain[1])
    assert os.getcwd() == home and not os.listdir(tmp_path)
    # --metis-levels reaches METIS on both paths, and the parts do not depend on it
    for method in ("metis", "multilevel"):
        disk, memory = (multilevel.assign(method, xadj, adjncy, vweights, 3, 4, 0, levels) for levels in ("disk", "memory"))
        assert disk.method == memory.method == method and np.array_equal(disk.parts, memory.parts)
    with pytest.raises(InputError, match=r"^--metis-levels: 'ram' is not one of disk, memory"):
        multilevel.assign("metis", xadj, adjncy, vweights, 3, 4, 0, "ram")
    with pytest.raises(RuntimeError), metis.spilled(str(tmp_path)):
        inside = os.getcwd()
        assert os.path.dirname(inside) == str(tmp_path) and inside != home
        raise RuntimeError("METIS failed")
    assert os.getcwd() == home and not os.listdir(tmp_path)


def test_metis_levels_that_would_not_fit_the_scratch_disk_stop_before_metis(tmp_path):
    """METIS keeps a level it cannot write in memory (and says so only on stdout), so a scratch
    disk too small for the levels is one line naming it before METIS starts: here a 1 MiB tmpfs
    and a graph of 2^25 directed edges, whose levels would take 0.8 GB (METIS never runs on it)."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"no tmpfs of our own to fill: mount said {mounted.stderr.strip() or mounted.returncode}")
    try:
        n, m = 1 << 20, 1 << 25
        assert metis.metis_spill_bytes(m, n, "disk") > 2**29
        xadj, adjncy, vweights = np.zeros(n + 1, np.int32), np.zeros(m, np.int32), np.ones(3 * n, np.int32)
        with pytest.raises(InputError, match=rf"^{small}: needs 0\.\d GiB of disk for METIS's coarse levels "
                                             r"\(--metis-levels memory .*, 0\.0 GiB free"):
            metis.part_graph_kway(xadj, adjncy, vweights, 3, 4, 0, spill_dir=str(small))
        assert not os.listdir(small)
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_weights_beyond_metis_indices_are_scaled(monkeypatch):
    """A METIS build whose indices end at 4000 (papers100M against 2^31, in small): auto coarsens to
    half of it, and the summed weights that exceed it are divided before METIS sees them."""
    w = np.array([[5, 1], [3, 1], [10, 1]])
    scaled = multilevel.scale_to(w, 6)
    assert scaled[:, 0].sum() <= 6 and (scaled >= 1).all() and np.array_equal(scaled[:, 1], w[:, 1])
    graph = load_spec("synthetic:rmat:scale=9,edge_factor=8,feat_dim=4,classes=4,seed=1")
    xadj, adjncy, vweights = csr_and_weights(graph)
    monkeypatch.setattr(metis, "index_limit", lambda: 4000)
    result = multilevel.assign("auto", xadj, adjncy, vweights, 3, 4, 0)
    assert result.method == "multilevel" and result.levels[-1][1] <= 2000 < graph.num_edges
    assert np.array_equal(np.unique(result.parts), np.arange(4))
    weights = np.stack([np.bincount(result.parts, weights=vweights[c::3], minlength=4) for c in range(3)], axis=1)
    assert (weights.max(axis=0) <= 1.10 * weights.mean(axis=0)).all()


def test_bad_limit_names_the_variable(monkeypatch):
    monkeypatch.setenv(multilevel.EDGE_LIMIT_ENV, "lots")
    with pytest.raises(InputError, match=f"^{multilevel.EDGE_LIMIT_ENV}: 'lots' is not a positive integer$"):
        multilevel.edge_limit()


@pytest.mark.parametrize("weight, expected", [(2**27, np.int32), (2**29, np.int64)])
def test_summed_weights_are_int32_while_no_cluster_can_pass_2_31(tmp_path, weight, expected):
    """A ring of 64 vertices with heavy edges (all together 128 x weight, past 2^31 either way),
    contracted into clusters of 4 consecutive vertices: a cluster's summed weighted degree is
    8 x weight, so its edges' summed weights fit int32 at 2^27 (2^30) and may not at 2^29 (2^32);
    the weights written are the exact sums either way."""
    n = 64
    nbrs = np.stack([(np.arange(n) - 1) % n, (np.arange(n) + 1) % n], axis=1)
    order = np.argsort(nbrs, axis=1)
    adjncy = np.take_along_axis(nbrs, order, axis=1).reshape(-1)
    xadj = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    fine = multilevel.Graph(xadj, adjncy, np.full(2 * n, weight, dtype=np.int64), np.ones((n, 1), dtype=np.int64))
    cmap = np.arange(n) // 4
    spilled = multilevel.contract(fine, cmap, n // 4, str(tmp_path / "level1"))
    coarse = spilled.load()
    assert coarse.adjwgt.dtype == expected and spilled.m == 2 * (n // 4)
    assert (coarse.adjwgt.astype(np.int64) == weight).all()  # one fine edge between neighbouring clusters
    assert np.array_equal(coarse.vwgt[:, 0], np.full(n // 4, 4))


def test_a_coarse_graph_is_the_summed_quotient_and_lives_on_disk_only_while_used(tmp_path):
    """``contract`` writes the coarse graph a chunk of rows at a time (chunks cut to a few edges
    here): read back, it is the quotient graph C^T A C with its diagonal dropped, weights summed,
    vertex weights summed; ``assign`` keeps its levels in a directory of its own under ``scratch``
    and removes it afterwards."""
    import scipy.sparse as sp

    graph = load_spec("synthetic:rmat:scale=9,edge_factor=8,feat_dim=4,classes=4,seed=1")
    xadj, adjncy, vweights = csr_and_weights(graph)
    n = xadj.size - 1
    fine = multilevel.Graph(xadj, adjncy, None, vweights.reshape(n, 3))
    cmap = np.random.default_rng(0).integers(0, 60, n)
    cmap = np.unique(cmap, return_inverse=True)[1]
    nc = int(cmap.max()) + 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(multilevel, "CHUNK_EDGES", 97)
        spilled = multilevel.contract(fine, cmap, nc, str(tmp_path / "level1"))
    coarse = spilled.load()
    a = sp.csr_matrix((np.ones(adjncy.size), adjncy, xadj), shape=(n, n))
    c = sp.csr_matrix((np.ones(n), (np.arange(n), cmap)), shape=(n, nc))
    q = (c.T @ a @ c).tolil()
    q.setdiag(0)
    q = q.tocsr()
    q.eliminate_zeros()
    q.sort_indices()
    assert (spilled.n, spilled.m) == (nc, q.nnz) and coarse.adjwgt.dtype == np.int32
    assert np.array_equal(coarse.xadj, q.indptr) and np.array_equal(coarse.adjncy, q.indices)
    assert np.array_equal(coarse.adjwgt, q.data.astype(np.int64))
    assert np.array_equal(coarse.vwgt, (c.T @ fine.vwgt).astype(np.int64))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    written = []

    def contract_noting_where(graph, cmap, nc, path):
        written.append(os.path.dirname(os.path.dirname(path)))
        return contract(graph, cmap, nc, path)

    contract = multilevel.contract
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(multilevel, "scratch_dir", lambda: str(scratch))
        mp.setattr(multilevel, "contract", contract_noting_where)
        result = multilevel.assign("multilevel", xadj, adjncy, vweights, 3, 4, 0)
    assert len(result.levels) >= 2 and set(written) == {str(scratch)} and list(scratch.iterdir()) == []


def test_metis_that_cannot_fit_in_memory_stops_before_it_starts(monkeypatch):
    """Where even METIS's least memory an edge seen here exceeds what the host has available, the
    run stops with one line naming --method, before METIS starts, instead of being killed in it."""
    graph = load_spec("synthetic:rmat:scale=9,edge_factor=8,feat_dim=4,classes=4,seed=1")
    xadj, adjncy, vweights = csr_and_weights(graph)
    monkeypatch.setitem(multilevel.METIS_LEAST_BYTES_PER_EDGE, "disk", 1 << 50)
    with pytest.raises(InputError, match=r"^--method auto: needs [0-9.]+ GiB of memory for METIS on "
                                         rf"{adjncy.size} directed edges, its levels on disk "
                                         r"\(--method multilevel needs less\), "):
        multilevel.assign("auto", xadj, adjncy, vweights, 3, 4, 0)
    assert multilevel.assign("multilevel", xadj, adjncy, vweights, 3, 4, 0).method == "multilevel"
