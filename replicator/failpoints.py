"""Named crash points for tests: `REPLICATOR_FAILPOINT=<name>` kills the process there.

The process dies by SIGKILL, like a machine losing power or an OOM kill: no cleanup runs.
With `REPLICATOR_FAILPOINT_ONCE=<file>` only the first process to reach the point dies (it
creates the file): a retried Spark task then gets through. Costs one environment lookup
when unset.
"""

from __future__ import annotations

import os
import signal

ENV = "REPLICATOR_FAILPOINT"
ONCE_ENV = "REPLICATOR_FAILPOINT_ONCE"


def failpoint(name: str) -> None:
    """Die here, at once, if the environment asks for this point."""
    if os.environ.get(ENV) == name and _first_time():
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
