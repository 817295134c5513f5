"""A command handed to the warm helper (`replicator warm start`), when one is up.

Starting Python and loading psycopg, pydantic, jinja2, click and the project's modules is a
quarter of a small cron run (bench/RESULTS.md). The helper has them loaded: it forks a child
that runs the command with this process's arguments, environment, folder, umask, nice value,
CPU affinity, resource limits, stdin, stdout and stderr, and this process relays signals to
it and exits with its exit code. With no helper up, the cost is one `stat`, and the command
runs here as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
from collections.abc import Callable
from types import FrameType

from .wire import OFF_ENV, RELAYED, Lines, connect, installation, send_request, socket_path

LOST = 1  # the helper died during the run and the child's own exit code never came
ANSWER_SECONDS = 60.0  # a helper answers at once (a fork); one that does not is stuck
OFF_VALUES = {"off", "0", "false", "no"}
_VALUED_OPTIONS = {"--project-dir", "--log-format"}  # the group's options that take a value


def run_in_helper(args: list[str]) -> int | None:
    """The command's exit code, run by the warm helper; None when it must run here: no
    helper, `REPLICATOR_WARM=off`, `replicator warm ...` itself, a descriptor 0-2 closed or
    a working folder gone (the child could not take them), or a helper that loaded other
    code (it then stops; `replicator warm start` starts one with the new code)."""
    if os.environ.get(OFF_ENV, "").strip().lower() in OFF_VALUES or _command(args) == "warm":
        return None
    path = socket_path()
    if path is None or not os.path.exists(path) or not _stdio_open():
        return None
    try:
        request = {"kind": "run", "argv": ["replicator", *args], **_this_process()}
    except OSError:
        return None
    conn = connect(path)
    if conn is None:
        return None
    with conn:
        conn.settimeout(ANSWER_SECONDS)
        try:
            send_request(conn, request, stdio=True)
            lines = Lines(conn)
            started = lines.next()
        except TimeoutError:
            print(
                f"replicator: the warm helper did not answer in {ANSWER_SECONDS:.0f} s; stop it "
                "(replicator warm stop) or run with REPLICATOR_WARM=off",
                file=sys.stderr,
            )
            return LOST  # it may have started the command: running it here too could race it
        except OSError:
            return None
        if not started or "pid" not in started:
            if started and started.get("stale"):
                _say_stale(args)
            return None
        conn.settimeout(None)
        child = int(started["pid"])
        for sig in RELAYED:
            if sig not in request["ignored"]:  # `nohup`: the child ignores it too
                signal.signal(sig, _relay_to(child))
        signal.signal(signal.SIGTSTP, _stop_with(child))
        finished = _next_or_none(lines)
    if finished is None:
        print("replicator: the warm helper stopped during the run", file=sys.stderr)
        return LOST
    return _as_own(int(finished["exit"]))


def _command(args: list[str]) -> str | None:
    """The command's name: the first argument that is neither an option nor its value."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _stdio_open() -> bool:
    """A closed stdout (`>&-`) would make the socket descriptor 1, and the child would write
    its output into the helper's connection."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


def _this_process() -> dict:
    """What the child takes from this process besides its arguments and descriptors."""
    umask = os.umask(0o022)
    os.umask(umask)
    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            with contextlib.suppress(OSError, ValueError):
                limits[name] = resource.getrlimit(getattr(resource, name))
    return {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "limits": limits,
        "ignored": [int(sig) for sig in RELAYED if signal.getsignal(sig) == signal.SIG_IGN],
        **installation(),
    }


def _say_stale(args: list[str]) -> None:
    message = (
        "the warm helper was started before replicator or a library changed: it stopped, and "
        "this command runs by itself; `replicator warm start` starts one with the new code"
    )
    if "json" in args or "--log-format=json" in args:
        print(json.dumps({"level": "warning", "event": "warm.stale", "message": message}))
    else:
        print(f"warning: {message}", file=sys.stderr)


def _relay_to(child: int) -> Callable[[int, FrameType | None], None]:
    def relay(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    return relay


def _stop_with(child: int) -> Callable[[int, FrameType | None], None]:
    """Ctrl-Z: the child stops, then this process as the shell expects; `fg` (SIGCONT)
    continues both."""

    def stop(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGSTOP)
        signal.signal(signal.SIGCONT, _continue_with(child))
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)

    return stop


def _continue_with(child: int) -> Callable[[int, FrameType | None], None]:
    def carry_on(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
        signal.signal(signal.SIGTSTP, _stop_with(child))

    return carry_on


def _next_or_none(lines: Lines) -> dict | None:
    try:
        return lines.next()
    except OSError:
        return None


def _as_own(code: int) -> int:
    """The child's exit: a code is returned; a signal's death is died here too, so that a
    shell or cron sees what it would have seen without the helper."""
    if code >= 0:
        return code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor needs to
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code  # not reached for a deadly signal
