"""A new buffer policy is one class and one registry line: this test registers one of its own
(replace on every third minibatch, counted across epochs) and trains with it end to end, in
process, at any process count, through the same job drivers/train.py runs: the replacements
land where the policy asked, training stays bit-identical to no buffer, and the simulator
reproduces the run exactly with the same class."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BUNDLED_CORA, partition_on_rank0, read_logs

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return partition_on_rank0(tmp_path_factory, f"planetoid:{BUNDLED_CORA}:cora", "cora-custom")


def shared_dir(tmp_path_factory, name: str) -> str:
    from mpi4py import MPI

    return MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp(name)) if MPI.COMM_WORLD.rank == 0 else None)


def test_a_policy_registered_here_trains_end_to_end(parts, tmp_path_factory):
    from mpi4py import MPI

    from rudder.prefetch.policies import ASKERS, Policy, register
    from rudder.sim.validate import validate
    from rudder.train import job

    @register("every_third")
    class EveryThird(Policy):
        def wants_replacement(self, view) -> bool:
            return view.counter % 3 == 0

    world = MPI.COMM_WORLD
    runs, logs = {}, {}
    for policy in ("none", "every_third"):
        runs[policy] = shared_dir(tmp_path_factory, policy) + "/run"
        assert job.main(["--data", parts, "--run-dir", runs[policy], "--policy", policy, "--epochs", "3",
                         "--batch-size", "16", "--delta", "1", "--eval-every", "0", "--progress", "none"]) == 0
        world.Barrier()
        logs[policy] = read_logs(runs[policy])
    assert [log["status"] for log in logs["every_third"]] == ["completed"] * world.size
    mine = logs["every_third"][world.rank]["minibatches"]
    counter = mine["epoch"].astype(np.int64) * (int(mine["step"].max()) + 1) + mine["step"]
    np.testing.assert_array_equal(mine["replaced"] == 1, counter % 3 == 0)
    assert (mine["asked_by"][mine["replaced"] == 1] == ASKERS[EveryThird.asker]).all()
    np.testing.assert_array_equal(mine["loss"], logs["none"][world.rank]["minibatches"]["loss"])
    if world.size > 1:
        assert mine["refills"].sum() > 0 and mine["hits"].sum() > 0  # it did steer a buffer
    if world.rank == 0:  # the simulator runs the same class on every partition
        compared, mismatches = validate(runs["every_third"])
        assert not mismatches and compared == sum(log["minibatches"].size for log in logs["every_third"])
