"""Split a table's extraction into ranges of roughly equal size, read in one snapshot.

Page ranges (`ctid`) when the extraction reads the source table as it is: each task scans
exactly its own pages (a TID Range Scan), whatever the key. Key ranges on the model's output
otherwise: arithmetic for integer keys, sampled percentiles for others. Any set of
boundaries is correct (the ranges always cover every value, NULL included); good
boundaries only balance the work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..postgres.catalog import TableInfo
from ..postgres.database import execute

INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
SMALL_TABLE_BYTES = 32 * 1024**2
BYTES_PER_PARTITION = 1024**3
SAMPLE_ROWS = 20_000


@dataclass(frozen=True)
class KeyRange:
    """`lower <= key < upper`; a missing bound is open; `nulls` adds `OR key IS NULL`."""

    lower: str | None
    upper: str | None
    nulls: bool = False


def partition_count(table_bytes: int, parallelism: int) -> int:
    """One partition per core, more for tables over a GiB each, one for small tables."""
    if table_bytes < SMALL_TABLE_BYTES:
        return 1
    return max(parallelism, math.ceil(table_bytes / BYTES_PER_PARTITION))


def split_integer_range(low: int, high: int, count: int) -> list[KeyRange]:
    """`count` contiguous ranges over [low, high], the outer ones open-ended."""
    count = max(1, min(count, high - low + 1))
    step = math.ceil((high - low + 1) / count)
    bounds = [str(low + i * step) for i in range(1, count)]
    return ranges_from_bounds(bounds)


def ranges_from_bounds(bounds: list[str]) -> list[KeyRange]:
    """Ranges between sorted, distinct boundaries; the first also takes NULL keys."""
    edges: list[str | None] = [None, *bounds, None]
    return [KeyRange(edges[i], edges[i + 1], nulls=(i == 0)) for i in range(len(edges) - 1)]


def plan_key_ranges(
    conn: psycopg.Connection[Any],
    source: TableInfo,
    key: str | None,
    key_type: str,
    parallelism: int,
    requested: int | None = None,
    size: tuple[int, int] | None = None,
) -> list[KeyRange]:
    """Read the table's size and key bounds (inside the caller's snapshot) and split it.

    `requested` (the table's `partitions` setting) replaces the size-based count; `size`
    (bytes, estimated rows) replaces the table's own, which a partitioned table lacks."""
    if key is None or source.column(key) is None:
        return [KeyRange(None, None, nulls=True)]
    if size is None:
        (table_bytes,) = execute(conn, "SELECT pg_relation_size(%s)", (source.oid,)).fetchone()
    else:
        table_bytes = size[0]
    count = requested or partition_count(table_bytes, parallelism)
    if count == 1:
        return [KeyRange(None, None, nulls=True)]
    column, table = sql.Identifier(key), sql.Identifier(source.name.schema, source.name.name)
    if key_type in INTEGER_TYPES:
        low, high = execute(
            conn, sql.SQL("SELECT min({c}), max({c}) FROM {t}").format(c=column, t=table)
        ).fetchone()
        if low is None:
            return [KeyRange(None, None, nulls=True)]
        return split_integer_range(low, high, count)
    estimate = size[1] if size is not None else None
    return ranges_from_bounds(_sampled_bounds(conn, source, column, table, count, estimate))


def _sampled_bounds(
    conn: psycopg.Connection[Any],
    source: TableInfo,
    column: sql.Identifier,
    table: sql.Identifier,
    count: int,
    estimate: int | None,
) -> list[str]:
    if estimate is None:
        (estimate,) = execute(
            conn, "SELECT reltuples FROM pg_class WHERE oid = %s", (source.oid,)
        ).fetchone()
    estimate = max(estimate, 1)
    percent = min(100.0, 100.0 * SAMPLE_ROWS / estimate)
    fractions = [i / count for i in range(1, count)]
    (bounds,) = execute(
        conn,
        sql.SQL(
            "SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {c})::text[] "
            "FROM {t} TABLESAMPLE SYSTEM (%s) WHERE {c} IS NOT NULL"
        ).format(c=column, t=table),
        (fractions, percent),
    ).fetchone()
    return sorted(set(bounds or []), key=(bounds or []).index)


def range_predicate(key: str, key_type: str, key_range: KeyRange) -> sql.Composable | None:
    """The WHERE condition of one range on the model's output, bounds cast to the key type."""
    column = sql.Identifier(key)
    parts: list[sql.Composable] = []
    if key_range.lower is not None:
        parts.append(
            sql.SQL("{} >= {}::{}").format(column, sql.Literal(key_range.lower), sql.SQL(key_type))
        )
    if key_range.upper is not None:
        parts.append(
            sql.SQL("{} < {}::{}").format(column, sql.Literal(key_range.upper), sql.SQL(key_type))
        )
    if not parts:
        return None
    condition = sql.SQL(" AND ").join(parts)
    if key_range.nulls:
        return sql.SQL("({} OR {} IS NULL)").format(condition, column)
    return condition


@dataclass(frozen=True)
class PageRange:
    """Heap pages `first <= page < end` of the source table; `end` None is open-ended."""

    first: int
    end: int | None


def plan_page_ranges(
    conn: psycopg.Connection[Any], source: TableInfo, parallelism: int, requested: int | None
) -> list[PageRange]:
    """Equal page ranges over the table (measured inside the caller's snapshot)."""
    pages, table_bytes = execute(
        conn,
        "SELECT pg_relation_size(%s) / current_setting('block_size')::int, pg_relation_size(%s)",
        (source.oid, source.oid),
    ).fetchone()
    count = max(1, min(requested or partition_count(table_bytes, parallelism), pages or 1))
    step = math.ceil((pages or 1) / count)
    edges = [i * step for i in range(count)]
    return [
        PageRange(first, edges[i + 1] if i + 1 < count else None) for i, first in enumerate(edges)
    ]


def page_predicate(page_range: PageRange) -> sql.Composable | None:
    """`ctid` bounds of one page range (None for the whole table)."""
    parts: list[sql.Composable] = []
    if page_range.first > 0:
        parts.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({page_range.first},0)")))
    if page_range.end is not None:
        parts.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({page_range.end},0)")))
    return sql.SQL(" AND ").join(parts) if parts else None
