"""Waiting for a descriptor to have something to read, with poll.

select() refuses a descriptor numbered 1024 or more, which a process with that many files
open hands out (a long run, a big project): every wait on a socket or pipe goes through here.
"""

from __future__ import annotations

import select


def readable(fd: int, timeout_s: float | None = None) -> bool:
    """Whether `fd` has something to read (or was closed) within `timeout_s` (None: wait
    as long as it takes)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else timeout_s * 1000))
