"""``ogb:DIR:NAME``: an OGB node-property dataset already on disk (its raw/ and split/ folders),
in the CSV layout or papers100M's numpy archives.

papers100M's ``raw/data.npz`` (``edge_index`` [2, E] int64: 26 GB; ``node_feat`` [N, 128]
float32: 57 GB; ``node_year``, ``num_nodes_list``) is never loaded: a stored member is
memory-mapped in place, a compressed one decompressed into a scratch ``.npy`` and mapped
(``partitioning.ondisk.npz_member``), and both are read in chunks. Labels come from
``raw/node-label.npz`` (``node_label``, NaN: unlabelled) or a ``node_label`` member of data.npz.
"""
from __future__ import annotations

import os
import zipfile

import numpy as np

from partitioning.csr import CHUNK_EDGES, array_chunks
from partitioning.features import as_float32
from partitioning.graph import GraphData, InputError, check_ids_in_range
from partitioning.ondisk import chunks_of, npz_member
from partitioning.spec import Options, build_graph, need_file, parse_options, positional


def _read_csv_gz(path: str, dtype):
    import pandas as pd

    try:
        return pd.read_csv(path, header=None, dtype=dtype).to_numpy()
    except Exception as e:
        raise InputError(path, f"unreadable OGB CSV ({e})") from None


def _npz_names(path: str) -> set[str]:
    try:
        with zipfile.ZipFile(path) as zf:
            return {name.removesuffix(".npy") for name in zf.namelist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise InputError(path, f"not a readable .npz archive ({e})") from None


def _labels_from(array: np.ndarray) -> np.ndarray:
    """int64 labels, -1 where the value is NaN (unlabelled), read in chunks."""
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array
    labels = np.empty(array.shape[0], dtype=np.int64)
    for lo, block in chunks_of(flat, CHUNK_EDGES):
        block = block.reshape(-1).astype(np.float64)
        labels[lo:lo + block.shape[0]] = np.where(np.isfinite(block), block, -1)
    return labels


def _load_npz_layout(raw: str):
    data = need_file(os.path.join(raw, "data.npz"))
    names = _npz_names(data)
    for key in ("edge_index", "node_feat", "num_nodes_list"):
        if key not in names:
            raise InputError(data, f"has no array '{key}' (has: {', '.join(sorted(names))})")
    edge_index = npz_member(data, "edge_index")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise InputError(data, f"edge_index has shape {edge_index.shape}, expected (2, E)")
    n = int(np.sum(npz_member(data, "num_nodes_list")))
    feats = as_float32(npz_member(data, "node_feat"), f"node_feat of {data}")
    if "node_label" in names:
        labels = _labels_from(npz_member(data, "node_label"))
    else:
        label_path = need_file(os.path.join(raw, "node-label.npz"))
        labels = _labels_from(npz_member(label_path, "node_label"))
    return array_chunks(edge_index[0], edge_index[1]), feats, labels, n


def load_ogb(rest: str, spec: str) -> GraphData:
    (root, name), optext = positional(rest, spec, 2, "ogb:DIR:NAME")
    opts = Options(parse_options(optext, spec), spec, set())
    base = next((d for d in (os.path.join(root, name.replace("-", "_")), os.path.join(root, name), root)
                 if os.path.isdir(os.path.join(d, "raw"))), None)
    if base is None:
        raise InputError(os.path.join(root, name.replace("-", "_"), "raw"),
                         "OGB raw directory not found (download it on a machine with internet first)")
    raw = os.path.join(base, "raw")
    if os.path.isfile(os.path.join(raw, "data.npz")):  # papers100M ships numpy archives
        edges, feats, labels, n = _load_npz_layout(raw)
    else:
        if os.path.isfile(os.path.join(raw, "node-feat.csv.gz")) is False:
            raise InputError(os.path.join(raw, "node-feat.csv.gz"),
                             "file not found (heterogeneous OGB datasets are not supported)")
        edge_index = _read_csv_gz(need_file(os.path.join(raw, "edge.csv.gz")), np.int64).T
        edges = (edge_index[0], edge_index[1])
        feats = np.ascontiguousarray(_read_csv_gz(os.path.join(raw, "node-feat.csv.gz"), np.float32))
        label_path = need_file(os.path.join(raw, "node-label.csv.gz"))
        labels = _labels_from(_read_csv_gz(label_path, np.float64).reshape(-1))
        n = int(_read_csv_gz(need_file(os.path.join(raw, "num-node-list.csv.gz")), np.int64).sum())
    if feats.shape[0] != n or labels.shape[0] != n:
        raise InputError(raw, f"{n} nodes, but {feats.shape[0]} feature rows and {labels.shape[0]} labels")
    split_root = os.path.join(base, "split")
    schemes = sorted(os.listdir(split_root)) if os.path.isdir(split_root) else []
    if len(schemes) != 1:
        raise InputError(split_root, f"expected exactly one split scheme folder, found {schemes}")
    masks = []
    for part in ("train", "valid", "test"):
        path = os.path.join(split_root, schemes[0], f"{part}.csv.gz")
        idx = _read_csv_gz(need_file(path), np.int64).reshape(-1)
        check_ids_in_range(idx, n, path, "split node")
        m = np.zeros(n, dtype=bool)
        m[idx] = True
        masks.append(m)
    info = {"dataset": name, "split": f"OGB {schemes[0]}", "unlabelled_nodes": int((labels < 0).sum())}
    return build_graph(name, n, edges, feats, labels, int(labels.max()) + 1, masks, info, opts.symmetric,
                       os.path.join(raw, "edge"))
