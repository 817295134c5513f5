"""The `replicator` command line: wires config, state, catalog and output together."""

from __future__ import annotations

import functools
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import ConfigError, ReplicatorError, UsageError
from .logs import configure_logging
from .project import Project
from .redact import redact

log = logging.getLogger("replicator.cli")


def _common(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options every subcommand takes after its name; errors become exit codes."""

    @click.option(
        "--project-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="The project directory.",
    )
    @click.option("-v", "--verbose", count=True, help="More detail, tracebacks included.")
    @click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
    @click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="Log lines as text or one JSON object per line.",
    )
    @functools.wraps(command)
    def wrapper(
        project_dir: Path, verbose: int, quiet: bool, log_format: str, **kwargs: Any
    ) -> None:
        configure_logging(verbose, quiet, log_format)
        click.get_current_context().meta["replicator.verbose"] = verbose
        try:
            code = command(project_dir=project_dir, **kwargs)
        except ReplicatorError as exc:
            _report(exc, verbose)
            sys.exit(exc.exit_code)
        except Exception as exc:  # a bug: one readable line, the traceback under -v
            _report(exc, verbose, prefix="internal error: ")
            sys.exit(1)
        sys.exit(code or 0)

    return wrapper


def _report(exc: BaseException, verbose: int, prefix: str = "") -> None:
    if verbose and not isinstance(exc, UsageError):  # a usage error's place is its message
        click.echo(redact("".join(traceback.format_exception(exc))), err=True)
    problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
    for problem in problems:
        click.echo(redact(f"error: {prefix}{problem}"), err=True)


select_option = click.option(
    "-s",
    "--select",
    "names",
    multiple=True,
    metavar="TABLE",
    help="Only these tables (repeatable).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="replicator")
def cli() -> None:
    """Keep copies of PostgreSQL tables in another PostgreSQL database, incrementally."""


@cli.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@_common
def init(project_dir: Path, directory: Path | None) -> int:
    """Write a new project scaffold into DIRECTORY (default: --project-dir)."""
    from .scaffold import init_project

    target = project_dir / directory if directory else project_dir
    for path in init_project(target):
        click.echo(f"wrote {path}")
    click.echo(
        f"next: edit {target / 'tables-config.json'}, copy .env.example to .env, "
        f"then run `replicator check --project-dir {target}`"
    )
    return 0


@cli.command(name="compile")
@select_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_common
def compile_command(project_dir: Path, names: tuple[str, ...], as_json: bool) -> int:
    """Print each table's next action, schema changes and SQL; nothing is executed."""
    from .compile import compile_tables

    project = Project.load(project_dir)
    return compile_tables(project, project.select(names), as_json)


@cli.command()
@select_option
@click.option("-f", "--full-refresh", is_flag=True, help="Reload the tables in full.")
@click.option(
    "--since",
    metavar="VALUE",
    help="Re-sync one table's replication-key range from VALUE (with -s); the cursor stays.",
)
@click.option("--until", metavar="VALUE", help="End of the --since range (included).")
@_common
def sync(
    project_dir: Path,
    names: tuple[str, ...],
    full_refresh: bool,
    since: str | None,
    until: str | None,
) -> int:
    """Sync the tables, one at a time, in config order."""
    from .sync import run_sync

    verbose = click.get_current_context().meta["replicator.verbose"]
    project = Project.load(project_dir)
    return run_sync(project, names, full_refresh, verbose, since=since, until=until)


@cli.command()
@click.option("--keep", is_flag=True, help="Leave the clusters running to explore them.")
@_common
def demo(project_dir: Path, keep: bool) -> int:
    """Throwaway clusters, sample tables, two syncs, a verified summary."""
    from .demo import run_demo

    verbose = click.get_current_context().meta["replicator.verbose"]
    return run_demo(project_dir, keep, verbose)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_common
def status(project_dir: Path, as_json: bool) -> int:
    """Per table: mode, cursor, last sync, last status, rows, pending reload."""
    from .status import print_status

    return print_status(Project.load(project_dir), as_json)


@cli.command()
@click.argument("tables", nargs=-1, required=True)
@_common
def refresh(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Mark TABLES for a full reload at the next sync."""
    from .state_commands import mark_for_refresh

    return mark_for_refresh(Project.load(project_dir), tables)


@cli.command()
@click.argument("tables", nargs=-1, required=True)
@_common
def adopt(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Let replicator replace and update existing destination TABLES it did not create."""
    from .adopt import adopt_tables

    return adopt_tables(Project.load(project_dir), tables)


@cli.group()
def state() -> None:
    """Inspect or edit sync-state."""


@state.command("show")
@click.argument("tables", nargs=-1)
@_common
def state_show(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Print the sync-state of TABLES (default: all) as JSON."""
    from .state_commands import show_state

    return show_state(Project.load(project_dir), tables)


@state.command("reset")
@click.argument("tables", nargs=-1, required=True)
@_common
def state_reset(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Forget TABLES' state: their next sync is a full reload."""
    from .state_commands import reset_state

    return reset_state(Project.load(project_dir), tables)


@state.command("set-cursor")
@click.argument("table")
@click.argument("value")
@_common
def state_set_cursor(project_dir: Path, table: str, value: str) -> int:
    """Set TABLE's cursor to VALUE (checked against the replication key's type)."""
    from .state_commands import set_cursor

    return set_cursor(Project.load(project_dir), table, value)


@cli.command()
@click.option("--ping", is_flag=True, help="Also send the webhook a test payload.")
@_common
def check(project_dir: Path, ping: bool) -> int:
    """Validate config, connections, privileges, keys and indexes; say what is wrong."""
    from .check import run_checks

    findings = run_checks(Project.load(project_dir), ping)
    for finding in findings:
        click.echo(redact(finding.line()))
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warn" for f in findings)
    click.echo(f"{errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


def main() -> None:
    cli(prog_name="replicator")
