"""Data-parallel steps at any process count: the reduced gradient equals the single-process
gradient of the mean loss over everyone's seeds (uneven and empty minibatches included), the
stop flag reaches every rank, and broadcast replicas are identical."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.mpi


def make_data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    n = 0 if rank == 1 else 3 + 2 * rank  # uneven, and rank 1 (if any) holds nothing
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("wire,wait", [("numpy", "spin"), ("tensor", "spin"), ("numpy", "yield")])
def test_gradient_is_the_global_mean(wire, wait):
    """``tensor``: MPI handed the torch tensor itself, as the device path hands it a CUDA buffer
    (mpi4py reads both through DLPack); ``yield``: the allreduce waited for by tests and sleeps."""
    from mpi4py import MPI

    from rudder.train.data_parallel import GradientAllreduce, broadcast_parameters, parameter_digest

    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.rank)  # different on purpose: the broadcast must fix it
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    broadcast_parameters(comm, model)
    digests = comm.allgather(parameter_digest(model))
    assert len(set(digests)) == 1
    reference = [p.detach().clone() for p in model.parameters()]

    x, y = make_data(comm.rank)
    loss_sum = 0.0
    if len(y):
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
        loss_sum = float(loss)
    allreduce = GradientAllreduce(comm, model, wait=wait)
    assert allreduce.path == "host" and allreduce.seconds_staging == 0.0
    if wire == "tensor":
        allreduce.wire_buffer = allreduce.wire
    totals = allreduce.allreduce(len(y), loss_sum, stop=comm.rank == comm.size - 1)
    assert totals.stop  # the last rank asked; every rank learns it

    # The same step in one process over every rank's data.
    single = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        for p, r in zip(single.parameters(), reference):
            p.copy_(r)
    xs, ys = zip(*(make_data(r) for r in range(comm.size)))
    all_y = torch.cat(ys)
    loss = torch.nn.functional.cross_entropy(single(torch.cat(xs)), all_y)
    loss.backward()
    assert totals.seeds == len(all_y)
    assert abs(totals.loss_sum / totals.seeds - float(loss)) < 1e-5
    for mine, theirs in zip(model.parameters(), single.parameters()):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
    grads = comm.allgather(np.concatenate([p.grad.numpy().ravel() for p in model.parameters()]))
    assert all(np.array_equal(g, grads[0]) for g in grads)  # bit-identical on every rank
