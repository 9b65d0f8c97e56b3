"""The GNN: GraphSAGE as in the paper (mean-aggregator SAGEConv layers, ReLU and dropout between
them), run on the sampled blocks of a minibatch, input side first.

Two implementations of the layer compute the same function with the same parameters: ``torch``
(``rudder.train.sage``, the default, on any device torch runs on) and ``dgl`` (DGL's own
``SAGEConv``, over DGL blocks; PyPI's DGL runs on CPU only). Each takes its own kind of block,
which ``blocks`` builds from the sampler's layers.
"""
from __future__ import annotations

import torch
from torch import nn

from rudder.data.dgl_bridge import sage_conv, to_blocks
from rudder.train.config import IMPLEMENTATIONS
from rudder.train.sage import Block, SAGEConv


class GraphSAGE(nn.Module):
    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int, dropout: float,
                 impl: str = "torch"):
        super().__init__()
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"GraphSAGE implementation {impl!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
        self.impl = impl
        self.widths = widths = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        layer = SAGEConv if impl == "torch" else sage_conv
        self.layers = nn.ModuleList(layer(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = nn.Dropout(dropout)

    def blocks(self, layers: list, backward: bool = True) -> list:
        """This implementation's blocks of sampled layers (``rudder.sampling.neighbors.Layer``), on
        the host; ``backward``: they will be trained through (the torch blocks' out-edges are made now)."""
        if self.impl == "dgl":
            return to_blocks(layers)
        return [Block.of(layer, backward) for layer in layers]

    def layer_forward(self, i: int, block, h: torch.Tensor) -> torch.Tensor:
        """Layer i alone (layer-wise inference runs the layers one at a time over all nodes)."""
        return self._after_layer(i, self.layers[i](block, h))

    def _after_layer(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """ReLU and dropout between layers; the last layer's output as it is."""
        return self.dropout(torch.relu(h)) if i < len(self.layers) - 1 else h

    def layer_forward_in_pieces(self, i: int, num_dst: int, pieces, h: torch.Tensor) -> torch.Tensor:
        """``layer_forward`` over layer i's block given as ``pieces`` of ``(block, a, b)``, each
        block the in-edges of destinations a:b (``SAGEConv.forward_in_pieces``: the products once).
        DGL's layer takes whole blocks: each piece runs the layer over every destination, its own
        rows kept, so that each product still has the whole layer's shape and bits."""
        if self.impl == "torch":
            h = self.layers[i].forward_in_pieces(num_dst, pieces, h)
        else:
            out = torch.empty((num_dst, self.widths[i + 1]), dtype=h.dtype, device=h.device)
            for block, a, b in pieces:
                out[a:b] = self.layers[i](block, h)[a:b]
            h = out
        return self._after_layer(i, h)

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h
