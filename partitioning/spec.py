"""What every input loader shares: a spec's positional parts and KEY=VALUE options, path checks,
train/val/test masks read from arrays, and the builder of the canonical ``GraphData``."""
from __future__ import annotations

import os

import numpy as np

from partitioning.csr import array_chunks, build_csr
from partitioning.features import first_nonfinite_row
from partitioning.graph import GraphData, InputError, check_ids_in_range, seeded_split

DEFAULT_SPLIT = (0.6, 0.2, 0.2)
SPLIT_OPTIONS = {"split", "split_seed"}


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


def first_key(z, keys):
    return next((k for k in keys if k in z), None)


def masks_from_arrays(z: dict, n: int, path: str):
    """Masks from ``*_mask`` booleans or ``*_idx`` index arrays; None when the file has neither."""
    masks = []
    for part, alt in (("train", "train"), ("val", "valid"), ("test", "test")):
        key = first_key(z, (f"{part}_mask", f"{alt}_mask", part, f"{part}_idx", f"{alt}_idx"))
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


def build_graph(name, n, edges, feats, labels, num_classes, masks, info, symmetric, where) -> GraphData:
    """``edges``: (src, dst) arrays, or re-iterable ``EdgeChunks`` (read twice, in chunks)."""
    if isinstance(edges, tuple):
        edges = array_chunks(np.asarray(edges[0]), np.asarray(edges[1]))
    indptr, indices = build_csr(edges, n, symmetric, where)
    info = dict(info, symmetrised=symmetric, self_loops="removed", duplicate_edges="removed")
    return GraphData(name, n, indptr, indices, feats, np.asarray(labels, dtype=np.int64), int(num_classes),
                     *masks, info=info)


def validate_graph(graph: GraphData, where: str) -> None:
    """Check shapes, ranges and values; raise InputError naming ``where`` otherwise."""
    n = graph.num_nodes
    feats = graph.features
    if feats.ndim != 2 or feats.shape[0] != n or feats.shape[1] < 1:
        raise InputError(where, f"features have shape {tuple(feats.shape)}, expected ({n}, D) for {n} nodes")
    if feats.dtype != np.float32:
        raise InputError(where, f"features are {feats.dtype}, expected float32")
    bad_row = first_nonfinite_row(feats)
    if bad_row is not None:
        raise InputError(where, f"features of node {bad_row} contain NaN or inf")
    if graph.labels.shape != (n,):
        raise InputError(where, f"labels have shape {graph.labels.shape}, expected ({n},)")
    for name in ("train_mask", "val_mask", "test_mask"):
        m = getattr(graph, name)
        if m.shape != (n,) or m.dtype != np.bool_:
            raise InputError(where, f"{name} has shape {m.shape} and dtype {m.dtype}, expected ({n},) bool")
    # -1 marks an unlabelled node (OGB papers100M); it may not sit in any split.
    in_split = graph.train_mask | graph.val_mask | graph.test_mask
    bad = (graph.labels >= graph.num_classes) | (graph.labels < np.where(in_split, 0, -1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(where, f"label {int(graph.labels[i])} of node {i} is out of range [0, {graph.num_classes})")

