"""The `replicator` command line: wires config, state, catalog and output together.

The options every command shares (`--project-dir`, `-v`, `-q`, `--log-format`) are accepted
before the command name as well as after it, as dbt accepts them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from . import __version__, interrupts
from .cli_help import ENVIRONMENT, EXAMPLES, EXIT_CODES, examples
from .errors import ConfigError, ReplicatorError, UsageError
from .project.project import Project
from .redact import redact
from .report.logs import configure_logging, error_line, json_output, say

log = logging.getLogger("replicator.cli")

_SHARED = ("project_dir", "verbose", "quiet", "log_format")


def _shared_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--project-dir, -v, -q, --log-format: on the group (before the command name) and on
    each command (after it)."""
    options = [
        click.option(
            "--project-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="The project directory (default: the current directory).",
        ),
        click.option("-v", "--verbose", count=True, help="More detail: SQL, tracebacks."),
        click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors."),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default=None,
            help="text (default), or one JSON object per line for everything printed.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _effective(ctx: click.Context, name: str) -> Any:
    """A shared option's value: given after the command name, else before it (on `state`
    or on `replicator` itself); -v counts add up."""
    chain = []
    while ctx is not None:
        chain.append(ctx)
        ctx = ctx.parent
    if name == "verbose":
        return sum(c.params.get(name) or 0 for c in chain)
    for level in chain:  # the innermost given wins
        if level.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            return level.params.get(name)
    return None


def _common(command: Callable[..., Any]) -> Callable[..., Any]:
    """The shared options; errors and interruptions become exit codes."""

    @_shared_options
    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        for name in _SHARED:
            kwargs.pop(name)
        shared = {name: _effective(ctx, name) for name in _SHARED}
        verbose = shared["verbose"]
        configure_logging(verbose, bool(shared["quiet"]), shared["log_format"] or "text")
        ctx.meta["replicator.verbose"] = verbose
        project_dir = shared["project_dir"] or Path(".")
        try:
            with interrupts.handled():
                code = command(project_dir=project_dir, **kwargs)
        except interrupts.Interrupted as exc:  # cleaned up on the way here
            if not exc.reported:
                log.error("%s", exc.describe())
            sys.exit(exc.exit_code)
        except ReplicatorError as exc:
            _report(exc, verbose)
            sys.exit(exc.exit_code)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except Exception as exc:  # a bug: one readable line, the traceback under -v
            _report(exc, verbose, prefix="internal error: ")
            sys.exit(1)
        sys.exit(code or 0)

    return wrapper


def _report(exc: BaseException, verbose: int, prefix: str = "") -> None:
    if verbose and not isinstance(exc, UsageError):  # a usage error's place is its message
        click.echo(redact("".join(traceback.format_exception(exc))), err=True)
    problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
    code = exc.exit_code if isinstance(exc, ReplicatorError) else 1
    for problem in problems:
        click.echo(error_line(f"{prefix}{problem}", code), err=True)


select_option = click.option(
    "-s",
    "--select",
    "names",
    multiple=True,
    metavar="TABLE",
    help="Only these tables (repeatable; the schema may be left out when the name is unique).",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (also with --log-format json)."
)

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, epilog=f"{EXAMPLES}\n\n{ENVIRONMENT}\n\n{EXIT_CODES}")
@click.version_option(__version__, prog_name="replicator")
@_shared_options
def cli(**_: Any) -> None:
    """Keep copies of PostgreSQL tables in another PostgreSQL database, incrementally.

    A project is a folder: tables-config.json (which tables, how), optional models/
    (per-table SELECTs) and macros/ (SQL overrides), and sync-state/ (where each table is).
    Run `replicator COMMAND --help` for a command's options and examples."""


@cli.command(
    short_help="Write a new project scaffold.",
    epilog=examples("replicator init my-pipeline", "cd my-pipeline && replicator check"),
)
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@_common
def init(project_dir: Path, directory: Path | None) -> int:
    """Write a new project into DIRECTORY (default: --project-dir): tables-config.json with
    commented examples, .env.example, a model, macros/README.md and sync-state/. An
    existing project is never overwritten."""
    from .project.scaffold import init_project

    target = project_dir / directory if directory else project_dir
    for path in init_project(target):
        say(f"wrote {path}", "init.wrote", path=str(path))
    say(
        f"next: edit {target / 'tables-config.json'}, copy .env.example to .env, "
        f"then run `replicator check --project-dir {target}`",
        "init.next",
    )
    return 0


@cli.command(
    name="compile",
    short_help="Print each table's next action and SQL; run nothing.",
    epilog=examples("replicator compile -s public.orders", "replicator compile --json | jq ."),
)
@select_option
@json_option
@click.option("--since", metavar="VALUE", help="Also show the re-sync of a key range (with -s).")
@click.option("--until", metavar="VALUE", help="End of the --since range (included).")
@_common
def compile_command(
    project_dir: Path,
    names: tuple[str, ...],
    as_json: bool,
    since: str | None,
    until: str | None,
) -> int:
    """Print what each table's next sync would do and why (the same plan `sync` makes), the
    schema changes since its last load, and the statements each action runs, as it builds
    them: full reload, incremental, a start without backfill, a --since re-sync. Catalogs
    are read; nothing is written. Exit 1 when a table cannot be compiled."""
    from .commands.compile import compile_tables

    project = Project.load(project_dir)
    return compile_tables(project, names, as_json or json_output(), since, until)


@cli.command(
    short_help="Sync the tables, one at a time, in config order.",
    epilog=examples(
        "replicator sync",
        "replicator sync -s public.orders -s public.customers",
        "replicator sync -f -s public.orders          # full reload now",
        "replicator sync -s public.orders --since '2026-11-01' --until '2026-11-02'",
        "*/5 * * * * cd /srv/pipeline && .venv/bin/replicator sync -q >> sync.log 2>&1",
    ),
)
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
    """Sync the tables (or only -s ones), one at a time, in config order: a full reload
    where needed (no state, schema change, missing destination, refresh), else the rows
    past each cursor. One webhook after the run; the exit code says how it went."""
    from .sync.run import run_sync

    verbose = click.get_current_context().meta["replicator.verbose"]
    project = Project.load(project_dir)
    return run_sync(project, names, full_refresh, verbose, since=since, until=until)


@cli.command(
    short_help="Throwaway clusters, sample tables, two syncs.",
    epilog=examples("replicator demo", "replicator demo --keep"),
)
@click.option("--keep", is_flag=True, help="Leave the clusters running to explore them.")
@_common
def demo(project_dir: Path, keep: bool) -> int:
    """Start a throwaway source and destination PostgreSQL, fill the source with sample
    tables, sync twice and check every row. Works in a temporary copy of the project's
    tables, models and macros: its sync-state, .env, webhook and Spark master are never
    used."""
    from .commands.demo import run_demo

    verbose = click.get_current_context().meta["replicator.verbose"]
    return run_demo(project_dir, keep, verbose)


@cli.command(
    short_help="Per table: cursor, lag, last run, rows, next action.",
    epilog=examples("replicator status", "replicator status --json"),
)
@json_option
@_common
def status(project_dir: Path, as_json: bool) -> int:
    """Per table: mode, cursor, lag behind the source's newest key, when the last run ended
    and how, rows in the destination, and the next action as `sync` will decide it. Exit 1
    when a state file cannot be read."""
    from .commands.status import print_status

    return print_status(Project.load(project_dir), as_json or json_output())


@cli.command(
    short_help="Mark tables for a full reload at the next sync.",
    epilog=examples("replicator refresh public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@_common
def refresh(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Mark TABLES for a full reload at the next sync; the mark clears once the reload
    committed."""
    from .commands.state_commands import mark_for_refresh

    return mark_for_refresh(Project.load(project_dir), tables)


@cli.command(
    short_help="Hand existing destination tables over to replicator.",
    epilog=examples("replicator adopt public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@_common
def adopt(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Let replicator replace and update the existing destination tables of TABLES, which
    it did not create (it never touches such a table otherwise). The next sync reloads
    them from the source unless their state says otherwise."""
    from .commands.adopt import adopt_tables

    return adopt_tables(Project.load(project_dir), tables)


@cli.group(context_settings=CONTEXT, short_help="Inspect or edit sync-state.")
@_shared_options
def state(**_: Any) -> None:
    """Inspect or edit sync-state (one JSON file per table in sync-state/)."""


@state.command(
    "show",
    short_help="Print tables' sync-state as JSON.",
    epilog=examples("replicator state show public.orders"),
)
@click.argument("tables", nargs=-1)
@_common
def state_show(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Print the sync-state of TABLES (default: all) as one JSON object (null: no state)."""
    from .commands.state_commands import show_state

    return show_state(Project.load(project_dir), tables)


@state.command(
    "reset",
    short_help="Forget tables' state: full reload next.",
    epilog=examples("replicator state reset public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@_common
def state_reset(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Forget TABLES' state: their next sync is a full reload."""
    from .commands.state_commands import reset_state

    return reset_state(Project.load(project_dir), tables)


@state.command(
    "set-cursor",
    short_help="Set a table's cursor by hand.",
    epilog=examples("replicator state set-cursor public.orders '2026-11-20 00:00:00+00'"),
)
@click.argument("table")
@click.argument("value")
@click.option("--force", is_flag=True, help="Set it even past the source's newest key.")
@_common
def state_set_cursor(project_dir: Path, table: str, value: str, force: bool) -> int:
    """Set TABLE's cursor to VALUE, cast by the source to the replication key's type and
    stored as PostgreSQL prints it (exit 2 when it is not of that type, or when it is past
    the source's newest key, unless --force)."""
    from .commands.state_commands import set_cursor

    return set_cursor(Project.load(project_dir), table, value, force)


@cli.command(
    short_help="Find what a sync would trip on; say how to fix it.",
    epilog=examples("replicator check", "replicator check --ping"),
)
@click.option("--ping", is_flag=True, help="Also send the webhook a test payload.")
@_common
def check(project_dir: Path, ping: bool) -> int:
    """Check the config, both connections and the privileges a sync needs, each table (its
    source, keys, indexes, model and destination, and the next sync's plan), Java and the
    JDBC driver, and a cluster's Spark master. One line per finding, with its fix; exit 1
    when one is an error. Nothing is written."""
    from .commands.check import print_checks

    return print_checks(Project.load(project_dir), ping)


def main() -> None:
    """The console script: click's own usage errors follow --log-format json too, and a
    closed stdout (`replicator compile | head`) ends the command quietly."""
    try:
        cli.main(prog_name="replicator", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        if "json" in _log_format_in(sys.argv[1:]):
            configure_logging(log_format="json")
            click.echo(error_line(exc.format_message(), exc.exit_code), err=True)
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C before a command took over
        sys.exit(130)
    except BrokenPipeError:
        _quiet_broken_pipe()


def _log_format_in(args: list[str]) -> str:
    """--log-format's value on a command line that click could not parse."""
    for index, arg in enumerate(args):
        if arg.startswith("--log-format="):
            return arg.split("=", 1)[1]
        if arg == "--log-format" and index + 1 < len(args):
            return args[index + 1]
    return "text"


def _quiet_broken_pipe() -> None:
    """The reader went away (`| head`): what it wanted was printed; exit 0 without a word."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
