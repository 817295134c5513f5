"""SIGTERM, SIGINT and SIGHUP (systemd, Kubernetes, `timeout`, Ctrl-C, a closed terminal):
stop a command cleanly.

The first signal cancels what is running on both databases (every connection this process
opened is tracked), cancels the run's Spark jobs, and raises `Interrupted` in the main thread,
so that each layer rolls back and drops what it created on its way out; `sync` then records
and reports the interrupted run. A second signal ends the process at once. The exit code is
128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.

A signal the process was started with ignored stays ignored: `nohup` ignores SIGHUP, and a
shell script's background job SIGINT, so that the command outlives them.

Kept free of heavy imports: the copy tasks that Spark's Python workers run track their
connections here too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from .errors import Interrupted

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_connections: weakref.WeakSet[Any] = weakref.WeakSet()
_hooks: dict[int, Callable[[], None]] = {}
_state = {"signal": 0, "graceful": 0, "stop": 0}
_stopping = threading.Event()
_lock = threading.Lock()


def track(conn: Any) -> Any:
    """Remember a psycopg connection, to cancel its query if the process is interrupted."""
    _connections.add(conn)
    return conn


def on_interrupt(hook: Callable[[], None]) -> Callable[[], None]:
    """Run `hook` (say, cancel Spark's jobs) when interrupted; returns a function that
    removes it."""
    key = id(hook)
    _hooks[key] = hook

    def remove() -> None:
        _hooks.pop(key, None)

    return remove


def requested() -> Interrupted | None:
    """The interruption under way, if any (for code that caught a cancelled query's error)."""
    return Interrupted(_state["signal"]) if _state["signal"] else None


def raise_if_requested() -> None:
    """Re-raise the interruption when an error was only its consequence."""
    interrupted = requested()
    if interrupted is not None:
        raise interrupted


def cancel_everything() -> None:
    """Cancel the running query of every tracked connection, then run the hooks.

    The hooks run on a thread of their own: the signal handler runs in the main thread,
    which may be waiting inside a py4j call, and py4j gives each thread one connection (a
    call from the handler would re-enter the read in progress)."""
    for conn in list(_connections):
        with contextlib.suppress(Exception):
            if not conn.closed:
                conn.cancel_safe(timeout=5.0)
    hooks = list(_hooks.values())
    if hooks:
        runner = threading.Thread(target=_run_hooks, args=(hooks,), name="cancel", daemon=True)
        runner.start()
        runner.join(timeout=10.0)


def _run_hooks(hooks: list[Callable[[], None]]) -> None:
    for hook in hooks:
        with contextlib.suppress(Exception):
            hook()


def stop_requested() -> bool:
    """Under `graceful()`: a signal asked the command to stop after what it is doing."""
    return bool(_state["stop"])


def stop_signal_name() -> str | None:
    """The signal that asked to stop (under `graceful()`), as `SIGTERM`; None without one."""
    return signal.Signals(_state["stop"]).name if _state["stop"] else None


def wait_unless_stopped(seconds: float) -> None:
    """Sleep, waking at once when a signal asks to stop (under `graceful()`)."""
    _stopping.wait(seconds)


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """For `sync --follow`: the first signal only asks to stop once the current table is done
    (`stop_requested`); a second one interrupts as usual, a third ends the process."""
    _state["graceful"], _state["stop"] = 1, 0
    _stopping.clear()
    try:
        yield
    finally:
        _state["graceful"] = _state["stop"] = 0


def _handle(signum: int, frame: Any) -> None:
    with _lock:
        if _state["graceful"] and not _state["stop"]:
            _state["stop"] = signum
            _stopping.set()
            return
        if _state["signal"]:  # a second signal: stop now
            os._exit(128 + signum)
        _state["signal"] = signum
    cancel_everything()
    raise Interrupted(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Handle SIGINT, SIGTERM and SIGHUP for the block (in the main thread; elsewhere a
    no-op), except those this process ignores (`nohup`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        s: signal.signal(s, _handle) for s in HANDLED if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state["signal"] = 0
