"""``dgl:FILE``: the first graph of a ``dgl.save_graphs`` file, with node data feat/label and
optional masks."""
from __future__ import annotations

import os

import numpy as np

from partitioning.graph import GraphData, InputError
from partitioning.spec import SPLIT_OPTIONS, Options, build_graph, first_key, masks_from_arrays, need_file, parse_options
from rudder.data.dgl_bridge import load_dgl


def load_dgl_file(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, SPLIT_OPTIONS)
    need_file(path)
    dgl = load_dgl()  # DGL and torch import here, only when a dgl: spec is given
    try:
        graphs, _ = dgl.load_graphs(path)
    except Exception as e:
        raise InputError(path, f"not a dgl.save_graphs file ({e})") from None
    g = graphs[0]
    nd = {k: v.numpy() for k, v in g.ndata.items()}
    fkey, lkey = first_key(nd, ("feat", "features", "x")), first_key(nd, ("label", "labels", "y"))
    if fkey is None or lkey is None:
        raise InputError(path, f"needs node data 'feat' and 'label' (has: {', '.join(nd) or 'none'})")
    n = g.num_nodes()
    src, dst = (t.numpy() for t in g.edges())
    masks = masks_from_arrays(nd, n, path)
    info = {"dataset": os.path.basename(path)}
    if masks is None:
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    labels = nd[lkey].reshape(-1)
    return build_graph(info["dataset"], n, (src, dst), np.ascontiguousarray(nd[fkey], dtype=np.float32), labels,
                       int(labels.max()) + 1 if n else 1, masks, info, opts.symmetric, path)
