"""Where the project's warm Spark server (`replicator spark start`) keeps its pid, port and
log, and whether it is up.

In the user's cache folder (replicator/cache.py), one folder per project (a hash of its
path): the server is this machine's, not the project's to commit, and two projects on one
machine each get their own (with their own spark.conf). Every run reads it: one small file
and a /proc lookup, no connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..cache import cache_dir

STATE_FILE = "server.json"
LOG_FILE = "server.log"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass(frozen=True)
class ServerState:
    """A server this project started; `ready` once it answered and ran a first job.

    `session_id`: the server-side session every run attaches to, so that the Python
    workers it forked stay warm between runs (a new session forks new ones: 0.6 s);
    `parallelism`: its task slots, known at start (asking costs a job)."""

    pid: int
    port: int
    started_at: str
    project: str
    ready: bool = False
    spark_version: str = ""
    session_id: str = ""
    parallelism: int = 1
    code: str = ""  # code_fingerprint() of the replicator it runs

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}"


def server_dir(root: Path) -> Path | None:
    """The project's folder for its server (None without a cache folder)."""
    base = cache_dir()
    if base is None:
        return None
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return base / "spark-server" / digest


def read_state(root: Path) -> ServerState | None:
    folder = server_dir(root)
    if folder is None:
        return None
    try:
        return ServerState(**json.loads((folder / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_state(root: Path, state: ServerState) -> None:
    """Written under a temporary name and renamed: a run never reads half a file."""
    folder = server_dir(root)
    assert folder is not None
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{STATE_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(asdict(state), indent=2) + "\n")
    temporary.replace(folder / STATE_FILE)


def remove_state(root: Path) -> None:
    folder = server_dir(root)
    if folder is not None:
        with contextlib.suppress(FileNotFoundError):
            (folder / STATE_FILE).unlink()


def alive(state: ServerState) -> bool:
    """Whether the recorded pid is still a Spark Connect server (not a reused pid)."""
    try:
        command = Path(f"/proc/{state.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return SERVER_CLASS.encode() in command


def running(root: Path) -> ServerState | None:
    """The project's warm server when it is up and ready, else None."""
    state = read_state(root)
    return state if state is not None and state.ready and alive(state) else None


_PACKAGE = Path(__file__).resolve().parent.parent


def code_fingerprint() -> str:
    """Which replicator this is: its version and its source files' sizes and times (about a
    millisecond). The warm server's Python workers import replicator once, when it starts:
    after an upgrade (or an edit of a checkout) they would run old code with the new."""
    from .. import __version__

    digest = hashlib.sha256(__version__.encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        status = path.stat()
        digest.update(
            f"{path.relative_to(_PACKAGE)}:{status.st_size}:{status.st_mtime_ns}".encode()
        )
    return digest.hexdigest()[:16]
