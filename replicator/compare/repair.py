"""Fixing exactly the rows a comparison found: extra rows deleted (or marked), missing and
different rows written from the source's snapshot, nothing else touched.

Each batch is one destination transaction, so a crash leaves whole batches done and the
next `verify --repair` finds and fixes the rest. Rows that are not in a batch are never
written: their `xmin` stays, and so does every cursor (a repair reads no replication key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.failpoints import failpoint
from ..postgres.database import execute, transaction
from ..postgres.naming import MARK_COLUMN
from . import range_sql as q
from .bisect import Found, Key
from .range_sql import Shape, Side
from .reader import RangeReader

BATCH_ROWS = 1000


@dataclass(frozen=True)
class Target:
    """The destination table a repair writes, and how it records a deleted row."""

    table: sql.Composable  # schema-qualified identifier
    columns: tuple[tuple[str, str], ...]  # the model's (name, type), in order
    mark: bool = False  # keep deleted rows, with MARK_COLUMN set


def repair(
    dest: psycopg.Connection[Any],
    reader: RangeReader,
    shape: Shape,
    source: Side,
    target: Target,
    found: Found,
) -> int:
    """Apply the fixes; the number of rows written or removed. A key on more than one source
    row is left: which of them the copy should hold is the sync's to say (the newest)."""
    repeated = set(found.repeated)
    changed = [k for k in (*found.missing, *found.different) if k not in repeated]
    done = 0
    for start in range(0, max(len(changed), len(found.extra)), BATCH_ROWS):
        extra = found.extra[start : start + BATCH_ROWS]
        keys = changed[start : start + BATCH_ROWS]
        rows = _source_rows(reader, shape, source, target, keys) if keys else []
        with transaction(dest):
            if extra:
                statement, params = remove(shape, target, extra)
                execute(dest, statement, params)
            if rows:
                statement, params = write(shape, target, rows)
                execute(dest, statement, params)
            failpoint("repair-before-commit")
        done += len(extra) + len(rows)
    return done


def remove(shape: Shape, target: Target, keys: Sequence[Key]) -> tuple[sql.Composable, list[Any]]:
    """Delete the rows with these keys, or mark them deleted (once: a mark keeps its time)."""
    if not target.mark:
        return q.delete_keys(shape, target.table, keys)
    params: list[Any] = []
    update = sql.SQL(
        "UPDATE {table} AS {alias} SET {mark} = now() WHERE {alias}.{mark} IS NULL AND {match}"
    ).format(
        table=target.table,
        alias=q.ident(q.ALIAS),
        mark=q.ident(MARK_COLUMN),
        match=q.keys_in(shape, keys, params),
    )
    return update, params


def write(
    shape: Shape, target: Target, rows: Sequence[Sequence[str | None]]
) -> tuple[sql.Composable, list[Any]]:
    extra = [(MARK_COLUMN, sql.SQL("NULL::timestamptz"))] if target.mark else []
    return q.upsert_rows(shape, target.table, target.columns, rows, extra)


def _source_rows(
    reader: RangeReader, shape: Shape, source: Side, target: Target, keys: Sequence[Key]
) -> list[tuple[str | None, ...]]:
    """The source rows with these keys, each value as text, from the comparison's snapshot."""
    names = [name for name, _ in target.columns]
    width = len(shape.key)
    rows = reader.one("source", q.rows_of(shape, source, names, keys))
    return [tuple(row[width:]) for row in rows]
