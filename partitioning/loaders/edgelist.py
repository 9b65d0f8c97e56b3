"""``edgelist:EDGES[,feat=F.npy,label=L.npy,split=S.npz]``: a text edge list (``SRC DST`` or
``SRC,DST`` lines) with optional feature, label and split arrays; structural features stand in
when none are given."""
from __future__ import annotations

import os

import numpy as np

from partitioning.graph import GraphData, InputError
from partitioning.spec import Options, build_graph, masks_from_arrays, need_file, parse_options


def _read_edge_text(path: str):
    import pandas as pd

    need_file(path)
    with open(path) as f:
        first = next((ln for ln in f if ln.strip() and not ln.startswith(("#", "%"))), "")
    sep = "," if "," in first else r"\s+"
    header = 0 if first.replace(",", " ").split() and not first.replace(",", " ").split()[0].lstrip("-").isdigit() else None
    try:
        table = pd.read_csv(path, sep=sep, header=header, comment="#", usecols=[0, 1], dtype=np.int64, engine="c")
    except Exception as e:
        raise InputError(path, f"expected lines 'SRC DST' (or SRC,DST) of integer node ids ({str(e).splitlines()[0]})") from None
    return table.iloc[:, 0].to_numpy(), table.iloc[:, 1].to_numpy()


def _load_npy(path: str, what: str):
    try:
        return np.load(need_file(path), allow_pickle=False)
    except InputError:
        raise
    except Exception as e:
        raise InputError(path, f"not a readable .npy {what} array ({e})") from None


def load_edgelist(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, {"feat", "label", "split", "split_seed"})
    src, dst = _read_edge_text(path)
    feats = _load_npy(opts.get("feat"), "feature") if opts.get("feat") else None
    labels = _load_npy(opts.get("label"), "label").reshape(-1) if opts.get("label") else None
    n = (feats.shape[0] if feats is not None else labels.shape[0] if labels is not None
         else int(max(src.max(initial=-1), dst.max(initial=-1)) + 1))
    if feats is not None and feats.ndim != 2:
        raise InputError(opts.get("feat"), f"expected a 2-D (nodes x dims) array, got shape {feats.shape}")
    if labels is not None and labels.shape[0] != n:
        raise InputError(opts.get("label"), f"has {labels.shape[0]} labels, expected {n} (one per node)")
    if labels is not None and not np.issubdtype(labels.dtype, np.integer):
        raise InputError(opts.get("label"), f"labels are {labels.dtype}, expected integers")
    info = {"dataset": os.path.basename(path)}
    if feats is None:  # structure only: two structural features so a model has an input
        deg = np.bincount(dst, minlength=n).astype(np.float32)
        feats = np.stack([np.ones(n, np.float32), np.log1p(deg)], axis=1)
        info["features"] = "none given: [1, log(1 + in-degree)]"
    if labels is None:
        labels = np.zeros(n, dtype=np.int64)
        info["labels"] = "none given: all 0"
    split_path = opts.get("split")
    if split_path:
        with np.load(need_file(split_path), allow_pickle=False) as z:
            masks = masks_from_arrays(dict(z), n, split_path)
        if masks is None:
            raise InputError(split_path, "needs train/val/test masks or index arrays (train, val|valid, test)")
        info["split"] = split_path
    else:
        opts.opts.pop("split", None)
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    labels = labels.astype(np.int64)
    return build_graph(info["dataset"], n, src, dst, np.ascontiguousarray(feats, dtype=np.float32), labels,
                       int(labels.max()) + 1 if n else 1, masks, info, opts.symmetric, path)
