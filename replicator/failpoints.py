"""Named crash points for tests: `REPLICATOR_FAILPOINT=<name>` kills the process there.

The process dies by SIGKILL, like a machine losing power or an OOM kill: no cleanup runs.
Costs one environment lookup when unset.
"""

from __future__ import annotations

import os
import signal

ENV = "REPLICATOR_FAILPOINT"


def failpoint(name: str) -> None:
    """Die here, at once, if the environment asks for this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
