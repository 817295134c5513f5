"""Where the first pass cuts the key space: about every BUCKET_ROWS rows, read cheaply from
the destination table (which has the primary-key index the cuts follow).

- A key whose first column is an integer: evenly spaced values between its smallest and
  largest (two index probes), which for the usual dense ids gives buckets of nearly equal
  size.
- Any other key: the first column's values in a random sample of the table's pages
  (`TABLESAMPLE SYSTEM`, a few percent of them).
The first pass cuts on the key's first column only: a composite key's later columns are cut
on by the bisection, inside the buckets that differ.
- A small or empty destination: no cut at all; the one bucket is cut by the bisection if
  it differs.
Uneven buckets cost a little time, never correctness: a bucket too big to compare row by
row is cut again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import TableName
from ..postgres.database import execute
from . import range_sql as q
from .bisect import LEAF_ROWS
from .range_sql import Bound, Shape

BUCKET_ROWS = 250
SAMPLED_ROWS_PER_CUT = 1000  # a sampled key per this many rows: fewer pages read
INTEGER_TYPES = ("smallint", "integer", "bigint")


def estimated_rows(conn: psycopg.Connection[Any], target: TableName) -> tuple[int, int]:
    """The destination table's rows and pages as last counted by PostgreSQL (vacuum,
    analyze, index builds); counted now when it never was."""
    rows, pages = execute(
        conn,
        "SELECT c.reltuples::bigint, c.relpages FROM pg_catalog.pg_class c "
        "WHERE c.oid = %s::regclass",
        (sql.Identifier(target.schema, target.name).as_string(None),),
    ).fetchone()
    if rows < 0:
        (rows,) = execute(
            conn,
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(target.schema, target.name)),
        ).fetchone()
    return int(rows), int(pages)


def first_thresholds(
    conn: psycopg.Connection[Any], shape: Shape, target: TableName, rows: int, pages: int
) -> Sequence[Bound]:
    """The cuts of the first pass, read inside the destination's snapshot."""
    if rows < 2 * LEAF_ROWS:
        return []
    side = q.destination_side(target.schema, target.name)
    if shape.key[0].type in INTEGER_TYPES:
        return _evenly_spaced(conn, shape, target, rows)
    cuts = max(rows // SAMPLED_ROWS_PER_CUT, 1)
    percent = min(100.0, 100.0 * cuts / max(pages, 1))
    statement, params = q.sample(shape, side, percent)
    keys = [tuple(row) for row in execute(conn, statement, params).fetchall()]
    step = max(len(keys) // cuts, 1)
    return keys[step - 1 :: step] if step > 1 else keys


def _evenly_spaced(
    conn: psycopg.Connection[Any], shape: Shape, target: TableName, rows: int
) -> Sequence[Bound]:
    key = sql.Identifier(shape.key[0].name)  # cut on the first column only
    low, high = execute(
        conn,
        sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(
            key, sql.Identifier(target.schema, target.name)
        ),
    ).fetchone()
    if low is None:
        return []
    buckets = max(rows // BUCKET_ROWS, 1)
    width = max((high - low + 1) // buckets, 1)
    return q.EvenCuts(low + width, high, width)
