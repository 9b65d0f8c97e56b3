"""Input SPECs: parse ``KIND:...`` strings and load them into a canonical ``GraphData``.

Kinds (a loader each, registered in ``LOADERS``)::

    planetoid:DIR:NAME[:norm=row]                     raw Planetoid files (Cora, CiteSeer, PubMed)
    musae:DIR:NAME[:label=COL[,bins=K][,feat_hash=D]] MUSAE layout (edges/features/target files)
    ogb:DIR:NAME                                      OGB node-property dataset already on disk
    npz:FILE                                          generic or gnn-benchmark .npz
    edgelist:EDGES[,feat=F.npy,label=L.npy,split=S.npz]
    dgl:FILE                                          a dgl.save_graphs file
    synthetic:rmat:scale=S,edge_factor=E,feat_dim=D,classes=C,seed=K
    synthetic:sbm:nodes=N,blocks=K,avg_degree=A,homophily=H,feat_dim=D,seed=K

Options shared by kinds without a standard split: ``split=TR/VA/TE`` (fractions, default
0.6/0.2/0.2) and ``split_seed=S`` (default 0: the DistDGL baseline's Facebook split). Every kind
takes ``sym=0`` to keep edge directions (default: symmetrise). Paths may not contain ':' or ','.
"""
from __future__ import annotations

import json
import os
import pickle

import numpy as np

from partitioning.graph import GraphData, InputError, canonical_edges, check_ids_in_range, seeded_split

DEFAULT_SPLIT = (0.6, 0.2, 0.2)


# ----------------------------------------------------------------------------- spec parsing
def parse_options(text: str, where: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InputError(where, f"option '{item}' is not KEY=VALUE")
        opts[key.strip()] = value.strip()
    return opts


class Options:
    """Typed access to a spec's KEY=VALUE options; unknown keys are an error."""

    def __init__(self, opts: dict[str, str], where: str, allowed: set[str]):
        unknown = sorted(set(opts) - allowed - {"sym"})
        if unknown:
            raise InputError(where, f"unknown option(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed | {'sym'}))})")
        self.opts, self.where = opts, where

    def get(self, key, default=None):
        return self.opts.get(key, default)

    def int(self, key, default=None, minimum=None):
        raw = self.opts.get(key)
        if raw is None:
            if default is None:
                raise InputError(self.where, f"option {key}= is required")
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InputError(self.where, f"option {key}={raw} is not an integer") from None
        if minimum is not None and value < minimum:
            raise InputError(self.where, f"option {key}={raw} must be >= {minimum}")
        return value

    def float(self, key, default, lo=None, hi=None):
        raw = self.opts.get(key)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise InputError(self.where, f"option {key}={raw} is not a number") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise InputError(self.where, f"option {key}={raw} must lie in [{lo}, {hi}]")
        return value

    @property
    def symmetric(self) -> bool:
        raw = self.opts.get("sym", "1")
        if raw not in ("0", "1"):
            raise InputError(self.where, f"option sym={raw} must be 0 or 1")
        return raw == "1"

    def split_masks(self, num_nodes: int):
        raw = self.opts.get("split")
        fractions = DEFAULT_SPLIT
        if raw is not None:
            try:
                fractions = tuple(float(x) for x in raw.split("/"))
            except ValueError:
                fractions = ()
            if len(fractions) != 3:
                raise InputError(self.where, f"option split={raw} is not TRAIN/VAL/TEST fractions, e.g. 0.6/0.2/0.2")
        seed = self.int("split_seed", 0)
        try:
            masks = seeded_split(num_nodes, fractions, seed)
        except InputError as e:
            raise InputError(self.where, e.what) from None
        return masks, {"split": "seeded random", "split_fractions": list(fractions), "split_seed": seed}


SPLIT_OPTIONS = {"split", "split_seed"}


def load_spec(spec: str) -> GraphData:
    """Load any input SPEC into a validated, canonical GraphData."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in LOADERS:
        raise InputError("--input", f"unknown spec '{spec}' (expected one of: {', '.join(k + ':...' for k in LOADERS)})")
    graph = LOADERS[kind](rest, spec)
    graph.info.setdefault("source", spec)
    graph.validate(spec)
    return graph


def positional(rest: str, spec: str, count: int, usage: str) -> tuple[list[str], str]:
    parts = rest.split(":")
    if len(parts) not in (count, count + 1) or not all(parts[:count]):
        raise InputError(spec, f"expected {usage}")
    return parts[:count], (parts[count] if len(parts) > count else "")


def need_file(path: str) -> str:
    if not os.path.isfile(path):
        raise InputError(path, "file not found")
    return path


def need_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise InputError(path, "directory not found")
    return path


def _graph(name, n, src, dst, feats, labels, num_classes, masks, info, symmetric, where) -> GraphData:
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    check_ids_in_range(src, n, where, "edge source")
    check_ids_in_range(dst, n, where, "edge destination")
    src, dst = canonical_edges(src, dst, n, symmetric)
    info = dict(info, symmetrised=symmetric, self_loops="removed", duplicate_edges="removed")
    return GraphData(name, n, src, dst, feats, np.asarray(labels, dtype=np.int64), int(num_classes),
                     *masks, info=info)


# ----------------------------------------------------------------------------- planetoid
class _ArrayUnpickler(pickle.Unpickler):
    """Planetoid files are Python-2 pickles of numpy/scipy objects; allow nothing else, so a
    crafted file cannot run code."""

    ALLOWED = ("numpy", "scipy.sparse", "collections", "copy_reg", "copyreg", "__builtin__", "builtins")

    def find_class(self, module, name):
        if module.startswith("scipy.sparse.") and "._" not in module:  # old private paths, e.g. scipy.sparse.csr
            import scipy.sparse

            if hasattr(scipy.sparse, name):
                return getattr(scipy.sparse, name)
        if module.startswith(self.ALLOWED) and not (module in ("builtins", "__builtin__") and name in ("eval", "exec", "getattr", "__import__", "open")):
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
    return _graph(name.lower(), n, src, dst, feats, labels, onehot.shape[1], masks, info, opts.symmetric, base + ".graph")


# ----------------------------------------------------------------------------- musae
# Label columns that make sense for the public MUSAE datasets (the user can override).
MUSAE_LABELS = {"facebook": ("page_type", None), "twitch": ("mature", None), "github": ("ml_target", None),
                "chameleon": ("target", 5), "squirrel": ("target", 5), "crocodile": ("target", 5)}


def _musae_file(root: str, candidates: list[str]) -> str:
    for c in candidates:
        p = os.path.join(root, c)
        if os.path.isfile(p):
            return p
    raise InputError(os.path.join(root, candidates[0]), "file not found" + (f" (nor {', '.join(candidates[1:])})" if len(candidates) > 1 else ""))


def load_musae(rest: str, spec: str) -> GraphData:
    (root, name), optext = positional(rest, spec, 2, "musae:DIR:NAME[:label=COL[,bins=K]]")
    opts = Options(parse_options(optext, spec), spec, {"label", "bins", "feat_hash"} | SPLIT_OPTIONS)
    need_dir(root)
    import pandas as pd

    edges_path = _musae_file(root, [f"{name}_edges.csv"])
    feats_path = _musae_file(root, [f"{name}_features.json", f"{name}.json"])
    target_path = _musae_file(root, [f"{name}_target.csv"])
    target = pd.read_csv(target_path)
    id_col = "new_id" if "new_id" in target.columns else "id"
    family = next((k for k in MUSAE_LABELS if name.lower().startswith(k) or k in name.lower()), None)
    default_label, default_bins = MUSAE_LABELS.get(family, (None, None))
    label_col = opts.get("label", default_label)
    if label_col is None:
        raise InputError(spec, f"no known label column for '{name}'; add :label=COL (columns: {', '.join(target.columns)})")
    if id_col not in target.columns or label_col not in target.columns:
        raise InputError(target_path, f"needs columns '{id_col}' and '{label_col}' (has: {', '.join(target.columns)})")
    n = len(target)
    ids = target[id_col].to_numpy()
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise InputError(target_path, f"column '{id_col}' must hold each node id 0..{n - 1} exactly once")
    bins = opts.int("bins", (default_bins or 0) if label_col == default_label else 0, minimum=0)
    column = target[label_col]
    if bins:
        if not np.issubdtype(column.dtype, np.number):
            raise InputError(target_path, f"column '{label_col}' is not numeric, so bins={bins} cannot apply")
        edges_q = np.quantile(column.to_numpy(dtype=np.float64), np.linspace(0, 1, bins + 1)[1:-1])
        codes = np.digitize(column.to_numpy(dtype=np.float64), edges_q)
        classes = bins
        label_note = f"'{label_col}' binned into {bins} quantile classes"
    else:
        values = sorted(column.astype(str).unique())
        codes = column.astype(str).map({v: i for i, v in enumerate(values)}).to_numpy()
        classes = len(values)
        label_note = f"'{label_col}' categorical, classes sorted: {values[:20]}"
    labels = np.empty(n, dtype=np.int64)
    labels[ids] = codes

    try:
        with open(feats_path) as f:
            active = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(feats_path, f"not a JSON object node -> feature indices ({e})") from None
    if not isinstance(active, dict):
        raise InputError(feats_path, "expected a JSON object node -> list of feature indices")
    rows, cols = [], []
    for key, idx in active.items():
        try:
            node = int(key)
        except ValueError:
            raise InputError(feats_path, f"key '{key}' is not a node id") from None
        if not 0 <= node < n:
            raise InputError(feats_path, f"node id {node} is out of range [0, {n})")
        rows.append(np.full(len(idx), node, dtype=np.int64))
        cols.append(np.asarray(idx, dtype=np.int64))
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    cols = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    if cols.size and cols.min() < 0:
        raise InputError(feats_path, f"negative feature index {int(cols.min())}")
    hash_dim = opts.int("feat_hash", 0, minimum=0)
    if hash_dim:  # feature hashing keeps very wide sparse inputs at a fixed width
        cols = (cols * 2654435761) % hash_dim
        dim = hash_dim
    else:
        dim = int(cols.max()) + 1 if cols.size else 1
    feats = np.zeros((n, dim), dtype=np.float32)
    feats[rows, cols] = 1.0  # dense binary multi-hot, as the DistDGL baseline uses

    try:
        edges = pd.read_csv(edges_path)
    except Exception as e:
        raise InputError(edges_path, f"unreadable CSV ({e})") from None
    if edges.shape[1] < 2:
        raise InputError(edges_path, "expected two columns id_1,id_2")
    masks, split_info = opts.split_masks(n)
    info = {"dataset": name, "labels": label_note,
            "features": f"dense binary multi-hot, {dim} dims" + (" (hashed)" if hash_dim else ""), **split_info}
    return _graph(name, n, edges.iloc[:, 0].to_numpy(), edges.iloc[:, 1].to_numpy(), feats, labels, classes,
                  masks, info, opts.symmetric, edges_path)


# ----------------------------------------------------------------------------- ogb
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
        raise InputError(os.path.join(root, name.replace("-", "_"), "raw"), "OGB raw directory not found (download it on a machine with internet first)")
    raw = os.path.join(base, "raw")
    if os.path.isfile(os.path.join(raw, "data.npz")):  # papers100M ships numpy archives
        with np.load(os.path.join(raw, "data.npz")) as z:
            edge_index, feats, n = z["edge_index"], z["node_feat"], int(np.sum(z["num_nodes_list"]))
        label_path = need_file(os.path.join(raw, "node-label.npz"))
        with np.load(label_path) as z:
            labels = z["node_label"].reshape(-1)
    else:
        if os.path.isfile(os.path.join(raw, "node-feat.csv.gz")) is False:
            raise InputError(os.path.join(raw, "node-feat.csv.gz"), "file not found (heterogeneous OGB datasets are not supported)")
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
    return _graph(name, n, edge_index[0], edge_index[1], feats, labels, int(labels.max()) + 1, masks, info,
                  opts.symmetric, os.path.join(raw, "edge"))


# ----------------------------------------------------------------------------- npz / edgelist / dgl
def _first_key(z, keys):
    return next((k for k in keys if k in z), None)


def load_npz(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, SPLIT_OPTIONS)
    try:
        z = dict(np.load(need_file(path), allow_pickle=False))
    except InputError:
        raise
    except Exception as e:
        raise InputError(path, f"not a readable .npz archive ({e})") from None
    import scipy.sparse as sp

    info = {"dataset": os.path.basename(path)}
    if "adj_indptr" in z:  # gnn-benchmark layout (shchur/gnn-benchmark)
        adj = sp.csr_matrix((z["adj_data"], z["adj_indices"], z["adj_indptr"]), shape=tuple(z["adj_shape"])).tocoo()
        src, dst, n = adj.row, adj.col, int(z["adj_shape"][0])
        if "attr_indptr" in z:
            feats = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]), shape=tuple(z["attr_shape"])).toarray()
        else:
            feats = z["attr_matrix"]
        labels = z["labels"]
        masks = None
    else:
        if "edge_index" in z:
            src, dst = z["edge_index"][0], z["edge_index"][1]
        elif "src" in z and "dst" in z:
            src, dst = z["src"], z["dst"]
        else:
            raise InputError(path, f"needs 'edge_index' or 'src'+'dst' (has: {', '.join(z)})")
        fkey, lkey = _first_key(z, ("features", "feat", "x")), _first_key(z, ("labels", "label", "y"))
        if fkey is None or lkey is None:
            raise InputError(path, f"needs features ('features'|'feat'|'x') and labels ('labels'|'label'|'y') (has: {', '.join(z)})")
        feats, labels = z[fkey], z[lkey]
        n = int(z["num_nodes"]) if "num_nodes" in z else feats.shape[0]
        masks = _masks_from_arrays(z, n, path)
    feats = np.ascontiguousarray(feats, dtype=np.float32)
    labels = np.asarray(labels).reshape(-1)
    if feats.shape[0] != n or labels.shape[0] != n:
        raise InputError(path, f"{n} nodes, but {feats.shape[0]} feature rows and {labels.shape[0]} labels")
    if masks is None:
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    return _graph(info["dataset"], n, src, dst, feats, labels, int(labels.max()) + 1 if n else 1, masks, info,
                  opts.symmetric, path)


def _masks_from_arrays(z: dict, n: int, path: str):
    """Masks from ``*_mask`` booleans or ``*_idx`` index arrays; None when the file has neither."""
    masks = []
    for part, alt in (("train", "train"), ("val", "valid"), ("test", "test")):
        key = _first_key(z, (f"{part}_mask", f"{alt}_mask", part, f"{part}_idx", f"{alt}_idx"))
        if key is None:
            return None
        arr = np.asarray(z[key])
        if arr.dtype == np.bool_ or key.endswith("_mask"):  # DGL stores bool masks as uint8
            if arr.shape != (n,) or not np.isin(arr, (0, 1)).all():
                raise InputError(path, f"'{key}' has shape {arr.shape}, expected a ({n},) 0/1 mask")
            masks.append(arr.astype(bool))
        else:
            arr = arr.astype(np.int64).reshape(-1)
            check_ids_in_range(arr, n, path, f"'{key}'")
            m = np.zeros(n, dtype=bool)
            m[arr] = True
            masks.append(m)
    return masks


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
    n = feats.shape[0] if feats is not None else labels.shape[0] if labels is not None else int(max(src.max(initial=-1), dst.max(initial=-1)) + 1)
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
            masks = _masks_from_arrays(dict(z), n, split_path)
        if masks is None:
            raise InputError(split_path, "needs train/val/test masks or index arrays (train, val|valid, test)")
        info["split"] = split_path
    else:
        opts.opts.pop("split", None)
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    labels = labels.astype(np.int64)
    return _graph(info["dataset"], n, src, dst, np.ascontiguousarray(feats, dtype=np.float32), labels,
                  int(labels.max()) + 1 if n else 1, masks, info, opts.symmetric, path)


def load_dgl_file(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, SPLIT_OPTIONS)
    need_file(path)
    from rudder.dgl_bridge import load_dgl

    dgl = load_dgl()
    try:
        graphs, _ = dgl.load_graphs(path)
    except Exception as e:
        raise InputError(path, f"not a dgl.save_graphs file ({e})") from None
    g = graphs[0]
    nd = {k: v.numpy() for k, v in g.ndata.items()}
    fkey, lkey = _first_key(nd, ("feat", "features", "x")), _first_key(nd, ("label", "labels", "y"))
    if fkey is None or lkey is None:
        raise InputError(path, f"needs node data 'feat' and 'label' (has: {', '.join(nd) or 'none'})")
    n = g.num_nodes()
    src, dst = (t.numpy() for t in g.edges())
    masks = _masks_from_arrays(nd, n, path)
    info = {"dataset": os.path.basename(path)}
    if masks is None:
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    labels = nd[lkey].reshape(-1)
    return _graph(info["dataset"], n, src, dst, np.ascontiguousarray(nd[fkey], dtype=np.float32), labels,
                  int(labels.max()) + 1 if n else 1, masks, info, opts.symmetric, path)


def load_synthetic(rest: str, spec: str) -> GraphData:
    from partitioning import synthetic

    kind, _, optext = rest.partition(":")
    if kind not in synthetic.GENERATORS:
        raise InputError(spec, f"unknown generator '{kind}' (expected one of: {', '.join(synthetic.GENERATORS)})")
    gen, allowed = synthetic.GENERATORS[kind]
    opts = Options(parse_options(optext, spec), spec, allowed | SPLIT_OPTIONS)
    n, src, dst, feats, labels, classes, info = gen(opts)
    masks, split_info = opts.split_masks(n)
    return _graph(info["dataset"], n, src, dst, feats, labels, classes, masks, {**info, **split_info}, opts.symmetric, spec)


LOADERS = {
    "planetoid": load_planetoid,
    "musae": load_musae,
    "ogb": load_ogb,
    "npz": load_npz,
    "edgelist": load_edgelist,
    "dgl": load_dgl_file,
    "synthetic": load_synthetic,
}
