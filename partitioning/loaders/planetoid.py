"""``planetoid:DIR:NAME[:norm=row]``: the raw Planetoid files (Cora, CiteSeer, PubMed) with their standard split."""
from __future__ import annotations

import os
import pickle

import numpy as np

from partitioning.graph import GraphData, InputError
from partitioning.spec import Options, build_graph, need_dir, need_file, parse_options, positional


class _ArrayUnpickler(pickle.Unpickler):
    """Planetoid files are Python-2 pickles of numpy/scipy objects; allow nothing else, so a
    crafted file cannot run code."""

    ALLOWED = ("numpy", "scipy.sparse", "collections", "copy_reg", "copyreg", "__builtin__", "builtins")
    BLOCKED_BUILTINS = ("eval", "exec", "getattr", "__import__", "open")  # each would let a pickle run code

    def find_class(self, module, name):
        if module.startswith("scipy.sparse.") and "._" not in module:  # old private paths, e.g. scipy.sparse.csr
            import scipy.sparse

            if hasattr(scipy.sparse, name):
                return getattr(scipy.sparse, name)
        if module.startswith(self.ALLOWED) and not (module in ("builtins", "__builtin__") and name in self.BLOCKED_BUILTINS):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _unpickle(path: str):
    need_file(path)
    try:
        with open(path, "rb") as f:
            return _ArrayUnpickler(f, encoding="latin1").load()
    except Exception as e:  # corrupt or foreign file
        raise InputError(path, f"not a readable Planetoid pickle ({type(e).__name__}: {e})") from None


def load_planetoid(rest: str, spec: str) -> GraphData:
    (root, name), optext = positional(rest, spec, 2, "planetoid:DIR:NAME[:norm=row]")
    opts = Options(parse_options(optext, spec), spec, {"norm"})
    need_dir(root)
    import scipy.sparse as sp

    base = os.path.join(root, f"ind.{name.lower()}")
    x, y, tx, ty, allx, ally, graph = (_unpickle(f"{base}.{p}") for p in ("x", "y", "tx", "ty", "allx", "ally", "graph"))
    index_file = need_file(f"{base}.test.index")
    try:
        test_idx = np.loadtxt(index_file, dtype=np.int64, ndmin=1)
    except ValueError as e:
        raise InputError(index_file, f"expected one integer node id per line ({e})") from None
    if allx.shape[0] != ally.shape[0] or tx.shape[0] != ty.shape[0] or tx.shape[0] != test_idx.size:
        raise InputError(base + ".*", f"row counts disagree: allx {allx.shape[0]}, ally {ally.shape[0]}, "
                         f"tx {tx.shape[0]}, ty {ty.shape[0]}, test.index {test_idx.size}")
    # Test rows cover ids min..max of test.index; CiteSeer has isolated ids missing there, padded
    # with zero rows as in the standard (Kipf / PyG) loader.
    lo, hi = int(test_idx.min()), int(test_idx.max())
    if lo != allx.shape[0]:
        raise InputError(index_file, f"smallest test id is {lo}, expected {allx.shape[0]} (the row count of allx)")
    tx_full = sp.lil_matrix((hi - lo + 1, tx.shape[1]), dtype=np.float32)
    tx_full[test_idx - lo, :] = tx
    ty_full = np.zeros((hi - lo + 1, ty.shape[1]), dtype=ty.dtype)
    ty_full[test_idx - lo, :] = ty
    feats = np.asarray(sp.vstack((allx, tx_full)).todense(), dtype=np.float32)
    onehot = np.vstack((ally, ty_full))
    n = feats.shape[0]
    labels = onehot.argmax(1)
    if opts.get("norm", "none") == "row":
        sums = feats.sum(1, keepdims=True)
        feats = feats / np.where(sums == 0, 1, sums)
    elif opts.get("norm", "none") != "none":
        raise InputError(spec, f"option norm={opts.get('norm')} must be row or none")
    src = np.fromiter((u for u, nbrs in graph.items() for _ in nbrs), dtype=np.int64)
    dst = np.fromiter((v for nbrs in graph.values() for v in nbrs), dtype=np.int64)
    masks = []
    for idx in (np.arange(y.shape[0]), np.arange(y.shape[0], y.shape[0] + 500), test_idx):
        m = np.zeros(n, dtype=bool)
        m[idx] = True
        masks.append(m)
    info = {"dataset": name, "split": "planetoid standard", "features": f"binary bag of words, norm={opts.get('norm', 'none')}"}
    return build_graph(name.lower(), n, (src, dst), feats, labels, onehot.shape[1], masks, info, opts.symmetric, base + ".graph")
