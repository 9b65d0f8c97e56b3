"""GraphSAGE's mean-aggregator layer in plain torch, over our own blocks: what DGL 2.1's
``SAGEConv(aggregator_type="mean")`` computes, without DGL, so that ``--device cuda`` needs
nothing but a CUDA build of torch.

A ``Block`` is one sampled layer (``rudder.sampling.neighbors.Layer``: edges as local indices,
destination nodes first among the sources) as two CSR index pairs: the in-edges of every
destination, which the forward pass averages over, and the out-edges of every source, which the
backward pass sums gradients over (made on the host with the block, in the pipeline thread).
Both directions are the same row sums, run through one autograd function because torch's own
backward of a CSR product transposes the matrix on every call (docs/training.md has the
measurements). On CPU the sums are a sparse-dense product with torch's CSR kernel (MKL, without
atomics, so the same inputs give the same bits). On CUDA they are a gather and a segmented
reduction, which sums each row in one fixed order: cuSPARSE's CSR product gave different bits
on the same inputs from call to call, so training on a GPU was not reproducible and a buffer
policy's losses were no longer bit-identical to no buffer's (measured on the lent GPU).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch
from torch import nn

# torch warns once per process that CSR tensors are a beta feature; we rely only on the product.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


@dataclass
class Block:
    num_src: int
    num_dst: int
    indptr: torch.Tensor  # (num_dst + 1,) int64: destination i's in-edges are indptr[i]:indptr[i + 1]
    indices: torch.Tensor  # (E,) int64: the source of each in-edge, grouped by destination
    rev_indptr: torch.Tensor | None  # (num_src + 1,) int64: each source's out-edges (None: made when needed)
    rev_indices: torch.Tensor | None  # (E,) int64: the destination of each out-edge, grouped by source
    degree: torch.Tensor  # (num_dst, 1) float32: in-degree, at least 1 (the mean's divisor; no edge: mean 0)

    @classmethod
    def of(cls, layer, backward: bool = True) -> Block:
        """The block of a sampled layer, on the host; ``backward``: also the out-edges now (in the
        pipeline thread, rather than in the training step's backward pass)."""
        src, dst = np.asarray(layer.src, dtype=np.int64), np.asarray(layer.dst, dtype=np.int64)
        if dst.size > 1 and (dst[1:] < dst[:-1]).any():  # the sampler's edges come grouped; others may not
            order = np.argsort(dst, kind="stable")
            src, dst = src[order], dst[order]
        indptr = _indptr(torch.from_numpy(dst), layer.num_dst)
        rev = _host_reverse(indptr.numpy(), src, layer.num_dst, layer.num_src) if backward else (None, None)
        return cls.of_tensors(layer.num_src, layer.num_dst, [indptr, torch.from_numpy(src), *rev])

    @classmethod
    def of_tensors(cls, num_src: int, num_dst: int, tensors: list) -> Block:
        """A block from its index tensors (``tensors()``), on their device."""
        indptr, indices, rev_indptr, rev_indices = tensors
        degree = (indptr[1:] - indptr[:-1]).clamp_(min=1).to(torch.float32).unsqueeze(1)
        return cls(num_src, num_dst, indptr, indices, rev_indptr, rev_indices, degree)

    def tensors(self) -> list:
        """The index tensors, in ``of_tensors`` order (what travels to the device)."""
        return [self.indptr, self.indices, self.rev_indptr, self.rev_indices]

    def to(self, device, non_blocking: bool = False) -> Block:
        moved = [t if t is None else t.to(device, non_blocking=non_blocking) for t in self.tensors()]
        return Block.of_tensors(self.num_src, self.num_dst, moved)

    def reversed_csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rev_indptr is None:
            dst = torch.repeat_interleave(torch.arange(self.num_dst, device=self.indptr.device),
                                          self.indptr[1:] - self.indptr[:-1], output_size=self.indices.numel())
            self.rev_indptr, self.rev_indices = _reverse(self.indices, dst, self.num_src)
        return self.rev_indptr, self.rev_indices


def _indptr(rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """CSR row pointers of edges grouped by row."""
    indptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=num_rows), 0, out=indptr[1:])
    return indptr


def _host_reverse(indptr: np.ndarray, src: np.ndarray, num_dst: int, num_src: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_reverse`` on the host by scipy's CSR-to-CSC transposition: a counting sort, linear in the
    edges, several times faster than a sort of the sources; the same arrays."""
    ones = np.ones(src.size, dtype=np.float32)
    reverse = scipy.sparse.csr_array((ones, src, indptr), shape=(num_dst, num_src)).tocsc()
    return (torch.from_numpy(reverse.indptr.astype(np.int64, copy=False)),
            torch.from_numpy(reverse.indices.astype(np.int64, copy=False)))


def _reverse(src: torch.Tensor, dst: torch.Tensor, num_src: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The out-edge CSR: edges regrouped by source, each source's destinations in ascending order."""
    order = torch.sort(src, stable=True).indices
    return _indptr(src[order], num_src), dst[order]


def _csr_product(indptr: torch.Tensor, indices: torch.Tensor, rows: int, h: torch.Tensor) -> torch.Tensor:
    """Row i of the result: the sum of h's rows at indices[indptr[i]:indptr[i + 1]]."""
    ones = torch.ones(indices.numel(), dtype=h.dtype, device=h.device)
    adjacency = torch.sparse_csr_tensor(indptr, indices, ones, (rows, h.shape[0]), check_invariants=False)
    return adjacency @ h


def _segment_sum(indptr: torch.Tensor, indices: torch.Tensor, rows: int, h: torch.Tensor) -> torch.Tensor:
    """``_csr_product``'s sums as a gather and a segmented reduction (a row without edges sums to
    0): each row summed in edge order, the same bits on every call; on CPU bit-equal to the CSR
    product and several times slower, so only the GPU uses it."""
    return torch.segment_reduce(h.index_select(0, indices), "sum", offsets=indptr, axis=0, unsafe=True)


def _row_sums(indptr: torch.Tensor, indices: torch.Tensor, rows: int, h: torch.Tensor) -> torch.Tensor:
    """Row i: the sum of h's rows at indices[indptr[i]:indptr[i + 1]], by the kernel that is
    reproducible on h's device."""
    return (_segment_sum if h.is_cuda else _csr_product)(indptr, indices, rows, h)


class _MeanOverInEdges(torch.autograd.Function):
    """Each destination's mean over its in-edges' source rows (0 without in-edges). As DGL's
    ``fn.mean`` does: the sum, then a division by the degree; backward divides, then sums over
    out-edges."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, block: Block) -> torch.Tensor:
        ctx.block = block
        return _row_sums(block.indptr, block.indices, block.num_dst, h.contiguous()) / block.degree

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None
        block = ctx.block
        rev_indptr, rev_indices = block.reversed_csr()
        return _row_sums(rev_indptr, rev_indices, block.num_src, (grad / block.degree).contiguous()), None


def mean_aggregate(block: Block, h: torch.Tensor) -> torch.Tensor:
    """(num_src, D) source rows -> (num_dst, D) means over each destination's in-edges."""
    return _MeanOverInEdges.apply(h, block)


class SAGEConv(nn.Module):
    """fc_self(h_dst) + fc_neigh(mean of in-neighbours), fc_self carrying the bias; fc_neigh is
    applied before aggregating when it narrows the rows (in_feats > out_feats), as DGL's
    ``lin_before_mp``. Modules, their order and their initialisation are DGL's (xavier_uniform with
    the ReLU gain on both weights, the bias left at nn.Linear's own): one torch seed gives both
    layers the same parameters, and state dicts load from one into the other."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.in_feats, self.out_feats = in_feats, out_feats
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_self = nn.Linear(in_feats, out_feats, bias=True)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        h_dst = h[:block.num_dst]
        if self.in_feats > self.out_feats:
            h_neigh = mean_aggregate(block, self.fc_neigh(h))
        else:
            h_neigh = self.fc_neigh(mean_aggregate(block, h))
        return self.fc_self(h_dst) + h_neigh

    def forward_in_pieces(self, num_dst: int, pieces, h: torch.Tensor) -> torch.Tensor:
        """``forward`` over a block given as ``pieces``, an iterable of ``(block, a, b)``: a block
        holding only the in-edges of destinations a:b (an evaluation reads and aggregates a bounded
        number of in-edges at a time). The matrix products run once, over the whole layer's rows,
        so the result has ``forward``'s bits on the whole block; each destination's mean comes from
        its own piece, summing the same neighbours in the same order."""
        narrowed = self.in_feats > self.out_feats
        source_rows = self.fc_neigh(h) if narrowed else h
        means = torch.empty((num_dst, source_rows.shape[1]), dtype=h.dtype, device=h.device)
        for block, a, b in pieces:
            means[a:b] = mean_aggregate(block, source_rows)[a:b]
        return self.fc_self(h[:num_dst]) + (means if narrowed else self.fc_neigh(means))

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, aggregator=mean"
