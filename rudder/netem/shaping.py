"""Rates, sizes and the qdisc on one shaped link end: install it, change its rate (a stall), read
its counters (the root qdisc's statistics, as ``tc -s qdisc`` shows them, read by netlink).

A link end is a device inside one namespace whose egress is shaped: ``lo`` for the shared link,
or one end of a node's veth pair for per-node links (``node`` = the node's NIC sending, ``switch``
= the bridge port sending to the node). ``tbf`` is a token bucket; ``htb`` one class holding the
same rate (both in the kernel here; ``netem`` is not, so no added delay)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rudder.netem.namespaces import NetemError, Netns

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
SIZE_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
QUEUE_LATENCY = "50ms"  # tbf's queue: packets waiting longer than this are dropped (TCP backs off)


def parse_rate(text: str, flag: str, allow_zero: bool = False) -> int:
    """'1gbit', '250mbit', '2.5gbit' -> bits per second; a one-line NetemError naming ``flag``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", text.strip().lower())
    if not match or match[2] not in RATE_UNITS or (float(match[1]) == 0 and not allow_zero):
        raise NetemError(f"{flag}: expected a rate like 10gbit, 1gbit or 250mbit (units {', '.join(RATE_UNITS)}), "
                         f"got {text!r}")
    return round(float(match[1]) * RATE_UNITS[match[2]])


def parse_size(text: str, flag: str) -> int:
    """'256kb', '1gb', '1500' -> bytes (binary units, as tc reads them)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", text.strip().lower())
    if not match or match[2] not in {**SIZE_UNITS, "": 1} or float(match[1]) <= 0:
        raise NetemError(f"{flag}: expected a size like 256kb, 4mb or 1gb, got {text!r}")
    return round(float(match[1]) * SIZE_UNITS.get(match[2], 1))


def format_rate(bits: int) -> str:
    for unit, scale in sorted(RATE_UNITS.items(), key=lambda u: -u[1]):
        if bits >= scale and bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class Shaper:
    """The shaping every link end gets: qdisc kind, rate in bit/s, bucket size in bytes."""

    qdisc: str
    rate: int
    burst: int


# the link ends that send what a node sends: their bytes summed are what crossed the network (a
# switch end's bytes are the same traffic again, on its way to the other node)
SENDING_ENDS = ("lo", "node")


@dataclass
class LinkEnd:
    node: int | None  # the emulated node whose NIC this is; None for the shared link
    end: str  # "lo", "node" (the node sending) or "switch" (the bridge sending to the node)
    ns: Netns
    dev: str

    @property
    def label(self) -> str:
        return "lo" if self.node is None else f"node{self.node}-{self.end}"


def install(link: LinkEnd, shaper: Shaper) -> None:
    mtu = json.loads(link.ns.run("ip", "-j", "link", "show", "dev", link.dev))[0]["mtu"]
    if shaper.burst < mtu:
        raise NetemError(f"--burst: {shaper.burst} bytes is below the {link.dev} MTU of {mtu} bytes (tbf would drop "
                         f"every full-size packet)")
    tc = ("tc", "qdisc", "add", "dev", link.dev, "root")
    if shaper.qdisc == "tbf":
        link.ns.run(*tc, "tbf", "rate", f"{shaper.rate}bit", "burst", f"{shaper.burst}b", "latency", QUEUE_LATENCY)
    else:
        link.ns.run(*tc, "handle", "1:", "htb", "default", "1")
        link.ns.run("tc", "class", "add", "dev", link.dev, *_htb_class(shaper.rate, shaper.burst))


def set_rate(link: LinkEnd, shaper: Shaper, rate: int) -> None:
    """Change the link end's rate in place, with a full bucket (its byte counter, the root
    qdisc's, carries on)."""
    if shaper.qdisc == "tbf":  # tbf refills its bucket on a change
        link.ns.run("tc", "qdisc", "change", "dev", link.dev, "root", "tbf", "rate", f"{rate}bit",
                    "burst", f"{shaper.burst}b", "latency", QUEUE_LATENCY)
    else:
        # Not `tc class change`: HTB keeps the class's token debt, counted in time, and a packet
        # sent during a stall at 8kbit runs it up to HTB's cap of 60 s, so the link "restored"
        # after the stall would stay silent up to a minute. A new class starts with a full bucket.
        link.ns.run("tc", "class", "del", "dev", link.dev, "classid", "1:1")
        link.ns.run("tc", "class", "add", "dev", link.dev, *_htb_class(rate, shaper.burst))


def _htb_class(rate: int, burst: int) -> tuple[str, ...]:
    return ("parent", "1:", "classid", "1:1", "htb", "rate", f"{rate}bit", "ceil", f"{rate}bit",
            "burst", f"{burst}b", "cburst", f"{burst}b")


def set_up(link: LinkEnd, up: bool) -> None:
    link.ns.run("ip", "link", "set", "dev", link.dev, "up" if up else "down")


def counters(link: LinkEnd) -> dict:
    """The root qdisc's counters on this link end: what crossed the shaping, and what it dropped."""
    root = link.ns.root_qdisc_stats(link.dev)
    return {"link": link.label, "node": link.node, "end": link.end, "netns": link.ns.name, "dev": link.dev,
            "qdisc": root["kind"], "sent_bytes": root["bytes"], "sent_packets": root["packets"],
            "dropped": root["drops"], "overlimits": root["overlimits"]}
