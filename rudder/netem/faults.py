"""Link faults at set times (``--fault``, repeatable; times in seconds from the job's start, or with
``--fault-after SIZE`` from when that much traffic has crossed the links).

    down@T+D[:node=K]          node K's link (default 0; the shared link: lo) down at T for D seconds
    stall@T+D[:RATE][:node=K]  its rate cut to RATE (default 8kbit: almost nothing) at T for D seconds

``down`` takes the switch's port to the node down (the node's NIC loses its carrier; for the shared
link, lo itself goes down); ``stall`` changes the shaping of both ends in place. Both are undone
after D seconds, and each step is printed and kept for the stats with the time it happened and the
link ends' byte counters just after the fault began and just before it ended. Faults
on one link should not overlap (each restores what it changed). A link down while MPI starts and
connects fails the job or delays it by the connections' retry backoff (docs/network.md), and how
long a start-up takes depends on the machine's load: ``--fault-after`` times the faults from the
job's traffic instead."""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from rudder.netem.namespaces import NetemError
from rudder.netem.shaping import SENDING_ENDS, counters, format_rate, parse_rate, set_rate, set_up
from rudder.netem.topology import Network

STALL_RATE = 8000
USAGE = "--fault: expected down@T+D[:node=K] or stall@T+D[:RATE][:node=K] (T, D in seconds)"


@dataclass
class Fault:
    text: str
    kind: str
    at: float
    duration: float
    node: int
    rate: int = STALL_RATE
    applied_at: float | None = None
    restored_at: float | None = None
    sent_at_apply: dict | None = None  # the node's link ends' byte counters just after the fault began
    sent_at_restore: dict | None = None  # ... and just before it ended: what crossed meanwhile

    def as_dict(self) -> dict:
        return {"fault": self.text, "kind": self.kind, "node": self.node, "at_s": self.at, "duration_s": self.duration,
                "stall_rate": format_rate(self.rate) if self.kind == "stall" else None,
                "applied_at_s": self.applied_at, "restored_at_s": self.restored_at,
                "sent_bytes_at_apply": self.sent_at_apply, "sent_bytes_at_restore": self.sent_at_restore}


def parse_fault(text: str, nodes: int) -> Fault:
    match = re.fullmatch(r"(down|stall)@(\d+(?:\.\d+)?)\+(\d+(?:\.\d+)?)((?::[^:]+)*)", text.strip())
    if not match or float(match[3]) <= 0:
        raise NetemError(f"{USAGE}, got {text!r}")
    fault = Fault(text, match[1], float(match[2]), float(match[3]), node=0)
    for item in filter(None, match[4].split(":")):
        if item.startswith("node="):
            if not item[5:].isdigit() or int(item[5:]) >= nodes:
                raise NetemError(f"--fault: node must be one of the {nodes} nodes (0..{nodes - 1}), got {text!r}")
            fault.node = int(item[5:])
        elif fault.kind == "stall":
            fault.rate = parse_rate(item, "--fault stall rate")
        else:
            raise NetemError(f"{USAGE}, got {text!r}")
    return fault


class FaultInjector:
    """Applies and undoes each fault on schedule, from one thread."""

    def __init__(self, faults: list[Fault], network: Network, after_bytes: int = 0):
        """``after_bytes``: the faults' times count from when the nodes have sent this much over
        the links (0: from the job's start)."""
        self.faults, self.network, self.after_bytes = faults, network, after_bytes
        self.clock_started_at: float | None = None  # seconds from the job's start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> None:
        self.t0 = t0
        if self.faults:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _crossed(self) -> int:
        """Bytes the nodes have sent over the links (the stats' ``crossed_bytes``)."""
        return sum(counters(link)["sent_bytes"] for link in self.network.links if link.end in SENDING_ENDS)

    def _run(self) -> None:
        clock = self.t0
        while self.after_bytes and self._crossed() < self.after_bytes:
            if self._stop.wait(0.05):
                return
        if self.after_bytes:
            clock = time.monotonic()
            self.clock_started_at = clock - self.t0
            print(f"netem: t={self.clock_started_at:.1f}s {self.after_bytes} B crossed: the faults' clock starts",
                  flush=True)
        steps = sorted([(f.at, True, f) for f in self.faults] + [(f.at + f.duration, False, f) for f in self.faults],
                       key=lambda s: (s[0], s[1]))
        for at, apply, fault in steps:
            if self._stop.wait(max(0.0, clock + at - time.monotonic())):
                return
            try:
                if not apply:
                    fault.sent_at_restore = self._sent(fault)
                self._change(fault, apply)
                if apply:
                    fault.sent_at_apply = self._sent(fault)
            except NetemError as e:  # e.g. the job ended and took its namespaces' processes with it
                print(f"netem: {fault.text}: {e}", flush=True)
                continue
            when = time.monotonic() - self.t0
            if apply:
                fault.applied_at = when
            else:
                fault.restored_at = when
            what = ("down" if apply else "up") if fault.kind == "down" else \
                (f"stalled at {format_rate(fault.rate)}" if apply else f"back to {format_rate(self.network.shaper.rate)}")
            link = "the shared link" if self.network.topology == "shared" else f"node{fault.node}'s link"
            print(f"netem: t={when:.1f}s {link} {what} ({fault.text})", flush=True)

    def _change(self, fault: Fault, apply: bool) -> None:
        links = self.network.node_links(fault.node)
        if fault.kind == "down":
            for link in links:
                if link.end in ("switch", "lo"):
                    set_up(link, not apply)
        else:
            for link in links:
                set_rate(link, self.network.shaper, fault.rate if apply else self.network.shaper.rate)

    def _sent(self, fault: Fault) -> dict:
        return {link.label: counters(link)["sent_bytes"] for link in self.network.node_links(fault.node)}

    def report(self) -> list[dict]:
        return [{**f.as_dict(), "clock_started_at_s": self.clock_started_at if self.after_bytes else 0.0}
                for f in self.faults]
