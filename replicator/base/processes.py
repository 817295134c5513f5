"""Whether a process still runs, by its pid: the JVM archive's builder and the warm helper
are waited for by pid."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while the pid exists, this user's process or another's (a reused pid included:
    callers that must know it is theirs check more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
