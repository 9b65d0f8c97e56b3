"""The root qdisc's statistics of one device, read over rtnetlink: what ``tc -s qdisc`` prints as
bytes, pkt, dropped and overlimits, without starting ``tc``.

A netlink socket belongs to the network namespace it was made in, so ``Netns`` makes one inside
its namespace and keeps it; a read is then one dump request and its replies, where ``nsenter tc
-s -j qdisc show`` forks, execs two programs and parses JSON, for every link end each time
``--fault-after`` polls (docs/network.md has the costs). The messages are the kernel's fixed
ABI (linux/rtnetlink.h, linux/pkt_sched.h, linux/gen_stats.h): a ``tcmsg`` and its attributes,
``TCA_KIND`` and the nested ``TCA_STATS2`` with ``gnet_stats_basic`` and ``gnet_stats_queue``.
"""
from __future__ import annotations

import itertools
import os
import socket
import struct

RTM_GETQDISC = 38
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
TC_H_ROOT = 0xFFFFFFFF  # a qdisc's parent handle when it is a device's root qdisc
TCA_KIND, TCA_STATS2 = 1, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
ATTR = struct.Struct("=HH")  # rtattr: length, type
BASIC = struct.Struct("=QI")  # gnet_stats_basic: bytes, packets
QUEUE = struct.Struct("=IIIII")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_sequence = itertools.count(1)


def open_socket() -> socket.socket:
    """A rtnetlink socket in the calling thread's network namespace."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)


def _attributes(data: bytes, offset: int, end: int) -> dict[int, bytes]:
    found = {}
    while offset + ATTR.size <= end:
        length, kind = ATTR.unpack_from(data, offset)
        if length < ATTR.size:
            break
        found[kind & 0x3FFF] = data[offset + ATTR.size:offset + length]  # without the nested/byte-order flags
        offset += (length + 3) & ~3
    return found


def root_qdisc_stats(sock: socket.socket, ifindex: int) -> dict | None:
    """The root qdisc of device ``ifindex`` (in the socket's namespace): kind, bytes, packets,
    drops and overlimits; None if the device has none."""
    sequence = next(_sequence)
    request = TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, 0, 0)
    sock.send(HEADER.pack(HEADER.size + len(request), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0) + request)
    found = None
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind, _, seq, _ = HEADER.unpack_from(data, offset)
            if length < HEADER.size:
                raise OSError(f"netlink: a malformed message of {length} bytes")
            end, body = offset + length, offset + HEADER.size
            if seq == sequence:
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    error = -struct.unpack_from("=i", data, body)[0]
                    raise OSError(error, f"netlink RTM_GETQDISC: {os.strerror(error)}")
                _, index, _, parent, _ = TCMSG.unpack_from(data, body)
                if index == ifindex and parent == TC_H_ROOT:
                    attrs = _attributes(data, body + TCMSG.size, end)
                    stats = _attributes(attrs[TCA_STATS2], 0, len(attrs[TCA_STATS2]))
                    sent_bytes, packets = BASIC.unpack_from(stats[TCA_STATS_BASIC])
                    _, _, drops, _, overlimits = QUEUE.unpack_from(stats[TCA_STATS_QUEUE])
                    found = {"kind": attrs[TCA_KIND].rstrip(b"\0").decode(), "bytes": sent_bytes, "packets": packets,
                             "drops": drops, "overlimits": overlimits}
            offset += (length + 3) & ~3
