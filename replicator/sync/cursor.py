"""Where the next incremental read starts: never past a row that could still commit.

Inside the extraction snapshot we know which source transactions are still in progress
(`pg_snapshot_xip`, no privilege needed). Any of them may later commit a row whose key is
below the maximum we read (an `updated_at` taken at its start, an id it drew from a
sequence earlier). So the maximum read (`hwm`) only becomes the cursor once every
transaction that was in progress when it was read has ended; until then it waits as
`pending` and the cursor stays where it was. Temporal keys also keep a `lookback` margin
against clock skew. Rows between the cursor and the maximum are read again next time and
merged idempotently. Values are compared by PostgreSQL, in the key's own type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError, UsageError
from ..plan.table_sql import TableSql, batch_query
from ..postgres.database import execute
from ..project.state import Cursor, Pending, TableState, Window

TEMPORAL_TYPES = ("timestamp", "date")


def newest_key(conn: psycopg.Connection[Any], rows: sql.Composable, key: str) -> str | None:
    """max(key) over a query's rows, as PostgreSQL prints it (None when there are none)."""
    alias = sql.Identifier("_replicator_rows")
    (value,) = execute(
        conn,
        sql.SQL("SELECT max({a}.{k})::text FROM ({q}) AS {a}").format(
            a=alias, k=sql.Identifier(key), q=rows
        ),
    ).fetchone()
    return value


def in_progress_xids(conn: psycopg.Connection[Any]) -> list[str]:
    """Transactions in progress in the current snapshot (the caller's transaction)."""
    rows = execute(
        conn, "SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) AS x ORDER BY 1"
    ).fetchall()
    return [row[0] for row in rows]


_OLDEST_WRITER = """
SELECT count(a.xact_start) = cardinality(%(xids)s::text[]), min(a.xact_start)::text
FROM pg_catalog.pg_stat_activity a
WHERE (a.backend_xid::text)::numeric
      = ANY (SELECT x::numeric %% 4294967296 FROM unnest(%(xids)s::text[]) AS x)
"""


def oldest_writer_start(conn: psycopg.Connection[Any], xids: list[str]) -> str | None:
    """When every in-progress transaction is visible in pg_stat_activity (needs
    pg_read_all_stats for other roles' sessions), the start of the oldest one."""
    if not xids:
        return None
    seen_all, oldest = execute(conn, _OLDEST_WRITER, {"xids": xids}).fetchone()
    return oldest if seen_all else None


def advance(
    conn: psycopg.Connection[Any],
    key_type: str,
    old: Cursor | None,
    pending: Pending | None,
    hwm: str | None,
    xids: list[str],
    lookback_seconds: int,
) -> tuple[Cursor | None, Pending | None]:
    """The cursor and pending value to store after reading everything up to `hwm`."""
    if hwm is None:  # nothing read: nothing new to wait for
        return old, pending if pending and set(pending.xids) & set(xids) else None
    waiting = set(xids)
    oldest = oldest_writer_start(conn, xids) if key_type.startswith(TEMPORAL_TYPES) else None
    if not waiting:
        target: str | None = hwm
    elif oldest is not None:  # no open writer can produce a key below its own start
        target = _least(conn, key_type, hwm, oldest)
        waiting = set()
    elif pending is not None and not set(pending.xids) & waiting:
        target = pending.value
    else:
        target = None
    new_pending = Pending(value=hwm, xids=xids) if waiting else None
    if target is None:
        return old, new_pending
    value = _greatest_of(conn, key_type, old, target, hwm, lookback_seconds)
    return Cursor(value=value, type=key_type), new_pending


def _least(conn: psycopg.Connection[Any], key_type: str, a: str, b: str) -> str:
    kind = sql.SQL(key_type)
    (value,) = execute(
        conn,
        sql.SQL("SELECT least({}::{}, {}::{})::text").format(
            sql.Literal(a), kind, sql.Literal(b), kind
        ),
    ).fetchone()
    return value


def _greatest_of(
    conn: psycopg.Connection[Any],
    key_type: str,
    old: Cursor | None,
    target: str,
    hwm: str,
    lookback_seconds: int,
) -> str:
    """greatest(old, least(target, hwm - lookback)), computed in the key's type."""
    kind = sql.SQL(key_type)
    ceiling: sql.Composable = sql.SQL("{}::{}").format(sql.Literal(hwm), kind)
    if lookback_seconds and key_type.startswith(TEMPORAL_TYPES):
        ceiling = sql.SQL("({} - make_interval(secs => {}))::{}").format(
            ceiling, sql.Literal(lookback_seconds), kind
        )
    candidate = sql.SQL("least({}::{}, {})").format(sql.Literal(target), kind, ceiling)
    if old is not None:
        candidate = sql.SQL("greatest({}::{}, {})").format(sql.Literal(old.value), kind, candidate)
    (value,) = execute(conn, sql.SQL("SELECT ({})::text").format(candidate)).fetchone()
    return value


def canonical_value(conn: psycopg.Connection[Any], value: str, key_type: str, subject: str) -> str:
    """A value typed by hand, cast by PostgreSQL to the key's type and printed back as the
    cursor text; exit 2 naming the value and the type when it is not one."""
    try:
        (text,) = execute(
            conn, sql.SQL("SELECT %s::{}::text").format(sql.SQL(key_type)), (value,)
        ).fetchone()
    except ReplicatorError as exc:
        raise UsageError(f"{subject}: {value!r} is not a valid {key_type}: {exc}") from None
    return text


def rows_past(built: TableSql, cursor: Cursor | None) -> sql.Composable:
    """The model's rows at or past the cursor (all of them without one)."""
    assert built.table.replication_key is not None
    return batch_query(
        built.model.sql,
        built.table.replication_key,
        built.replication_key_type,
        cursor.value if cursor else None,
        with_nulls=built.key_can_be_null,
    )


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found at or past a table's cursor (incremental.probe, probe_many)."""

    changed: bool
    pending: Pending | None
    rows: int  # rows at or past the cursor: the size of the batch a sync would read
    exact: bool = True  # False: the count stopped at its limit (probe_limit)


def probe_limit(state: TableState) -> int:
    """How far a probe counts the rows at or past the cursor: one more than the last sync
    read there (more means changed; fewer, rows gone), one without a record of that."""
    return state.window.rows + 1 if state.window is not None else 1


def count_and_newest(built: TableSql, cursor: Cursor | None, limit: int | None) -> sql.Composable:
    """The count and the newest key of the model's rows at or past the cursor, as two
    columns. With `limit`, the count stops there: an index range scan reads that many rows,
    not a whole batch scattered over the table; the newest key is an index lookup."""
    past = rows_past(built, cursor)
    if limit is None:
        return sql.SQL("count(*), max(b.{k})::text FROM ({q}) AS b").format(
            k=sql_key(built), q=past
        )
    return sql.SQL(
        "(SELECT count(*) FROM (SELECT 1 FROM ({q}) AS b LIMIT {n}) AS c), "
        "(SELECT max(b.{k}) FROM ({q}) AS b)::text"
    ).format(k=sql_key(built), q=past, n=sql.Literal(limit))


def sql_key(built: TableSql) -> sql.Identifier:
    """The replication key, quoted."""
    return sql.Identifier(built.table.replication_key or "")


def window_columns(built: TableSql) -> sql.Composable:
    """Count, newest key and hash of the rows `b`, as a Window holds them: what a sync
    records (`fingerprint`) and what a probe of many tables compares with (probe_many.py)."""
    return sql.SQL(
        "count(*), max(b.{k})::text, "
        "coalesce(md5(string_agg(md5(b::text), '' ORDER BY md5(b::text))), '')"
    ).format(k=sql_key(built))


def fingerprint(conn: psycopg.Connection[Any], built: TableSql, cursor: Cursor | None) -> Window:
    """Count, newest key and hash of the model's rows at or past the cursor."""
    rows, newest, digest = execute(
        conn,
        sql.SQL("SELECT {columns} FROM ({q}) AS b").format(
            columns=window_columns(built), q=rows_past(built, cursor)
        ),
    ).fetchone()
    return Window(rows=rows, hash=digest, max=newest)


def first_cursor(
    conn: psycopg.Connection[Any], built: TableSql
) -> tuple[Cursor | None, Pending | None, Window | None]:
    """The cursor after a full load, from the load's own snapshot (cursor.py's rules)."""
    key = built.table.replication_key
    if key is None:
        return None, None, None
    hwm = newest_key(conn, sql.SQL(built.model.sql), key)
    xids = in_progress_xids(conn)
    cursor, pending = advance(
        conn, built.replication_key_type, None, None, hwm, xids, built.table.lookback
    )
    if cursor is None and hwm is not None:  # writers in progress: start over from the start
        pending = Pending(value=hwm, xids=xids)
    return cursor, pending, fingerprint(conn, built, cursor)
