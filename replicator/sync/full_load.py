"""A table's full reload: copy one snapshot into a side table with Spark, then swap it in.

1. Destination: schema, user-defined types, a fresh side table in `_replicator` (no key yet).
2. Source: export a snapshot; read the first cursor and the partition bounds inside it.
3. Spark: one task per partition streams COPY from source to side table (copy_stream.py).
4. Destination: build the primary key, analyze, swap (swap.py).
A crash before the swap leaves the live table untouched; the next run drops the stale side
table and starts over.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlglot import exp

from ..errors import DatabaseError, TableProblem
from ..failpoints import failpoint
from ..identifiers import TableName
from ..plan.table_sql import MODEL_ALIAS, TableSql
from ..postgres import ddl
from ..postgres.catalog import TableInfo
from ..postgres.database import execute
from ..postgres.dependent_views import reload_problem
from ..postgres.dest_schema import ensure_bookkeeping, ensure_schemas
from ..postgres.dest_types import ensure_types
from ..postgres.naming import INTERNAL_SCHEMA, derived_name, retired_table
from ..postgres.snapshot import ExportedSnapshot
from ..postgres.swap import swap_in
from ..project.state import Cursor, Pending, Window
from ..transfer.copy_progress import NO_PROGRESS, Sink, watch_copy
from ..transfer.copy_stream import CopyTask
from ..transfer.copy_tasks import copy_tasks
from ..transfer.markers import discard, forget_markers, new_load_id
from ..transfer.partitions import page_predicate, plan_key_ranges, plan_page_ranges, range_predicate
from ..transfer.spark_runner import SparkRunner
from .context import Endpoints
from .cursor import first_cursor

log = logging.getLogger(__name__)

UNIQUE_VIOLATION = psycopg.errors.UniqueViolation.sqlstate


@dataclass(frozen=True)
class LoadResult:
    rows: int
    bytes: int
    cursor: Cursor | None
    pending: Pending | None
    window: Window | None
    partitions: int
    lock_seconds: float


def side_table(target: TableName) -> TableName:
    """Where a full reload of `target` is loaded before the swap."""
    return TableName(INTERNAL_SCHEMA, derived_name("new", target))


def prepare_destination(ends: Endpoints, built: TableSql) -> TableName:
    """Schemas, types and an empty side table (a stale one from a crash is dropped)."""
    dest, target = ends.dest, built.table.target
    ensure_schemas(dest, [target.schema])
    ensure_bookkeeping(dest)
    ensure_types(ends.source, dest, [c.type_oid for c in built.columns])
    side = side_table(target)
    for statement in side_table_statements(built):
        execute(dest, statement)
    return side


def side_table_statements(built: TableSql) -> list[exp.Expression]:
    """A fresh side table, without its key (building the key after the load measured faster
    than maintaining it: bench/RESULTS.md). What a killed run left is dropped first: a stale
    side table, and a replaced table the swap renamed aside but did not drop yet."""
    side, target = side_table(built.table.target), built.table.target
    return [
        ddl.drop_table(retired_table(target)),
        ddl.drop_table(side),
        ddl.create_table(side, built.columns),
    ]


def side_key_name(built: TableSql) -> str | None:
    """The side table's primary-key name while it is built; the swap renames it."""
    return derived_name("pk", built.table.target) if built.primary_key else None


def side_key_statement(built: TableSql) -> sql.Composable | None:
    """The primary key, built on the loaded side table."""
    name = side_key_name(built)
    if name is None:
        return None
    side = side_table(built.table.target)
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
        sql.Identifier(side.schema, side.name),
        sql.Identifier(name),
        sql.SQL(", ").join(map(sql.Identifier, built.primary_key)),
    )


def full_reload(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    spark: SparkRunner,
    progress: Sink = NO_PROGRESS,
) -> LoadResult:
    """Reload the table from one consistent snapshot; return what was copied."""
    phases = _Phases(built.table.written_name)
    blocked = reload_problem(ends.dest, built.table.target)
    if blocked is not None:  # found before anything is copied, not by the swap at the end
        problem, fix = blocked
        raise TableProblem(f"{built.table.written_name}: {problem}; fix: {fix}")
    estimate = _estimated_rows(ends.source, source)
    in_process = not spark.needed_for(estimate)
    if not in_process:
        spark.warm_up()  # the JVM starts while types and the side table are created
    try:
        return _load_and_swap(ends, built, source, spark, progress, estimate, in_process, phases)
    except BaseException:
        discard(ends.dest, built.table.target, [side_table(built.table.target)])
        raise


def _load_and_swap(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    spark: SparkRunner,
    progress: Sink,
    estimate: int,
    in_process: bool,
    phases: _Phases,
) -> LoadResult:
    progress.phase("preparing the destination")
    side = prepare_destination(ends, built)
    phases.mark("destination prepared")
    load_id = new_load_id(ends.dest, built.table.target)
    with ExportedSnapshot(ends.source_url) as snap:
        assert snap.conn is not None
        progress.phase("reading the first cursor from the model, in the load's snapshot")
        cursor, pending, window = first_cursor(snap.conn, built)
        progress.phase("planning partitions" + ("" if in_process else ", starting Spark"))
        parallelism = 1 if in_process else spark.parallelism()
        phases.mark("snapshot exported" + ("" if in_process else ", Spark ready"))
        tasks = _copy_tasks(snap, ends, built, source, side, load_id, parallelism)
        progress.phase("copying")
        with watch_copy(ends.dest_url, side, load_id, len(tasks), estimate, progress):
            results = spark.run_copy_tasks(tasks, in_process=in_process)
        phases.mark(
            f"copied {len(tasks)} partition(s) (task seconds: "
            f"{', '.join(f'{r.seconds:.1f}' for r in results)})"
        )
    failpoint("after-load-before-swap")
    progress.phase("building the primary key, analyzing")
    _finish_side_table(ends.dest, side, built)
    phases.mark("primary key built, analyzed")
    target = built.table.target
    progress.phase("swapping the new table in")
    lock_seconds = swap_in(ends.dest, side, target)
    phases.mark(f"swapped (table lock held {lock_seconds * 1000:.0f} ms)")
    forget_markers(ends.dest, load_id)
    return LoadResult(
        rows=sum(r.rows for r in results),
        bytes=sum(r.bytes for r in results),
        cursor=cursor,
        pending=pending,
        window=window,
        partitions=len(tasks),
        lock_seconds=lock_seconds,
    )


class _Phases:
    """Debug log lines with the time each step of a load took."""

    def __init__(self, table: str) -> None:
        self.table, self.last = table, time.monotonic()

    def mark(self, what: str) -> None:
        now = time.monotonic()
        log.debug("%s: %s in %.2f s", self.table, what, now - self.last)
        self.last = now


def _estimated_rows(conn: psycopg.Connection[Any], source: TableInfo) -> int:
    """pg_class's row estimate; from the size when the table was never analyzed."""
    (estimate,) = execute(
        conn,
        "SELECT CASE WHEN reltuples >= 0 THEN reltuples::bigint "
        "ELSE pg_relation_size(oid) / 100 END FROM pg_catalog.pg_class WHERE oid = %s",
        (source.oid,),
    ).fetchone()
    return int(estimate)


def _copy_tasks(
    snap: ExportedSnapshot,
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    side: TableName,
    load_id: str,
    parallelism: int,
) -> list[CopyTask]:
    return copy_tasks(
        load_id,
        ends.source_url,
        ends.dest_url,
        snap.snapshot_id,
        _partition_queries(snap, built, source, parallelism),
        (side.schema, side.name),
        [c.name for c in built.columns],
        freeze=True,
        origin=built.model.origin,
    )


def _partition_queries(
    snap: ExportedSnapshot, built: TableSql, source: TableInfo, parallelism: int
) -> list[sql.Composable]:
    """One SELECT per partition: page ranges of the table, else key ranges of the model."""
    assert snap.conn is not None
    model, requested = sql.SQL(built.model.sql), built.table.partitions
    if built.model.reads_table_as_is and source.kind == "table":
        pages = plan_page_ranges(snap.conn, source, parallelism, requested)
        predicates = [page_predicate(p) for p in pages]
        # The built-in model is `SELECT <columns> FROM <table>`: the bounds go straight on.
        return [model if p is None else sql.SQL("{} WHERE {}").format(model, p) for p in predicates]
    key = built.primary_key[0] if built.primary_key else None
    key_type = built.type_of(key or "")
    ranges = plan_key_ranges(snap.conn, source, key, key_type, parallelism, requested)
    queries: list[sql.Composable] = []
    for key_range in ranges:
        predicate = range_predicate(key, key_type, key_range) if key else None
        queries.append(
            model
            if predicate is None
            else sql.SQL("SELECT * FROM ({}) AS {} WHERE {}").format(
                model, sql.Identifier(MODEL_ALIAS), predicate
            )
        )
    return queries


def _keep_newest_version_per_key(
    dest: psycopg.Connection[Any], side: TableName, built: TableSql
) -> None:
    """The model emitted a key more than once: keep the version an incremental merge would
    keep (highest replication key, ties broken by the row's text), so both paths agree."""
    key = built.table.replication_key
    order = [sql.SQL("{} DESC").format(sql.Identifier(key))] if key else []
    order.append(sql.SQL("s::text DESC"))
    removed = execute(
        dest,
        sql.SQL(
            "DELETE FROM {side} AS d USING (SELECT ctid, row_number() OVER "
            "(PARTITION BY {key} ORDER BY {order}) AS n FROM {side} AS s) AS r "
            "WHERE d.ctid = r.ctid AND r.n > 1"
        ).format(
            side=sql.Identifier(side.schema, side.name),
            key=sql.SQL(", ").join(map(sql.Identifier, built.primary_key)),
            order=sql.SQL(", ").join(order),
        ),
    ).rowcount
    log.warning(
        "%s: the model returned %d row(s) whose primary key another row also has; kept the "
        "newest version of each key",
        built.table.written_name,
        removed,
    )


def _finish_side_table(dest: psycopg.Connection[Any], side: TableName, built: TableSql) -> None:
    """Build the primary key after the load, then analyze, before readers see the table."""
    table = sql.Identifier(side.schema, side.name)
    # A bigger sort budget lets PostgreSQL build the key in memory, with parallel workers.
    execute(dest, "SET maintenance_work_mem = '512MB'")
    key = side_key_statement(built)
    if key is not None:
        try:
            execute(dest, key)
        except DatabaseError as exc:
            if exc.sqlstate != UNIQUE_VIOLATION:
                raise
            _keep_newest_version_per_key(dest, side, built)
            execute(dest, key)
    execute(dest, sql.SQL("ANALYZE {}").format(table))
    execute(dest, "RESET maintenance_work_mem")
