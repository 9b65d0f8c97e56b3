"""The GNN: GraphSAGE as in the paper (mean-aggregator SAGEConv layers, ReLU and dropout between
them), run on the sampled blocks of a minibatch, input side first."""
from __future__ import annotations

import torch
from torch import nn

from rudder.data.dgl_bridge import sage_conv


class GraphSAGE(nn.Module):
    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int, dropout: float):
        super().__init__()
        self.widths = widths = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(sage_conv(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = nn.Dropout(dropout)

    def layer_forward(self, i: int, block, h: torch.Tensor) -> torch.Tensor:
        """Layer i alone (layer-wise inference runs the layers one at a time over all nodes)."""
        h = self.layers[i](block, h)
        if i < len(self.layers) - 1:
            h = self.dropout(torch.relu(h))
        return h

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h
