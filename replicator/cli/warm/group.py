"""`replicator warm start|stop|status`: the warm helper, which runs cron's commands without
starting Python and loading replicator each time (warm_server.py, warm_client.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ...base.errors import ReplicatorError, UsageError
from ...base.processes import alive
from ...report.logs import json_output, say
from ..help_text import examples
from ..options import common, json_option, shared_options
from .wire import SOCKET_PATH_MAX, ask, socket_path

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
START_SECONDS = 60.0  # loading replicator: about half a second here
STOP_SECONDS = 30.0


@click.group(
    context_settings=CONTEXT,
    short_help="Keep replicator loaded for cron runs.",
    epilog=examples(
        "replicator warm start    # once, e.g. at boot (@reboot in crontab)",
        "replicator warm status   # exit 0 when it is up",
        "replicator warm stop",
    ),
)
@shared_options
def warm(**_: Any) -> None:
    """A background process that keeps Python and replicator loaded (0.4 s of each command
    here). While it is up, every `replicator` command of this installation and user is run
    by a copy of it (a fork) with the command's own arguments, environment, folder, stdin,
    stdout and stderr, and ends with the same output and exit code; signals reach it.
    REPLICATOR_WARM=off runs a command without it. When replicator or a library is
    upgraded, the helper stops at the next command (which runs without it): start it again.
    Its socket and log are in the user's cache folder ($REPLICATOR_CACHE_DIR, default
    ~/.cache/replicator). It serves any project: no --project-dir needed."""


@warm.command("start", short_help="Start the warm helper (if not running).")
@common
def warm_start(project_dir: Path) -> int:
    """Start the helper in the background and wait until it answers. Does nothing when it is
    running already, unless replicator or a library changed since it started: then it is
    replaced by one with the new code."""
    path = _usable_socket_path()
    up = ask(path, {"kind": "ping"})
    if up is not None and up["current"]:
        say(f"warm helper already running (pid {up['pid']})", "warm.running", pid=up["pid"])
        return 0
    if up is not None:  # it loaded other files than the installation holds now: replace it
        _stop(path)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"the warm helper's folder {os.path.dirname(path)} cannot be made ({exc.strerror}): "
            "set REPLICATOR_CACHE_DIR to a folder this user can write"
        ) from None
    log = _log_path(path)
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "replicator.cli.warm.helper", path],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
        )
    deadline = time.monotonic() + START_SECONDS
    while (up := ask(path, {"kind": "ping"})) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise ReplicatorError(f"the warm helper did not start; its log: {log}")
        time.sleep(0.05)
    say(f"warm helper started (pid {up['pid']}); log: {log}", "warm.started", pid=up["pid"])
    return 0


@warm.command("stop", short_help="Stop the warm helper.")
@common
def warm_stop(project_dir: Path) -> int:
    """Stop the helper: commands then run in their own process again. Runs it started
    finish first; the helper exits after them."""
    pid = _stop(_usable_socket_path())
    if pid is None:
        say("no warm helper running", "warm.not_running")
    elif alive(pid):
        say(f"warm helper (pid {pid}) stops once its runs end", "warm.stopping", pid=pid)
    else:
        say(f"warm helper stopped (pid {pid})", "warm.stopped", pid=pid)
    return 0


@warm.command("status", short_help="Is the warm helper up? (exit 0 when it is)")
@json_option
@common
def warm_status(project_dir: Path, as_json: bool) -> int:
    """Whether the helper is up, since when and how many commands it ran; exit 0 when it is
    up, 1 when not."""
    path = socket_path()
    up = ask(path, {"kind": "ping"}) if path is not None else None
    report = {
        "running": up is not None,
        "current": up and up["current"],
        "pid": up and up["pid"],
        "started_at": up and _when(up["started"]),
        "commands_run": up and up["served"],
        "running_now": up and up["running"],
        "socket": path,
        "log": path and _log_path(path),
    }
    if as_json or json_output():
        print(json.dumps(report, indent=None if json_output() else 2))
    elif path is None:
        print("warm helper: not running (none can: REPLICATOR_CACHE_DIR is off)")
    elif up is None:
        print("warm helper: not running (replicator warm start starts it)")
    else:
        print(
            f"warm helper: up (pid {up['pid']}, since {report['started_at']}, "
            f"{up['served']} command(s) run, {up['running']} running now)"
        )
        if not up["current"]:
            print(
                "replicator or a library changed since it started: the next command stops it "
                "and runs by itself; replicator warm start starts one with the new code"
            )
        print(f"log: {report['log']}")
    return 0 if up is not None else 1


def _stop(path: str) -> int | None:
    """Ask the helper to stop and wait (a while) until it did; its pid, None when none.
    Its socket is gone at once: a helper still finishing runs takes no new command."""
    answer = ask(path, {"kind": "stop"})
    if answer is None:
        return None
    pid = int(answer["pid"])
    deadline = time.monotonic() + STOP_SECONDS
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def _usable_socket_path() -> str:
    path = socket_path()
    if path is None:
        raise UsageError(
            "the warm helper needs a cache folder for its socket, and REPLICATOR_CACHE_DIR "
            "is off: set it to a folder"
        )
    if len(path.encode()) > SOCKET_PATH_MAX:
        raise UsageError(
            f"the warm helper's socket path would be {len(path.encode())} bytes, over the "
            f"{SOCKET_PATH_MAX} a socket allows: {path}; set REPLICATOR_CACHE_DIR to a "
            "shorter folder"
        )
    return path


def _log_path(path: str) -> str:
    return path.removesuffix(".sock") + ".log"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
