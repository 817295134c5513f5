"""The user's replicator cache folder: the JVM's class archive, the executors' shipped
environment and the warm Spark servers' pid files and logs live there.

`$REPLICATOR_CACHE_DIR`, else `~/.cache/replicator`; `off` means no cache (each falls back
to working without one, or says why it cannot)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "REPLICATOR_CACHE_DIR"


def cache_dir() -> Path | None:
    """The folder, created if needed; None when turned off or not writable."""
    configured = os.environ.get(CACHE_ENV)
    if configured == "off":
        return None
    base = Path(configured) if configured else Path.home() / ".cache" / "replicator"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return base if os.access(base, os.W_OK) else None
