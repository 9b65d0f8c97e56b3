"""python -m rudder.netem end to end: a job's RMA traffic really crosses the shaped links (the
qdiscs' byte counters against the bytes the trainers logged), every policy trains bit-identically
under shaping, a SIGKILL of the job or of the tool leaves no namespace, link or process behind, the
congestion flow keeps to its bounds and stops by itself, faults take a link down and bring it back,
and bad input is one line. Skipped, with the reason, where private namespaces or tc are missing."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, mpiexec, read_logs, run_train

from rudder.netem.congestion import CHUNK, parse_profile
from rudder.netem.job import mpiexec_sections, ranks_of, with_rank_shim
from rudder.netem.namespaces import Netns, support_problem
from rudder.netem.shaping import LinkEnd, Shaper, counters, install

PROBLEM = support_problem()
needs_netem = pytest.mark.skipif(PROBLEM is not None, reason=f"no shaped network on this machine: {PROBLEM}")
PROBE = os.path.join(REPO, "bench", "rma_gets.py")
ENV = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")


def netem(*args) -> list[str]:
    return [sys.executable, "-m", "rudder.netem", *map(str, args)]


def run_netem(*args, timeout=600):
    return subprocess.run(netem(*args), capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)


def train(parts, run, *flags) -> list[str]:
    return [mpiexec(), "-n", "2", sys.executable, os.path.join(REPO, "drivers", "train.py"), "--data", parts, "--run-dir",
            run, "--epochs", "2", "--batch-size", "32", "--progress", "none", "--eval-every", "0", *flags]


@pytest.fixture(scope="module")
def cora2(tmp_path_factory):
    from partitioning.partition import partition_graph
    from partitioning.sources import load_spec

    out = str(tmp_path_factory.mktemp("cora2") / "parts")
    partition_graph(load_spec(f"planetoid:{BUNDLED_CORA}:cora"), 2, out, method="metis", seed=0)
    return out


@needs_netem
@pytest.mark.parametrize("links", ["shared", "per-node"])
def test_a_jobs_rma_traffic_crosses_the_shaping(cora2, tmp_path, links):
    run, stats_path = str(tmp_path / "run"), tmp_path / "stats.json"
    proc = run_netem("--rate", "1gbit", "--links", links, "--stats", stats_path, "--", *train(cora2, run, "--policy", "none"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    stats, logs = json.loads(stats_path.read_text()), read_logs(run)
    assert [log["layout"]["num_nodes"] for log in logs] == [2, 2]  # each rank its own (emulated) node
    fetched = [int(log["minibatches"]["bytes_rma"].sum()) for log in logs]
    assert min(fetched) > 0
    assert stats["crossed_bytes"] >= sum(fetched)
    if links == "per-node":  # what rank r fetched came in through node r's port: each rank was in its node
        into = {link["node"]: link["sent_bytes"] for link in stats["links"] if link["end"] == "switch"}
        assert all(into[rank] >= fetched[rank] for rank in (0, 1)), (into, fetched)
    else:
        assert [link["link"] for link in stats["links"]] == ["lo"]
    assert stats["env"] == {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "MPIR_CVAR_NUM_CLIQUES": "2"}
    assert "sent through the shaping" in proc.stdout


@needs_netem
def test_every_policy_under_shaping_trains_bit_identically(cora2, tmp_path):
    base = str(tmp_path / "unshaped")
    proc = run_train(2, "--data", cora2, "--run-dir", base, "--epochs", 2, "--batch-size", 32, "--progress", "none",
                     "--eval-every", 0, "--policy", "none", env={"MPIR_CVAR_NUM_CLIQUES": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    unshaped = [log["minibatches"] for log in read_logs(base)]
    # The scored buffer (fixed replaces; static is fixed without replacements) and the window buffer.
    for policy, flags in (("none", []), ("fixed", ["--delta", "2"]), ("lookahead", ["--lookahead", "4"])):
        run = str(tmp_path / policy)
        proc = run_netem("--rate", "250mbit", "--links", "per-node", "--", *train(cora2, run, "--policy", policy, *flags))
        assert proc.returncode == 0, proc.stderr[-3000:]
        tables = [log["minibatches"] for log in read_logs(run)]
        for ours, theirs in zip(tables, unshaped):
            np.testing.assert_array_equal(ours["loss"], theirs["loss"], err_msg=policy)
            np.testing.assert_array_equal(ours["input_nodes"], theirs["input_nodes"])
        assert policy == "none" or sum(int(t["hits"].sum()) for t in tables) > 0, policy


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def process(pid: int) -> tuple[int, str] | None:
    """(pid, start time) of a live process: a pid reused later does not match."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return pid, f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def netns_holders(inodes: set[int]) -> list[str]:
    """Who still holds one of these network namespaces: a process inside, a descriptor, a mount."""
    held = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino in inodes:
                held.append(f"process {pid}")
            held += [f"fd of {pid}" for fd in os.listdir(f"/proc/{pid}/fd")
                     if re.fullmatch(r"net:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}") or "")
                     and int(os.readlink(f"/proc/{pid}/fd/{fd}")[5:-1]) in inodes]
        except OSError:
            continue
    with open("/proc/self/mountinfo") as f:
        held += [f"mount {line.split()[4]}" for line in f if any(f"net:[{i}]" in line for i in inodes)]
    return held


def root_network() -> tuple[str, str, str]:
    links = {line.split(":")[1].strip().split("@")[0] for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()}
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
    named = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return links, qdiscs, named


@needs_netem
# Each victim once and each topology at least once (the teardown does not depend on which link
# the victim sat behind; the namespaces do, and both kinds are checked).
@pytest.mark.parametrize("links,victim", [("per-node", "job"), ("shared", "tool"), ("per-node", "sigterm")])
def test_sigkill_leaves_nothing_behind(links, victim):
    """SIGKILL to the job (the tool's child) or to the tool; and SIGTERM to the tool, which passes it on."""
    before = root_network()
    tool = subprocess.Popen(netem("--rate", "100mbit", "--links", links, "--congestion", "constant:10mbit", "--",
                                  mpiexec(), "-n", "2", sys.executable, PROBE, 1 << 20, 10**6),
                            env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, job, ranks = time.monotonic() + 120, [], []
    while time.monotonic() < deadline and tool.poll() is None:  # until both ranks run (in their nodes)
        unshare = children(tool.pid)
        inits = [c for u in unshare for c in children(u)]
        if inits:
            pidns = os.stat(f"/proc/{inits[0]}/ns/pid").st_ino
            job = [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if _in_pidns(p, pidns)]
            ranks = [p for p in job if PROBE in _cmdline(p) and "rudder.netem.rank" not in _cmdline(p)
                     and _cmdline(p).startswith(sys.executable)]
            if len(ranks) == 2:
                break
        time.sleep(0.2)
    assert len(ranks) == 2, tool.stderr.read() if tool.poll() is not None else "the job did not start"
    inodes = {int(os.readlink(f"/proc/{tool.pid}/fd/{fd}")[5:-1]) for fd in os.listdir(f"/proc/{tool.pid}/fd")
              if os.readlink(f"/proc/{tool.pid}/fd/{fd}").startswith("net:[")}
    assert len(inodes) == (3 if links == "per-node" else 1)
    rank_netns = {os.stat(f"/proc/{p}/ns/net").st_ino for p in ranks}
    assert rank_netns <= inodes and len(rank_netns) == (2 if links == "per-node" else 1)
    everything = [process(p) for p in [tool.pid, *children(tool.pid), *job]]
    assert all(map(process_alive, everything)) and len(netns_holders(inodes)) > len(inodes)  # the checks below can see them

    if victim == "sigterm":
        os.kill(tool.pid, signal.SIGTERM)
    else:
        os.kill(tool.pid if victim == "tool" else children(tool.pid)[0], signal.SIGKILL)
    returncode = tool.wait(timeout=60)  # (the test reaps the tool: a zombie would look alive)
    if victim == "sigterm":  # mpiexec passed it to the ranks, they ended, and the tool returned their status
        assert returncode > 0 and "python -m rudder.netem:" not in tool.stderr.read()
    else:
        assert returncode == (-signal.SIGKILL if victim == "tool" else 128 + signal.SIGKILL)  # the tool saw the job end
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (any(map(process_alive, everything)) or netns_holders(inodes)):
        time.sleep(0.2)
    assert not [p for p in everything if process_alive(p)]
    assert netns_holders(inodes) == []
    after = root_network()
    assert not {name for name in after[0] - before[0] if re.fullmatch(r"br0|port\d+|eth0|veth.*", name)}
    assert after[1:] == before[1:]
    assert not [p for p in filter(str.isdigit, os.listdir("/proc")) if PROBE in _cmdline(p)]


def _cmdline(pid) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def _in_pidns(pid: str, inode: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino == inode
    except OSError:
        return False


def process_alive(entry) -> bool:
    return entry is not None and process(entry[0]) == entry


@needs_netem
@pytest.mark.parametrize("links", ["shared", "per-node"])
def test_the_congestion_flow_keeps_its_bounds_and_stops_by_itself(tmp_path, links):
    stats_path = tmp_path / "stats.json"
    proc = run_netem("--rate", "100mbit", "--links", links, "--nodes", 2, "--congestion",
                     "square:40mbit,period=0.5,duty=0.6,start=0.3,duration=1.5", "--stats", stats_path, "--", "sleep", 6)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(stats_path.read_text())
    flow = stats["congestion"]
    assert flow["stop_reason"] == "duration" and flow["stopped_at_s"] >= flow["started_at_s"] >= 0.3
    assert 0 < flow["bytes_sent"] <= 40e6 / 8 * 1.5 + 2 * CHUNK and flow["bytes_received"] == flow["bytes_sent"]
    assert sum(flow["received_bytes_per_second"]) == flow["bytes_received"]
    expected = ["127.0.0.1"] * 2 if links == "shared" else ["10.211.0.1", "10.211.0.2"]
    assert flow["addresses"] == expected  # the namespaces' own addresses, nothing else
    out_of_node0 = sum(link["sent_bytes"] for link in stats["links"]
                       if link["end"] in ("lo", "node") and link["node"] in (None, 0))
    assert out_of_node0 >= flow["bytes_sent"]  # it crossed the shaped link(s)
    assert "stopped: duration" in proc.stdout

    proc = run_netem("--rate", "100mbit", "--links", links, "--nodes", 2, "--congestion",
                     "steps:0=80mbit/0.1=0bit/0.2=80mbit,bytes=1mb", "--stats", stats_path, "--", "sleep", 3)
    flow = json.loads(stats_path.read_text())["congestion"]
    assert proc.returncode == 0 and flow["stop_reason"] == "bytes" and flow["bytes_sent"] == flow["bytes_received"] == 1 << 20


@needs_netem
@pytest.mark.parametrize("links,qdisc", [("shared", "tbf"), ("per-node", "htb")])
def test_faults_take_the_link_down_and_bring_it_back(tmp_path, links, qdisc):
    """60 Gets of 256 KiB at 20 Mbit/s take over 6 s, so both faults fall inside the job. Their clock
    starts once 1 MB has crossed (--fault-after): MPI has connected, however long the ranks took to
    start (a link down while they connect fails the job or stalls it for a minute: docs/network.md)."""
    stats_path = tmp_path / "stats.json"
    proc = run_netem("--rate", "20mbit", "--links", links, "--qdisc", qdisc, "--fault-after", "1mb", "--fault", "down@1+0.5",
                     "--fault", "stall@2.5+0.5", "--stats", stats_path, "--", mpiexec(), "-n", 2, sys.executable, PROBE,
                     256 << 10, 60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # every Get returned the right bytes
    stats = json.loads(stats_path.read_text())
    assert {link["qdisc"] for link in stats["links"]} == {qdisc}
    down, stall = stats["faults"]
    assert down["clock_started_at_s"] == stall["clock_started_at_s"] > 0
    for fault in (down, stall):
        assert fault["applied_at_s"] >= fault["clock_started_at_s"] + fault["at_s"] - 0.01
        assert fault["restored_at_s"] > fault["applied_at_s"]
    port = "lo" if links == "shared" else "node0-switch"
    assert down["sent_bytes_at_restore"][port] == down["sent_bytes_at_apply"][port]  # nothing crossed while down
    stalled = stall["sent_bytes_at_restore"][port] - stall["sent_bytes_at_apply"][port]
    assert stalled <= 2 * stats["burst_bytes"] + 8000 / 8 * (stall["restored_at_s"] - stall["applied_at_s"]) + 65536
    final = next(link["sent_bytes"] for link in stats["links"] if link["link"] == port)
    assert final > stall["sent_bytes_at_restore"][port]  # traffic went on after the link came back
    assert re.search(r"t=\d+\.\ds 1048576 B crossed: the faults' clock starts", proc.stdout)
    assert re.search(r"t=\d+\.\ds .*link down \(down@1\+0\.5\)", proc.stdout)
    assert "link stalled at 8kbit (stall@2.5+0.5)" in proc.stdout


@needs_netem
@pytest.mark.parametrize("qdisc", ["tbf", "htb"])
def test_link_counters_are_tcs(qdisc):
    """The counters read by netlink are the ones ``tc -s qdisc`` prints for the root qdisc, after
    traffic that queued on it (a 4 Mbit/s link with a small bucket: both count overlimits, tbf drops
    what would wait over its latency)."""
    ns = Netns("counters")
    try:
        ns.run("ip", "link", "set", "lo", "up")
        link = LinkEnd(None, "lo", ns, "lo")
        install(link, Shaper(qdisc, 4 * 10**6, 65536))
        with ns.entered():
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(300):
            sender.sendto(bytes(1400), ("127.0.0.1", 9))
        sender.close()
        deadline = time.monotonic() + 10
        while True:  # until the queue has drained, so that both reads see the same counts
            tc = next(q for q in json.loads(ns.run("tc", "-s", "-j", "qdisc", "show", "dev", "lo")) if q.get("root"))
            if tc["qlen"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        ours = counters(link)
    finally:
        ns.close()
    assert ours["qdisc"] == tc["kind"] == qdisc
    assert (ours["sent_bytes"], ours["sent_packets"], ours["dropped"], ours["overlimits"]) == \
        (tc["bytes"], tc["packets"], tc["drops"], tc["overlimits"])
    assert ours["sent_packets"] > 40 and ours["overlimits"] > 0


@pytest.mark.parametrize("args,flag", [
    (["--rate", "fast", "--", "true"], "--rate"),
    (["--rate", "1gbit", "--congestion", "wobble:1gbit", "--", "true"], "--congestion"),
    (["--rate", "1gbit", "--congestion", "square:1gbit,duty=0.5", "--", "true"], "--congestion"),
    (["--rate", "1gbit", "--fault", "down@soon", "--", "true"], "--fault"),
    (["--rate", "1gbit", "--fault-after", "lots", "--fault", "down@1+1", "--", "true"], "--fault-after"),
    (["--rate", "1gbit", "--burst", "1kb", "--", "true"], "--burst"),
    (["--rate", "1gbit", "--links", "per-node", "--", "true"], "--nodes"),
    (["--rate", "1gbit", "--stats", "/nonexistent/stats.json", "--", "true"], "--stats"),
    (["--rate", "1gbit"], "no command"),
    (["--", "true"], "--rate"),
])
def test_bad_input_is_one_line(args, flag):
    proc = run_netem(*args, timeout=60)
    if flag == "--burst" and PROBLEM:
        pytest.skip(f"the MTU check needs a shaped link: {PROBLEM}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and flag in proc.stderr, proc.stderr


def test_the_rank_shim_outside_the_tool_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "rudder.netem.rank", "true"], capture_output=True, text=True,
                          env={k: v for k, v in ENV.items() if k not in ("PMI_RANK", "RUDDER_NETEM_NETNS")})
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "PMI_RANK" in proc.stderr


def test_the_shim_goes_before_each_program_on_the_mpiexec_line():
    argv = ["mpiexec", "-n", "2", "-genv", "A", "B", "-bind-to", "core", "-l", "python", "x.py", "-n", "9", ":",
            "-np", "1", "python", "y.py"]
    assert mpiexec_sections(argv) == [(9, 2), (16, 1)] and ranks_of(argv) == 3
    shimmed = with_rank_shim(argv)
    assert shimmed[9:14] == [sys.executable, "-m", "rudder.netem.rank", "python", "x.py"]
    assert shimmed[-5:] == [sys.executable, "-m", "rudder.netem.rank", "python", "y.py"]
    assert ranks_of(["python", "train.py"]) is None


def test_profiles():
    square = parse_profile("square:1gbit,period=2,duty=0.25", nodes=2)
    assert [square.rate_at(t) for t in (0, 0.4, 0.6, 2.1, 3.9)] == [10**9, 10**9, 0, 10**9, 0]
    steps = parse_profile("steps:1=100mbit/3=0bit/4=1gbit,duration=10,from=1,to=0", nodes=2)
    assert [steps.rate_at(t) for t in (0.5, 1, 2.9, 3, 5)] == [0, 10**8, 10**8, 0, 10**9]
    assert (steps.src, steps.dst, steps.max_bytes) == (1, 0, 10**9 * 10 // 8)
    assert parse_profile("constant:8mbit,bytes=1mb", nodes=2).max_bytes == 1 << 20
