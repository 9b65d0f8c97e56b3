"""python -m rudder.netem --rate 1gbit [options] -- COMMAND: run COMMAND in a shaped private network.

    python -m rudder.netem --rate 1gbit --links per-node --stats net.json -- mpiexec -n 4 python drivers/train.py ...

Builds the network (rudder.netem.topology), starts the command in it (rudder.netem.job), runs the
congestion flow and the faults on the job's clock, and when the command ends reads every shaped
link's counters, prints a summary and writes ``--stats``, and exits with the command's status.
A signal to the tool is passed to the command; a second one, or no end within GRACE seconds,
kills the job. Docs: docs/network.md."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

from rudder.netem.congestion import CongestionFlow, parse_profile
from rudder.netem.faults import FaultInjector, parse_fault
from rudder.netem.job import Job, is_mpiexec, ranks_of
from rudder.netem.namespaces import NetemError, support_problem
from rudder.netem.shaping import SENDING_ENDS, Shaper, counters, format_rate, parse_rate, parse_size
from rudder.netem.topology import TOPOLOGIES, build

PROG = "python -m rudder.netem"
GRACE = 150.0  # longer than a trainer's own clean stop (15 s, 120 s when it checkpoints first)
TRANSPORT = ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "MPIR_CVAR_NUM_CLIQUES")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line
        raise NetemError(message)


def parser() -> Parser:
    ap = Parser(prog=PROG, description="Run a command inside private network namespaces with shaped links "
                "(docs/network.md).", usage=f"{PROG} --rate RATE [options] -- COMMAND ...")
    ap.add_argument("--rate", required=True, help="every link's rate, each way (tc units: 10gbit, 1gbit, 250mbit)")
    ap.add_argument("--links", choices=TOPOLOGIES, default="shared",
                    help="shared: one link (lo) for all ranks; per-node: a shaped veth per emulated node into a bridge")
    ap.add_argument("--nodes", type=int, default=None,
                    help="emulated nodes (MPIR_CVAR_NUM_CLIQUES; rank r on node r %% N); default: mpiexec's -n")
    ap.add_argument("--qdisc", choices=("tbf", "htb"), default="tbf", help="the shaping qdisc on each link end")
    ap.add_argument("--burst", default="256kb", help="token bucket size (at least the link's MTU; lo's is 64 KiB)")
    ap.add_argument("--mtu", type=int, default=1500, help="per-node links' MTU (1500: Ethernet; 9000: jumbo frames)")
    ap.add_argument("--congestion", metavar="PROFILE", default=None,
                    help="a competing flow: constant:RATE | square:RATE,period=S[,duty=F] | steps:T=RATE/T=RATE/..., "
                         "then ,start= ,duration= ,bytes= ,from= ,to= (docs/network.md)")
    ap.add_argument("--fault", action="append", default=[], metavar="FAULT",
                    help="down@T+D[:node=K] or stall@T+D[:RATE][:node=K] (repeatable; seconds from the job's start, "
                         "or from --fault-after's traffic)")
    ap.add_argument("--fault-after", metavar="SIZE", default=None,
                    help="start the faults' clock once this much has crossed the links (e.g. 1mb: MPI has connected "
                         "and data flows), not at the job's start, however long the start-up takes")
    ap.add_argument("--stats", metavar="FILE.json", default=None,
                    help="write the links' byte counters, the congestion flow and the faults here")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        return run(parser().parse_args(ours), command)
    except NetemError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace, command: list[str]) -> int:
    if not command:
        raise NetemError("no command: give it after -- (e.g. -- mpiexec -n 2 python drivers/train.py ...)")
    shaper = Shaper(a.qdisc, parse_rate(a.rate, "--rate"), parse_size(a.burst, "--burst"))
    nodes = a.nodes or ranks_of(command) or (1 if a.links == "shared" else 0)
    if not 1 <= nodes <= 250:
        raise NetemError(f"--nodes: expected 1 to 250 emulated nodes, got {nodes or 'none'}"
                         + ("" if nodes else " (the command is not `mpiexec -n N ...`: give --nodes)"))
    if a.stats and not os.path.isdir(os.path.dirname(os.path.abspath(a.stats))):
        raise NetemError(f"--stats: the folder of {a.stats} does not exist")
    if not 576 <= a.mtu <= 65535:
        raise NetemError(f"--mtu: expected 576 to 65535 bytes, got {a.mtu}")
    profile = parse_profile(a.congestion, nodes) if a.congestion else None
    faults = [parse_fault(text, nodes) for text in a.fault]
    fault_after = parse_size(a.fault_after, "--fault-after") if a.fault_after else 0
    problem = support_problem()
    if problem:
        raise NetemError(problem)

    network = build(a.links, nodes, shaper, a.mtu)
    try:
        flow = CongestionFlow(profile, network) if profile else None
        injector = FaultInjector(faults, network, fault_after)
        links = "one link shared by all (lo)" if a.links == "shared" else "a link per node, each way"
        print(f"netem: {nodes} emulated node(s), {links} at {format_rate(shaper.rate)} ({shaper.qdisc}, burst "
              f"{shaper.burst} B)", flush=True)
        if a.links == "per-node" and not is_mpiexec(command):
            print(f"netem: {command[0]} is not mpiexec: it runs in node 0's namespace and nothing moves the processes it "
                  "starts to other nodes (docs/network.md)", flush=True)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        job = Job(command, network)  # before any thread of ours: the child's set-up runs between fork and exec
        t0 = time.monotonic()
        for part in filter(None, (flow, injector)):
            part.start(t0)
        returncode = wait(job)
        elapsed = time.monotonic() - t0
        injector.stop()
        if flow:
            flow.stop()
        links = [counters(link) for link in network.links]  # while the namespaces are still held
    finally:
        network.close()
    stats = {"topology": a.links, "nodes": nodes, "rate": format_rate(shaper.rate), "rate_bit": shaper.rate,
             "qdisc": shaper.qdisc, "burst_bytes": shaper.burst, "mtu": a.mtu if a.links == "per-node" else None,
             "addresses": network.addresses, "namespaces": {ns.name: ns.inode for ns in network.namespaces},
             "command": job.argv, "env": {k: job.env[k] for k in TRANSPORT}, "started": started,
             "elapsed_s": round(elapsed, 3), "returncode": returncode, "links": links,
             "crossed_bytes": sum(end["sent_bytes"] for end in links if end["end"] in SENDING_ENDS),
             "congestion": flow.report() if flow else None, "faults": injector.report()}
    summarise(stats)
    if a.stats:
        with open(a.stats, "w") as f:
            json.dump(stats, f, indent=1)
    return returncode if returncode >= 0 else 128 - returncode


def wait(job: Job) -> int:
    """The command's exit status; signals to the tool go to the command, a second one (or GRACE
    seconds without an end) kills the job."""
    received: list[float] = []

    def on_signal(sig, _frame):
        received.append(time.monotonic())
        job.forward(sig) if len(received) == 1 else job.kill()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while (returncode := job.wait(0.5)) is None:
            if received and time.monotonic() > received[0] + GRACE:
                job.kill()
        return returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def summarise(stats: dict) -> None:
    links = ", ".join(f"{end['link']} {end['sent_bytes'] / 1e6:.1f} MB" for end in stats["links"])
    print(f"netem: {stats['elapsed_s']:.1f} s, command exited {stats['returncode']}; sent through the shaping: {links}")
    c = stats["congestion"]
    if c:
        print(f"netem: congestion {c['profile']} from {c['addresses'][0]} to {c['addresses'][1]}: "
              f"{c['bytes_received'] / 1e6:.1f} MB received, {c['bytes_sent'] / 1e6:.1f} MB sent, from "
              f"t={c['started_at_s'] or 0:.1f}s to t={c['stopped_at_s'] or 0:.1f}s (stopped: {c['stop_reason']})")
