"""Named crash points for tests: `REPLICATOR_FAILPOINT=<name>` kills the process there.

The process dies by SIGKILL, like a machine losing power or an OOM kill: no cleanup runs.
With `REPLICATOR_FAILPOINT_ONCE=<file>` only the first process to reach the point dies (it
creates the file): a retried Spark task then gets through. `<name>@N` dies the Nth time the
process passes the point. Costs one environment lookup when unset.

`pause_point` is the gentler kind: the process waits there until the test lets it go.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "REPLICATOR_FAILPOINT"
ONCE_ENV = "REPLICATOR_FAILPOINT_ONCE"


_reached: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Die here, at once, if the environment asks for this point: `<name>`, or `<name>@N`
    for the Nth time this process reaches it (a load's Nth copy task, in-process)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    if nth:
        _reached[name] = _reached.get(name, 0) + 1
        if nth != str(_reached[name]):
            return
    if _first_time():
        os.kill(os.getpid(), signal.SIGKILL)


def _first_time() -> bool:
    marker = os.environ.get(ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


PAUSE_ENV = "REPLICATOR_PAUSE_AT"  # `<name>=<file>`
PAUSE_SECONDS = 120.0


def pause_point(name: str) -> None:
    """Wait here while a test does something between two steps no lock can hold apart:
    with `REPLICATOR_PAUSE_AT=<name>=<file>`, the process creates `<file>.reached` and goes
    on once `<file>` exists (or after PAUSE_SECONDS). Costs one environment lookup when
    unset."""
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted:
        return
    point, _, marker = wanted.partition("=")
    if point != name or not marker:
        return
    with open(f"{marker}.reached", "w"):
        pass
    deadline = time.monotonic() + PAUSE_SECONDS
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
