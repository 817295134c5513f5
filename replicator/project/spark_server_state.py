"""Where the project's warm Spark server (`replicator spark start`) keeps its pid, port, token
and log, and whether it is up and fit for this run.

In the user's cache folder (replicator/base/cache.py), one folder per project (a hash of its
path), private to the user (0700; the state file 0600: it holds the server's token): the
server is this machine's, not the project's to commit, and two projects on one machine each
get their own (with their own spark.conf). Every run reads it: one small file and a /proc
lookup, no connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from ..base.cache import cache_dir
from ..base.redact import register_secret

STATE_FILE = "server.json"
LOG_FILE = "server.log"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
INSTANCE_KEY = "spark.replicator.instance"  # on the server's command line: whose it is


@dataclass(frozen=True)
class ServerState:
    """A server this project started; `ready` once it answered and ran a first job.

    `instance`: a random id on the server's command line (a reused pid is not ours);
    `token`: what a client must present (anyone on this machine can reach 127.0.0.1);
    `session_id`: the server-side session every run attaches to, so that the Python workers
    it forked stay warm between runs (a new session forks new ones);
    `parallelism`: its task slots, known at start (asking costs a job);
    `code`, `settings`: fingerprints of the replicator and the Spark settings it runs."""

    pid: int
    port: int
    started_at: str
    project: str
    instance: str = ""
    token: str = ""
    ready: bool = False
    spark_version: str = ""
    session_id: str = ""
    parallelism: int = 1
    code: str = ""
    settings: str = ""

    @property
    def url(self) -> str:
        # `localhost`, not 127.0.0.1: pyspark sends a token over a local channel only then
        return f"sc://localhost:{self.port}/;token={self.token}"

    @property
    def address(self) -> str:
        """The URL without its token, for what is printed."""
        return f"sc://localhost:{self.port}"


def server_dir(root: Path) -> Path | None:
    """The project's folder for its server (None without a cache folder)."""
    base = cache_dir()
    if base is None:
        return None
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return base / "spark-server" / digest


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Held by `spark start` (for the whole start) and `spark stop`: two starts at once
    would each start a server, and only one would be recorded."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_state(root: Path) -> ServerState | None:
    folder = server_dir(root)
    if folder is None:
        return None
    try:
        document = json.loads((folder / STATE_FILE).read_text())
        known = {field.name for field in dataclasses.fields(ServerState)}
        state = ServerState(**{k: v for k, v in document.items() if k in known})
    except (OSError, ValueError, TypeError):
        return None
    register_secret(state.token)
    return state


def write_state(root: Path, state: ServerState) -> None:
    """Written under a temporary name (0600) and renamed: a run never reads half a file."""
    folder = server_dir(root)
    assert folder is not None
    temporary = folder / f".{STATE_FILE}.{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(json.dumps(asdict(state), indent=2) + "\n")
    temporary.replace(folder / STATE_FILE)


def remove_state(root: Path, state: ServerState) -> None:
    """Remove the state file if it still describes `state` (not a newer server's)."""
    current = read_state(root)
    folder = server_dir(root)
    if folder is not None and current is not None and current.instance == state.instance:
        with contextlib.suppress(FileNotFoundError):
            (folder / STATE_FILE).unlink()


def alive(state: ServerState) -> bool:
    """Whether the recorded pid is still this very server (not a reused pid)."""
    try:
        command = Path(f"/proc/{state.pid}/cmdline").read_bytes()
    except OSError:
        return False
    mine = f"{INSTANCE_KEY}={state.instance}".encode()
    return SERVER_CLASS.encode() in command and mine in command


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


def settings_fingerprint(
    master: str | None, conf: Mapping[str, str], ship_environment: bool
) -> str:
    """The Spark settings a server was started with, and the libpq environment (PG*) its
    copy tasks inherit: a run whose own differ (spark.conf edited since, a one-off
    REPLICATOR_SPARK_MASTER, a PGPASSWORD set only for cron) must not use the server."""
    libpq = sorted((k, v) for k, v in os.environ.items() if k.startswith("PG"))
    document = [master or "local[*]", sorted(conf.items()), ship_environment, libpq]
    return hashlib.sha256(json.dumps(document).encode()).hexdigest()[:16]
