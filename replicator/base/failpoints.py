"""Named crash points for tests: `REPLICATOR_FAILPOINT=<name>` kills the process there.

The process dies by SIGKILL, like a machine losing power or an OOM kill: no cleanup runs.
With `REPLICATOR_FAILPOINT_ONCE=<file>` only the first process to reach the point dies (it
creates the file): a retried Spark task then gets through. `<name>@N` dies the Nth time the
process passes the point. Costs one environment lookup when unset.
"""

from __future__ import annotations

import os
import signal

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
