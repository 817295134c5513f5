"""The `replicator` command line: wires config, state, catalog and output together.

The options every command shares (`--project-dir`, `-v`, `-q`, `--log-format`) are accepted
before the command name as well as after it, as dbt accepts them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ..base.errors import UsageError
from ..report.logs import configure_logging, error_line, json_output, say
from ..spark.jvm_stop import stop_spark_on_exit
from .dbt_command import dbt_sources
from .groups import cdc, state
from .help_text import ENVIRONMENT, EXAMPLES, EXIT_CODES, examples
from .options import (
    common,
    json_option,
    load_expanded,
    quiet_broken_pipe,
    select_option,
    shared_options,
)
from .spark_commands import spark
from .warm.group import warm

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, epilog=f"{EXAMPLES}\n\n{ENVIRONMENT}\n\n{EXIT_CODES}")
@click.version_option(__version__, prog_name="replicator")
@shared_options
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
@common
def init(project_dir: Path, directory: Path | None) -> int:
    """Write a new project into DIRECTORY (default: --project-dir): tables-config.json with
    commented examples, .env.example, a model, macros/README.md and sync-state/. An
    existing project is never overwritten."""
    from ..project.scaffold import init_project, next_steps

    target = project_dir / directory if directory else project_dir
    written = init_project(target)
    for path in written:
        say(f"wrote {path}", "init.wrote", path=str(path))
    say(next_steps(target, written), "init.next")
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
@common
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
    from ..commands.compile import compile_tables

    project = load_expanded(project_dir)
    return compile_tables(project, names, as_json or json_output(), since, until)


@cli.command(
    short_help="Sync the tables, one at a time, in config order.",
    epilog=examples(
        "replicator sync",
        "replicator sync -s public.orders -s public.customers",
        "replicator sync -f -s public.orders          # full reload now",
        "replicator sync -s public.orders --since '2026-11-01' --until '2026-11-02'",
        "*/5 * * * * cd /srv/pipeline && .venv/bin/replicator sync -q >> sync.log 2>&1",
        "replicator sync --follow --interval 2      # until SIGTERM/Ctrl-C",
    ),
)
@select_option
@click.option("-f", "--full-refresh", is_flag=True, help="Reload in full, from scratch: no resume.")
@click.option(
    "--since",
    metavar="VALUE",
    help="Re-sync one table's replication-key range from VALUE (with -s); the cursor stays.",
)
@click.option("--until", metavar="VALUE", help="End of the --since range (included).")
@click.option(
    "--deletes",
    "check_deletes",
    is_flag=True,
    help="Check tables with `deletes` set for rows deleted in the source now.",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --deletes: delete even more than half of a table's rows.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Keep syncing until SIGTERM/SIGINT/SIGHUP (the current table finishes; exit 0).",
)
@click.option(
    "--interval",
    type=click.FloatRange(0, 86_400),
    default=None,
    metavar="S",
    help="With --follow: seconds between two runs (default 5).",
)
@common
def sync(
    project_dir: Path,
    names: tuple[str, ...],
    full_refresh: bool,
    since: str | None,
    until: str | None,
    check_deletes: bool,
    force: bool,
    follow: bool,
    interval: float | None,
) -> int:
    """Sync the tables (or only -s ones), one at a time, in config order: a full reload
    where needed (no state, schema change, missing destination, refresh), else the rows
    past each cursor. One webhook after the run; the exit code says how it went."""
    from ..sync.run import run_sync

    if force and not check_deletes:
        raise UsageError("--force goes with --deletes: `replicator sync --deletes --force`")
    verbose = click.get_current_context().meta["replicator.verbose"]
    from ..project.project import Project

    project = Project.load(project_dir)
    if interval is not None and not follow:
        raise UsageError("--interval goes with --follow: `replicator sync --follow --interval 5`")
    if follow:
        if full_refresh or since or until or check_deletes:
            raise UsageError(
                "--follow repeats plain runs: it does not go with -f, --since, --until or "
                "--deletes (run those once, then follow)"
            )
        from ..sync.follow import follow as follow_runs

        return follow_runs(project, names, verbose, 5.0 if interval is None else interval)
    return run_sync(
        project,
        names,
        full_refresh,
        verbose,
        since=since,
        until=until,
        check_deletes=check_deletes,
        force_deletes=force,
    )


@cli.command(
    short_help="Prove each copy row by row; --repair fixes what differs.",
    epilog=examples(
        "replicator verify",
        "replicator verify -s public.orders --repair",
        "replicator verify --json | jq '.[] | select(.status != \"equal\")'",
    ),
)
@select_option
@click.option(
    "--repair",
    is_flag=True,
    help="Fix exactly the rows that differ (no reload; cursors stay where they are).",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --repair: delete even more than half of a table's rows.",
)
@json_option
@common
def verify(
    project_dir: Path, names: tuple[str, ...], repair: bool, force: bool, as_json: bool
) -> int:
    """Compare each table's destination with what its model reads from the source, one
    snapshot per side: rows hashed per primary-key range, differing ranges narrowed down
    and compared row by row. Rows the source changed after the table's last sync are
    reported as not yet synced, never as differences. Exit 0 when every table is equal
    (with --repair: when every difference was repaired), 1 when rows differ or a table
    could not be compared. One `verify.finished` webhook after the run. A repair that would
    delete more than half of a table's rows is refused unless --force."""
    from ..commands.verify import run_verify

    if force and not repair:
        raise UsageError("--force goes with --repair: `replicator verify --repair --force`")
    verbose = click.get_current_context().meta["replicator.verbose"]
    project = load_expanded(project_dir)
    return run_verify(project, names, repair, as_json or json_output(), verbose, force)


@cli.command(
    short_help="Throwaway clusters, sample tables, two syncs.",
    epilog=examples("replicator demo", "replicator demo --keep"),
)
@click.option("--keep", is_flag=True, help="Leave the clusters running to explore them.")
@common
def demo(project_dir: Path, keep: bool) -> int:
    """Start a throwaway source and destination PostgreSQL, fill the source with sample
    tables, sync twice and check every row. Works in a temporary copy of the project's
    tables, models and macros: its sync-state, .env, webhook and Spark master are never
    used."""
    from ..commands.demo import run_demo

    verbose = click.get_current_context().meta["replicator.verbose"]
    return run_demo(project_dir, keep, verbose)


@cli.command(
    "ls",
    short_help="The tables the config selects, patterns expanded.",
    epilog=examples("replicator ls", "replicator ls -s 'sales.orders' --json"),
)
@select_option
@json_option
@common
def ls(project_dir: Path, names: tuple[str, ...], as_json: bool) -> int:
    """List the tables a sync works on, each pattern of tables-config.json ("sales.*")
    matched against the source's catalog now: name, destination, mode, replication key,
    primary key, and the entry (`tables[i]`, and its pattern) that chose it."""
    from ..commands.ls import list_tables

    return list_tables(load_expanded(project_dir), names, as_json or json_output())


@cli.command(
    short_help="Per table: cursor, lag, last run, rows, next action.",
    epilog=examples(
        "replicator status", "replicator status --json", "replicator status --history 5 -s orders"
    ),
)
@select_option
@click.option(
    "--history",
    type=click.IntRange(1, 100_000),
    is_flag=False,
    flag_value=10,
    default=None,
    metavar="[N]",
    help="Each table's last N runs (default 10) from _replicator.runs in the destination.",
)
@json_option
@common
def status(project_dir: Path, names: tuple[str, ...], history: int | None, as_json: bool) -> int:
    """Per table: mode, cursor, lag behind the source's newest key, when the last run ended
    and how, rows in the destination, and the next action as `sync` will decide it. Exit 1
    when a state file cannot be read. With --history: each table's last runs instead."""
    from ..project.project import Project

    project = Project.load(project_dir)
    if history is not None:
        from ..commands.status_history import print_history

        return print_history(project, names, history, as_json or json_output())
    from ..commands.status import print_status

    return print_status(project, as_json or json_output(), names)


@cli.command(
    short_help="An HTML page of the tables' last runs (report.html).",
    epilog=examples("replicator report", "replicator report -o /srv/www/replicator.html"),
)
@select_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the page (default: report.html in the project folder).",
)
@click.option("--runs", type=click.IntRange(1, 10_000), default=30, help="Runs per table (30).")
@common
def report(project_dir: Path, names: tuple[str, ...], output: Path | None, runs: int) -> int:
    """Write one self-contained HTML page (no script, font or link: it opens offline) from
    _replicator.runs in the destination: per table its last status, its lag over its last
    runs, rows and seconds per run, and every failure with its reason."""
    from ..commands.report_page import write_report
    from ..project.project import Project

    return write_report(Project.load(project_dir), names, output, runs)


@cli.command(
    short_help="Mark tables for a full reload at the next sync.",
    epilog=examples("replicator refresh public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@common
def refresh(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Mark TABLES for a full reload at the next sync; the mark clears once the reload
    committed."""
    from ..commands.state_commands import mark_for_refresh

    return mark_for_refresh(load_expanded(project_dir), tables)


@cli.command(
    short_help="Hand existing destination tables over to replicator.",
    epilog=examples("replicator adopt public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@common
def adopt(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Let replicator replace and update the existing destination tables of TABLES, which
    it did not create (it never touches such a table otherwise). The next sync reloads
    them from the source unless their state says otherwise."""
    from ..commands.adopt import adopt_tables

    return adopt_tables(load_expanded(project_dir), tables)


@cli.command(
    short_help="Find what a sync would trip on; say how to fix it.",
    epilog=examples("replicator check", "replicator check --ping"),
)
@click.option("--ping", is_flag=True, help="Also send the webhook a test payload.")
@common
def check(project_dir: Path, ping: bool) -> int:
    """Check the config, both connections and the privileges a sync needs, each table (its
    source, keys, indexes, model and destination, and the next sync's plan), Java and the
    JDBC driver, and a cluster's Spark master. One line per finding, with its fix; the
    tables of a pattern summed up where they say the same (-v: one line per table, -vv: and
    the statements run); exit 1
    when one is an error, 2 when the config itself cannot be read. Nothing is written."""
    from ..commands.check.checks import print_checks
    from ..project.project import Project
    from ..report.logs import configure_logging, json_output, quiet

    verbose = click.get_current_context().meta.get("replicator.verbose", 0)
    if verbose:  # -v: a line per table; -vv: the statements too, as -v gives elsewhere
        configure_logging(verbose - 1, quiet(), "json" if json_output() else "text")
    return print_checks(Project.load(project_dir), ping, verbose)


for group in (state, cdc, spark, warm, dbt_sources):
    cli.add_command(group)


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
        quiet_broken_pipe()
    finally:
        stop_spark_on_exit()  # no JVM outlives the command


def _log_format_in(args: list[str]) -> str:
    """--log-format's value on a command line that click could not parse."""
    for index, arg in enumerate(args):
        if arg.startswith("--log-format="):
            return arg.split("=", 1)[1]
        if arg == "--log-format" and index + 1 < len(args):
            return args[index + 1]
    return "text"
