"""The torch GraphSAGE layer (rudder.train.sage) against DGL 2.1's SAGEConv(aggregator_type="mean"):
the same initial parameters from one seed, and the same outputs and gradients (of the weights and
of the inputs) on random blocks and on Cora's sampled blocks, at 1-3 layers, with destinations
that have no in-edges (some of them sources elsewhere, some isolated) and layers with no edge."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import BUNDLED_CORA

from bench.sage_layer import sampled_minibatches
from rudder.sampling.neighbors import Layer
from rudder.train.model import GraphSAGE
from rudder.train.sage import Block, SAGEConv, _csr_product, _segment_sum

# float32 sums of up to a few hundred terms in another order: a few ulps of the largest term.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def twins(widths: list[int], seed: int = 0) -> tuple[GraphSAGE, GraphSAGE]:
    """Our model and DGL's, each built from the same seed (their parameters must then be equal)."""
    models = []
    for impl in ("torch", "dgl"):
        torch.manual_seed(seed)
        models.append(GraphSAGE(widths[0], widths[1], widths[-1], len(widths) - 1, dropout=0.0, impl=impl))
    return models[0], models[1]


def random_layers(sizes: list[int], rng: np.random.Generator, edges_per_dst: int = 4) -> list[Layer]:
    """Blocks input side first over node counts ``sizes`` (sources then destinations, shrinking).
    In each, a quarter of the destinations get no in-edge: half of those are sources of other
    edges, half appear nowhere else (isolated); edges come in random order."""
    layers = []
    for num_src, num_dst in zip(sizes[:-1], sizes[1:]):
        silent = rng.choice(num_dst, size=max(1, num_dst // 4), replace=False)
        receiving = np.setdiff1d(np.arange(num_dst), silent)
        dst = rng.choice(receiving, size=edges_per_dst * num_dst)
        isolated = silent[: silent.size // 2]
        allowed = np.setdiff1d(np.arange(num_src), isolated)
        src = rng.choice(allowed, size=dst.size)
        src[: silent.size - isolated.size] = silent[isolated.size:]  # the others send
        order = rng.permutation(dst.size)
        layers.append(Layer(src[order], dst[order], num_src, num_dst))
    return layers


def forward_backward(model: GraphSAGE, layers: list[Layer], x: torch.Tensor, seed: int = 1):
    x = x.clone().requires_grad_()
    out = model(model.blocks(layers), x)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * upstream).sum().backward()
    return out.detach(), x.grad, {name: p.grad for name, p in model.named_parameters()}


def assert_same(ours, theirs):
    (out, x_grad, grads), (ref_out, ref_x_grad, ref_grads) = ours, theirs
    torch.testing.assert_close(out, ref_out, **TOLERANCE)
    torch.testing.assert_close(x_grad, ref_x_grad, **TOLERANCE)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOLERANCE, msg=name)


def test_parameters_are_dgls_from_the_same_seed():
    for in_feats, out_feats in ((20, 5), (5, 20), (8, 8)):
        ours, theirs = twins([in_feats, out_feats])
        assert list(ours.state_dict()) == list(theirs.state_dict())
        for (name, p), q in zip(ours.state_dict().items(), theirs.state_dict().values()):
            assert torch.equal(p, q), name
        assert ours.layers[0].fc_self.bias.abs().sum() > 0  # DGL leaves nn.Linear's bias init: so do we


@pytest.mark.parametrize("widths", [[12, 5], [5, 12], [6, 6], [30, 8, 4], [4, 8, 8, 3], [40, 16, 16, 7]])
def test_random_blocks(widths):
    rng = np.random.default_rng(sum(widths))
    sizes = [120, 60, 25, 10][-len(widths):]
    layers = random_layers(sizes, rng)
    ours, theirs = twins(widths)
    x = torch.randn(sizes[0], widths[0], generator=torch.Generator().manual_seed(2))
    assert_same(forward_backward(ours, layers, x), forward_backward(theirs, layers, x))
    in_degree = np.bincount(layers[-1].dst, minlength=layers[-1].num_dst)
    assert (in_degree == 0).any() and (in_degree > 0).any()


def test_layers_without_edges_and_lone_destinations():
    rng = np.random.default_rng(5)
    empty = Layer(np.zeros(0, np.int64), np.zeros(0, np.int64), 9, 4)
    lone = Layer(np.array([3]), np.array([1]), 5, 4)  # one edge; three destinations receive nothing
    for widths, layers in (([7, 3], [empty]), ([3, 7], [empty]), ([6, 5, 2], [random_layers([30, 9], rng)[0], empty]),
                           ([6, 2], [lone])):
        ours, theirs = twins(widths)
        x = torch.randn(layers[0].num_src, widths[0])
        result = forward_backward(ours, layers, x)
        assert_same(result, forward_backward(theirs, layers, x))
        if layers[0] is empty:  # no neighbour anywhere: the self term alone
            torch.testing.assert_close(result[0], ours.layers[0].fc_self(x[: empty.num_dst]).detach())


@pytest.fixture(scope="module")
def cora():
    from partitioning.sources import load_spec

    return load_spec(f"planetoid:{BUNDLED_CORA}:cora")


@pytest.mark.parametrize("fanouts", [[5], [10, 25], [-1, 3, 4]])
def test_cora_sampled_blocks(cora, fanouts):
    minibatches = sampled_minibatches(cora, 64, fanouts, 3, seed=len(fanouts))
    widths = [cora.feat_dim] + [16] * (len(fanouts) - 1) + [cora.num_classes]
    ours, theirs = twins(widths)
    for mb in minibatches:
        x = torch.from_numpy(cora.features[mb.input_nodes])
        assert_same(forward_backward(ours, mb.layers, x), forward_backward(theirs, mb.layers, x))
    in_degree = np.bincount(minibatches[0].layers[0].dst, minlength=minibatches[0].layers[0].num_dst)
    assert in_degree.max() > 1


def test_block_layout():
    """Block.of on edges in any order equals the CSR of the same edges; the out-edges made
    lazily (evaluation's blocks) equal those made with the block."""
    rng = np.random.default_rng(0)
    layer = random_layers([40, 15], rng)[0]
    block, lazy = Block.of(layer), Block.of(layer, backward=False)
    assert lazy.rev_indptr is None
    for a, b in zip(block.reversed_csr(), lazy.reversed_csr()):
        assert torch.equal(a, b)
    dense = np.zeros((layer.num_dst, layer.num_src), dtype=np.int64)
    np.add.at(dense, (layer.dst, layer.src), 1)
    rows = np.repeat(np.arange(layer.num_dst), np.diff(block.indptr.numpy()))
    rebuilt = np.zeros_like(dense)
    np.add.at(rebuilt, (rows, block.indices.numpy()), 1)
    assert np.array_equal(rebuilt, dense)
    cols = np.repeat(np.arange(layer.num_src), np.diff(block.rev_indptr.numpy()))
    reverse = np.zeros_like(dense)
    np.add.at(reverse, (block.rev_indices.numpy(), cols), 1)
    assert np.array_equal(reverse, dense)
    assert torch.equal(block.degree.squeeze(1), torch.from_numpy(np.maximum(dense.sum(1), 1)).float())


@pytest.mark.parametrize("sizes", [[40, 15], [300, 120], [50, 50]])
def test_the_gpus_row_sums_are_the_cpus(sizes):
    """The GPU's row sums (a gather and a segmented reduction) give the CPU's CSR product's bits in
    both directions of a block with silent and isolated destinations (both sum a row in edge
    order); on a GPU, where there is one, the same bits on every call (cuSPARSE's product did not)."""
    rng = np.random.default_rng(sizes[0])
    block = Block.of(random_layers(sizes, rng)[0])
    scales = 10.0 ** rng.uniform(-3, 3, (block.num_src, 1))  # rows of very different sizes: order matters
    x = torch.from_numpy((rng.standard_normal((block.num_src, 7)) * scales).astype(np.float32))
    grad = torch.from_numpy(rng.standard_normal((block.num_dst, 7), dtype=np.float32))
    directions = [(block.indptr, block.indices, block.num_dst, x), (*block.reversed_csr(), block.num_src, grad)]
    for indptr, indices, rows, h in directions:
        expected = _csr_product(indptr, indices, rows, h)
        assert torch.equal(_segment_sum(indptr, indices, rows, h), expected)
        assert not expected[np.diff(indptr.numpy()) == 0].any()
        if torch.cuda.is_available():
            on_gpu = [t.cuda() for t in (indptr, indices, h)]
            first = _segment_sum(on_gpu[0], on_gpu[1], rows, on_gpu[2])
            assert all(torch.equal(first, _segment_sum(on_gpu[0], on_gpu[1], rows, on_gpu[2])) for _ in range(5))


def test_layer_state_dict_loads_into_dgls():
    ours, theirs = twins([10, 4], seed=0)
    other = SAGEConv(10, 4)
    theirs.layers[0].load_state_dict(other.state_dict())
    ours.layers[0].load_state_dict(other.state_dict())
    layers = random_layers([20, 8], np.random.default_rng(1))
    x = torch.randn(20, 10)
    assert_same(forward_backward(ours, layers, x), forward_backward(theirs, layers, x))
