"""One run of a `replicator sync --follow` process, timed by the process itself.

A cron run pays Python's start and the tool's imports (about 0.5 s, bench/RESULTS.md) before
any database work; a `--follow` process pays them once and then runs every `--interval`
seconds. Its JSON log says how long each run took (`follow.run`, `seconds`): that is the
figure taken here, for the run that caught up the round's changes.

Between its turns the process is stopped (SIGSTOP) so that its polling does not slow the other
tools' runs; its turn continues it (SIGCONT) and stops it again once the catching-up run has
said it finished. The interval between its runs is a second: at 0.2 s its next run could
start before the stop arrived, be frozen through the other tools' turns, catch up the next
round's rows when continued, and report their wait as its own (68.9 s once, 2026-11-27).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from typing import Any

TIMEOUT = 600.0


class FollowFailed(Exception):
    """The process died, or no run caught up within TIMEOUT."""


class FollowProcess:
    """A `sync --follow --log-format json` process and the events its log has said."""

    def __init__(self, command: list[str], env: dict[str, str], interval: float = 1.0) -> None:
        argv = [*command, "--follow", "--interval", str(interval), "--log-format", "json"]
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.tail: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.tail = [*self.tail[-5:], line.strip()]
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue

    def _next(self, deadline: float) -> dict[str, Any]:
        while True:
            try:
                return self.events.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    said = " | ".join(self.tail)
                    raise FollowFailed(f"exit {self.process.returncode}: {said}") from None
                if time.monotonic() > deadline:
                    raise FollowFailed(f"no run caught up in {TIMEOUT:.0f} s") from None

    def settle(self) -> None:
        """Wait for its first run to finish, then stop it until its turn."""
        deadline = time.monotonic() + TIMEOUT
        while self._next(deadline).get("event") != "follow.run":
            pass
        self.process.send_signal(signal.SIGSTOP)

    def run_that_copies(self) -> float:
        """Continue it; the seconds of the first run that copied rows (its own figure)."""
        while not self.events.empty():  # what it said before this turn
            self.events.get_nowait()
        self.process.send_signal(signal.SIGCONT)
        deadline, copied = time.monotonic() + TIMEOUT, False
        while True:
            event = self._next(deadline)
            if event.get("event") == "table.finished":
                if event.get("status") != "success":
                    raise FollowFailed(f"{event.get('name')}: {event.get('error')}")
                copied = copied or bool(event.get("rows"))
            elif event.get("event") == "follow.run" and copied:
                self.process.send_signal(signal.SIGSTOP)
                return float(event["seconds"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
