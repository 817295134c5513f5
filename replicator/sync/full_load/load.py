"""A table's full reload: copy one snapshot into a side table with Spark, then swap it in.

1. Destination: schema, user-defined types, a fresh side table in `_replicator` (no key yet).
2. Source: export a snapshot; read the first cursor and the partition bounds inside it.
3. Spark: one task per partition streams COPY from source to side table (copy_stream.py).
4. Destination: build the primary key, analyze, swap (swap.py).
A crash before the swap leaves the live table untouched. A cursor table's load resumes in
the next run from its committed partitions (resume.py); any other starts over.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import DatabaseError, TableProblem
from ...base.failpoints import failpoint
from ...base.identifiers import TableName, display_ident
from ...plan.cursor import first_cursor
from ...plan.table_sql import TableSql
from ...postgres.catalog import TableInfo
from ...postgres.copy_objects import CopyIndex
from ...postgres.database import Endpoints, execute, render, run_steps
from ...postgres.dependent_views import reload_problem
from ...postgres.history_tables import Versions, snapshot_steps
from ...postgres.naming import MARKER_TABLE
from ...postgres.snapshot import ExportedSnapshot
from ...postgres.swap import read_facts, swap_in
from ...project.state import Cursor, Pending, Window
from ...spark.runner import SparkRunner
from ...transfer.copy_progress import NO_PROGRESS, Sink, watch_copy
from ...transfer.markers import discard, forget_loads, forget_markers, fresh_load_id
from ...transfer.partitions import KeyRange
from ..incremental.batch import say_repeated_keys
from ..scripts import (
    DestinationFacts,
    applied_steps,
    key_statement,
    key_steps,
    prepare_steps,
    side_key_name,
    side_table,
)
from . import resume
from .parts import estimated_rows, part_tasks, plan_parts

log = logging.getLogger(__name__)

UNIQUE_VIOLATION = psycopg.errors.UniqueViolation.sqlstate
NOT_NULL_VIOLATION = psycopg.errors.NotNullViolation.sqlstate


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
    versions: Versions | None = None  # what the load wrote in the table's history
    resumed: tuple[int, int] | None = None  # (partitions an earlier run loaded, partitions)


def full_reload(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    spark: SparkRunner,
    progress: Sink = NO_PROGRESS,
    *,
    capture: bool = False,
    resumable: bool = False,
    fresh: bool = False,
) -> LoadResult:
    """Reload the table from one consistent snapshot; return what was copied. With
    `capture` (a `cdc` table), the snapshot comes with its log position, which the swap
    records as the table's applied position (cdc/source/slot_snapshot.py). `resumable` (a
    cursor table): the load can be resumed if it is killed, and resumes an unfinished one
    unless `fresh` (sync --full-refresh)."""
    phases = _Phases(built.table.written_name)
    target = built.table.target
    _ = built.history  # a history table that cannot be kept fails the table before it copies
    blocked = reload_problem(ends.dest, target)
    if blocked is not None:  # found before anything is copied, not by the swap at the end
        problem, fix = blocked
        raise TableProblem(f"{built.table.written_name}: {problem}; fix: {fix}")
    estimate = estimated_rows(ends.source, source)
    in_process = not spark.needed_for(estimate)
    found = resume.usable(ends, built, source, fresh) if resumable else None
    load_id = found.resume.load_id if found else fresh_load_id(target)
    if not in_process:
        spark.warm_up()  # the JVM starts while types and the side table are created
    try:
        return _load_and_swap(
            ends,
            built,
            source,
            spark,
            progress,
            estimate,
            in_process,
            phases,
            capture,
            found,
            load_id,
            resumable,
        )
    except BaseException as exc:
        unusable = isinstance(exc, NullInTheKey)
        if not (resumable and resume.kept(ends.dest, built, load_id, unusable=unusable)):
            also = [resume.forget_step(target)] if resumable else []
            discard(ends.dest, target, [side_table(target)], also)
        raise


def prepare_destination(ends: Endpoints, built: TableSql, keep_side: bool = False) -> TableName:
    """Schemas, bookkeeping, types and an empty side table (scripts.prepare_steps)."""
    facts = DestinationFacts.read(ends.source, ends.dest, built)
    run_steps(ends.dest, prepare_steps(built, facts, keep_side=keep_side))
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
    found: resume.Found | None,
    load_id: str,
    resumable: bool,
) -> LoadResult:
    target = built.table.target
    progress.phase("preparing the destination")
    side = prepare_destination(ends, built, keep_side=found is not None)
    phases.mark("destination prepared")
    if found is None:
        forget_loads(ends.dest, target)
    lsn: int | None = None
    if capture:
        from ...cdc.apply.applied import ensure_applied_table  # a cdc table's only

        ensure_applied_table(ends.dest)
        # a slot's snapshot waits for every transaction open in the source to end
        progress.phase("waiting for the source's open transactions (a log snapshot waits)")
    with _load_snapshot(ends.source_url, capture) as snap:
        assert snap.conn is not None
        if found is None:
            progress.phase("reading the first cursor from the model, in the load's snapshot")
            cursor, pending, window = first_cursor(snap.conn, built)
            progress.phase("planning partitions" + ("" if in_process else ", starting Spark"))
            parallelism = 1 if in_process else spark.parallelism()
            parts = plan_parts(snap.conn, built, source, parallelism)
            todo = list(range(len(parts)))
            if resumable and resume.can_resume(built, parts):
                node = resume.relfilenode(snap.conn, source)
                shape = resume.shape_of(built)
                plan = resume.Resume(load_id, parts, cursor, pending, window, shape, node)
                run_steps(ends.dest, [resume.record_step(target, load_id, plan.as_json())])
        else:
            resume.check_unchanged(snap.conn, source, found, built.table.written_name)
            cursor, pending, window = found.resume.cursor, found.resume.pending, found.resume.window
            parts = found.resume.parts
            todo = [i for i in range(len(parts)) if i not in found.loaded]
            log.info(
                "%s: resuming the load: %d of %d partitions loaded, copying %d",
                built.table.written_name,
                len(found.loaded),
                len(parts),
                len(todo),
            )
        phases.mark("snapshot exported" + ("" if in_process else ", Spark ready"))
        urls = (ends.source_url, ends.dest_url)
        tasks = part_tasks(snap.snapshot_id, urls, built, load_id, parts, todo)
        progress.phase("copying")
        with watch_copy(ends.dest_url, side, load_id, len(parts), estimate, progress):
            results = spark.run_copy_tasks(tasks, in_process=in_process) if tasks else []
        engine = "in this process" if in_process else f"on {spark.where}"
        phases.mark(
            f"copied {len(tasks)} partition(s) {engine} (task seconds: "
            f"{', '.join(f'{r.seconds:.1f}' for r in results)})"
        )
        if capture:
            lsn = snap.lsn  # a slot's snapshot (_load_snapshot): its position in the log
        taken_at = snap.taken_at
    failpoint("after-load-before-swap")
    rows, size = _loaded(ends.dest, load_id)
    progress.phase("building the primary key and indexes, analyzing")
    moved = found is not None and not isinstance(parts[0], KeyRange)  # page ranges
    wanted = read_facts(ends.dest, target).objects.with_configured(built.indexes).indexes
    removed, indexes = _finish_side_table(
        ends.dest, side, built, [i for i in wanted if i.tail is not None], rows_moved_pages=moved
    )
    rows -= removed if moved else 0  # read twice, kept once
    phases.mark(f"primary key and {len(indexes)} index(es) built, analyzed")
    progress.phase("swapping the new table in")
    also = applied_steps(target, lsn)
    # Any full load ends an unfinished one (a table whose mode changed, say).
    also.append(resume.forget_step(target))
    if built.history is not None:  # the copy and its history change together
        assert taken_at is not None
        also += snapshot_steps(built.history, taken_at)
    swapped = swap_in(ends.dest, side, target, side_key_name(built), also, indexes)
    versions = None
    if built.history is not None:  # its last two statements close, then open versions
        closed, added = swapped.also_rows[-2:]
        versions = Versions(added=added, closed=closed)
    lock_seconds = swapped.lock_seconds
    phases.mark(f"swapped (table lock held {lock_seconds * 1000:.0f} ms)")
    said = {i.name for i in wanted if i not in indexes and i.tail is not None}
    for index in swapped.left_out:
        if index.name not in said:  # made while the load ran, or of a shape not rebuilt
            log.warning(
                "%s: the reload left out index %s of the copy (made while it loaded, or of a "
                "kind it cannot rebuild); to create it again: %s",
                built.table.written_name,
                display_ident(index.name),
                index.statement(target),
            )
    forget_markers(ends.dest, load_id)
    return LoadResult(
        rows=rows,
        bytes=size,
        cursor=cursor,
        pending=pending,
        window=window,
        partitions=len(parts),
        lock_seconds=lock_seconds,
        lsn=lsn,
        versions=versions,
        resumed=(len(found.loaded), len(parts)) if found else None,
    )


def _load_snapshot(source_url: str, capture: bool) -> ExportedSnapshot:
    """The load's snapshot: a `cdc` table's from a new slot, with its log position (the
    log's modules imported for such a table only), any other's exported by a session."""
    if not capture:
        return ExportedSnapshot(source_url)
    from ...cdc.source.slot_snapshot import SlotSnapshot

    return SlotSnapshot(source_url)


def _loaded(dest: psycopg.Connection[Any], load_id: str) -> tuple[int, int]:
    """Rows and bytes the load's partitions committed (an earlier run's included)."""
    (rows, size) = execute(
        dest,
        sql.SQL(
            "SELECT coalesce(sum(rows), 0), coalesce(sum(bytes), 0) FROM {} WHERE load_id = %s"
        ).format(MARKER_TABLE.identifier()),
        (load_id,),
    ).fetchone()
    return int(rows), int(size)


class _Phases:
    """Debug log lines with the time each step of a load took."""

    def __init__(self, table: str) -> None:
        self.table, self.last = table, time.monotonic()

    def mark(self, what: str) -> None:
        now = time.monotonic()
        log.debug("%s: %s in %.2f s", self.table, what, now - self.last)
        self.last = now


def _keep_newest_version_per_key(
    dest: psycopg.Connection[Any], side: TableName, built: TableSql, rows_moved_pages: bool
) -> int:
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
    if rows_moved_pages:  # an updated row read from its old page and its new one: the catch-up
        log.info(  # that follows brings its newest version in any case
            "%s: %d row(s) moved pages between the resumed load's snapshots; kept one "
            "version of each key",
            built.table.written_name,
            removed,
        )
    else:
        say_repeated_keys(built, removed)
    return removed


def _finish_side_table(
    dest: psycopg.Connection[Any],
    side: TableName,
    built: TableSql,
    indexes: list[CopyIndex],
    *,
    rows_moved_pages: bool,
) -> tuple[int, list[CopyIndex]]:
    """Build the primary key and the copy's indexes after the load, then analyze, before
    readers see the table (scripts.key_steps). A model that returned a key twice fails the
    key build once; so does a resumed load of page ranges where a row moved pages between
    its two snapshots. Returns how many rows that removed, and the indexes built."""
    key = key_statement(built)
    key_text = render(key) if key is not None else None
    target = built.table.target
    of_index = {step.text: index for index in indexes for step in index.build(side, target)}
    removed, failed = 0, set()
    for step in key_steps(built, indexes):
        index = of_index.get(step.text)
        if index is not None and index.name in failed:
            continue
        try:
            execute(dest, step.statement, step.params)
        except DatabaseError as exc:
            if index is not None:
                failed.add(_index_failed(built, index, exc))
                continue
            if step.text == key_text and exc.sqlstate == NOT_NULL_VIOLATION:
                raise _null_in_the_key(built) from None
            if step.text != key_text or exc.sqlstate != UNIQUE_VIOLATION:
                raise
            removed = _keep_newest_version_per_key(dest, side, built, rows_moved_pages)
            execute(dest, step.statement, step.params)
    return removed, [index for index in indexes if index.name not in failed]


def _index_failed(built: TableSql, index: CopyIndex, exc: DatabaseError) -> str:
    """An index the new rows or columns do not allow: one `tables[].indexes` asks for fails
    the table; one someone made on the copy is left out, said with its statement."""
    name, target = built.table.written_name, built.table.target
    why = str(exc).removeprefix("destination: ").replace(index.built_name(target), index.name)
    if exc.detail:
        why += f" ({exc.detail.rstrip('.')})"
    if index.configured:
        raise TableProblem(
            f"{name}: the index {display_ident(index.name)} that tables-config.json asks for "
            f"cannot be built on the reloaded table: {why}; fix the rows or the entry"
        ) from None
    log.warning(
        "%s: the reload left out index %s of the copy: it cannot be built on the new rows or "
        "columns (%s); to create it again: %s",
        name,
        display_ident(index.name),
        why,
        index.statement(built.table.target),
    )
    return index.name


class NullInTheKey(TableProblem):
    """The model returned a row with NULL in a primary key column (a `primary_key` chosen
    in the config over nullable columns): no copy can have that key, and the rows copied
    are of no use to a resumed load."""


def _null_in_the_key(built: TableSql) -> NullInTheKey:
    name = built.table.written_name
    columns = ", ".join(map(display_ident, built.primary_key))
    return NullInTheKey(
        f"{name}: the source has rows with NULL in the primary key ({columns}), which a "
        "primary key cannot hold: fix those rows in the source, or set `primary_key` to "
        "columns that are never NULL; the next sync starts the load over"
    )
