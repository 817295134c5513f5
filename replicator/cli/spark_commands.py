"""`replicator spark start|stop|status`: the project's warm Spark server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .help_text import examples
from .options import common, json_option, shared_options

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(
    context_settings=CONTEXT,
    short_help="Keep a warm Spark server for cron runs.",
    epilog=examples(
        "replicator spark start    # once, e.g. at boot (@reboot in crontab)",
        "replicator spark status   # exit 0 when it is up",
        "replicator spark stop",
    ),
)
@shared_options
def spark(**_: Any) -> None:
    """A local Spark Connect server that stays up between runs. While it is up, `sync` and
    `verify` connect to it (about a second) instead of starting Spark (a JVM: several
    seconds) for the copies it runs faster than this process (measured on this host; or
    from spark.min_rows rows when that is set). It runs the
    project's spark.master and spark.conf, listens on 127.0.0.1 only, and keeps its pid,
    port and log in the user's cache folder ($REPLICATOR_CACHE_DIR, default
    ~/.cache/replicator). spark.remote, when set, wins over it."""


@spark.command("start", short_help="Start the warm server (if not running).")
@common
def spark_start(project_dir: Path) -> int:
    """Start the project's warm Spark server in the background and wait until it answers
    and has run a first job. Does nothing when it is running already."""
    from ..commands.spark_server import start_server
    from ..project.project import Project

    return start_server(Project.load(project_dir))


@spark.command("stop", short_help="Stop the warm server.")
@common
def spark_stop(project_dir: Path) -> int:
    """Stop the project's warm Spark server (SIGTERM, SIGKILL after 30 s). Runs then start
    Spark themselves again where Spark is the faster engine."""
    from ..commands.spark_server import stop_server

    return stop_server(project_dir.resolve())


@spark.command("status", short_help="Is the warm server up? (exit 0 when it is)")
@json_option
@common
def spark_status(project_dir: Path, as_json: bool) -> int:
    """Whether the project's warm Spark server is up, where, and whether sync uses it; exit
    0 when it is up, 1 when not."""
    from ..commands.spark_server import print_server_status
    from ..project.project import Project

    return print_server_status(Project.load(project_dir), as_json)
