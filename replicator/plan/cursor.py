"""Where the next incremental read starts: never past a row that could still commit.

Right after the extraction snapshot is taken we look at the source's open transactions
(postgres/open_transactions.py: every one, with an xid or not yet, no privilege needed).
Any of them may later commit a row whose key is below the maximum we read (an `updated_at`
taken at its start, an id it drew from a sequence earlier). So the maximum read (`hwm`)
only becomes the cursor once every transaction open at the read has ended; until then it
waits as `pending` and the cursor stays where it was. Where the role sees every session's
start (a timestamp key on a primary), the cursor goes as far as the oldest open
transaction's start instead. Temporal keys also keep a `lookback` margin against clock
skew. Rows between the cursor and the maximum are read again next time and merged
idempotently. Values are compared by PostgreSQL, in the key's own type.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError, UsageError
from ..postgres.database import execute
from ..postgres.open_transactions import OpenTransactions, look
from ..postgres.types.type_closure import base_type
from ..project.state import Cursor, Pending, Window
from .table_sql import TableSql
from .window import fingerprint

TEMPORAL_TYPES = ("timestamp", "date")


def newest_key(
    conn: psycopg.Connection[Any], rows: sql.Composable, key: str, key_type: str
) -> str | None:
    """max(key) over a query's rows, as PostgreSQL prints it (None when there are none),
    among the values a cursor may become (`finite_test`).

    Asked as the first row in descending order rather than as max(): right after a big
    write the planner's statistics say the batch has one row, and it then prefers an
    aggregate over every row of the batch (a heap fetch each, 0.3-0.5 s for 60,000 rows)
    to the index's last entry, which ORDER BY ... LIMIT 1 takes. Same order either way:
    both use the type's default ordering and the column's collation."""
    alias = sql.Identifier("_replicator_rows")
    ref = sql.SQL("{}.{}").format(alias, sql.Identifier(key))
    row = execute(
        conn,
        sql.SQL("SELECT {r}::text FROM ({q}) AS {a} WHERE {w} ORDER BY {r} DESC LIMIT 1").format(
            r=ref, q=rows, a=alias, w=set_and_finite(base_type(conn, key_type), ref)
        ),
    ).fetchone()
    return row[0] if row else None


def set_and_finite(key_type: str, ref: sql.Composable) -> sql.Composable:
    """The key value `ref` is not NULL (NULLs come first in descending order) and is one a
    cursor may become (`finite_test`): the rows whose first and last in key order are the
    index's two ends."""
    finite = finite_test(key_type, ref)
    not_null = sql.SQL("{} IS NOT NULL").format(ref)
    return not_null if finite is None else sql.SQL("{} AND {}").format(not_null, finite)


def where_finite(key_type: str, ref: sql.Composable) -> sql.Composable:
    """` WHERE` the key value `ref` is one a cursor may become (`finite_test`), or empty."""
    test = finite_test(key_type, ref)
    return sql.SQL("") if test is None else sql.SQL(" WHERE {}").format(test)


def finite_test(key_type: str, ref: sql.Composable) -> sql.Composable | None:
    """The test that the key value `ref` is one a cursor may become: not `infinity` (dates,
    timestamps, floats, numeric) nor NaN; None for a type without such values (`key_type`
    is a domain's base type, type_closure.base_type). A cursor
    at infinity would never see a later row (every finite key is below it); a row keyed so
    is read again by every run instead, as a row at the cursor is."""
    if key_type.startswith(TEMPORAL_TYPES):
        return sql.SQL("isfinite({})").format(ref)
    if key_type.startswith(("real", "double precision")):
        return sql.SQL("{} < 'Infinity'").format(ref)  # NaN sorts above Infinity
    if key_type.startswith("numeric"):
        return sql.SQL("scale({}) IS NOT NULL").format(ref)  # NULL for NaN and ±Infinity
    return None


def advance(
    conn: psycopg.Connection[Any],
    key_type: str,
    old: Cursor | None,
    pending: Pending | None,
    hwm: str | None,
    seen: OpenTransactions,
    lookback_seconds: int,
) -> tuple[Cursor | None, Pending | None]:
    """The cursor and pending value to store after reading everything up to `hwm`, with
    `seen` the transactions open at the read's snapshot."""
    if hwm is None:  # nothing read: nothing new to wait for
        return old, pending if pending and seen.still_open(pending) else None
    temporal = base_type(conn, key_type).startswith(TEMPORAL_TYPES)  # a domain's too
    oldest = seen.oldest_start if temporal else None
    new_pending: Pending | None = None
    if seen.nothing_open:
        target: str | None = hwm
    elif oldest is not None:  # no open transaction can produce a key below its own start
        target = _least(conn, key_type, hwm, oldest)
    else:
        new_pending = seen.pending(hwm)
        target = pending.value if pending is not None and not seen.still_open(pending) else None
    if target is None:
        return old, new_pending
    value = _greatest_of(conn, key_type, old, target, hwm, lookback_seconds if temporal else 0)
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
    """greatest(old, least(target, hwm - lookback)), computed in the key's type (a
    temporal one when `lookback_seconds` is set)."""
    kind = sql.SQL(key_type)
    ceiling: sql.Composable = sql.SQL("{}::{}").format(sql.Literal(hwm), kind)
    if lookback_seconds:
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


def first_cursor(
    conn: psycopg.Connection[Any], built: TableSql
) -> tuple[Cursor | None, Pending | None, Window | None]:
    """The cursor after a full load, from the load's own snapshot (cursor.py's rules): the
    first thing read in it, so that its look at the open transactions comes right after the
    snapshot (open_transactions.py)."""
    key = built.table.replication_key
    if key is None:
        return None, None, None
    seen = look(conn)
    hwm = newest_key(conn, sql.SQL(built.model.sql), key, built.replication_key_type)
    cursor, pending = advance(
        conn, built.replication_key_type, None, None, hwm, seen, built.table.lookback
    )
    return cursor, pending, fingerprint(conn, built, cursor)
