"""Network namespaces held by open descriptors of this process, never by name.

A namespace made with ``unshare(CLONE_NEWNET)`` lives while a process is inside it or holds a
descriptor of it. The tool creates each one from its main thread, keeps only the descriptor and
steps back into the namespace it came from, so nothing is ever named in /var/run/netns or bound on
a mount: when the tool and its job are gone, however they went (SIGKILL included), the kernel frees
the namespaces and, with them, every link and qdisc made inside. Other processes reach a namespace
through the descriptor's path, ``/proc/<tool pid>/fd/<n>`` (``nsenter --net=PATH``, or ``setns``
from the rank shim). The tool reads its qdiscs' counters through a netlink socket made inside each
namespace (``rudder.netem.netlink``), kept while the namespace is held."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import threading

from rudder.netem import netlink

CLONE_NEWNET = 0x40000000
TOOLS = ("ip", "tc", "nsenter", "unshare")
_libc = ctypes.CDLL(None, use_errno=True)


class NetemError(RuntimeError):
    """A problem the tool reports as one line (bad input, missing kernel support, a failed step)."""


def _check(result: int, call: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace behind ``fd`` (a thread's own setting)."""
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")


def enter(path: str) -> None:
    """Move the calling thread into the namespace at ``path`` (the rank shim, before it execs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        setns(fd)
    finally:
        os.close(fd)


class Netns:
    """One private network namespace, ``name`` for messages and the stats file."""

    def __init__(self, name: str):
        self.name = name
        here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            try:
                self.fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)  # close-on-exec: the job gets paths
            finally:
                setns(here)
        finally:
            os.close(here)
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.inode = os.fstat(self.fd).st_ino
        self._netlink = None  # made on the first read, inside the namespace
        self._ifindex: dict[str, int] = {}
        self._netlink_lock = threading.Lock()  # the fault thread and the main thread both read counters

    def run(self, *argv: str) -> str:
        """Run ``argv`` (ip, tc) inside this namespace; its stdout, or a NetemError naming the step."""
        proc = subprocess.run(["nsenter", f"--net={self.path}", *argv], capture_output=True, text=True)
        if proc.returncode:
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise NetemError(f"`{' '.join(argv)}` in namespace {self.name} failed: {why}")
        return proc.stdout

    @contextlib.contextmanager
    def entered(self):
        """The calling thread inside this namespace for the block (sockets made there stay there)."""
        here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            setns(self.fd)
            yield self
        finally:
            setns(here)
            os.close(here)

    def root_qdisc_stats(self, dev: str) -> dict:
        """The counters of device ``dev``'s root qdisc in this namespace (``rudder.netem.netlink``)."""
        with self._netlink_lock:
            if self._netlink is None or dev not in self._ifindex:
                with self.entered():
                    self._netlink = self._netlink or netlink.open_socket()
                    try:
                        self._ifindex[dev] = socket.if_nametoindex(dev)
                    except OSError:
                        raise NetemError(f"no device {dev} in namespace {self.name}") from None
            stats = netlink.root_qdisc_stats(self._netlink, self._ifindex[dev])
        if stats is None:
            raise NetemError(f"no root qdisc on {dev} in namespace {self.name}")
        return stats

    def close(self) -> None:
        with self._netlink_lock:
            if self._netlink is not None:
                self._netlink.close()
                self._netlink = None
        os.close(self.fd)


def support_problem() -> str | None:
    """Why this machine cannot shape a private network (one line), or None when it can: the tools,
    a private namespace, and a tbf qdisc inside it."""
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found on PATH (install iproute2 and util-linux)"
    try:
        probe = Netns("probe")
    except OSError as e:
        return f"cannot create a network namespace ({e}; needs root or CAP_SYS_ADMIN)"
    try:
        probe.run("ip", "link", "set", "lo", "up")
        probe.run("tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms")
    except NetemError as e:
        return f"cannot shape a link in a private namespace ({e})"
    finally:
        probe.close()
    return None
