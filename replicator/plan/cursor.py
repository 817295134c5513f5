"""A replication-key cursor's rules, whole: where the next read starts, the window of rows a
sync leaves at or past it (and the probe that finds them unchanged), and what a cursor
cannot see (said by `check`).

**Never past a row that could still commit.** Right after the extraction snapshot is taken
we look at the source's open transactions (postgres/open_transactions.py: every one, with
an xid or not yet, no privilege needed). Any of them may later commit a row whose key is
below the maximum we read (an `updated_at` taken at its start, an id it drew from a
sequence earlier). So the maximum read (`hwm`) only becomes the cursor once every
transaction open at the read has ended; until then it waits as `pending` and the cursor
stays where it was. Where the role sees every session's start (a timestamp key on a
primary), the cursor goes as far as the oldest open transaction's start instead. Temporal
keys also keep a `lookback` margin against clock skew. Rows between the cursor and the
maximum are read again next time and merged idempotently. Values are compared by
PostgreSQL, in the key's own type.

**The window.** A sync records the count, newest key and hash of the rows at or past the
cursor; a run skips the table when the probe finds the same (a no-op), and `verify` counts a
row there that differs as not yet synced only when the next sync reads them again.

**What a cursor cannot see** (docs/how-it-works/incremental.md): rows
deleted in the source never pass it, a key that can be NULL is read again by every sync,
and a `timestamp without time zone` key goes backwards when the source's TimeZone changes
or in a daylight-saving fall-back hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError, UsageError
from ..base.identifiers import display_ident
from ..postgres.database import execute
from ..postgres.open_transactions import OpenTransactions, look
from ..postgres.types.type_closure import base_type
from ..project.state import Cursor, Pending, TableState, Window
from .table_sql import TableSql, batch_query

TEMPORAL_TYPES = ("timestamp", "date")


def newest_key(
    conn: psycopg.Connection[Any], rows: sql.Composable, key: str, key_type: str
) -> str | None:
    """max(key) over a query's rows, as PostgreSQL prints it (None when there are none),
    among the values a cursor may become (`finite_test`).

    Asked as the first row in descending order rather than as max(): right after a big
    write the planner's statistics say the batch has one row, and it then prefers an
    aggregate over every row of the batch (a heap fetch each) to the index's last
    entry, which ORDER BY ... LIMIT 1 takes. Same order either way:
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
        stuck = pending is not None and seen.still_open(pending)
        since = (pending.since if stuck and pending is not None else None) or _now()
        new_pending = seen.pending(hwm, since)
        target = pending.value if pending is not None and not stuck else None
    if target is None:
        return old, new_pending
    value = _greatest_of(conn, key_type, old, target, hwm, lookback_seconds if temporal else 0)
    return Cursor(value=value, type=key_type), new_pending


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# A cursor held back this long by the same transactions is said as a warning: a session left
# idle in a transaction (an application's pool, a forgotten psql) holds every cursor of the
# source back, and each batch reads again all that came since.
LONG_WAIT_SECONDS = 3600


def waiting_line(name: str, cursor: Cursor | None, pending: Pending) -> tuple[bool, str]:
    """What a sync says of a cursor that waits (`pending`): whether it has waited long (a
    warning), and the line."""
    since = pending.since or _now()
    waited = (
        datetime.now(UTC) - datetime.fromisoformat(since.replace("Z", "+00:00"))
    ).total_seconds()
    sessions = f" (pid {', '.join(map(str, pending.pids))})" if pending.pids else ""
    at = cursor.value if cursor is not None else "the start (no cursor yet)"
    text = (
        f"{name}: the cursor waits at {at} for the transactions open when the batch was read"
        f"{sessions}, since {since}: it moves to {pending.value} once they end (the rows "
        "between are read again meanwhile, nothing is missed)"
    )
    long = waited >= LONG_WAIT_SECONDS
    if long:
        text += (
            f"; it has waited {waited / 3600:.1f} h: a session idle in a transaction "
            "(pg_stat_activity state 'idle in transaction') holds it back"
        )
    return long, text


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


# ------------------------------------------------------------------ the window and the probe


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
    """What a probe found at or past a table's cursor (`probe` below, sync/probe_many.py)."""

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
    records (`fingerprint`) and what a probe of many tables compares with (probe_many.py).
    The hash needs no order: the sums of two 64-bit hashes of each row's text (seeds 0 and
    1), so a window of millions of rows (a table loaded with one `updated_at` for all) is
    one scan, not a sort (4M rows: 3.4-5.2 s against 9.9 s for md5s sorted and chained)."""

    def hashed(seed: int) -> sql.Composable:
        return sql.SQL('coalesce(sum(hashtextextended(b::text COLLATE "C", {})), 0)::text').format(
            sql.Literal(seed)
        )

    return sql.SQL("count(*), max(b.{k})::text, md5({first} || ':' || {second})").format(
        k=sql_key(built), first=hashed(0), second=hashed(1)
    )


def fingerprint(conn: psycopg.Connection[Any], built: TableSql, cursor: Cursor | None) -> Window:
    """Count, newest key and hash of the model's rows at or past the cursor."""
    rows, newest, digest = execute(
        conn,
        sql.SQL("SELECT {columns} FROM ({q}) AS b").format(
            columns=window_columns(built), q=rows_past(built, cursor)
        ),
    ).fetchone()
    return Window(rows=rows, hash=digest, max=newest)


def probe(conn: psycopg.Connection[Any], built: TableSql, state: TableState) -> ProbeResult:
    """Has anything at or past the cursor changed since it was read? One snapshot."""
    execute(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        seen = look(conn)
        limit = probe_limit(state)
        changed, rows = _changed(conn, built, state, limit)
    finally:
        execute(conn, "ROLLBACK")
    return ProbeResult(changed, still_pending(state, seen), rows, rows < limit)


def still_pending(state: TableState, seen: OpenTransactions) -> Pending | None:
    """The state's pending cursor while a transaction it waits for may still be open."""
    return state.pending if state.pending and seen.still_open(state.pending) else None


def changed_since(conn: psycopg.Connection[Any], built: TableSql, state: TableState) -> bool:
    """`probe`'s answer in the caller's transaction (`verify`: its source snapshot)."""
    return _changed(conn, built, state, probe_limit(state))[0]


def _changed(
    conn: psycopg.Connection[Any], built: TableSql, state: TableState, limit: int
) -> tuple[bool, int]:
    """Changed, and the rows counted (up to `limit`): count and newest key first (cheap),
    the hash of every row only when those match."""
    rows, newest = execute(
        conn, sql.SQL("SELECT ") + count_and_newest(built, state.cursor, limit)
    ).fetchone()
    stored = state.window
    if stored is None or (rows, newest) != (stored.rows, stored.max):
        return True, rows
    return fingerprint(conn, built, state.cursor) != stored, rows


# ------------------------------------------------------------------ what a cursor cannot see


@dataclass(frozen=True)
class Limit:
    message: str
    fix: str


def cursor_limits(
    built: TableSql, source_zone: str, key_base: str | None = None, key_not_null: bool = False
) -> list[Limit]:
    """The limits of this table's cursor, each with its fix (none for full-refresh).
    `source_zone` is the source server's default TimeZone, which local times most likely
    were written in; `key_base` the key's type under its domains, `key_not_null` whether
    one of them is NOT NULL (type_closure.domain_base)."""
    key = built.table.replication_key
    if key is None:
        return []
    name, table = display_ident(key), built.table.name
    limits = []
    if built.key_can_be_null and not key_not_null:
        limits.append(
            Limit(
                f"replication key {name} can be NULL: no cursor can order such rows, so "
                "every sync reads all of them again (merged idempotently, slow when there "
                "are many)",
                f"ALTER TABLE {table} ALTER COLUMN {name} SET NOT NULL, or a model that "
                f"coalesces it (coalesce({name}, created_at) AS {name})",
            )
        )
    if (key_base or built.replication_key_type).startswith("timestamp without time zone"):
        limits.append(
            Limit(
                f"replication key {name} is a timestamp without time zone: values written in "
                "local time go backwards when the source's TimeZone changes or in a "
                "daylight-saving fall-back hour, and the rows written then are skipped",
                f"make it timestamptz (ALTER TABLE {table} ALTER COLUMN {name} TYPE timestamptz "
                f"USING {name} AT TIME ZONE '{source_zone}', if that is the zone it was "
                f"written in), or a model that converts it ({name} AT TIME ZONE "
                f"'{source_zone}' AS {name})",
            )
        )
    return limits
