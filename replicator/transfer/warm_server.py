"""The project's warm Spark server: a Spark Connect server kept running between cron runs,
so a run connects in about a second instead of starting a JVM, and every batch can go
through Spark (`replicator spark start|stop|status`).

It is the pip pyspark's own server class started through `spark-submit`, in its own
session (a terminal closing does not stop it), with the project's `spark.master` and
`spark.conf` and replicator's defaults (spark_session.spark_conf), listening on 127.0.0.1
only: whoever reaches a Connect server runs code as its user. Its pid, port and log are in
the project's folder of the user's cache (project/spark_server_state.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from ..errors import ReplicatorError
from ..project.settings import Settings
from ..project.spark_remote import Remote
from ..project.spark_server_state import (
    LOG_FILE,
    SERVER_CLASS,
    ServerState,
    alive,
    code_fingerprint,
    read_state,
    remove_state,
    server_dir,
    write_state,
)
from .spark_session import EXECUTOR_PYTHON_KEY, is_local, spark_conf

PREFERRED_PORT = 15002
START_SECONDS = 180.0
STOP_SECONDS = 30.0
NAME = "replicator warm server"


def start(
    root: Path, settings: Settings, timeout: float = START_SECONDS
) -> tuple[ServerState, bool]:
    """Start the project's server unless it runs already; (its state, whether started now).

    Returns once the server answered and ran a first job (its Python workers are up)."""
    current = read_state(root)
    if current is not None and alive(current):
        if current.ready:
            return current, False
        raise ReplicatorError(
            f"the warm Spark server (pid {current.pid}) is still starting: wait for it, or "
            "`replicator spark stop` it"
        )
    folder = server_dir(root)
    if folder is None:
        raise ReplicatorError(
            "the warm Spark server keeps its pid file and log in the cache folder, and "
            "REPLICATOR_CACHE_DIR is off or not writable: set it to a writable folder"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with open(folder / LOG_FILE, "ab") as log:
        process = subprocess.Popen(
            _command(settings, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=_environment(settings),
            start_new_session=True,
        )
    state = ServerState(process.pid, port, _now(), str(root.resolve()), code=code_fingerprint())
    write_state(root, state)
    try:
        ready = _wait_until_ready(state, process, timeout, folder / LOG_FILE)
    except BaseException:
        _terminate(process.pid, STOP_SECONDS)
        remove_state(root)
        raise
    write_state(root, ready)
    return ready, True


def stop(root: Path, timeout: float = STOP_SECONDS) -> ServerState | None:
    """Stop the project's server (SIGTERM, then SIGKILL past the timeout); the state it
    had, or None when none was running."""
    state = read_state(root)
    if state is None:
        return None
    remove_state(root)
    if not alive(state):
        return None
    _terminate(state.pid, timeout)
    return state


def _command(settings: Settings, port: int) -> list[str]:
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    shipped = None
    if settings.ship_environment and not is_local(settings.spark_master):
        from .executor_env import executor_archive  # a cluster master's executors need it

        shipped = executor_archive()
    conf = spark_conf(
        settings.spark_master, settings.spark_conf, quiet=True, executor_archive=shipped
    )
    conf["spark.app.name"] = NAME
    conf["spark.connect.grpc.binding.address"] = "127.0.0.1"
    conf["spark.connect.grpc.binding.port"] = str(port)
    # Runs attach to one session (ServerState.session_id): it must outlive a daily cron.
    conf["spark.connect.session.manager.defaultSessionTimeout"] = "3650d"
    command = [str(submit), "--class", SERVER_CLASS, "--name", NAME]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return command


def _environment(settings: Settings) -> dict[str, str]:
    """The server's Python workers run this interpreter locally (replicator installed);
    on a cluster master, the executors' own (spark_session._choose_executor_python)."""
    env = dict(os.environ)
    env.pop("SPARK_HOME", None)  # the pip pyspark's scripts find their own
    if EXECUTOR_PYTHON_KEY in settings.spark_conf:
        env["PYSPARK_PYTHON"] = settings.spark_conf[EXECUTOR_PYTHON_KEY]
    elif is_local(settings.spark_master):
        env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def _wait_until_ready(
    state: ServerState, process: subprocess.Popen[bytes], timeout: float, log: Path
) -> ServerState:
    """Poll the port until the server answers, then run a first job in the session every
    run will attach to: the state, ready."""
    from .connect_session import attach, close
    from .executor_env import ALIAS
    from .task_job import default_parallelism, run_job

    remote = Remote.parse(state.url)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise ReplicatorError(
                f"the warm Spark server exited at start (code {process.returncode}): "
                f"{_last_lines(log)} (whole log: {log})"
            )
        with contextlib.suppress(OSError):
            socket.create_connection((remote.host, remote.port), timeout=1).close()
            break
        if time.monotonic() > deadline:
            raise ReplicatorError(
                f"the warm Spark server did not answer within {timeout:.0f} s: see {log}"
            )
        time.sleep(0.5)
    session_id = str(uuid.uuid4())
    session = attach(remote, session_id)
    assert session is not None  # a new id is a new session
    try:
        parallelism = default_parallelism(session)
        run_job(session, abs, list(range(parallelism)), ALIAS)
        version = str(session.version)
    finally:
        close(session, release=False)
    return dataclasses.replace(
        state, ready=True, spark_version=version, session_id=session_id, parallelism=parallelism
    )


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _exists(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    """Whether the process is still there (a child of ours is reaped, not a zombie)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
