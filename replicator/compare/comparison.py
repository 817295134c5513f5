"""Setting up one table's comparison: the two sides, the key, the snapshots, the first cuts,
and where the first pass runs. Shared by `verify` (every column) and the delete check of
cursor tables (the key alone)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..plan.table_sql import TableSql
from ..postgres.catalog import Column
from ..postgres.database import Endpoints, execute
from ..postgres.snapshot import ExportedSnapshot, ImportedSnapshot
from ..project.config import TableConfig
from ..spark.runner import SparkRunner
from . import range_sql as q
from .bisect import Found, find_differences
from .reader import RangeReader
from .repair import MARK_COLUMN, Target
from .thresholds import estimated_rows, first_thresholds

# A keys-only comparison (the delete check) starts Spark only for tables this many times
# `spark.min_rows`, or when the run's Spark is up already: a JVM start costs more than
# hashing a few million keys in PostgreSQL.
KEYS_ONLY_FACTOR = 20


@dataclass(frozen=True)
class Sides:
    """What one table's comparison reads and, for a repair, writes."""

    shape: q.Shape
    source: q.Side
    destination: q.Side
    target: Target
    keys_only: bool = False


def sides_of(
    ends: Endpoints,
    table: TableConfig,
    built: TableSql,
    destination_columns: tuple[Column, ...],
    *,
    keys_only: bool = False,
) -> Sides:
    """The model's rows against the destination table's (its rows marked deleted left
    out); every column hashed, or with `keys_only` the primary key alone."""
    shape = key_shape(ends, built.columns, built.primary_key)
    if keys_only:
        shape = q.Shape(shape.key, tuple(built.primary_key), fast_hash=shape.fast_hash)
    marked = any(c.name == MARK_COLUMN for c in destination_columns)
    unmarked = sql.SQL("{}.{} IS NULL").format(q.ident(q.ALIAS), q.ident(MARK_COLUMN))
    return Sides(
        shape,
        q.source_side(built.model.sql),
        q.destination_side(table.target.schema, table.target.name, unmarked if marked else None),
        Target(
            q.ident(table.target.schema, table.target.name),
            tuple((c.name, c.type) for c in built.columns),
            mark=marked,
        ),
        keys_only,
    )


# On the source's snapshot: the test of a source row the next sync copies, with its values.
Fresh = Callable[[psycopg.Connection[Any]], tuple[sql.Composable, list[Any]] | None]


@contextlib.contextmanager
def compared(
    ends: Endpoints,
    table: TableConfig,
    sides: Sides,
    spark: SparkRunner,
    fresh: Fresh | None = None,
    source_snapshot: str | None = None,
) -> Iterator[tuple[Found, RangeReader]]:
    """Compare the sides, each in a snapshot that stays open for the block (a repair reads
    the source rows it writes from the same snapshot). `fresh` gives, on the source's
    snapshot, which source rows are not yet synced (bisect.py). `source_snapshot`: the
    source side reads that exported snapshot (a new slot's, for `cdc restart`) instead of
    its own."""
    rows, pages = estimated_rows(ends.dest, table.target)
    on_spark = rows > 0 and spark.needed_for(rows)
    if sides.keys_only:  # hashing keys is cheap: worth a JVM start only for huge tables
        on_spark = rows > 0 and (spark.started or spark.needed_for(rows // KEYS_ONLY_FACTOR))
    if on_spark:
        spark.warm_up()  # the JVM starts while the snapshots are taken and the cuts read
    with (
        (
            ImportedSnapshot(ends.source_url, source_snapshot)
            if source_snapshot is not None
            else ExportedSnapshot(ends.source_url, "source")
        ) as ours,
        ExportedSnapshot(ends.dest_url, "destination") as theirs,
    ):
        assert theirs.conn is not None and ours.conn is not None
        reader = RangeReader(ours, theirs, spark if on_spark else None)
        cuts = first_thresholds(theirs.conn, sides.shape, table.target, rows, pages)
        found = find_differences(
            reader,
            sides.shape,
            sides.source,
            sides.destination,
            cuts,
            fresh=fresh(ours.conn) if fresh is not None else None,
            # one range per two cores and side: the servers, not Spark, do the hashing
            chunks=max(spark.parallelism() // 2, 1) if on_spark else 1,
        )
        yield found, reader


def key_shape(
    ends: Endpoints, columns: tuple[Column, ...], primary_key: tuple[str, ...]
) -> q.Shape:
    """The key columns with their types, whether each is text-like (has a collation), and
    the row hash both servers compute alike."""
    by_name = {c.name: c for c in columns}
    oids = [by_name[k].type_oid for k in primary_key]
    collatable = dict(
        execute(
            ends.source,
            "SELECT t.oid, t.typcollation <> 0 FROM pg_catalog.pg_type t WHERE t.oid = ANY(%s)",
            (oids,),
        ).fetchall()
    )
    key = tuple(
        q.KeyColumn(k, by_name[k].type, bool(collatable.get(by_name[k].type_oid, True)))
        for k in primary_key
    )
    fast = agree_on_fast_hash(ends.source, ends.dest)
    return q.Shape(key, tuple(c.name for c in columns), fast_hash=fast)


def agree_on_fast_hash(source: psycopg.Connection[Any], dest: psycopg.Connection[Any]) -> bool:
    """Whether both servers compute `hashtextextended` alike. It is PostgreSQL's stable
    hash-partitioning function, but its bytes follow the machine's byte order: a big-endian
    server on one side would make every row look different, so md5 is used then."""
    values = []
    for conn in (source, dest):
        try:
            values.append(execute(conn, q.FAST_HASH_PROBE).fetchone()[0])
        except DatabaseError:
            return False
    return values[0] == values[1]
