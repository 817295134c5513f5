"""A session on a Spark Connect server (`spark.remote`): no JVM in this process.

The client's own retry policy waits up to about fifteen minutes for a server that does not
answer; a cron run should fail the table soon instead, saying which server. So the port is
probed first (a server that is down fails at once), and a call lost mid-run is retried for
about 14 s: enough for a network blip or a long pause of the server's JVM, not for a dead
server.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import traceback
from pathlib import Path
from typing import Any

from ..base.errors import ReplicatorError
from ..project.spark_remote import Remote

PROBE_SECONDS = 5.0

log = logging.getLogger(__name__)


def probe(remote: Remote, timeout: float = PROBE_SECONDS) -> None:
    """Raise a clear error unless something accepts connections at the server's port."""
    try:
        socket.create_connection((remote.host, remote.port), timeout=timeout).close()
    except OSError as exc:
        raise ReplicatorError(
            f"the Spark Connect server at {remote} does not answer ({exc.strerror or exc}): "
            "start it (replicator spark start, for this project's warm server) or fix "
            "spark.remote / REPLICATOR_SPARK_REMOTE"
        ) from None


def connect(remote: Remote, shipped: Path | None = None) -> Any:
    """A new session on the server (never a cached one: a server restarted since would
    have forgotten it), with `shipped` added as an archive artifact."""
    session = _session(remote, remote.url)
    if shipped is not None:
        from .executor_env import ALIAS

        session.addArtifacts(f"{shipped}#{ALIAS}", archive=True)
    return session


def attach(remote: Remote, session_id: str) -> Any | None:
    """The server-side session `session_id` (the warm server's), or None when the server
    no longer has it (it expired, or was released)."""
    separator = "" if ";" in remote.url else "/"
    session = _session(remote, f"{remote.url}{separator};session_id={session_id}")
    try:
        answered = bool(session.version)  # the first call: fails on a forgotten session
    except Exception as exc:
        if "SESSION_CLOSED" not in str(exc) and "INVALID_HANDLE" not in str(exc):
            raise
        answered = False
    if not answered:
        close(session, release=False)
    return session if answered else None


def _session(remote: Remote, url: str) -> Any:
    probe(remote)
    _quiet_channel_thread()
    # pyspark logs a failed query's whole JVM stack trace as JSON on stderr; the run
    # reports the error itself, in one line.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession

    session = SparkSession.builder.remote(url).create()
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=6, initial_backoff=100, max_backoff=4000, jitter=100)]
    )
    return session


def server_version(remote: Remote) -> str:
    """The server's Spark version (what `check` reports); raises when it does not answer."""
    session = connect(remote)
    try:
        return str(session.version)
    finally:
        close(session)


def unavailable(exc: BaseException) -> bool:
    """Whether the error (or what caused it) says the server is gone: gRPC's UNAVAILABLE
    (connection refused or reset), or the client gave up retrying."""
    import grpc

    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "getGrpcStatusCode", None)
        if code is not None and code() == grpc.StatusCode.UNAVAILABLE:
            return True
        if isinstance(seen, grpc.RpcError) and seen.code() == grpc.StatusCode.UNAVAILABLE:
            return True
        if type(seen).__name__ == "RetriesExceeded":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def abandon(session: Any) -> None:
    """Let go of a session on a server that is gone. Its client still retries, in the
    background, the calls that release the failed job's results, and the process would
    wait for them as it exits (28 s after a killed warm server, measured): they stop at
    their next attempt."""
    for policy in session.client.get_retry_policies():
        policy.max_retries = 0


def close(session: Any, *, release: bool = True) -> None:
    """Close the connection and, with `release`, the session on the server (the server
    itself keeps running); the warm server's shared session is kept."""
    with contextlib.suppress(Exception):  # the server may be gone: nothing to release
        if release:
            session.stop()
        else:
            session.client.close()


_previous_hook: Any = None


def _quiet_channel_thread() -> None:
    """gRPC's channel thread can die with `TypeError: 'NoneType' object is not callable`
    when the channel closes while it waits for a call's last event (seen once in many runs,
    after SIGTERM cancelled a job: the run itself had stopped cleanly). That thread's death
    at close is logged at debug level instead of printing a traceback on stderr; any other
    thread's error still goes to the hook that was there."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback else []
        if args.exc_type is TypeError and any(
            f.name == "channel_spin" and f.filename.endswith("_channel.py") for f in frames
        ):
            log.debug("gRPC's channel thread stopped as its channel closed: %s", args.exc_value)
            return
        _previous_hook(args)

    threading.excepthook = hook
