"""``npz:FILE``: a generic .npz (edges, features, labels, optional masks) or the gnn-benchmark
layout (shchur/gnn-benchmark: CSR adjacency and attributes). The generic layout's edges and
features are memory-mapped and read in chunks (``partitioning.ondisk.npz_member``), not loaded."""
from __future__ import annotations

import os

import numpy as np

from partitioning.csr import array_chunks
from partitioning.features import as_float32
from partitioning.graph import GraphData, InputError
from partitioning.ondisk import npz_member
from partitioning.spec import SPLIT_OPTIONS, Options, build_graph, first_key, masks_from_arrays, need_file, parse_options


def load_npz(rest: str, spec: str) -> GraphData:
    path, _, optext = rest.partition(",")
    opts = Options(parse_options(optext, spec), spec, SPLIT_OPTIONS)
    try:
        z = np.load(need_file(path), allow_pickle=False)  # members are read when asked for
        z.files  # noqa: B018 - a file that is no archive fails here
    except InputError:
        raise
    except Exception as e:
        raise InputError(path, f"not a readable .npz archive ({e})") from None
    import scipy.sparse as sp

    info = {"dataset": os.path.basename(path)}
    if "adj_indptr" in z:  # gnn-benchmark layout (shchur/gnn-benchmark)
        adj = sp.csr_matrix((z["adj_data"], z["adj_indices"], z["adj_indptr"]), shape=tuple(z["adj_shape"])).tocoo()
        edges, n = (adj.row, adj.col), int(z["adj_shape"][0])
        if "attr_indptr" in z:
            feats = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]), shape=tuple(z["attr_shape"])).toarray()
        else:
            feats = z["attr_matrix"]
        labels = z["labels"]
        masks = None
    else:
        if "edge_index" in z:
            edge_index = npz_member(path, "edge_index")
            edges = array_chunks(edge_index[0], edge_index[1])
        elif "src" in z and "dst" in z:
            edges = array_chunks(npz_member(path, "src"), npz_member(path, "dst"))
        else:
            raise InputError(path, f"needs 'edge_index' or 'src'+'dst' (has: {', '.join(z)})")
        fkey, lkey = first_key(z, ("features", "feat", "x")), first_key(z, ("labels", "label", "y"))
        if fkey is None or lkey is None:
            raise InputError(path, "needs features ('features'|'feat'|'x') and labels ('labels'|'label'|'y') "
                                   f"(has: {', '.join(z)})")
        feats, labels = as_float32(npz_member(path, fkey), f"'{fkey}' of {path}"), z[lkey]
        n = int(z["num_nodes"]) if "num_nodes" in z else feats.shape[0]
        masks = masks_from_arrays(z, n, path)
    feats = np.ascontiguousarray(feats, dtype=np.float32) if not isinstance(feats, np.memmap) else feats
    labels = np.asarray(labels).reshape(-1)
    if feats.shape[0] != n or labels.shape[0] != n:
        raise InputError(path, f"{n} nodes, but {feats.shape[0]} feature rows and {labels.shape[0]} labels")
    if masks is None:
        masks, split_info = opts.split_masks(n)
        info.update(split_info)
    z.close()
    return build_graph(info["dataset"], n, edges, feats, labels, int(labels.max()) + 1 if n else 1, masks, info,
                       opts.symmetric, path)
