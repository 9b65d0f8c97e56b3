"""Round trip: the union of the partitions reproduces the loaded input exactly, on real
datasets (skipped when ../shared/data is absent) and on generated ones."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA, shared_dataset
from partition_helpers import reassemble

from partitioning.partition import partition_graph
from partitioning.sources import load_spec
from partitioning.verify import verify
from rudder.data.partition_store import PartitionMeta


def assert_round_trip(graph, directory):
    r = reassemble(directory)
    assert r["meta"].num_nodes == graph.num_nodes and r["meta"].num_edges == graph.num_edges
    np.testing.assert_array_equal(r["src"], graph.src)
    np.testing.assert_array_equal(r["dst"], graph.dst)
    np.testing.assert_array_equal(r["features"], graph.features)
    np.testing.assert_array_equal(r["labels"], graph.labels)
    for k in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(r[k], getattr(graph, k))
    return r


def assert_halos_match_input(graph, r):
    """Halo of each part, recomputed from the input edges without the partitioner's code."""
    new_of_orig = np.empty(graph.num_nodes, dtype=np.int64)
    new_of_orig[r["orig_of_new"]] = np.arange(graph.num_nodes)
    in_degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    owner = np.empty(graph.num_nodes, dtype=np.int64)
    for p in r["parts"]:
        owner[p.orig_ids] = p.part_id
    for p in r["parts"]:
        into_part = owner[graph.dst] == p.part_id
        expected = np.unique(graph.src[into_part & (owner[graph.src] != p.part_id)])
        np.testing.assert_array_equal(np.sort(r["orig_of_new"][p.halo_nodes]), expected)
        np.testing.assert_array_equal(p.halo_owners, owner[r["orig_of_new"][p.halo_nodes]])
        np.testing.assert_array_equal(p.halo_in_degree, in_degree[r["orig_of_new"][p.halo_nodes]])
        # Owned ranges are contiguous and ordered by part.
        assert np.array_equal(new_of_orig[p.orig_ids], np.arange(p.node_start, p.node_end))


CASES = [
    ("bundled-cora", lambda: f"planetoid:{BUNDLED_CORA}:cora", "metis", 3),
    ("bundled-cora-random", lambda: f"planetoid:{BUNDLED_CORA}:cora", "random", 4),
    ("cora", lambda: shared_dataset("planetoid", "cora"), "metis", 4),
    ("citeseer", lambda: shared_dataset("planetoid", "citeseer"), "metis", 2),
    ("facebook", lambda: shared_dataset("musae", "facebook"), "metis", 4),
    ("rmat", lambda: "synthetic:rmat:scale=11,edge_factor=8,feat_dim=8,classes=4,seed=3", "metis", 4),
    ("sbm", lambda: "synthetic:sbm:nodes=3000,blocks=6,avg_degree=8,feat_dim=8,seed=2", "random", 3),
    ("rmat-directed", lambda: "synthetic:rmat:scale=10,edge_factor=4,feat_dim=4,seed=1,sym=0", "metis", 2),
]


@pytest.mark.parametrize("name,spec,method,parts", CASES, ids=[c[0] for c in CASES])
def test_round_trip(tmp_path, name, spec, method, parts):
    spec = spec()
    graph = load_spec(spec)
    out = tmp_path / "parts"
    meta, _ = partition_graph(graph, parts, str(out), method=method, seed=0, source=spec)
    assert meta.num_parts == parts and meta.source == spec
    summary = verify(str(out))
    assert summary["num_edges"] == graph.num_edges
    r = assert_round_trip(graph, str(out))
    assert_halos_match_input(graph, r)
    sizes = np.diff(meta.offsets)
    if method == "random":
        assert sizes.max() - sizes.min() <= 1
    else:  # METIS balances nodes and training nodes (multi-constraint)
        assert sizes.max() <= 1.15 * sizes.mean()
        train = np.array([p.num_train for p in meta.parts])
        assert train.max() <= 1.2 * train.mean() + 2


def test_known_dataset_facts():
    """Counts every GNN paper quotes for these datasets, and the DistDGL baseline's Facebook split."""
    cora = load_spec(f"planetoid:{BUNDLED_CORA}:cora")
    assert (cora.num_nodes, cora.num_edges, cora.feat_dim, cora.num_classes) == (2708, 10556, 1433, 7)
    assert (cora.train_mask.sum(), cora.val_mask.sum(), cora.test_mask.sum()) == (140, 500, 1000)
    assert np.array_equal(np.flatnonzero(cora.train_mask), np.arange(140))
    citeseer = load_spec(shared_dataset("planetoid", "citeseer"))
    assert (citeseer.num_nodes, citeseer.num_edges, citeseer.feat_dim, citeseer.num_classes) == (3327, 9104, 3703, 6)
    fb = load_spec(shared_dataset("musae", "facebook"))
    assert (fb.num_nodes, fb.num_edges, fb.feat_dim, fb.num_classes) == (22470, 341646, 4714, 4)
    perm = np.random.default_rng(0).permutation(22470)
    assert np.array_equal(np.flatnonzero(fb.train_mask), np.sort(perm[:13482]))
    assert np.array_equal(np.flatnonzero(fb.test_mask), np.sort(perm[17976:]))


def test_same_input_same_files(tmp_path):
    """Two runs of the tool (separate processes, as users run it) write identical partitions;
    --seed changes the result of both methods."""
    from conftest import run_cli

    spec = "synthetic:sbm:nodes=2000,blocks=4,feat_dim=8,seed=5"
    for name in ("a", "b"):
        assert run_cli("--input", spec, "--num-parts", 3, "--out", tmp_path / name).returncode == 0
    a, b = (PartitionMeta.load(str(tmp_path / name)) for name in ("a", "b"))
    assert [p.sha256 for p in a.parts] == [p.sha256 for p in b.parts]
    assert a.edge_hash == b.edge_hash and a.offsets == b.offsets
    graph = load_spec(spec)
    m1, _ = partition_graph(graph, 3, str(tmp_path / "m1"), method="metis", seed=0)
    m2, _ = partition_graph(graph, 3, str(tmp_path / "m2"), method="metis", seed=7)
    assert [p.sha256 for p in m1.parts] == [p.sha256 for p in a.parts]  # in-process == CLI
    assert [p.sha256 for p in m2.parts] != [p.sha256 for p in a.parts]
    r1, _ = partition_graph(graph, 3, str(tmp_path / "r1"), method="random", seed=2)
    r2, _ = partition_graph(graph, 3, str(tmp_path / "r2"), method="random", seed=2)
    r3, _ = partition_graph(graph, 3, str(tmp_path / "r3"), method="random", seed=3)
    assert [p.sha256 for p in r1.parts] == [p.sha256 for p in r2.parts]
    assert [p.sha256 for p in r1.parts] != [p.sha256 for p in r3.parts]


def test_halo_count_equals_isin():
    """The log row's input_halo: a binary search a remote input, the count np.isin gave (logs
    compare bit for bit across versions and with the simulator)."""
    from rudder.data.partition_store import halo_count

    rng = np.random.default_rng(0)
    for halo_size, n in ((0, 5), (1, 5), (50, 0), (50, 40), (1000, 300)):
        halo = np.unique(rng.integers(0, 3000, halo_size))
        ids = rng.permutation(np.unique(rng.integers(-5, 3005, n)))
        assert halo_count(ids, halo) == int(np.isin(ids, halo, assume_unique=True).sum())
