"""`replicator refresh` and `replicator state ...`: read or edit sync-state under the run lock."""

from __future__ import annotations

import json
import logging
from typing import Any

import click
import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError, StateError, UsageError
from ..base.identifiers import display_ident
from ..plan.cursor import canonical_value, newest_key
from ..plan.inspect_table import inspect_table
from ..plan.selection import expanded_or_known
from ..postgres.catalog import describe_table
from ..postgres.database import connect, execute
from ..project.config import TableConfig
from ..project.project import Project
from ..project.runlock import run_lock
from ..project.state import Cursor, TableState
from ..report.logs import json_output, say

log = logging.getLogger(__name__)


def mark_for_refresh(project: Project, names: tuple[str, ...]) -> int:
    """Flag tables for a full reload at the next sync (the flag clears when it commits)."""
    tables = project.select(names)
    with run_lock(project.state_dir):
        for table in tables:
            state = project.store.read(table.name) or TableState(table=str(table.name))
            updated = state.model_copy(
                update={"pending_full_reload": True, "pending_reason": "refresh requested"}
            )
            project.store.write(updated, table.name)
            say(
                f"{table.written_name}: marked for a full reload at the next sync",
                "state.refresh",
                name=table.written_name,
            )
    return 0


def show_state(project: Project, names: tuple[str, ...]) -> int:
    """Print the states as one JSON object keyed by table name (null: no state yet); it
    needs no database (the table patterns are matched against sync-state's tables when the
    source is out of reach)."""
    project, fallback = expanded_or_known(project)
    if fallback is not None:
        log.warning("%s", fallback)
    out: dict[str, object] = {}
    failed = False
    for table in project.select(names):
        try:
            state = project.store.read(table.name)
        except StateError as exc:
            out[table.written_name] = {"error": str(exc)}
            failed = True
            continue
        out[table.written_name] = state.model_dump(mode="json") if state else None
    indent = None if json_output() else 2  # one line under --log-format json
    click.echo(json.dumps(out, indent=indent, ensure_ascii=False))
    return 1 if failed else 0


def reset_state(project: Project, names: tuple[str, ...]) -> int:
    """Delete tables' state files: their next sync reloads them in full. A table a pattern
    matched before and the source no longer has (the runs say it is gone) is named as the
    runs name it: its state goes, and the runs stop saying so."""
    gone = {str(v.name): v for v in project.vanished}
    tables = (
        project.select(tuple(n for n in names if n not in gone)) if set(names) - gone.keys() else []
    )
    with run_lock(project.state_dir):
        for name in (n for n in names if n in gone):
            project.store.delete(gone[name].name)
            say(
                f"{name}: gone from the source; its state removed (its copy in the "
                "destination is kept: drop it there if it is not wanted)",
                "state.reset",
                name=name,
            )
        for table in tables:
            existed = project.store.delete(table.name)
            verb = "state removed" if existed else "had no state"
            say(
                f"{table.written_name}: {verb}; the next sync reloads it in full",
                "state.reset",
                name=table.written_name,
            )
    return 0


def set_cursor(project: Project, name: str, value: str, force: bool = False) -> int:
    """Set a table's cursor, cast by the source to the replication key's type and reprinted.
    A cursor past the source's newest key (a typo in the year) needs `force`: until the
    source caught up, no sync would read a row."""
    table = project.find(name)
    if table.mode == "cdc":
        raise UsageError(
            f"{table.written_name}: mode cdc has no cursor to set: its copy goes on from its "
            "position in the source's log. To copy it again from the source, run "
            f"`replicator refresh {table.written_name}` (the next sync reloads it)"
        )
    if table.replication_key is None:
        raise UsageError(
            f"{table.written_name}: mode {table.mode} has no cursor: every sync reloads it"
        )
    with connect(project.env.source(), "source") as conn:
        info = describe_table(conn, table.name)
        column = info.column(table.replication_key) if info else None
        if column is None:
            raise ReplicatorError(
                f"{table.written_name}: replication key column "
                f"{display_ident(table.replication_key)} not found in the source table"
            )
        canonical = canonical_value(conn, value, column.type, table.written_name)
        newest = _newest_key(conn, project, table)
        if not force and newest is not None and _after(conn, canonical, newest, column.type):
            raise UsageError(
                f"{table.written_name}: {canonical} is past the source's newest "
                f"{display_ident(table.replication_key)} ({newest}): no sync would read a row "
                "until the source passes it (a typo?); to set it anyway, add --force"
            )
    with run_lock(project.state_dir):
        state = project.store.read(table.name)
        if state is None or state.last_synced_at is None:
            raise ReplicatorError(
                f"{table.written_name}: has no state yet; its first sync is a full load "
                "(run `replicator sync` first, then set the cursor)"
            )
        project.store.write(
            # A hand-set cursor invalidates what the probe knows: the next run reads from it.
            state.model_copy(
                update={
                    "cursor": Cursor(value=canonical, type=column.type),
                    "window": None,
                    "pending": None,
                }
            ),
            table.name,
        )
    say(
        f"{table.written_name}: cursor set to {canonical} ({column.type})",
        "state.cursor_set",
        name=table.written_name,
        cursor=canonical,
    )
    return 0


def _newest_key(conn: psycopg.Connection[Any], project: Project, table: TableConfig) -> str | None:
    """The newest replication key the table's model reads now."""
    built = inspect_table(conn, table, project.templates)
    return newest_key(
        conn, sql.SQL(built.model.sql), table.replication_key or "", built.replication_key_type
    )


def _after(conn: psycopg.Connection[Any], value: str, newest: str, key_type: str) -> bool:
    (after,) = execute(
        conn, sql.SQL("SELECT %s::{t} > %s::{t}").format(t=sql.SQL(key_type)), (value, newest)
    ).fetchone()
    return bool(after)
