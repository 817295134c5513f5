"""`replicator state show|reset|set-cursor` (sync-state) and `replicator cdc drop|restart`
(the log capture's slot and publication)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .help_text import examples
from .options import common, load_expanded, select_option, shared_options

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, short_help="Inspect or edit sync-state.")
@shared_options
def state(**_: Any) -> None:
    """Inspect or edit sync-state (one JSON file per table in sync-state/)."""


@state.command(
    "show",
    short_help="Print tables' sync-state as JSON.",
    epilog=examples("replicator state show public.orders"),
)
@click.argument("tables", nargs=-1)
@common
def state_show(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Print the sync-state of TABLES (default: all) as one JSON object (null: no state).
    A source out of reach matches the table patterns against sync-state's tables."""
    from ..commands.state_commands import show_state
    from ..project.project import Project

    return show_state(Project.load(project_dir), tables)


@state.command(
    "reset",
    short_help="Forget tables' state: full reload next.",
    epilog=examples("replicator state reset public.orders"),
)
@click.argument("tables", nargs=-1, required=True)
@common
def state_reset(project_dir: Path, tables: tuple[str, ...]) -> int:
    """Forget TABLES' state: their next sync is a full reload."""
    from ..commands.state_commands import reset_state

    return reset_state(load_expanded(project_dir), tables)


@state.command(
    "set-cursor",
    short_help="Set a table's cursor by hand.",
    epilog=examples("replicator state set-cursor public.orders '2026-11-20 00:00:00+00'"),
)
@click.argument("table")
@click.argument("value")
@click.option("--force", is_flag=True, help="Set it even past the source's newest key.")
@common
def state_set_cursor(project_dir: Path, table: str, value: str, force: bool) -> int:
    """Set TABLE's cursor to VALUE, cast by the source to the replication key's type and
    stored as PostgreSQL prints it (exit 2 when it is not of that type, or when it is past
    the source's newest key, unless --force). Cursor tables only: a full-refresh table
    has no cursor, and a cdc table's position is the log's (`replicator refresh` reloads
    it)."""
    from ..commands.state_commands import set_cursor

    return set_cursor(load_expanded(project_dir), table, value, force)


@click.group(
    context_settings=CONTEXT,
    short_help="Manage the log capture of cdc tables.",
    epilog=examples(
        "replicator cdc drop   # an abandoned project: stop the source keeping WAL",
        "replicator cdc restart --repair   # a lost slot: a new one, the copies kept",
    ),
)
@shared_options
def cdc(**_: Any) -> None:
    """The replication slot and publication the project's `mode: "cdc"` tables read."""


@cdc.command(
    "drop",
    short_help="Drop the project's slot and publication.",
    epilog=examples("replicator cdc drop"),
)
@common
def cdc_drop(project_dir: Path) -> int:
    """Drop the replication slot and publication replicator created for this project, so
    the source stops keeping WAL for it (an abandoned slot keeps WAL until the disk fills).
    The cdc tables reload in full at their next sync, from a new slot."""
    from ..commands.capture_commands import drop_capture

    return drop_capture(load_expanded(project_dir))


@cdc.command(
    "restart",
    short_help="A new slot; --repair keeps the copies (no reload).",
    epilog=examples(
        "replicator cdc restart --repair   # after a major upgrade dropped the slot",
        "replicator cdc restart --repair -s public.orders   # the others reload",
        "replicator cdc restart   # every cdc table reloads at the next sync",
    ),
)
@select_option
@click.option(
    "--repair",
    is_flag=True,
    help="Bring each copy to the new slot's snapshot by writing only the rows that differ.",
)
@common
def cdc_restart(project_dir: Path, names: tuple[str, ...], repair: bool) -> int:
    """Start the log capture again from a new slot, after the slot was lost or dropped (a
    major upgrade drops every slot), or by choice. The tool's own slot is made again; a
    slot named in `cdc` with "create": false is the DBA's and must exist. With --repair,
    each cdc copy (or each -s one) is compared with the new slot's snapshot by range hashes
    and exactly the rows that differ are written: the tables stay in place, and later syncs
    go on from the slot. Without --repair (and for the tables -s leaves out), every cdc
    table reloads in full at the next sync. Exit 1 when a repair did not finish (that table
    reloads at the next sync)."""
    from ..commands.capture_commands import restart_capture_command

    verbose = click.get_current_context().meta["replicator.verbose"]
    return restart_capture_command(load_expanded(project_dir), names, repair, verbose)
