"""`_replicator.runs` in the destination: one row per table per run, queryable with SQL,
each row with the project it is of (`project_id`: projects that share a destination see and
prune their own runs only).

A run writes all its rows in one statement (an INSERT over `unnest` of one array per column:
one round trip for a project of 1,000 tables) and deletes the rows older than `history_days`
in the same short transaction. The history is a record, not part of the sync: a destination
that cannot take it (out of reach, no privilege, a lock held) gets a warning in the log and
never changes the run's exit code. Its rows hold the results' errors, which are redacted
when the result is made (sync/context.py `failure`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError
from ..postgres.database import connect, execute, fetch_all, run_steps, transaction
from ..postgres.dest_schema import missing_schemas, schema_steps
from ..postgres.naming import INTERNAL_SCHEMA, RUNS_TABLE
from .history_rows import COLUMNS, RunRow

log = logging.getLogger("replicator.history")

# Column types, in RunRow's order: the column order readers of the table rely on
# (docs/guides/metrics-and-report.md).
TYPES = {
    "run_id": "text",
    "table_name": "text",
    "destination": "text",
    "started_at": "timestamptz",
    "finished_at": "timestamptz",
    "action": "text",
    "reason": "text",
    "status": "text",
    "rows": "bigint",
    "bytes": "bigint",
    "deleted": "bigint",
    "error": "text",
    "cursor_before": "text",
    "cursor_after": "text",
    "lag_seconds": "double precision",
    "versions_added": "bigint",
    "versions_closed": "bigint",
}
# the columns later versions added, given to a table made before them
_ADDED = ("versions_added", "versions_closed")
assert tuple(TYPES) == COLUMNS
_NOT_NULL = {"run_id", "table_name", "started_at", "finished_at", "status"}
# A run never waits long on its history: a lock held on it costs a warning, not a hang.
_TIMEOUTS = ("SET LOCAL lock_timeout = '5s'", "SET LOCAL statement_timeout = '60s'")


# The project a row is of (project/identity.py), from the destination session's setting:
# two projects that share a destination each read and prune their own runs only.
OURS = sql.SQL("nullif(pg_catalog.current_setting('replicator.project', true), '')")
PROJECT = sql.SQL("project_id IS NOT DISTINCT FROM {}").format(OURS)


def table_ddl() -> list[sql.Composed]:
    """The table and its two indexes (a table's latest rows; the pruning), if missing."""
    runs = RUNS_TABLE.identifier()
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}{}").format(
            sql.Identifier(name),
            sql.SQL(kind),
            sql.SQL(" NOT NULL" if name in _NOT_NULL else ""),
        )
        for name, kind in TYPES.items()
    )
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ({}, project_id text DEFAULT {}, "
            "PRIMARY KEY (run_id, table_name))"
        ).format(runs, columns, OURS),
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS runs_table_started ON {} (table_name, started_at)"
        ).format(runs),
        sql.SQL("CREATE INDEX IF NOT EXISTS runs_finished ON {} (finished_at)").format(runs),
    ]


def insert_statement() -> sql.Composed:
    """Every row of a run in one statement: one bound array per column."""
    names = sql.SQL(", ").join(sql.Identifier(name) for name in COLUMNS)
    arrays = sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(k)) for k in TYPES.values())
    return sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({})").format(
        RUNS_TABLE.identifier(), names, arrays
    )


def prune_statement() -> sql.Composed:
    """The project's rows past its `history_days`, and any of no project (written by hand)."""
    return sql.SQL(
        "DELETE FROM {} WHERE finished_at < now() - make_interval(days => %s) "
        "AND ({} OR project_id IS NULL)"
    ).format(RUNS_TABLE.identifier(), PROJECT)


def record(
    dest_url: str,
    rows: Sequence[RunRow],
    history_days: int,
    session: psycopg.Connection[Any] | None = None,
) -> bool:
    """Insert the run's rows and prune the old ones, on `session` (the run's own, idle) or
    a connection of their own; False (and a warning) when the destination cannot take them."""
    if not rows:
        return True
    try:
        if session is not None:
            write(session, rows, history_days)
        else:
            with connect(dest_url, "destination") as dest:
                write(dest, rows, history_days)
    except (ReplicatorError, psycopg.Error) as exc:
        log.warning(
            "the run's history was not recorded in %s (the run itself is not affected): %s",
            RUNS_TABLE,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return False
    return True


def write(dest: psycopg.Connection[Any], rows: Sequence[RunRow], history_days: int) -> None:
    """Create the table when missing, insert, prune: one transaction."""
    ensure_table(dest)
    columns = [list(column) for column in zip(*(row.values() for row in rows), strict=True)]
    with transaction(dest):
        for setting in _TIMEOUTS:
            execute(dest, setting)
        execute(dest, insert_statement(), columns)
        execute(dest, prune_statement(), (history_days,))


def ensure_table(dest: psycopg.Connection[Any]) -> None:
    (exists, current) = execute(
        dest,
        "SELECT to_regclass(%s) IS NOT NULL, EXISTS (SELECT FROM pg_catalog.pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attname = %s)",
        (RUNS_TABLE.sql(), RUNS_TABLE.sql(), _ADDED[-1]),
    ).fetchone()
    if exists and not current:  # made by an earlier version of replicator
        for name in _ADDED:
            execute(
                dest,
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    RUNS_TABLE.identifier(), sql.Identifier(name), sql.SQL(TYPES[name])
                ),
            )
    if exists:
        return
    run_steps(dest, schema_steps(missing_schemas(dest, [INTERNAL_SCHEMA])))
    for statement in table_ddl():
        execute(dest, statement)


def recent(dest: psycopg.Connection[Any], tables: Sequence[str], per_table: int) -> list[RunRow]:
    """The latest `per_table` rows of each of these tables (source names), newest first
    within a table; none when no run was recorded yet."""
    (exists,) = execute(dest, "SELECT to_regclass(%s) IS NOT NULL", (RUNS_TABLE.sql(),)).fetchone()
    if not exists:
        return []
    names = sql.SQL(", ").join(sql.Identifier(name) for name in COLUMNS)
    query = sql.SQL(
        "SELECT {names} FROM (SELECT {names}, row_number() OVER (PARTITION BY table_name "
        "ORDER BY started_at DESC, finished_at DESC) AS newest FROM {runs} "
        "WHERE table_name = ANY(%s) AND {ours}) AS r WHERE newest <= %s "
        "ORDER BY table_name, started_at DESC, finished_at DESC"
    ).format(names=names, runs=RUNS_TABLE.identifier(), ours=PROJECT)
    return [RunRow(*row) for row in fetch_all(dest, query, (list(tables), per_table))]
