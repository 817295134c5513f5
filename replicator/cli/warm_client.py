"""A command handed to the warm helper (`replicator warm start`), when one is up.

Starting Python and loading psycopg, pydantic, jinja2, click and the project's modules took
0.4 s of a 1.6 s cron run of a 1% batch here. The helper has them loaded: it forks a child
that runs the command with this process's arguments, environment, folder, umask, stdin,
stdout and stderr, and this process relays signals to it and exits with its exit code.
With no helper up, the cost is one `stat`, and the command runs here as usual.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from .warm_socket import OFF_ENV, Lines, connect, installation, send_request, socket_path

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
LOST = 1  # the helper died during the run and the child's own exit code never came
ANSWER_SECONDS = 60.0  # a helper answers at once (a fork); one that does not is stuck


def run_in_helper(args: list[str]) -> int | None:
    """The command's exit code, run by the warm helper; None when it must run here: no
    helper, `REPLICATOR_WARM=off`, `replicator warm ...` itself, or a helper that loaded
    other code (it then stops; the next `warm start` loads the new code)."""
    if os.environ.get(OFF_ENV) == "off" or "warm" in args:
        return None
    path = socket_path()
    if path is None or not os.path.exists(path):
        return None
    conn = connect(path)
    if conn is None:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {
        "kind": "run",
        "argv": ["replicator", *args],
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        **installation(),
    }
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
            return None  # a helper of other code, stopping
        conn.settimeout(None)
        child = int(started["pid"])
        for sig in RELAYED:
            signal.signal(sig, _relay_to(child))
        finished = _next_or_none(lines)
    if finished is None:
        print("replicator: the warm helper stopped during the run", file=sys.stderr)
        return LOST
    return _as_own(int(finished["exit"]))


def _relay_to(child: int) -> Callable[[int, FrameType | None], None]:
    def relay(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    return relay


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
