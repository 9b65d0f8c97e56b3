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

from partitioning.graph import GraphData, InputError
from partitioning.loaders.dgl_file import load_dgl_file
from partitioning.loaders.edgelist import load_edgelist
from partitioning.loaders.musae import load_musae
from partitioning.loaders.npz import load_npz
from partitioning.loaders.ogb import load_ogb
from partitioning.loaders.planetoid import load_planetoid
from partitioning.loaders.synthetic import load_synthetic
from partitioning.spec import validate_graph

# Kind -> loader(rest of the spec after "KIND:", the whole spec for error messages). The order
# is the one the "unknown spec" error lists.
LOADERS = {
    "planetoid": load_planetoid,
    "musae": load_musae,
    "ogb": load_ogb,
    "npz": load_npz,
    "edgelist": load_edgelist,
    "dgl": load_dgl_file,
    "synthetic": load_synthetic,
}


def load_spec(spec: str) -> GraphData:
    """Load any input SPEC into a validated, canonical GraphData."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in LOADERS:
        raise InputError("--input", f"unknown spec '{spec}' (expected one of: {', '.join(k + ':...' for k in LOADERS)})")
    graph = LOADERS[kind](rest, spec)
    graph.info.setdefault("source", spec)
    validate_graph(graph, spec)
    return graph
