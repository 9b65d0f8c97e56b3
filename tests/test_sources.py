"""Every input kind loads into the same canonical graph: small files written here in each
kind's real on-disk layout, checked against the graph they were made from."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from partitioning.graph import InputError
from partitioning.sources import load_spec

# A small undirected graph with a self-loop and a duplicate, as raw inputs often have.
N = 6
RAW_EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0], [1, 0], [2, 2], [0, 3]])
FEATS = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 10
LABELS = np.array([0, 1, 2, 0, 1, 2])


def expected_edges():
    pairs = {(int(a), int(b)) for a, b in RAW_EDGES if a != b} | {(int(b), int(a)) for a, b in RAW_EDGES if a != b}
    return sorted(pairs, key=lambda e: (e[1], e[0]))  # canonical (dst, src) order


def assert_graph(g, feats=FEATS, labels=LABELS):
    assert g.num_nodes == N
    assert list(zip(g.src.tolist(), g.dst.tolist())) == expected_edges()
    np.testing.assert_array_equal(g.features, feats)
    np.testing.assert_array_equal(g.labels, labels)
    assert g.features.dtype == np.float32 and g.labels.dtype == np.int64


def write_csv_gz(path, rows, fmt="%d"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt=fmt, delimiter=",")


def test_ogb_csv_layout(tmp_path):
    base = tmp_path / "ogbn_tiny"
    write_csv_gz(base / "raw" / "edge.csv.gz", RAW_EDGES)
    write_csv_gz(base / "raw" / "node-feat.csv.gz", FEATS, fmt="%.6f")
    write_csv_gz(base / "raw" / "node-label.csv.gz", LABELS.reshape(-1, 1))
    write_csv_gz(base / "raw" / "num-node-list.csv.gz", np.array([[N]]))
    for part, idx in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        write_csv_gz(base / "split" / "time" / f"{part}.csv.gz", np.array(idx).reshape(-1, 1))
    g = load_spec(f"ogb:{tmp_path}:ogbn-tiny")
    assert_graph(g)
    assert g.train_mask.tolist() == [True, True, True, False, False, False]
    assert g.info["split"] == "OGB time"


def test_ogb_npz_layout_with_unlabelled_nodes(tmp_path):
    raw = tmp_path / "ogbn_papers" / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "data.npz", edge_index=RAW_EDGES.T, node_feat=FEATS, num_nodes_list=np.array([N]))
    labels = LABELS.astype(np.float64)
    labels[5] = np.nan
    np.savez(raw / "node-label.npz", node_label=labels.reshape(-1, 1))
    for part, idx in (("train", [0, 1]), ("valid", [2]), ("test", [3, 4])):
        write_csv_gz(tmp_path / "ogbn_papers" / "split" / "time" / f"{part}.csv.gz", np.array(idx).reshape(-1, 1))
    g = load_spec(f"ogb:{tmp_path}:ogbn-papers")
    assert_graph(g, labels=np.array([0, 1, 2, 0, 1, -1]))
    assert g.info["unlabelled_nodes"] == 1


def test_ogb_missing_raw_dir(tmp_path):
    with pytest.raises(InputError, match="OGB raw directory not found"):
        load_spec(f"ogb:{tmp_path}:ogbn-arxiv")


def test_npz_generic_with_index_split(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, edge_index=RAW_EDGES.T, x=FEATS, y=LABELS, train_idx=[0, 1], valid_idx=[2], test_idx=[5])
    g = load_spec(f"npz:{path}")
    assert_graph(g)
    assert np.flatnonzero(g.test_mask).tolist() == [5]


def test_npz_gnn_benchmark_layout(tmp_path):
    import scipy.sparse as sp

    adj = sp.csr_matrix((np.ones(len(RAW_EDGES)), (RAW_EDGES[:, 0], RAW_EDGES[:, 1])), shape=(N, N))
    attr = sp.csr_matrix(FEATS)
    path = tmp_path / "bench.npz"
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=adj.shape,
             attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape, labels=LABELS)
    g = load_spec(f"npz:{path},split=0.5/0.25/0.25,split_seed=3")
    assert_graph(g)
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (3, 1, 2)


@pytest.mark.parametrize("text", ["{a} {b}", "{a},{b}", "{a}\t{b}"])
def test_edgelist_formats(tmp_path, text):
    lines = ["src,dst" if "," in text else "# src dst"] + [text.format(a=a, b=b) for a, b in RAW_EDGES]
    (tmp_path / "e.txt").write_text("\n".join(lines) + "\n")
    np.save(tmp_path / "f.npy", FEATS)
    np.save(tmp_path / "l.npy", LABELS)
    np.savez(tmp_path / "s.npz", train=np.array([0, 1]), val=np.array([2]), test=np.array([3]))
    g = load_spec(f"edgelist:{tmp_path / 'e.txt'},feat={tmp_path / 'f.npy'},label={tmp_path / 'l.npy'},"
                  f"split={tmp_path / 's.npz'}")
    assert_graph(g)
    assert g.train_mask.sum() == 2 and g.info["split"].endswith("s.npz")


def test_edgelist_structure_only(tmp_path):
    (tmp_path / "e.txt").write_text("\n".join(f"{a} {b}" for a, b in RAW_EDGES))
    g = load_spec(f"edgelist:{tmp_path / 'e.txt'},sym=0")
    assert g.num_nodes == N and g.feat_dim == 2 and g.num_classes == 1
    assert (0, 1) in zip(g.src.tolist(), g.dst.tolist()) and (3, 0) not in zip(g.src.tolist(), g.dst.tolist())
    assert g.info["symmetrised"] is False


def test_dgl_file(tmp_path):
    import torch

    from rudder.data.dgl_bridge import load_dgl

    dgl = load_dgl()
    g = dgl.graph((torch.from_numpy(RAW_EDGES[:, 0]), torch.from_numpy(RAW_EDGES[:, 1])), num_nodes=N)
    g.ndata["feat"] = torch.from_numpy(FEATS)
    g.ndata["label"] = torch.from_numpy(LABELS)
    for name, idx in (("train_mask", [0]), ("val_mask", [1]), ("test_mask", [2, 3])):
        m = torch.zeros(N, dtype=torch.bool)
        m[idx] = True
        g.ndata[name] = m
    dgl.save_graphs(str(tmp_path / "g.bin"), [g])
    loaded = load_spec(f"dgl:{tmp_path / 'g.bin'}")
    assert_graph(loaded)
    assert np.flatnonzero(loaded.test_mask).tolist() == [2, 3]


def write_musae(root, name, target_rows, columns):
    root.mkdir(exist_ok=True)
    (root / f"{name}_edges.csv").write_text("id_1,id_2\n" + "\n".join(f"{a},{b}" for a, b in RAW_EDGES) + "\n")
    (root / f"{name}_features.json").write_text(json.dumps({str(i): [i % 3, 4] for i in range(N)}))
    rows = "\n".join(",".join(map(str, r)) for r in target_rows)
    (root / f"{name}_target.csv").write_text(",".join(columns) + "\n" + rows + "\n")


def test_musae_categorical_and_binned(tmp_path):
    kinds = ["tvshow", "company", "politician", "tvshow", "government", "company"]
    write_musae(tmp_path, "facebook", [(i, 100 + i, f"page{i}", kinds[i], i * 1.5) for i in range(N)],
                ["id", "facebook_id", "page_name", "page_type", "score"])
    g = load_spec(f"musae:{tmp_path}:facebook")
    assert g.labels.tolist() == [3, 0, 2, 3, 1, 0]  # classes sorted alphabetically
    assert g.feat_dim == 5 and g.features[1].tolist() == [0, 1, 0, 0, 1]
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (3, 1, 2)
    binned = load_spec(f"musae:{tmp_path}:facebook:label=score,bins=3")
    assert binned.num_classes == 3 and binned.labels.tolist() == [0, 0, 1, 1, 2, 2]
    hashed = load_spec(f"musae:{tmp_path}:facebook:feat_hash=2")
    assert hashed.feat_dim == 2


def test_musae_unknown_dataset_needs_label(tmp_path):
    write_musae(tmp_path, "mystery", [(i, i) for i in range(N)], ["id", "colour"])
    with pytest.raises(InputError, match="add :label=COL"):
        load_spec(f"musae:{tmp_path}:mystery")
    assert load_spec(f"musae:{tmp_path}:mystery:label=colour").num_classes == N


def test_synthetic_is_seeded():
    a = load_spec("synthetic:rmat:scale=9,edge_factor=4,feat_dim=4,classes=4,seed=7")
    b = load_spec("synthetic:rmat:scale=9,edge_factor=4,feat_dim=4,classes=4,seed=7")
    c = load_spec("synthetic:rmat:scale=9,edge_factor=4,feat_dim=4,classes=4,seed=8")
    assert np.array_equal(a.src, b.src) and np.array_equal(a.features, b.features)
    assert not np.array_equal(a.src, c.src)
    assert a.num_nodes == 512 and a.num_classes == 4


def edge_homophily(g):
    return float((g.labels[g.src] == g.labels[g.dst]).mean())


def chance(g):
    p = np.bincount(g.labels) / g.num_nodes
    return float((p ** 2).sum())


def test_synthetic_labels_follow_structure():
    """Labels are derived from structure: neighbours share a class well above chance, and
    RMAT keeps its skew (a few hubs hold many edges)."""
    rmat = load_spec("synthetic:rmat:scale=12,edge_factor=8,feat_dim=4,classes=4,seed=1")
    assert edge_homophily(rmat) > 0.6 and edge_homophily(rmat) > 2.5 * chance(rmat)
    assert np.bincount(rmat.labels).min() > 0.1 * rmat.num_nodes / 4  # no class swallowed the graph
    deg = np.bincount(rmat.dst, minlength=rmat.num_nodes)
    assert deg.max() > 20 * deg.mean()
    sbm = load_spec("synthetic:sbm:nodes=4000,blocks=4,homophily=0.9,feat_dim=4,seed=1")
    assert abs(edge_homophily(sbm) - 0.9) < 0.03
    # features carry the class signal: the nearest class centroid beats chance
    centroids = np.stack([sbm.features[sbm.labels == c].mean(0) for c in range(4)])
    guess = np.argmin(((sbm.features[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (guess == sbm.labels).mean() > 0.4


# ----------------------------------------------------------------------------- streaming loaders
def write_papers_layout(root, compressed: bool, n=300, seed=0):
    """OGB papers100M's on-disk layout in small: raw/data.npz (edge_index, node_feat, node_year,
    num_nodes_list), raw/node-label.npz (NaN = unlabelled), split/time/*.csv.gz."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, n, size=(2, 4 * n))
    feats = rng.standard_normal((n, 7)).astype(np.float32)
    labels = rng.integers(0, 5, size=n).astype(np.float64)
    labels[rng.random(n) < 0.3] = np.nan
    raw = root / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(raw / "data.npz", edge_index=edges, node_feat=feats, node_year=rng.integers(1990, 2020, size=(n, 1)),
         num_nodes_list=np.array([n]), num_edges_list=np.array([edges.shape[1]]))
    save(raw / "node-label.npz", node_label=labels.reshape(-1, 1))
    labelled = np.flatnonzero(np.isfinite(labels))
    for part, idx in (("train", labelled[:100]), ("valid", labelled[100:130]), ("test", labelled[130:])):
        write_csv_gz(root / "ogbn_papers100M" / "split" / "time" / f"{part}.csv.gz", idx.reshape(-1, 1))
    return edges, feats, np.where(np.isfinite(labels), labels, -1).astype(np.int64)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "compressed"])
def test_ogb_papers_layout_streams(tmp_path, compressed):
    """data.npz's members are memory-mapped, not loaded: in place when stored, through a scratch
    .npy when compressed (removed once the graph is gone); the graph is the one the arrays hold."""
    import gc

    from partitioning.ondisk import set_scratch_dir

    edges, feats, labels = write_papers_layout(tmp_path, compressed)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    set_scratch_dir(str(scratch))
    try:
        g = load_spec(f"ogb:{tmp_path}:ogbn-papers100M")
        assert isinstance(g.features, np.memmap)
        assert (g.features.filename.startswith(str(scratch))) == compressed
        pairs = {(int(a), int(b)) for a, b in edges.T if a != b} | {(int(b), int(a)) for a, b in edges.T if a != b}
        assert list(zip(g.src.tolist(), g.dst.tolist())) == sorted(pairs, key=lambda e: (e[1], e[0]))
        np.testing.assert_array_equal(g.features, feats)
        np.testing.assert_array_equal(g.labels, labels)
        assert g.info["unlabelled_nodes"] == int((labels < 0).sum()) and g.train_mask.sum() == 100
        del g
        gc.collect()
        assert not os.listdir(scratch)
    finally:
        set_scratch_dir(None)


def test_edgelist_in_chunks_is_the_same_graph(tmp_path, monkeypatch):
    """An edge list read 64 lines at a time, and its CSR built 64 edges a chunk, is the graph one
    chunk gives: the same CSR, bit for bit."""
    from partitioning import csr
    from partitioning.loaders import edgelist

    rng = np.random.default_rng(1)
    pairs = rng.integers(0, 200, size=(1500, 2))
    (tmp_path / "e.txt").write_text("src dst\n" + "\n".join(f"{a} {b}" for a, b in pairs) + "\n")
    whole = load_spec(f"edgelist:{tmp_path / 'e.txt'}")
    monkeypatch.setattr(edgelist, "CHUNK_EDGES", 64)
    monkeypatch.setattr(csr, "CHUNK_EDGES", 64)
    chunked = load_spec(f"edgelist:{tmp_path / 'e.txt'}")
    assert whole.indices.dtype == np.int32
    np.testing.assert_array_equal(chunked.indptr, whole.indptr)
    np.testing.assert_array_equal(chunked.indices, whole.indices)
    np.testing.assert_array_equal(chunked.features, whole.features)
    expected = {(int(a), int(b)) for a, b in pairs if a != b} | {(int(b), int(a)) for a, b in pairs if a != b}
    assert sorted(zip(whole.dst.tolist(), whole.src.tolist())) == sorted((d, s) for s, d in expected)


def test_scratch_too_large_is_one_line(tmp_path):
    """Scratch space that the disk cannot hold: one line naming the directory and the need, before writing."""
    from partitioning.ondisk import ScratchArray, set_scratch_dir

    set_scratch_dir(str(tmp_path))
    try:
        with pytest.raises(InputError, match=r"needs \d+\.\d GiB of disk for the 1e\+15 generated rows") as e:
            ScratchArray((10**15, 128), np.float32, "the 1e+15 generated rows")
        assert str(e.value).startswith(str(tmp_path)) and "\n" not in str(e.value)
        assert not os.listdir(tmp_path)
    finally:
        set_scratch_dir(None)
