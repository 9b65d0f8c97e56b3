"""The simulator's time model (rudder.sim.timing) on hand-built cases, and machine profile files
(rudder.sim.machine): a round trip, the machine picked by rate, and bad files as one line."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from rudder.sim import timing
from rudder.sim.machine import Machine, MachineError, load_profile, parse_rate, pick, resolve, save_profile

HOST = dict(name="h", ranks_per_node=1, latency=0.01, bandwidth=1.0, node_bandwidth=10.0, flops=1.0,
            step_overhead=0.0, links="shared")


def test_serial_steps_add_up_and_overlapped_steps_take_the_longer_side():
    prepare, train, sync = np.array([[1.0, 1, 1, 1]]), np.array([[2.0, 2, 2, 2]]), np.zeros(4)
    assert timing.pipeline_end(prepare, train, sync, 0).tolist() == [3, 6, 9, 12]  # each step prepare + train
    assert timing.pipeline_end(prepare, train, sync, 1).tolist() == [3, 5, 7, 9]  # the first prepare, then max
    assert timing.pipeline_end(train, prepare, sync, 1).tolist() == [3, 5, 7, 9]  # pipeline-bound: the same
    # two trainers meet in each step's allreduce: the slower one sets the step, the sync adds to it
    two = timing.pipeline_end(np.array([[1.0, 1], [3, 3]]), np.array([[1.0, 1], [1, 1]]), np.array([0.5, 0.5]), 0)
    assert two.tolist() == [4.5, 9.0]
    # depth 1 lets the producer run one minibatch ahead of the queue, never more
    end = timing.pipeline_end(np.array([[1.0, 1, 1, 1, 1]]), np.array([[10.0, 0, 0, 0, 0]]), np.zeros(5), 1)
    assert end.tolist() == [11, 11, 11, 12, 13]  # minibatches 1 and 2 were prepared during step 0; 3 was not
    assert timing.epoch_seconds(np.array([3.0, 6, 9, 12]), np.array([0, 0, 1, 1]), [0, 1]) == [6, 6]
    # the modelled epoch time is the logs' (rudder.logs.metrics): with phases, each phase's median weighted
    costs = {"prepare": np.ones((1, 6)), "train": np.array([[4.0, 4, 4, 1, 1, 1]]), "comm": np.zeros((1, 6))}
    epoch_of = np.repeat(np.arange(6), 1)  # a step an epoch: epochs 1-2 of 4 s, 3-5 of 1 s (timed: 1-5)
    assert timing.epoch_time(costs, 0.0, 0, epoch_of, 6)["seconds"] == 2.0  # the middle of 5, 5, 2, 2, 2
    assert timing.epoch_time(costs, 0.0, 0, epoch_of, 6, np.array([0, 0, 0, 1, 1, 1]))["seconds"] == \
        pytest.approx((2 * 5 + 3 * 2) / 5)


def test_a_shared_link_is_divided_in_time_between_the_fetches_on_it():
    """shared_link_pipeline: without bytes it is pipeline_end; fetches that start together share
    the link as link_seconds has it; a fetch alone on the link gets all of it; the link carries
    no more than its bandwidth; a copy beside the Gets bounds a read from below."""
    rng = np.random.default_rng(0)
    for depth in (0, 1, 2):
        for trainers in (1, 3):
            prepare, train, sync = rng.random((trainers, 12)), rng.random((trainers, 12)), rng.random(12) * 0.1
            end, _ = timing.shared_link_pipeline(prepare, 0 * prepare, 0 * prepare, train, sync, depth, 1.0)
            np.testing.assert_allclose(end, timing.pipeline_end(prepare, train, sync, depth))
    b = np.array([[1.0], [2.0], [3.0]])
    zero = np.zeros((3, 1))
    end, on_link = timing.shared_link_pipeline(zero, b, zero, zero, np.zeros(1), 0, 1.0)
    np.testing.assert_allclose(on_link, timing.link_seconds(b, Machine(**HOST)))  # together: as link_seconds
    # trainer 1 computes for 2 s while trainer 0 fetches: each has the link to itself
    end, on_link = timing.shared_link_pipeline(np.array([[0.0], [2.0]]), np.array([[2.0], [2.0]]), np.zeros((2, 1)),
                                               np.zeros((2, 1)), np.zeros(1), 1, 1.0)
    assert on_link[:, 0].tolist() == [2, 2] and end.tolist() == [4]
    # overlapped, many steps: the link never carries more than its bandwidth
    head, nbytes, train = rng.random((4, 40)), rng.random((4, 40)) * 3, rng.random((4, 40))
    end, on_link = timing.shared_link_pipeline(head, nbytes, 0 * head, train, np.zeros(40), 1, 2.0)
    assert end[-1] >= nbytes.sum() / 2.0 and (on_link >= nbytes / 2.0 - 1e-9).all()
    end, on_link = timing.shared_link_pipeline(zero, b, zero + 7.0, zero, np.zeros(1), 0, 1.0)
    assert end.tolist() == [7]  # a copy of 7 s beside the Gets (6 s of bytes): each read ends at 7 s


def test_overlapped_sampling_reads_wait_behind_the_bulk_and_feature_reads_do_not():
    """On a shared link with overlap, a sampling round pays the loaded round trip (its small reads
    queue behind other trainers' feature bytes), a feature round the unloaded one (its bytes are
    that bulk, already shared by link_seconds); without overlap both pay the unloaded one."""
    m = Machine(**{**HOST, "loaded_latency": 0.5, "sample_step": 0.0, "cores": 0})
    zeros = np.zeros(3)
    sampled = [dict(edges=zeros, input_nodes=zeros, flops=zeros, sample_seconds=zeros, adjacency_bytes_remote=zeros,
                    adjacency_rounds=np.array([1.0, 0, 0])) for _ in range(2)]
    fetched = [dict(rows_rma=zeros, decisions_at=zeros, fetch_seconds=zeros, bytes_rma=zeros, hits=zeros,
                    fetch_rounds=np.array([0.0, 1, 2])) for _ in range(2)]
    overlapped = timing.step_costs(m, sampled, fetched, 4, depth=1)["comm"][0]
    serial = timing.step_costs(m, sampled, fetched, 4, depth=0)["comm"][0]
    np.testing.assert_allclose(overlapped, [0.5, 0.01, 0.02])
    np.testing.assert_allclose(serial, [0.01, 0.01, 0.02])


def test_a_long_shared_memory_copy_overlaps_the_gets_and_a_short_one_precedes_them():
    """dist_array issues the Gets before a shared-memory copy of more than COPY_FIRST_MAX_BYTES and
    copies while they fly: the model charges such a step max(copy, comm), a shorter copy (or one
    with nothing to Get) copy + comm."""
    m = Machine(**{**HOST, "latency": 0.0, "bandwidth": 1e9 * 8, "sample_step": 0.0, "cores": 0,
                   "assemble_byte": 1e-9})
    big = (timing.COPY_FIRST_MAX_BYTES // 4) * 2  # rows of 4 bytes: 8 MiB x 2 of them
    inputs, rma = np.array([big + 1000.0, big + 1000, 1000, 1000]), np.array([1000.0, 0, 1000, 0])
    one = np.ones(4)
    sampled = [dict(edges=0 * one, input_nodes=inputs, flops=0 * one, sample_seconds=0 * one,
                    adjacency_bytes_remote=0 * one, adjacency_rounds=0 * one)]
    fetched = [dict(rows_rma=rma, decisions_at=0 * one, fetch_seconds=0 * one, bytes_rma=rma * 4, hits=0 * one,
                    fetch_rounds=0 * one)]
    costs = timing.step_costs(m, sampled, fetched, 1, depth=1)
    copy = (inputs - rma) * 4 * 1e-9
    comm = costs["comm"][0]
    np.testing.assert_allclose(costs["prepare"][0], [max(copy[0], comm[0]), copy[1] + comm[1], copy[2] + comm[2],
                                                     copy[3] + comm[3]])
    assert costs["prepare"][0][0] < copy[0] + comm[0]  # the long copy with Gets: overlapped
    hits = dict(fetched[0], hits=np.array([big, 0.0, 0, 0]))  # the same inputs, held by the buffer: a short read
    np.testing.assert_allclose(timing.step_costs(m, sampled, [hits], 1, depth=1)["prepare"][0][0], copy[0] + comm[0])


def _steps(trainers: int, steps: int, cpu: float, link_bytes: float) -> tuple[list, list]:
    """Counts for ``trainers`` x ``steps`` minibatches: ``cpu`` seconds of sampling each (as its
    sampled edges at one second an edge) and ``link_bytes`` off-node bytes of features."""
    one = np.ones(steps)
    sampled = [dict(edges=cpu * one, input_nodes=0 * one, flops=one, sample_seconds=0 * one,
                    adjacency_bytes_remote=0 * one, adjacency_rounds=0 * one) for _ in range(trainers)]
    fetched = [dict(rows_rma=one, decisions_at=0 * one, fetch_seconds=0 * one, bytes_rma=link_bytes * one,
                    hits=0 * one, fetch_rounds=0 * one) for _ in range(trainers)]
    return sampled, fetched


def test_yielding_threads_share_the_cores_only_while_busy():
    """Spinning, every thread is runnable; yielding, only busy ones are: the slowdown is spinning's
    with every thread busy, falls with the busy shares, and the training threads (which compute
    together) see all of theirs. modelled_epoch settles on a slowdown that the busy shares of its
    own epoch reproduce, and yielding is never slower than spinning."""
    m = Machine(**{**HOST, "latency": 0.0, "sample_edge": 1.0, "cores": 2})
    spin = timing.contention(m, 4, 1, 0.5)
    assert spin == timing.PerThread(4.25, 4.25)
    assert timing.yielding_slowdown(m, 4, 1, 0.5, timing.PerThread(1.0, 1.0)) == spin
    assert timing.yielding_slowdown(m, 4, 1, 0.0, timing.PerThread(0.0, 0.0)) == timing.PerThread(1.0, 2.0)
    assert timing.yielding_slowdown(m, 4, 1, 0.0, timing.PerThread(0.5, 0.25)) == timing.PerThread(1.75, 3.0)
    assert timing.yielding_slowdown(m, 4, 0, 0.0, timing.PerThread(0.0, 0.0)) == timing.contention(m, 4, 0)
    epoch_of = np.repeat(np.arange(4), 10)  # 4 epochs: 2 steady ones (rudder.logs.metrics)
    for cpu, link_bytes, bound in ((0.5, 1.0, "link"), (1.0, 0.0, "cpu")):
        sampled, fetched = _steps(4, 40, cpu, link_bytes)
        spun = timing.modelled_epoch(m, sampled, fetched, 1, 1, 0.0, epoch_of, 4, 0.0, "spin")
        out = timing.modelled_epoch(m, sampled, fetched, 1, 1, 0.0, epoch_of, 4, 0.0, "yield")
        assert spun["slowdown"] == timing.contention(m, 4, 1) and out["seconds"] <= spun["seconds"] + 1e-9
        work = timing.step_costs(m, sampled, fetched, 1, 1, 0.0, out["slowdown"])["work"]
        busy = timing.busy_shares(work, out["slowdown"], 4, sum(out["per_epoch"]))
        again = timing.yielding_slowdown(m, 4, 1, 0.0, busy)
        assert again.prepare == pytest.approx(out["slowdown"].prepare, abs=2e-3)
        assert again.train == pytest.approx(out["slowdown"].train, abs=2e-3)
        if bound == "link":  # 4 bytes a step at 1 byte/s against 0.5 s of CPU: pipeline threads often asleep
            assert out["slowdown"].prepare < 2.0 < spin.prepare and out["seconds"] < 0.9 * spun["seconds"]
            # moving bytes and yielding waits take CPU too: a higher slowdown, a longer epoch, in either mode
            busier = dataclasses.replace(m, byte_cpu=0.05, wait_cpu=0.1)
            for mode, base in (("spin", spun), ("yield", out)):
                more = timing.modelled_epoch(busier, sampled, fetched, 1, 1, 0.0, epoch_of, 4, 0.0, mode)
                assert more["slowdown"].train > base["slowdown"].train and more["seconds"] > base["seconds"]
        else:  # preparing takes as long as training, with nothing to wait for: every thread busy, as spinning
            assert out["seconds"] == pytest.approx(spun["seconds"], rel=0.03)  # less the pipeline's start


def test_a_buffers_cpu_is_added_to_its_own_policys_assembly():
    """Machine.buffer_cpu: a minibatch's preparing costs a buffer a + b x input nodes more: the
    figures of its policy and settings where those were calibrated, else its policy's pooled
    ones; no other policy's."""
    work = "lookahead buffer_fraction=0.25 lookahead=4"
    m = Machine(**{**HOST, "latency": 0.0, "buffer_cpu": {"lookahead": [0.5, 0.25], work: [1.0, 0.5]}})
    sampled, fetched = _steps(2, 3, 1.0, 0.0)
    for s in sampled:
        s["input_nodes"] = np.full(3, 4.0)
    base = timing.step_costs(m, sampled, fetched, 1, 0)["prepare"]

    def added(buffer_work):
        return timing.step_costs(m, sampled, fetched, 1, 0, buffer_work=buffer_work)["prepare"] - base

    np.testing.assert_allclose(added(work), 1.0 + 0.5 * 4)
    np.testing.assert_allclose(added("lookahead buffer_fraction=0.25 lookahead=8"), 0.5 + 0.25 * 4)
    np.testing.assert_allclose(added("fixed buffer_fraction=0.25 delta=8"), 0.0)


def test_links_divide_bandwidth_as_their_topology_does():
    b = np.array([[1.0], [2.0], [3.0]])
    own = timing.link_seconds(b, Machine(**{**HOST, "links": "per-trainer"}))
    shared = timing.link_seconds(b, Machine(**HOST))
    per_node = timing.link_seconds(b, Machine(**{**HOST, "links": "per-node"}))
    assert own[:, 0].tolist() == [1, 2, 3]
    assert shared[:, 0].tolist() == [3, 5, 6]  # fair sharing: the last done when all 6 bytes crossed
    assert per_node[:, 0].tolist() == [2, 2, 3]  # its own bytes, or the mean sender's
    assert timing.allreduce_seconds(100, 4, Machine(**HOST)) == pytest.approx(6 * 0.01 + 4 * 1.5 * 400)
    assert timing.allreduce_seconds(100, 4, Machine(**{**HOST, "links": "per-trainer"})) == pytest.approx(
        6 * 0.01 + 1.5 * 400)


def test_a_profile_file_round_trips_and_picks_the_machine_of_a_rate(tmp_path):
    one = Machine(**{**HOST, "rate": "1gbit", "rate_bit": 1e9, "get_call": 2e-5, "cores": 2,
                     "buffer_cpu": {"fixed": [1e-3, 2e-7]},
                     "calibration": {"probe": {"small_get_s": 0.01}}})
    slow = Machine(**{**HOST, "name": "h250", "rate": "250mbit", "rate_bit": 2.5e8})
    path = str(tmp_path / "p.json")
    save_profile(path, [one, slow])
    assert load_profile(path) == [one, slow] and load_profile(path)[0].calibration == one.calibration
    assert resolve(path, parse_rate("250mbit"), "shared") == slow
    assert resolve(path, 1e9) == one
    with pytest.raises(MachineError, match="name one with --rate"):
        resolve(path)
    with pytest.raises(MachineError, match="not per-node"):
        pick(path, [one, slow], 1e9, "per-node")
    with pytest.raises(MachineError, match="unshaped"):
        resolve(path, 0.0)  # an unshaped run has no machine in a shaped profile
    with pytest.raises(MachineError, match="--rate '1 gigabit'"):
        parse_rate("1 gigabit")


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "other"}), "expected {\"format\": \"rudder-machine\""),
    (json.dumps({"format": "rudder-machine", "machines": [{"name": "x"}]}), "missing bandwidth"),
    (json.dumps({"format": "rudder-machine", "machines": [{**HOST, "bandwidth": -1}]}), "non-negative"),
    (json.dumps({"format": "rudder-machine", "machines": [{**HOST, "links": "mesh"}]}), "links must be one of"),
    (json.dumps({"format": "rudder-machine", "machines": [{**HOST, "buffer_cpu": {"fixed": [1]}}]}),
     "buffer_cpu must map"),
])
def test_a_bad_profile_file_is_one_line(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(MachineError, match="--machine .*bad.json") as e:
        load_profile(str(path))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_cli_says_what_is_wrong_with_a_profile_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": "rudder-machine", "machines": [{**HOST, "links": "mesh"}]}))
    expected = "links must be one of"
    proc = subprocess.run([sys.executable, "-m", "rudder.simulate", "--data", str(tmp_path), "--machine", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
