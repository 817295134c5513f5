"""The probe of many cursor tables at once (plan/window.probe's rules, one snapshot): each
table's count, newest key and hash of its rows at or past its cursor, in one statement of
fifty tables. The rows read stop one past what the last sync read there (probe_limit): more
means changed whatever their hash, so a table with a large batch waiting costs no more than
an untouched one. A run of 1,000 untouched tables probes them in twenty round trips, not
5,000 (a count first and hashes second took twice the planning: bench/RESULTS.md)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..plan.cursor import ProbeResult, probe_limit, rows_past, still_pending, window_columns
from ..plan.table_sql import TableSql
from ..postgres.database import execute, fetch_union
from ..postgres.naming import MARK_COLUMN
from ..postgres.open_transactions import look, snapshot_xmax
from ..project.state import TableState, Window

Item = tuple[Hashable, TableSql, TableState]


def probe_many(conn: psycopg.Connection[Any], items: Sequence[Item]) -> dict[Hashable, ProbeResult]:
    """Each table's probe, by key; {} when one statement fails (a model that divides by zero,
    say): each table is then probed alone, and the one at fault fails alone."""
    if not items:
        return {}
    execute(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        seen = look(conn)
        found = _windows(conn, items)
    except DatabaseError:
        return {}
    finally:
        execute(conn, "ROLLBACK")
    results = {}
    for key, _, state in items:
        rows, newest, digest = found[key]
        limit = probe_limit(state)
        # fewer rows than the limit: every row past the cursor was read, so the window is
        # exact; as many: more than the last sync read there, changed
        changed = rows >= limit or Window(rows=rows, hash=digest, max=newest) != state.window
        results[key] = ProbeResult(changed, still_pending(state, seen), rows, rows < limit)
    return results


def _windows(
    conn: psycopg.Connection[Any], items: Sequence[Item]
) -> dict[Hashable, tuple[Any, ...]]:
    """Each table's count, newest key and hash over its rows at or past its cursor, read up
    to its probe limit."""
    branches = [
        sql.SQL("SELECT {i}::int, {columns} FROM (SELECT * FROM ({q}) AS p LIMIT {n}) AS b").format(
            i=sql.Literal(i),
            columns=window_columns(built),
            q=rows_past(built, state.cursor),
            n=sql.Literal(probe_limit(state)),
        )
        for i, (_, built, state) in enumerate(items)
    ]
    rows = fetch_union(conn, branches)
    return {items[row[0]][0]: tuple(row[1:]) for row in rows}


def counts_match(
    ends_source: psycopg.Connection[Any],
    ends_dest: psycopg.Connection[Any],
    items: Sequence[Item],
) -> tuple[set[Hashable], str | None]:
    """Of `deletes` tables found unchanged at and past their cursors, those whose copy holds
    as many rows (not marked deleted) as their model reads: nothing was deleted there since
    the copy last matched it, so their delete check can be skipped. The copy holds every
    source row (the cursor's rule), and every row it holds more is one the source lost;
    equal counts mean there is none. A count each, fifty tables a statement on each side.
    Any difference, or a failed count, leaves the table to its delete check. With the
    tables, the destination's xmax before its counts (state.exact_xmax)."""
    if not items:
        return set(), None
    try:
        exact = snapshot_xmax(ends_dest)
        source = _counts(
            ends_source,
            [
                sql.SQL("SELECT * FROM ({}) AS m").format(sql.SQL(built.model.sql))
                for _, built, _ in items
            ],
        )
        dest = _counts(
            ends_dest,
            [
                sql.SQL("SELECT * FROM {}{}").format(
                    built.table.target.identifier(),
                    sql.SQL(" WHERE {} IS NULL").format(sql.Identifier(MARK_COLUMN))
                    if built.table.deletes == "mark"
                    else sql.SQL(""),
                )
                for _, built, _ in items
            ],
        )
    except DatabaseError:
        return set(), None
    return {key for i, (key, _, _) in enumerate(items) if source.get(i) == dest.get(i)}, exact


def _counts(conn: psycopg.Connection[Any], queries: list[sql.Composable]) -> dict[int, int]:
    branches = [
        sql.SQL("SELECT {}::int, count(*) FROM ({}) AS c").format(sql.Literal(i), query)
        for i, query in enumerate(queries)
    ]
    return {row[0]: row[1] for row in fetch_union(conn, branches)}
