"""The assemblers' input matrices are reused only once nothing refers to them (rudder.data.row_blocks)."""
import time
import types

import numpy as np
import pytest
import torch

from rudder.comm.dist_array import ReadStats
from rudder.data.row_blocks import RowBlocks
from rudder.prefetch.assembly import AssemblyStats
from rudder.prefetch.pipeline import MinibatchPipeline, matrices_in_flight


def test_a_block_comes_back_only_when_no_view_or_tensor_holds_it():
    blocks = RowBlocks(dim=8, keep=3)
    x = blocks.take(100)
    x[:] = 1.0
    held = x[10:20]  # a view of a view: numpy refers it to the block itself, not to x
    del x
    y = blocks.take(100)
    assert not np.shares_memory(y, held) and blocks.fresh == 2
    tensor = torch.from_numpy(held)
    del held
    z = blocks.take(90)  # the first block is still held by the tensor; the second by y
    assert not np.shares_memory(z, tensor.numpy()) and not np.shares_memory(z, y) and blocks.fresh == 3
    del z
    again = blocks.take(90)  # the third block, idle again
    assert blocks.reused == 1 and not np.shares_memory(again, tensor.numpy())
    del tensor, again
    assert blocks.take(100).shape == (100, 8) and blocks.reused == 2


def test_autograds_saved_input_keeps_its_block_until_the_backward_pass_is_done():
    blocks = RowBlocks(dim=16, keep=2)
    layer = torch.nn.Linear(16, 4)
    x = blocks.take(50)
    x[:] = np.random.default_rng(0).random((50, 16), dtype=np.float32)
    loss = layer(torch.from_numpy(x)).sum()  # the weight's gradient needs the input: autograd keeps it
    expected = x.copy()
    del x
    other = blocks.take(50)
    other[:] = 0.0
    loss.backward()
    alike = torch.nn.Linear(16, 4)
    alike.load_state_dict(layer.state_dict())
    alike(torch.from_numpy(expected)).sum().backward()  # the same product on the rows as they were
    assert torch.equal(layer.weight.grad, alike.weight.grad)
    del loss, other
    blocks.take(50)
    assert blocks.fresh == 2 and blocks.reused == 1


def test_too_small_idle_blocks_make_way_and_no_more_than_keep_idle_stay():
    blocks = RowBlocks(dim=4, keep=2)
    held = [blocks.take(10), blocks.take(10), blocks.take(10)]  # the third is not kept: two are
    assert len(blocks.blocks) == 2 and blocks.fresh == 3
    del held
    large = blocks.take(1000)  # both idle blocks are too small: they go, a larger one comes
    assert len(blocks.blocks) == 1 and large.base.shape[0] >= 1000
    small = blocks.take(5)  # the large one is busy: a small one beside it
    del large
    assert blocks.take(900).base is not small.base and blocks.reused == 1
    blocks.release_idle()
    assert [b.shape[0] for b in blocks.blocks] == [small.base.shape[0]]  # only the busy one stays


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_pipeline_needs_no_more_blocks_than_matrices_in_flight_and_never_overwrites_a_held_one(depth):
    """The real pipeline thread filling blocks while the consumer holds one a step, as the trainer's
    ``step`` does: each matrix still holds its own minibatch's rows when trained, and the pool
    (and rudder.plan's minibatch term) needs ``matrices_in_flight(depth)`` blocks at most."""
    class Sampler:
        def sample(self, seeds, key):
            return types.SimpleNamespace(input_nodes=seeds)

    class Assembler:
        blocks = RowBlocks(dim=3, keep=matrices_in_flight(depth))

        def assemble(self, nodes, future):
            x = self.blocks.take(nodes.size)
            x[:] = nodes[:, None]
            return x, AssemblyStats(ReadStats())

    schedule = ((0, step, np.arange(200, dtype=np.int64) + step) for step in range(40))
    assembler = Assembler()
    pipeline = MinibatchPipeline(schedule, Sampler(), assembler, depth)

    def step():
        item, _ = pipeline.next()
        time.sleep(0.002)  # the step's compute, while the pipeline prepares the next ones
        assert (item.x == item.seeds[:, None]).all(), item.step

    for _ in range(40):
        step()
    pipeline.close()
    assert assembler.blocks.fresh <= matrices_in_flight(depth) and assembler.blocks.reused == 40 - assembler.blocks.fresh
