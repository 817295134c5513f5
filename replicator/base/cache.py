"""The user's replicator cache folder: the JVM's class archive, the executors' shipped
environment, the warm Spark servers' pid files and logs and the warm helper's socket live
there.

`$REPLICATOR_CACHE_DIR`, else `~/.cache/replicator`; `off` means no cache (each falls back
to working without one, or says why it cannot)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

CACHE_ENV = "REPLICATOR_CACHE_DIR"


def cache_root() -> str | None:
    """Where the folder is, not created; None when turned off. Needs only `os`: the warm
    helper's client (cli/warm/wire.py) reads it before anything else is loaded."""
    configured = os.environ.get(CACHE_ENV)
    if configured == "off":
        return None
    return configured or os.path.join(os.path.expanduser("~"), ".cache", "replicator")


def cache_dir() -> Path | None:
    """The folder, created if needed; None when turned off or not writable."""
    from pathlib import Path  # here, not above: see cache_root

    root = cache_root()
    if root is None:
        return None
    base = Path(root)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return base if os.access(base, os.W_OK) else None
