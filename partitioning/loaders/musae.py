"""``musae:DIR:NAME[:label=COL[,bins=K][,feat_hash=D]]``: the MUSAE layout (NAME_edges.csv,
NAME_features.json, NAME_target.csv), split at random by the shared split options."""
from __future__ import annotations

import json
import os

import numpy as np

from partitioning.graph import GraphData, InputError
from partitioning.spec import SPLIT_OPTIONS, Options, build_graph, need_dir, parse_options, positional

# Label columns that make sense for the public MUSAE datasets (the user can override).
MUSAE_LABELS = {"facebook": ("page_type", None), "twitch": ("mature", None), "github": ("ml_target", None),
                "chameleon": ("target", 5), "squirrel": ("target", 5), "crocodile": ("target", 5)}


def _musae_file(root: str, candidates: list[str]) -> str:
    for c in candidates:
        p = os.path.join(root, c)
        if os.path.isfile(p):
            return p
    also = f" (nor {', '.join(candidates[1:])})" if len(candidates) > 1 else ""
    raise InputError(os.path.join(root, candidates[0]), "file not found" + also)


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
    return build_graph(name, n, (edges.iloc[:, 0].to_numpy(), edges.iloc[:, 1].to_numpy()), feats, labels, classes,
                       masks, info, opts.symmetric, edges_path)
