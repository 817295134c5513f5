"""The project's warm Spark server: a Spark Connect server kept running between cron runs,
so a run connects in about a second instead of starting a JVM, and every batch can go
through Spark (`replicator spark start|stop|status`).

It is the pip pyspark's own server class started through `spark-submit`, in its own
session (a terminal closing does not stop it), with the project's `spark.master` and
`spark.conf` and replicator's defaults (spark_session.spark_conf). It listens on 127.0.0.1
only and wants a random token (whoever reaches a Connect server runs code as its user, and
other users of this machine reach 127.0.0.1). The token travels in its environment and its
settings in a 0600 properties file, not on its command line (`ps` shows that to everyone).
Its pid, port, token and log are in the project's private folder of the user's cache
(project/spark_server_state.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from ..base.errors import ReplicatorError
from ..project.settings import Settings
from ..project.spark_remote import Remote
from ..project.spark_server_state import (
    INSTANCE_KEY,
    LOG_FILE,
    SERVER_CLASS,
    ServerState,
    alive,
    code_fingerprint,
    locked,
    read_state,
    remove_state,
    server_dir,
    settings_fingerprint,
    write_state,
)
from .session import EXECUTOR_PYTHON_KEY, is_local, shipped_archive, spark_conf

PREFERRED_PORT = 15002
START_SECONDS = 180.0
STOP_SECONDS = 30.0
NAME = "replicator warm server"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
PROPERTIES_FILE = "spark.properties"


def start(
    root: Path, settings: Settings, timeout: float = START_SECONDS
) -> tuple[ServerState, bool]:
    """Start the project's server unless it runs already; (its state, whether started now).

    Returns once the server answered and ran a first job (its Python workers are up)."""
    folder = _folder(root)
    with locked(folder):
        current = read_state(root)
        if current is not None and alive(current):
            if current.ready:
                return current, False
            # Not ready, yet no start holds the lock: the start that launched it died.
            _terminate(current.pid, STOP_SECONDS)
        return _launch(root, folder, settings, timeout), True


def stop(root: Path, timeout: float = STOP_SECONDS) -> ServerState | None:
    """Stop the project's server (SIGTERM, then SIGKILL past the timeout); the state it
    had, or None when none was running."""
    folder = server_dir(root)
    if folder is None or not folder.is_dir():
        return None
    with locked(folder):
        state = read_state(root)
        if state is None:
            return None
        remove_state(root, state)
        if not alive(state):
            return None
        _terminate(state.pid, timeout)
        return state


def _folder(root: Path) -> Path:
    folder = server_dir(root)
    if folder is None:
        raise ReplicatorError(
            "the warm Spark server keeps its pid file and log in the cache folder, and "
            "REPLICATOR_CACHE_DIR is off or not writable: set it to a writable folder"
        )
    return folder


def _launch(root: Path, folder: Path, settings: Settings, timeout: float) -> ServerState:
    state = ServerState(
        pid=0,
        port=_free_port(),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        project=str(root.resolve()),
        instance=uuid.uuid4().hex,
        token=secrets.token_urlsafe(24),
        code=code_fingerprint(),
        settings=settings_fingerprint(
            settings.spark_master, settings.spark_conf, settings.ship_environment
        ),
    )
    properties = _write_properties(folder, settings, state.port)
    command = [
        str(_spark_home() / "bin" / "spark-submit"),
        *("--class", SERVER_CLASS, "--name", NAME, "--properties-file", str(properties)),
        *("--conf", f"{INSTANCE_KEY}={state.instance}"),
    ]
    descriptor = os.open(folder / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=_environment(settings, state.token),
            start_new_session=True,
        )
    state = dataclasses.replace(state, pid=process.pid)
    write_state(root, state)
    try:
        ready = _wait_until_ready(state, process, timeout, folder / LOG_FILE)
    except BaseException:
        _terminate(process.pid, STOP_SECONDS)
        remove_state(root, state)
        raise
    write_state(root, ready)
    return ready


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _write_properties(folder: Path, settings: Settings, port: int) -> Path:
    """The server's Spark settings, in a file only this user reads (spark.conf may hold
    secrets such as spark.authenticate.secret)."""
    shipped = shipped_archive(settings.spark_master, settings.ship_environment)
    conf = spark_conf(
        settings.spark_master, settings.spark_conf, quiet=True, executor_archive=shipped
    )
    conf["spark.app.name"] = NAME
    conf["spark.connect.grpc.binding.address"] = "127.0.0.1"
    conf["spark.connect.grpc.binding.port"] = str(port)
    # Runs attach to one session (ServerState.session_id): it must outlive a daily cron.
    conf["spark.connect.session.manager.defaultSessionTimeout"] = "3650d"
    path = folder / PROPERTIES_FILE
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        for key, value in conf.items():  # java.util.Properties: backslashes escaped
            out.write(f"{key}={value.replace(chr(92), chr(92) * 2)}\n")
    return path


def _environment(settings: Settings, token: str) -> dict[str, str]:
    """The server's Python workers run this interpreter locally (replicator installed);
    on a cluster master, the executors' own (spark_session._choose_executor_python)."""
    env = dict(os.environ)
    env.pop("SPARK_HOME", None)  # the pip pyspark's scripts find their own
    env[TOKEN_ENV] = token
    if EXECUTOR_PYTHON_KEY in settings.spark_conf:
        env["PYSPARK_PYTHON"] = settings.spark_conf[EXECUTOR_PYTHON_KEY]
    elif is_local(settings.spark_master):
        env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def _wait_until_ready(
    state: ServerState, process: subprocess.Popen[bytes], timeout: float, log: Path
) -> ServerState:
    """Poll the port until the server answers, check that it is this one, then run a first
    job in the session every run will attach to: the state, ready."""
    remote = Remote.parse(state.url)
    deadline = time.monotonic() + timeout
    while True:
        _check_running(process, log)
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", remote.port), timeout=1).close()
            break
        if time.monotonic() > deadline:
            raise ReplicatorError(
                f"the warm Spark server did not answer within {timeout:.0f} s: see {log}"
            )
        time.sleep(0.5)
    try:
        return _first_job(state, remote, process, log)
    except ReplicatorError:
        raise
    except Exception as exc:  # the server answered, then failed the session or the job
        from .runner import spark_error_message

        raise ReplicatorError(
            f"the warm Spark server started but could not run a job: "
            f"{spark_error_message(exc)} (its log: {log})"
        ) from None


def _first_job(
    state: ServerState, remote: Remote, process: subprocess.Popen[bytes], log: Path
) -> ServerState:
    from .connect_session import attach, close
    from .executor_env import ALIAS
    from .task_job import default_parallelism, run_job

    session_id = str(uuid.uuid4())
    session = attach(remote, session_id)
    assert session is not None  # a new id is a new session
    try:
        if session.conf.get(INSTANCE_KEY, None) != state.instance:
            raise ReplicatorError(
                f"port {state.port} is answered by another Spark Connect server than the "
                "one just started (two starts at once?): run replicator spark start again"
            )
        parallelism = default_parallelism(session)
        run_job(session, abs, list(range(parallelism)), ALIAS)
        version = str(session.version)
    finally:
        close(session, release=False)
    _check_running(process, log)
    return dataclasses.replace(
        state, ready=True, spark_version=version, session_id=session_id, parallelism=parallelism
    )


def _check_running(process: subprocess.Popen[bytes], log: Path) -> None:
    if process.poll() is not None:
        raise ReplicatorError(
            f"the warm Spark server exited at start (code {process.returncode}): "
            f"{_last_lines(log)} (whole log: {log})"
        )


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _exists(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    """Whether the process is still there (a child of ours is reaped; a zombie is gone)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rpartition(")")[2].split()[0] != "Z"


def _free_port() -> int:
    """15002 (Spark's usual port) when free on 127.0.0.1, else any free one."""
    for port in (PREFERRED_PORT, 0):
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind(("127.0.0.1", port))
            return int(probe.getsockname()[1])
    raise ReplicatorError("no free TCP port on 127.0.0.1 for the warm Spark server")


def _last_lines(log: Path, count: int = 5) -> str:
    with contextlib.suppress(OSError):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-count:])
    return "no log"
