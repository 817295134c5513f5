"""`replicator status`: what sync-state says about each table, and what the next sync will do."""

from __future__ import annotations

import json
import sys
from typing import Any

from psycopg import sql
from rich.console import Console
from rich.table import Table

from .config import TableConfig
from .database import connect, execute
from .errors import ReplicatorError, StateError
from .inspect_table import inspect_table
from .plan import plan_table
from .project import Project
from .redact import redact
from .settings import SOURCE_URL
from .table_sql import MODEL_ALIAS

_POSITION = """
SELECT max_key::text, {lag}
FROM (SELECT max({alias}.{key}) AS max_key FROM ({model}) AS {alias}) AS m
"""
_LAG = "(max_key - %(cursor)s::{type})::text"
# Key types whose difference means something: an interval, a number of days or of ids.
_SUBTRACTABLE = (
    "timestamp",
    "date",
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "real",
    "double precision",
)


def source_positions(
    project: Project, rows: list[dict[str, Any]]
) -> tuple[dict[str, tuple[str | None, str | None]], str | None]:
    """Per incremental table: the source's newest key and how far the cursor is behind it
    (an interval for timestamps, a difference for numbers). Read from the index, cheaply;
    skipped, with a note, when the source is not configured or not reachable."""
    url = project.env.get(SOURCE_URL)
    if not url:
        return {}, f"lag not shown: {SOURCE_URL} is not set"
    positions: dict[str, tuple[str | None, str | None]] = {}
    try:
        with connect(url, "source") as conn:
            for table, row in zip(project.config.tables, rows, strict=True):
                if table.replication_key is None:
                    continue
                try:
                    positions[table.written_name] = _position(conn, project, table, row)
                except ReplicatorError as exc:
                    row["last_error"] = row["last_error"] or redact(str(exc))
    except ReplicatorError as exc:
        return positions, f"lag not shown: {redact(str(exc))}"
    return positions, None


def _position(
    conn: Any, project: Project, table: TableConfig, row: dict[str, Any]
) -> tuple[str | None, str | None]:
    built = inspect_table(conn, table, project.templates)
    key_type = built.replication_key_type
    lag = (
        sql.SQL(_LAG).format(type=sql.SQL(key_type))
        if row["cursor"] is not None and key_type.startswith(_SUBTRACTABLE)
        else sql.SQL("NULL")
    )
    query = sql.SQL(_POSITION).format(
        lag=lag,
        alias=sql.Identifier(MODEL_ALIAS),
        key=sql.Identifier(table.replication_key or ""),
        # The model is the user's SQL: `%` doubled since a parameter is bound.
        model=sql.SQL(built.model.sql.replace("%", "%%")),
    )
    newest, lag = execute(conn, query, {"cursor": row["cursor"]}).fetchone()
    return newest, lag


def table_status(project: Project, table: TableConfig) -> dict[str, Any]:
    """One table's status row; the pinned keys of `status --json` are always present."""
    row: dict[str, Any] = {
        "name": table.written_name,
        "destination": str(table.target),
        "mode": table.mode,
        "cursor": None,
        "cursor_type": None,
        "last_synced_at": None,
        "last_status": None,
        "last_error": None,
        "rows": None,
        "pending_full_reload": None,
        "next_action": None,
        "source_max": None,
        "lag": None,
    }
    try:
        state = project.store.read(table.name)
    except StateError as exc:
        row.update(last_status="error", last_error=redact(str(exc)))
        return row
    plan = plan_table(table.mode or "", state)
    row["pending_full_reload"] = plan.action == "full_reload"
    row["next_action"] = (
        plan.action if plan.action == "incremental" else f"full_reload: {plan.reason}"
    )
    if state is None:
        return row
    if state.cursor is not None:
        row.update(cursor=state.cursor.value, cursor_type=state.cursor.type)
    row["last_synced_at"] = state.last_synced_at
    if state.last_run is not None:
        row.update(
            last_status=state.last_run.status,
            rows=state.last_run.rows,
            last_error=state.last_run.error,
        )
    return row


def print_status(project: Project, as_json: bool) -> int:
    rows = [table_status(project, t) for t in project.config.tables]
    positions, note = source_positions(project, rows)
    for row in rows:
        row["source_max"], row["lag"] = positions.get(row["name"], (None, None))
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        grid = Table(box=None, pad_edge=False)
        titles = ("table", "mode", "cursor", "lag", "last sync", "status", "rows", "next")
        for title in titles:
            grid.add_column(title, overflow="fold")
        for row in rows:
            grid.add_row(
                row["name"],
                row["mode"],
                _text(row["cursor"]),
                _text(row["lag"]),
                _text(row["last_synced_at"]),
                _text(row["last_status"]),
                _text(row["rows"]),
                _text(row["next_action"]),
            )
        console.print(grid)
        if note:
            console.print(note, markup=False)
        for row in rows:
            if row["last_error"]:
                console.print(f"{row['name']}: {row['last_error']}", markup=False)
    return 1 if any(r["last_status"] == "error" for r in rows) else 0


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
