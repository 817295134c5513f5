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

from ..capture.applied import ensure_applied_table, record_applied_step
from ..capture.slot_snapshot import SlotSnapshot
from ..errors import DatabaseError, TableProblem
from ..failpoints import failpoint
from ..identifiers import TableName
from ..plan.table_sql import MODEL_ALIAS, TableSql
from ..postgres.catalog import TableInfo
from ..postgres.database import execute, render, run_steps
from ..postgres.dependent_views import reload_problem
from ..postgres.endpoints import Endpoints
from ..postgres.snapshot import ExportedSnapshot
from ..postgres.swap import swap_in
from ..project.state import Cursor, Pending, Window
from ..transfer.copy_progress import NO_PROGRESS, Sink, watch_copy
from ..transfer.copy_stream import CopyTask
from ..transfer.copy_tasks import copy_tasks
from ..transfer.markers import discard, forget_markers, new_load_id
from ..transfer.partitions import page_predicate, plan_key_ranges, plan_page_ranges, range_predicate
from ..transfer.spark_runner import SparkRunner
from .cursor import first_cursor
from .scripts import (
    DestinationFacts,
    key_statement,
    key_steps,
    prepare_steps,
    side_key_name,
    side_table,
)

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
    lsn: int | None = None  # a `cdc` table: the log position its snapshot holds


def full_reload(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    spark: SparkRunner,
    progress: Sink = NO_PROGRESS,
    *,
    capture: bool = False,
) -> LoadResult:
    """Reload the table from one consistent snapshot; return what was copied. With
    `capture` (a `cdc` table), the snapshot comes with its log position, which the swap
    records as the table's applied position (capture/slot_snapshot.py)."""
    phases = _Phases(built.table.written_name)
    blocked = reload_problem(ends.dest, built.table.target)
    if blocked is not None:  # found before anything is copied, not by the swap at the end
        problem, fix = blocked
        raise TableProblem(f"{built.table.written_name}: {problem}; fix: {fix}")
    estimate = estimated_rows(ends.source, source)
    in_process = not spark.needed_for(estimate)
    if not in_process:
        spark.warm_up()  # the JVM starts while types and the side table are created
    try:
        return _load_and_swap(
            ends, built, source, spark, progress, estimate, in_process, phases, capture
        )
    except BaseException:
        discard(ends.dest, built.table.target, [side_table(built.table.target)])
        raise


def prepare_destination(ends: Endpoints, built: TableSql) -> TableName:
    """Schemas, bookkeeping, types and an empty side table (scripts.prepare_steps)."""
    facts = DestinationFacts.read(ends.source, ends.dest, built)
    run_steps(ends.dest, prepare_steps(built, facts))
    return side_table(built.table.target)


def _load_and_swap(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    spark: SparkRunner,
    progress: Sink,
    estimate: int,
    in_process: bool,
    phases: _Phases,
    capture: bool,
) -> LoadResult:
    progress.phase("preparing the destination")
    side = prepare_destination(ends, built)
    phases.mark("destination prepared")
    load_id = new_load_id(ends.dest, built.table.target)
    lsn: int | None = None
    if capture:
        ensure_applied_table(ends.dest)
    with SlotSnapshot(ends.source_url) if capture else ExportedSnapshot(ends.source_url) as snap:
        assert snap.conn is not None
        progress.phase("reading the first cursor from the model, in the load's snapshot")
        cursor, pending, window = first_cursor(snap.conn, built)
        progress.phase("planning partitions" + ("" if in_process else ", starting Spark"))
        parallelism = 1 if in_process else spark.parallelism()
        phases.mark("snapshot exported" + ("" if in_process else ", Spark ready"))
        urls = (ends.source_url, ends.dest_url)
        tasks = load_tasks(snap.conn, snap.snapshot_id, urls, built, source, load_id, parallelism)
        progress.phase("copying")
        with watch_copy(ends.dest_url, side, load_id, len(tasks), estimate, progress):
            results = spark.run_copy_tasks(tasks, in_process=in_process)
        phases.mark(
            f"copied {len(tasks)} partition(s) (task seconds: "
            f"{', '.join(f'{r.seconds:.1f}' for r in results)})"
        )
        if isinstance(snap, SlotSnapshot):
            lsn = snap.lsn
    failpoint("after-load-before-swap")
    progress.phase("building the primary key, analyzing")
    _finish_side_table(ends.dest, side, built)
    phases.mark("primary key built, analyzed")
    target = built.table.target
    progress.phase("swapping the new table in")
    also = [record_applied_step(target, lsn)] if lsn is not None else []
    lock_seconds = swap_in(ends.dest, side, target, side_key_name(built), also)
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
        lsn=lsn,
    )


class _Phases:
    """Debug log lines with the time each step of a load took."""

    def __init__(self, table: str) -> None:
        self.table, self.last = table, time.monotonic()

    def mark(self, what: str) -> None:
        now = time.monotonic()
        log.debug("%s: %s in %.2f s", self.table, what, now - self.last)
        self.last = now


def estimated_rows(conn: psycopg.Connection[Any], source: TableInfo) -> int:
    """pg_class's row estimate; from the size when the table was never analyzed."""
    (estimate,) = execute(
        conn,
        "SELECT CASE WHEN reltuples >= 0 THEN reltuples::bigint "
        "ELSE pg_relation_size(oid) / 100 END FROM pg_catalog.pg_class WHERE oid = %s",
        (source.oid,),
    ).fetchone()
    return int(estimate)


def load_tasks(
    conn: psycopg.Connection[Any],
    snapshot: str,
    urls: tuple[str, str],
    built: TableSql,
    source: TableInfo,
    load_id: str,
    parallelism: int,
) -> list[CopyTask]:
    """The load's COPY tasks, one per partition, partitions read through `conn` (inside the
    snapshot, for a load; outside it, for `compile`)."""
    side = side_table(built.table.target)
    return copy_tasks(
        load_id,
        *urls,
        snapshot,
        _partition_queries(conn, built, source, parallelism),
        (side.schema, side.name),
        [c.name for c in built.columns],
        freeze=True,
        origin=built.model.origin,
    )


def _partition_queries(
    conn: psycopg.Connection[Any], built: TableSql, source: TableInfo, parallelism: int
) -> list[sql.Composable]:
    """One SELECT per partition: page ranges of the table, else key ranges of the model."""
    model, requested = sql.SQL(built.model.sql), built.table.partitions
    if built.model.reads_table_as_is and source.kind == "table":
        pages = plan_page_ranges(conn, source, parallelism, requested)
        predicates = [page_predicate(p) for p in pages]
        # The built-in model is `SELECT <columns> FROM <table>`: the bounds go straight on.
        return [model if p is None else sql.SQL("{} WHERE {}").format(model, p) for p in predicates]
    key = built.primary_key[0] if built.primary_key else None
    key_type = built.type_of(key or "")
    ranges = plan_key_ranges(conn, source, key, key_type, parallelism, requested)
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
    """Build the primary key after the load, then analyze, before readers see the table
    (scripts.key_steps). A model that returned a key twice fails the key build once."""
    key = key_statement(built)
    key_text = render(key) if key is not None else None
    for step in key_steps(built):
        try:
            execute(dest, step.statement, step.params)
        except DatabaseError as exc:
            if step.text != key_text or exc.sqlstate != UNIQUE_VIOLATION:
                raise
            _keep_newest_version_per_key(dest, side, built)
            execute(dest, step.statement, step.params)
