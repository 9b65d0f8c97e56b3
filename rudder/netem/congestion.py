"""A competing flow between two emulated nodes, paced to a time profile and bounded in time and
bytes (``--congestion PROFILE``).

    constant:RATE                         RATE throughout
    square:RATE,period=S[,duty=F]         RATE for the first F (default 0.5) of every S seconds, then nothing
    steps:T=RATE/T=RATE/...               RATE from each T on (nothing before the first)
    ... and after any of them: ,start=S (default 0) ,duration=S (default 60) ,bytes=SIZE ,from=K ,to=K

Times count from the job's start (``start`` delays the profile's zero); the flow stops by itself
after ``duration`` seconds or ``bytes`` bytes (default: what the peak rate could send in the
duration), or when the job ends. It is one TCP connection of plain sockets from node ``from``
(default 0) to node ``to`` (default 1), made inside those nodes' namespaces on their own addresses
(the shared link: 127.0.0.1 of the shared namespace), so it crosses the same shaped links as the
job and nothing else. The receiver counts what arrived, per second, for the stats."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from rudder.netem.namespaces import NetemError
from rudder.netem.shaping import format_rate, parse_rate, parse_size
from rudder.netem.topology import Network

CHUNK = 256 << 10
USAGE = ("--congestion: expected constant:RATE, square:RATE,period=S[,duty=F] or steps:T=RATE/T=RATE/..., then "
         "optionally ,start=S ,duration=S ,bytes=SIZE ,from=K ,to=K")


@dataclass
class Profile:
    text: str
    kind: str
    steps: list[tuple[float, int]]  # (from this second on, bit/s); constant and square have one
    period: float = 0.0
    duty: float = 0.5
    start: float = 0.0
    duration: float = 60.0
    max_bytes: int = 0
    src: int = 0
    dst: int = 1

    def rate_at(self, t: float) -> int:
        """The profile's rate at ``t`` seconds after its start."""
        if self.kind == "square":
            return self.steps[0][1] if (t % self.period) < self.duty * self.period else 0
        if self.kind == "constant":
            return self.steps[0][1]
        return next((rate for at, rate in reversed(self.steps) if at <= t), 0)

    def as_dict(self) -> dict:
        return {"profile": self.text, "kind": self.kind, "steps": [[at, format_rate(r)] for at, r in self.steps],
                "period_s": self.period or None, "duty": self.duty if self.kind == "square" else None,
                "start_s": self.start, "duration_s": self.duration, "max_bytes": self.max_bytes,
                "from_node": self.src, "to_node": self.dst}


def parse_profile(text: str, nodes: int) -> Profile:
    kind, _, rest = text.partition(":")
    arg, *pairs = rest.split(",")
    keys = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or key not in {"period", "duty", "start", "duration", "bytes", "from", "to"}:
            raise NetemError(f"{USAGE}; got {text!r} ({pair!r} is not one of them)")
        keys[key] = value
    try:
        if kind in ("constant", "square"):
            steps = [(0.0, parse_rate(arg, "--congestion"))]
        elif kind == "steps":
            steps = [(float(at), parse_rate(rate, "--congestion", allow_zero=True))
                     for at, rate in (step.split("=") for step in arg.split("/"))]
            if [at for at, _ in steps] != sorted({at for at, _ in steps}) or steps[0][0] < 0:
                raise ValueError
        else:
            raise ValueError
        profile = Profile(text, kind, steps, period=float(keys.get("period", 0)), duty=float(keys.get("duty", 0.5)),
                          start=float(keys.get("start", 0)), duration=float(keys.get("duration", 60)),
                          src=int(keys.get("from", 0)), dst=int(keys.get("to", 1 if nodes > 1 else 0)))
    except (ValueError, NetemError):
        raise NetemError(f"{USAGE}; got {text!r}") from None
    if kind == "square" and (profile.period <= 0 or not 0 < profile.duty <= 1):
        raise NetemError(f"--congestion: square needs period=S > 0 and 0 < duty <= 1, got {text!r}")
    if profile.start < 0 or profile.duration <= 0:
        raise NetemError(f"--congestion: start must be >= 0 and duration > 0 seconds, got {text!r}")
    if not (0 <= profile.src < nodes and 0 <= profile.dst < nodes) or (profile.src == profile.dst and nodes > 1):
        raise NetemError(f"--congestion: from and to must be two of the {nodes} nodes (0..{nodes - 1}), got {text!r}")
    peak = max(rate for _, rate in steps)
    profile.max_bytes = parse_size(keys["bytes"], "--congestion bytes") if "bytes" in keys else \
        int(peak * profile.duration / 8)
    return profile


class CongestionFlow:
    """The flow's two sockets, made now inside the nodes' namespaces; ``start`` paces it."""

    def __init__(self, profile: Profile, network: Network):
        self.profile, self.stop_reason = profile, None
        self.addresses = (network.addresses[profile.src], network.addresses[profile.dst])
        with network.node_ns[profile.dst].entered():
            listener = socket.create_server((self.addresses[1], 0))
        with network.node_ns[profile.src].entered():
            self.sender = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sender.connect(listener.getsockname())
        self.receiver, _ = listener.accept()
        listener.close()
        self.sent = self.received = 0
        self.per_second: dict[int, int] = {}
        self.started_at = self.stopped_at = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True), threading.Thread(target=self._receive, daemon=True)]

    def start(self, t0: float) -> None:
        self.t0 = t0
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.sender.close()
        self.receiver.close()

    def _send(self) -> None:
        p, chunk, allowance = self.profile, bytes(CHUNK), 0.0
        self.sender.settimeout(0.2)  # a link that is down must not keep the flow from stopping
        if self._stop.wait(max(0.0, self.t0 + p.start - time.monotonic())):
            return self._finish("job ended")
        self.started_at, last = time.monotonic() - self.t0, time.monotonic()
        while True:
            now = time.monotonic()
            t = now - self.t0 - p.start
            if self._stop.is_set() or t >= p.duration or self.sent >= p.max_bytes:
                return self._finish("job ended" if self._stop.is_set() else "duration" if t >= p.duration else "bytes")
            rate = p.rate_at(t) / 8
            allowance = min(allowance + rate * (now - last), 2 * CHUNK) if rate else 0.0
            last = now
            size = min(CHUNK, p.max_bytes - self.sent)
            if allowance < size:
                self._stop.wait(min(0.02, (size - allowance) / rate) if rate else 0.02)
                continue
            try:
                n = self.sender.send(chunk[:size])
            except TimeoutError:
                continue
            self.sent += n
            allowance -= n

    def _finish(self, reason: str) -> None:
        self.stop_reason, self.stopped_at = reason, time.monotonic() - self.t0
        try:
            self.sender.shutdown(socket.SHUT_WR)  # the receiver sees the end
        except OSError:
            pass

    def _receive(self) -> None:
        buffer = bytearray(CHUNK)
        self.receiver.settimeout(0.2)
        while not (self._stop.is_set() and self.stop_reason):
            try:
                n = self.receiver.recv_into(buffer)
            except TimeoutError:
                continue
            except OSError:
                return
            if not n:
                return
            self.received += n
            second = int(time.monotonic() - self.t0)
            self.per_second[second] = self.per_second.get(second, 0) + n

    def report(self) -> dict:
        last = max(self.per_second, default=-1)
        return {**self.profile.as_dict(), "addresses": list(self.addresses), "started_at_s": self.started_at,
                "stopped_at_s": self.stopped_at, "stop_reason": self.stop_reason, "bytes_sent": self.sent,
                "bytes_received": self.received,
                "received_bytes_per_second": [self.per_second.get(s, 0) for s in range(last + 1)]}
