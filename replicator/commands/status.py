"""`replicator status`: each table's last run, as sync-state recorded it, and what the next
sync will do, decided by the same plan `compile` and `sync` use when both databases answer.

`lag` is the source's newest replication key minus the newest key already copied (the
highest of the cursor and the rows read past it: the stored cursor itself stays a lookback
behind on purpose). `rows` is the destination table's row count; `last_run_rows` what the
last run read. No statement on the source runs longer than POSITION_TIMEOUT_SECONDS: status
never hangs on a slow model (it says so instead) or a locked catalog.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from ..base.errors import DatabaseError, ReplicatorError, StateError, TableProblem
from ..base.redact import redact
from ..cdc.preflight import capture_problem
from ..cdc.source.unused_slot import unused_slot
from ..plan import selection
from ..plan.cursor import where_finite
from ..plan.decide import Plan, plan_table
from ..plan.drift import Planned, plan_now
from ..plan.read_ahead import read_ahead
from ..plan.table_sql import MODEL_ALIAS, TableSql, fitting_cursor
from ..postgres.database import connect, execute
from ..postgres.types.type_closure import base_type
from ..project.config import TableConfig
from ..project.project import Project
from ..project.settings import DEST_URL, SOURCE_URL
from ..project.state import TableState
from ..report.logs import json_output
from ..sync.full_load.resume import outlook, resumable
from .capture_status import capture_notes

log = logging.getLogger(__name__)

POSITION_TIMEOUT_SECONDS = 10
QUERY_CANCELED = psycopg.errors.QueryCanceled.sqlstate


class _SlowModel(Exception):
    """The newest-key query of a table's model took longer than status waits."""


class _CursorAhead(Exception):
    """The stored cursor is past the source's newest key (args: that key, the note)."""


_POSITION = """
SELECT max_key::text, {lag}, max_key < %(cursor)s::{type}
FROM (SELECT max({alias}.{key}) AS max_key FROM ({model}) AS {alias}{finite}) AS m
"""
_LAG = "(max_key - greatest(%(cursor)s::{type}, %(read)s::{type}, %(pending)s::{type}))::text"
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


def table_status(project: Project, table: TableConfig) -> tuple[dict[str, Any], TableState | None]:
    """One table's status row from its sync-state; the pinned keys of `status --json` are
    always present. The state comes back too (None also when it cannot be read)."""
    row: dict[str, Any] = {
        "name": table.written_name,
        "destination": str(table.target),
        "mode": table.mode,
        "cursor": None,
        "cursor_type": None,
        "last_synced_at": None,
        "last_run_at": None,
        "last_status": None,
        "last_action": None,  # the last run's action and why (`schema evolved: ...`)
        "last_reason": None,
        "last_error": None,
        "rows": None,
        "last_run_rows": None,
        "pending_full_reload": None,
        "next_action": None,
        "source_max": None,
        "lag": None,
        "cursor_ahead": None,
        "slot_lag_bytes": None,  # a `cdc` table: log written since its copy's position
        "slot_warning": None,  # a `cdc` table: what its slot holds, as sync warns of it
        "resumable": None,  # an unfinished full load: {"loaded": k, "partitions": n}
        # a cursor the source's open transactions hold back: {"to", "since", "pids"}
        "cursor_waits": None,
    }
    try:
        state = project.planning_state(table)
    except StateError as exc:
        row.update(last_status="error", last_error=redact(str(exc)))
        return row, None
    _set_plan(
        row, plan_table(table.mode or "", state, name=table.written_name, pattern=table.pattern)
    )
    if state is None:
        return row, None
    if state.cursor is not None:
        row.update(cursor=state.cursor.value, cursor_type=state.cursor.type)
    if state.pending is not None:
        waits = state.pending
        row["cursor_waits"] = {"to": waits.value, "since": waits.since, "pids": waits.pids}
    row["last_synced_at"] = state.last_synced_at
    if state.last_run is not None:
        row.update(
            last_run_at=state.last_run.finished_at,
            last_status=state.last_run.status,
            last_action=state.last_run.action,
            last_reason=state.last_run.reason,
            last_run_rows=state.last_run.rows,
            last_error=state.last_run.error,
        )
    history = table.history_table
    if history is not None:  # where its versions are, and what the last run wrote there
        last = state.last_run
        row["history"] = {
            "table": str(history),
            "last_run_versions_added": last.versions_added if last else None,
            "last_run_versions_closed": last.versions_closed if last else None,
        }
    return row, state


def _set_plan(row: dict[str, Any], plan: Plan) -> None:
    row["pending_full_reload"] = plan.action == "full_reload"
    row["next_action"] = (
        plan.action if plan.action == "incremental" else f"{plan.action}: {plan.reason}"
    )


def print_status(project: Project, as_json: bool, names: tuple[str, ...] = ()) -> int:
    project, notes = expanded_or_known(project)
    tables = project.select(names)
    read = [table_status(project, t) for t in tables]
    rows = [row for row, _ in read]
    notes += _observe_live(project, tables, read)
    notes += [_waiting_note(row) for row in rows if row["cursor_waits"] is not None]
    if as_json:
        # One line under --log-format json (every line printed is one JSON value).
        print(json.dumps(rows, indent=None if json_output() else 2, ensure_ascii=False))
        for note in notes:
            log.info("%s", note)
    else:
        _print_grid(rows, notes)
    return 1 if any(r["last_status"] == "error" for r in rows) else 0


def _waiting_note(row: dict[str, Any]) -> str:
    """A cursor held back by transactions that were open when its table's batch was read."""
    waits = row["cursor_waits"]
    pids = f" (pid {', '.join(map(str, waits['pids']))})" if waits["pids"] else ""
    since = f" since {waits['since']}" if waits["since"] else ""
    return (
        f"{row['name']}: the cursor waits for transactions open when its last batch was "
        f"read{pids}{since}: it moves to {waits['to']} once they end (a session idle in a "
        "transaction holds it back: pg_stat_activity shows it)"
    )


def expanded_or_known(project: Project) -> tuple[Project, list[str]]:
    """The project with its patterns matched now (or against sync-state's tables, with the
    source out of reach: status still shows the last runs), and the notes to print."""
    project, fallback = selection.expanded_or_known(project)
    if fallback is not None:
        return project, [fallback]
    return project, [*project.unmatched, *(v.line() for v in project.vanished)]


def _print_grid(rows: list[dict[str, Any]], notes: list[str]) -> None:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    grid = Table(box=None, pad_edge=False)
    titles = ("table", "mode", "cursor", "lag", "last run", "status", "rows", "next")
    for title in titles:
        grid.add_column(title, overflow="fold")
    for row in rows:
        grid.add_row(
            row["name"],
            row["mode"],
            _text(row["cursor"]),
            _text(row["lag"]),
            _text(row["last_run_at"] or row["last_synced_at"]),
            _text(row["last_status"]),
            _text(row["rows"]),
            _text(row["next_action"]),
        )
    console.print(grid)
    for note in notes:
        console.print(note, markup=False, soft_wrap=True)
    for row in rows:
        history = row.get("history")
        if history is not None and history["last_run_versions_added"] is not None:
            console.print(
                f"{row['name']}: history in {history['table']}, the last run "
                f"{history['last_run_versions_added']:,} version(s) added, "
                f"{history['last_run_versions_closed'] or 0:,} closed",
                markup=False,
                soft_wrap=True,
            )
    for row in rows:
        if row["last_error"]:
            error = row["last_error"].removeprefix(f"{row['name']}: ")
            console.print(f"{row['name']}: {error}", markup=False, soft_wrap=True)


def _observe_live(
    project: Project,
    tables: tuple[TableConfig, ...],
    read: list[tuple[dict[str, Any], TableState | None]],
) -> list[str]:
    """Fill in the next action (the sync's own plan), lag and destination rows from the
    databases; without them, the next action comes from sync-state alone, with a note."""
    source_url = project.env.optional_source()
    dest_url = project.optional_destination()
    notes: list[str] = []
    with (
        _connected(source_url, SOURCE_URL, "source", notes) as source,
        _connected(dest_url, DEST_URL, "destination", notes) as dest,
    ):
        if source is None:
            notes.append("next action, lag and source_max from sync-state alone (see above)")
            return notes
        ahead = read_ahead(source, dest, tables)
        # The newest keys come from the models: a slow one must not make status hang. Set
        # once for the session, not per table (four statements a table became one).
        execute(
            source,
            sql.SQL("SET statement_timeout = {}").format(
                sql.Literal(f"{POSITION_TIMEOUT_SECONDS}s")
            ),
        )
        for table, (row, state) in zip(tables, read, strict=True):
            if row["last_status"] == "error":
                continue
            try:
                planned = plan_now(source, dest, table, project.templates, state, ahead=ahead)
                if table.mode == "cdc":  # what the sync fails such a table for, first
                    problem = capture_problem(
                        source, planned.source, planned.built, project.cdc_tables
                    )
                    if problem is not None:
                        raise TableProblem(problem)
                _set_plan(row, planned.plan)
                if planned.plan.action == "incremental":  # else the copy is rebuilt: no lag
                    _show_position(source, planned, state, row, notes)
                if dest is not None and planned.observed.destination is not None:
                    row["rows"] = _count(dest, table)
                if dest is not None:
                    _show_resumable(source, dest, planned, row)
            except ReplicatorError as exc:
                row["next_action"] = (
                    f"unknown: a statement on the source took over {POSITION_TIMEOUT_SECONDS} s "
                    "(a lock on the table?)"
                    if getattr(exc, "sqlstate", None) == QUERY_CANCELED
                    else f"fail: {redact(str(exc))}"
                )
        if any(t.mode == "cdc" for t in tables):
            notes.extend(capture_notes(project, source, tables, [row for row, _ in read]))
        elif (unused := unused_slot(source, project)) is not None:
            notes.append(f"cdc: {': '.join(unused)}")
    if dest is None:
        notes.append("rows (in the destination) not shown; the plan did not look at it")
    return notes


def _show_position(
    source: psycopg.Connection[Any],
    planned: Planned,
    state: TableState | None,
    row: dict[str, Any],
    notes: list[str],
) -> None:
    """The source's newest key and the lag behind it; a note when the model is slow or
    the cursor is past the newest key."""
    try:
        row["source_max"], row["lag"] = _position(source, planned, state)
        row["cursor_ahead"] = False if row["cursor"] is not None else None
    except _SlowModel as slow:
        notes.append(str(slow))
    except _CursorAhead as ahead:
        row.update(source_max=ahead.args[0], lag=None, cursor_ahead=True)
        notes.append(ahead.args[1])


def _show_resumable(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    planned: Planned,
    row: dict[str, Any],
) -> None:
    """An unfinished full load, and whether the next sync resumes it (sync/full_load/resume.py)."""
    table = planned.built.table
    if not resumable(table.mode, table.replication_key):
        return
    seen = outlook(source, dest, planned.built, planned.source)
    if seen is None:
        return
    found, reason = seen
    loaded, parts = len(found.loaded), len(found.resume.parts)
    if planned.plan.action in ("incremental", "skip_backfill"):
        row["next_action"] += f"; drops an unfinished reload ({loaded} of {parts} loaded)"
    elif planned.plan.action != "full_reload":
        return
    elif reason is None:
        row["resumable"] = {"loaded": loaded, "partitions": parts}
        row["next_action"] += f"; resumable: {loaded} of {parts} partitions loaded"
    else:
        row["next_action"] += f"; starts over ({loaded} of {parts} partitions loaded): {reason}"


@contextlib.contextmanager
def _connected(
    url: str | None, variable: str, side: str, notes: list[str]
) -> Iterator[psycopg.Connection[Any] | None]:
    if url is None:
        notes.append(f"{side} not inspected: {variable} is not set")
        yield None
        return
    try:
        conn = connect(url, side)
    except ReplicatorError as exc:
        notes.append(redact(f"{side} not inspected: {exc}"))
        yield None
        return
    with conn:
        yield conn


def _position(
    conn: psycopg.Connection[Any], planned: Planned, state: TableState | None
) -> tuple[str | None, str | None]:
    """The source's newest key, and how far the newest copied key is behind it."""
    built = planned.built
    key = built.table.replication_key
    if key is None:
        return None, None
    key_type = base_type(conn, built.replication_key_type)  # a domain's lag is its base's
    copied = _copied_positions(built, state)
    lag = (
        sql.SQL(_LAG).format(type=sql.SQL(key_type))
        if any(copied.values()) and key_type.startswith(_SUBTRACTABLE)
        else sql.SQL("NULL")
    )
    query = sql.SQL(_POSITION).format(
        lag=lag,
        type=sql.SQL(key_type),
        alias=sql.Identifier(MODEL_ALIAS),
        key=sql.Identifier(key),
        # The model is the user's SQL: `%` doubled since parameters are bound.
        model=sql.SQL(built.model.sql.replace("%", "%%")),
        # the newest key a cursor could become: an `infinity` is no lag
        finite=where_finite(
            key_type, sql.SQL("{}.{}").format(sql.Identifier(MODEL_ALIAS), sql.Identifier(key))
        ),
    )
    try:  # under the session's statement_timeout (_observe_live)
        newest, behind, ahead = execute(conn, query, copied).fetchone()
        if behind is not None and behind.startswith("-"):  # a row read, since filtered
            behind = "00:00:00" if ":" in behind else "0"
    except DatabaseError as exc:
        if exc.sqlstate != QUERY_CANCELED:
            raise
        raise _SlowModel(
            f"{built.table.written_name}: lag not computed: its model ({built.model.origin}) "
            f"took over {POSITION_TIMEOUT_SECONDS} s to return the newest key"
        ) from None
    if ahead:  # nothing is read until the source passes the cursor: not a negative lag
        raise _CursorAhead(
            newest,
            f"{built.table.written_name}: the cursor ({copied['cursor']}) is past the source's "
            f"newest key ({newest}): no sync reads a row until the source passes it. Nothing "
            "to do when the newest rows were deleted; when the source went back (a restore, "
            "a cursor set by hand) and rows behind the cursor are to be read, "
            f"`replicator state set-cursor {shlex.quote(built.table.written_name)} "
            f"{shlex.quote(newest)}` moves it back",
        )
    return newest, behind


def _copied_positions(built: TableSql, state: TableState | None) -> dict[str, str | None]:
    """The keys the last runs copied up to: the cursor, the newest key read past it, and a
    newest key read but held back (pending) while source transactions were open. None of
    them when they are not values of the key as it is now (its mode or type changed)."""
    if state is None or fitting_cursor(built, state.cursor) is None:
        return {"cursor": None, "read": None, "pending": None}
    return {
        "cursor": state.cursor.value if state.cursor else None,
        # a row read at `infinity` says nothing of how far the finite keys were read
        "read": _finite(state.window.max) if state.window else None,
        "pending": state.pending.value if state.pending else None,
    }


def _count(conn: psycopg.Connection[Any], table: TableConfig) -> int:
    target = sql.Identifier(table.target.schema, table.target.name)
    (rows,) = execute(conn, sql.SQL("SELECT count(*) FROM {}").format(target)).fetchone()
    return int(rows)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _finite(value: str | None) -> str | None:
    return None if value is None or value.lower() in ("infinity", "-infinity", "nan") else value
