"""A job must never hang silently (DistDGL's users' first complaint: a rank blocked in a
collective or an RMA read on a dead link waits forever). Each trainer rank runs a watchdog: a
thread that ends the whole job when the rank has made no progress for ``timeout`` seconds, with
one line naming the rank and what each of its threads was waiting for.

Progress is what the run path reports (``progress()``: a minibatch trained, an evaluation batch,
a checkpoint written); ``doing(thread, what)`` says what a thread is waiting for now, for that
line. A stall shorter than the timeout (a link that comes back) costs nothing. The stall ends
the job through ``on_stall(message)`` (the trainer's: close the log, abort every rank).
"""
from __future__ import annotations

import threading
import time


class Watchdog:
    def __init__(self, timeout: float, on_stall):
        self.timeout, self.on_stall = timeout, on_stall
        self.last = time.monotonic()
        self.activity: dict[str, str] = {}  # thread: what it waits for now
        self.stopped = threading.Event()
        self.thread = None
        if timeout > 0:
            self.thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
            self.thread.start()

    def progress(self) -> None:
        self.last = time.monotonic()

    def doing(self, thread: str, what: str) -> None:
        self.activity[thread] = what

    def stalled_for(self) -> float:
        return time.monotonic() - self.last

    def describe(self) -> str:
        return "; ".join(f"{thread}: {what}" for thread, what in sorted(self.activity.items())) or "nothing reported"

    def _watch(self) -> None:
        period = min(1.0, self.timeout / 10)
        while not self.stopped.wait(period):
            if self.stalled_for() > self.timeout:
                self.on_stall(f"no progress for {self.timeout:g} s (--stall-timeout); {self.describe()}")
                return

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
