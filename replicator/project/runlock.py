"""The run lock: one sync (or state edit) per project at a time, via flock on sync-state/.lock.

flock is released by the kernel when the holder dies, even by SIGKILL, so a crashed run never
leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..base.errors import LockHeld

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_lock(state_dir: Path) -> Iterator[None]:
    """Hold the project's lock for the block; LockHeld (exit 75) if another process has it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockHeld(
                f"another replicator process (pid {holder}) holds the lock {path}; "
                "it is still running: try again when it has finished"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
