"""`replicator sync --follow`: runs one after another until SIGTERM, SIGINT or SIGHUP, which
let the current table finish; then exit 0.

Its webhook must not flood the receiver with a post every few seconds: a failed run is posted
at once, so is the first success after a failure; other successes are summed up in one post
at most every `webhook.summary_interval` seconds (the latest run's payload, with `runs`: how
many runs it stands for).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..base.errors import LockHeld
from ..base.interrupts import graceful, stop_requested, wait_unless_stopped
from ..project.project import Project
from ..report.webhook import post
from .run import run_sync

log = logging.getLogger("replicator.sync")


class FollowNotifier:
    """Which runs' payloads are posted."""

    def __init__(self, project: Project) -> None:
        self.webhook = project.settings.webhook
        configured = project.config.webhook
        self.every = configured.summary_interval if configured else 60
        self.failing = False
        # None until the first post, which is due at once: monotonic time starts at boot,
        # so "0.0" would hold the first run's post back on a machine up for less than
        # `summary_interval`.
        self.last_post: float | None = None
        self.unsent: dict[str, Any] | None = None
        self.runs = 0

    def offer(self, payload: dict[str, Any], failed: bool) -> None:
        if self.webhook is None:
            return
        self.runs += 1
        due = self.last_post is None or time.monotonic() - self.last_post >= self.every
        if failed or self.failing or due:
            self.failing = failed
            self._post(payload)
        else:
            self.unsent = payload

    def flush(self) -> None:
        """At the end: the successes not posted yet."""
        if self.unsent is not None:
            self._post(self.unsent, within=10.0)

    def _post(self, payload: dict[str, Any], within: float = 60.0) -> None:
        assert self.webhook is not None
        post(self.webhook, {**payload, "runs": self.runs}, within=within)
        self.last_post, self.unsent, self.runs = time.monotonic(), None, 0


def follow(project: Project, names: tuple[str, ...], verbose: int, interval: float) -> int:
    notifier = FollowNotifier(project)
    runs = 0
    log.info(
        "follow: syncing every %g s until SIGTERM, SIGINT or SIGHUP (which let the current "
        "table finish)",
        interval,
        extra={"fields": {"event": "follow.started", "interval": interval}},
    )
    with graceful():
        while not stop_requested():
            started = time.monotonic()
            try:
                code = run_sync(project, names, False, verbose, notify=notifier.offer)
            except LockHeld as exc:
                log.warning("follow: %s; trying again in %g s", exc, interval)
                code = LockHeld.exit_code
            runs += 1
            seconds = time.monotonic() - started
            log.info(
                "follow: run %d finished (exit code %d) in %.1f s",
                runs,
                code,
                seconds,
                extra={
                    "fields": {
                        "event": "follow.run",
                        "runs": runs,
                        "exit_code": code,
                        "seconds": round(seconds, 3),
                    }
                },
            )
            if not stop_requested():
                wait_unless_stopped(interval)
    notifier.flush()
    log.info(
        "follow: stopped by a signal after %d run(s)",
        runs,
        extra={"fields": {"event": "follow.finished", "runs": runs}},
    )
    return 0
