"""`replicator spark start|stop|status`: the project's warm Spark server (a Spark Connect
server kept running between cron runs; spark/connect_server.py starts and stops it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..base.redact import redact
from ..project.project import Project
from ..project.spark_server_state import (
    LOG_FILE,
    ServerState,
    alive,
    read_state,
    running,
    server_dir,
)
from ..report.logs import json_output, say
from ..spark import connect_server as warm_server
from ..spark.engine_choice import EngineChoice


def start_server(project: Project) -> int:
    settings = project.settings
    if running(project.root) is None:
        say("starting the warm Spark server (a JVM start: 10-30 s)...", "spark.starting")
    state, started = warm_server.start(project.root, settings)
    verb = "started" if started else "already running"
    say(
        f"warm Spark server {verb} at {state.address} (pid {state.pid}, Spark "
        f"{state.spark_version}); log: {_log(project.root)}",
        "spark.started" if started else "spark.running",
        url=state.address,
        pid=state.pid,
    )
    unfit = settings.unfit(state)
    if not started and unfit:
        say(
            f"note: it was started with {unfit} than this run's, so runs do not use it: "
            "restart it (replicator spark stop, then replicator spark start)",
            "spark.note",
        )
    if settings.spark_remote and not settings.warm_server:
        say(
            "note: spark.remote (or REPLICATOR_SPARK_REMOTE) is set, so sync keeps using "
            "that server, not this one",
            "spark.note",
        )
    return 0


def stop_server(root: Path) -> int:
    """Needs no valid config: a project whose config broke can still stop its server."""
    state = warm_server.stop(root)
    if state is None:
        say("no warm Spark server running for this project", "spark.not_running")
    else:
        say(f"warm Spark server stopped (pid {state.pid})", "spark.stopped", pid=state.pid)
    return 0


def print_server_status(project: Project, as_json: bool) -> int:
    """Exit 0 when the server is up and ready, 1 when not (scripts can test it)."""
    state = read_state(project.root)
    live = state if state is not None and alive(state) else None
    settings = project.settings
    unfit = live and settings.unfit(live)
    report: dict[str, Any] = {
        "running": bool(live and live.ready),
        "starting": bool(live and not live.ready),
        "url": live.address if live else None,
        "pid": live.pid if live else None,
        "spark_version": live.spark_version if live else None,
        "started_at": live.started_at if live else None,
        "log": _log(project.root),
        "used_by_sync": settings.warm_server is not None,
        "not_used_because": unfit or None,
        "min_rows": settings.min_rows,
        "copies_on_spark": EngineChoice.for_settings(settings).describe(),
    }
    if as_json or json_output():  # under --log-format json every line printed is JSON
        print(json.dumps(report, indent=None if json_output() else 2))
    else:
        print(_describe(live, settings.spark_remote, settings.warm_server is not None))
        if unfit:
            print(f"it was started with {unfit} than this run's: sync does not use it; restart it")
        if settings.warm_server:
            print(f"sync runs copies on it {EngineChoice.for_settings(settings).describe()}")
        elif not live or not live.ready:
            print(f"sync starts Spark itself ({settings.spark_master or 'local[*]'})")
        print(f"log: {report['log']}")
    return 0 if report["running"] else 1


def _describe(state: ServerState | None, remote: str | None, used: bool) -> str:
    if state is None:
        return "warm Spark server: not running (replicator spark start starts it)"
    if not state.ready:
        return f"warm Spark server: starting (pid {state.pid})"
    line = (
        f"warm Spark server: up at {state.address} (pid {state.pid}, Spark "
        f"{state.spark_version}, since {state.started_at})"
    )
    if remote and not used:
        line += f"\nsync uses spark.remote ({redact(remote)}) instead"
    return line


def _log(root: Path) -> str:
    folder = server_dir(root)
    return str(folder / LOG_FILE) if folder is not None else "none (no cache folder)"
