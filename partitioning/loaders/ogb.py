"""``ogb:DIR:NAME``: an OGB node-property dataset already on disk (its raw/ and split/ folders),
in the CSV layout or papers100M's numpy archives."""
from __future__ import annotations

import os

import numpy as np

from partitioning.graph import GraphData, InputError, check_ids_in_range
from partitioning.spec import Options, build_graph, need_file, parse_options, positional


def _read_csv_gz(path: str, dtype):
    import pandas as pd

    try:
        return pd.read_csv(path, header=None, dtype=dtype).to_numpy()
    except Exception as e:
        raise InputError(path, f"unreadable OGB CSV ({e})") from None


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
        with np.load(os.path.join(raw, "data.npz")) as z:
            edge_index, feats, n = z["edge_index"], z["node_feat"], int(np.sum(z["num_nodes_list"]))
        label_path = need_file(os.path.join(raw, "node-label.npz"))
        with np.load(label_path) as z:
            labels = z["node_label"].reshape(-1)
    else:
        if os.path.isfile(os.path.join(raw, "node-feat.csv.gz")) is False:
            raise InputError(os.path.join(raw, "node-feat.csv.gz"),
                             "file not found (heterogeneous OGB datasets are not supported)")
        edge_index = _read_csv_gz(need_file(os.path.join(raw, "edge.csv.gz")), np.int64).T
        feats = _read_csv_gz(os.path.join(raw, "node-feat.csv.gz"), np.float32)
        label_path = need_file(os.path.join(raw, "node-label.csv.gz"))
        labels = _read_csv_gz(label_path, np.float64).reshape(-1)
        n = int(_read_csv_gz(need_file(os.path.join(raw, "num-node-list.csv.gz")), np.int64).sum())
    feats = np.ascontiguousarray(feats, dtype=np.float32)
    if feats.shape[0] != n or labels.shape[0] != n:
        raise InputError(raw, f"{n} nodes, but {feats.shape[0]} feature rows and {labels.shape[0]} labels")
    labelled = np.isfinite(labels)
    labels = np.where(labelled, labels, -1).astype(np.int64)  # -1: unlabelled (papers100M)
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
    info = {"dataset": name, "split": f"OGB {schemes[0]}", "unlabelled_nodes": int((~labelled).sum())}
    return build_graph(name, n, edge_index[0], edge_index[1], feats, labels, int(labels.max()) + 1, masks, info,
                       opts.symmetric, os.path.join(raw, "edge"))
