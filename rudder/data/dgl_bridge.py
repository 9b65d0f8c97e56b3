"""The one door to DGL: every DGL import in Rudder goes through ``load_dgl()``, and only when
DGL is used (``--model-impl dgl``, the tests' single-process reference): importing this module
imports no DGL.

DGL 2.1.0 (the newest Linux wheel) eagerly loads its GraphBolt C++ library, built only for
torch 2.0-2.2.1, so a plain ``import dgl`` on torch 2.13 raises FileNotFoundError for
``libgraphbolt_pytorch_2.13.0.so``. Classic DGL (libdgl.so: graphs, sampling, blocks, SAGEConv,
METIS) does not need GraphBolt, so we skip exactly that one library load while DGL imports and
restore the patched functions right after. GraphBolt, ``dgl.sparse`` and tensoradapter stay
unusable; nothing in Rudder touches them.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

_GRAPHBOLT_LIB = "libgraphbolt_pytorch"


def load_dgl():
    """Import DGL once (with the GraphBolt skip) and return the module."""
    if "dgl" in sys.modules:
        return sys.modules["dgl"]
    import torch

    real_load, real_exists = torch.classes.load_library, os.path.exists

    def load_library(path):
        return None if _GRAPHBOLT_LIB in str(path) else real_load(path)

    def exists(path):
        return True if _GRAPHBOLT_LIB in str(path) else real_exists(path)

    torch.classes.load_library, os.path.exists = load_library, exists
    try:
        with warnings.catch_warnings():
            # torchdata 0.8 prints a datapipes deprecation banner on DGL's import.
            warnings.simplefilter("ignore", UserWarning)
            os.environ.setdefault("DGLBACKEND", "pytorch")
            dgl = importlib.import_module("dgl")
    finally:
        torch.classes.load_library, os.path.exists = real_load, real_exists
    return dgl


def sage_conv(in_feats: int, out_feats: int):
    """DGL's GraphSAGE layer with the mean aggregator (the paper's model)."""
    return load_dgl().nn.SAGEConv(in_feats, out_feats, aggregator_type="mean")


def runs_on_cuda() -> bool:
    """Whether this DGL build can put a graph on a CUDA device."""
    import torch

    try:
        load_dgl().graph((torch.tensor([0]), torch.tensor([0]))).to("cuda")
    except Exception:  # DGLError on CPU builds, a CUDA error without a GPU: either way, it cannot
        return False
    return True


def to_blocks(layers, device=None) -> list:
    """DGL message-flow blocks from sampled layers (``rudder.sampling.neighbors.Layer``, input side first):
    edges as local (src, dst) indices, destination nodes first among the sources."""
    import torch

    dgl = load_dgl()
    blocks = []
    for layer in layers:
        block = dgl.create_block((torch.from_numpy(layer.src), torch.from_numpy(layer.dst)),
                                 num_src_nodes=layer.num_src, num_dst_nodes=layer.num_dst)
        blocks.append(block.to(device) if device is not None else block)
    return blocks
