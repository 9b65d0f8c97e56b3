"""``edgelist:EDGES[,feat=F.npy,label=L.npy,split=S.npz]``: a text edge list (``SRC DST`` or
``SRC,DST`` lines) with optional feature, label and split arrays; structural features stand in
when none are given.

The text is parsed in chunks of 4M lines into a scratch file of int64 pairs (16 bytes an edge on
disk, one chunk in memory), which the CSR builder then reads twice; ``.npy`` arrays are memory-mapped."""
from __future__ import annotations

import os

import numpy as np

from partitioning.csr import CHUNK_EDGES
from partitioning.features import as_float32
from partitioning.graph import GraphData, InputError
from partitioning.ondisk import ScratchArray, chunks_of
from partitioning.spec import Options, build_graph, masks_from_arrays, need_file, parse_options


def _read_edge_text(path: str):
    """(edges: a scratch memmap [M, 2] int64, in-degree of each id seen, largest id)."""
    import pandas as pd

    need_file(path)
    with open(path) as f:
        first = next((ln for ln in f if ln.strip() and not ln.startswith(("#", "%"))), "")
    sep = "," if "," in first else r"\s+"
    header = 0 if first.replace(",", " ").split() and not first.replace(",", " ").split()[0].lstrip("-").isdigit() else None
    out = ScratchArray((None, 2), np.int64, f"the edges of {path}")
    in_degree, top = np.zeros(0, dtype=np.int64), -1
    try:
        reader = pd.read_csv(path, sep=sep, header=header, comment="#", usecols=[0, 1], dtype=np.int64, engine="c",
                             chunksize=CHUNK_EDGES)
        for table in reader:
            pairs = table.to_numpy(dtype=np.int64)
            out.append(pairs)
            top = max(top, int(pairs.max(initial=-1)))
            dst = pairs[:, 1]
            if dst.size and dst.min() >= 0:  # negative ids: build_csr names them
                count = np.bincount(dst)
                if count.size > in_degree.size:
                    in_degree = np.concatenate([in_degree, np.zeros(count.size - in_degree.size, np.int64)])
                in_degree[:count.size] += count
    except InputError:
        out.abandon()
        raise
    except Exception as e:
        out.abandon()
        raise InputError(path, f"expected lines 'SRC DST' (or SRC,DST) of integer node ids ({str(e).splitlines()[0]})") from None
    return out.finish(), in_degree, top


def pair_chunks(edges: np.ndarray):
    """(src, dst) chunks of an [M, 2] array of pairs (a memmap's pages released after each)."""
    def chunks():
        for _, block in chunks_of(edges, CHUNK_EDGES):
            yield block[:, 0], block[:, 1]
    return chunks


def _load_npy(path: str, what: str):
    try:
        return np.load(need_file(path), allow_pickle=False, mmap_mode="r")
    except InputError:
        raise
    except Exception as e:
        raise InputError(path, f"not a readable .npy {what} array ({e})") from None


def load_edgelist(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, {"feat", "label", "split", "split_seed"})
    edges, in_degree, top = _read_edge_text(path)
    feats = _load_npy(opts.get("feat"), "feature") if opts.get("feat") else None
    labels = np.asarray(_load_npy(opts.get("label"), "label")).reshape(-1) if opts.get("label") else None
    n = (feats.shape[0] if feats is not None else labels.shape[0] if labels is not None else top + 1)
    if feats is not None and feats.ndim != 2:
        raise InputError(opts.get("feat"), f"expected a 2-D (nodes x dims) array, got shape {feats.shape}")
    if labels is not None and labels.shape[0] != n:
        raise InputError(opts.get("label"), f"has {labels.shape[0]} labels, expected {n} (one per node)")
    if labels is not None and not np.issubdtype(labels.dtype, np.integer):
        raise InputError(opts.get("label"), f"labels are {labels.dtype}, expected integers")
    info = {"dataset": os.path.basename(path)}
    if feats is None:  # structure only: two structural features so a model has an input
        deg = np.zeros(n, dtype=np.float32)
        deg[:min(n, in_degree.size)] = in_degree[:n]
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
    return build_graph(info["dataset"], n, pair_chunks(edges), as_float32(feats, opts.get("feat") or path), labels,
                       int(labels.max()) + 1 if n else 1, masks, info, opts.symmetric, path)
