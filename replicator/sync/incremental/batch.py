"""A table's incremental batch: the rows at or past its cursor read in one snapshot, staged
in the destination and merged in one destination transaction, and where the cursor goes.

Two ways. The direct one, for a batch this process copies whole: the source reads it in one
REPEATABLE READ transaction of the run's own session (no other session joins the read, so no
snapshot is exported), and the destination stages it in a temporary table inside the merge's
own transaction, dropped as that transaction ends: no staging table to create beforehand,
drop afterwards or leave behind when the run is killed, and no marker, since nothing retries
the copy. The general one, for a batch copied on Spark, in COPY's text form (whose names
need the source's search_path on the destination) or staged in parts (merge_pipeline.py):
UNLOGGED staging tables in `_replicator`, and an exported snapshot the copy tasks import,
with a marker per task; a batch staged in parts is read by this process alone, so its
snapshot is a transaction of the run's own source session too, and it keeps no markers.
Either way the open transactions are looked at right after the snapshot,
then the newest key is read, the rows copied, and the new cursor and its fingerprint taken
in the same snapshot.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from ...base.failpoints import failpoint
from ...base.identifiers import TableName
from ...plan.cursor import advance, count_and_newest, fingerprint, newest_key, set_and_finite
from ...plan.table_sql import TableSql, batch_query
from ...postgres.database import Endpoints, execute, run_steps, transaction
from ...postgres.history_tables import Versions, batch_steps
from ...postgres.naming import MAX_STAGING_PARTS, staging_table, staging_tables
from ...postgres.open_transactions import look
from ...postgres.snapshot import ExportedSnapshot, SessionSnapshot
from ...postgres.types.type_closure import base_type
from ...project.state import Cursor, Pending, TableState, Window
from ...spark.engine_choice import IN_PROCESS
from ...spark.runner import SparkRunner
from ...transfer.copy_progress import NO_PROGRESS, Sink, watch_copy
from ...transfer.copy_stream import (
    SOURCE_BEGIN,
    CopyResult,
    CopyTask,
    copy_errors,
    stream_between,
)
from ...transfer.copy_tasks import copy_tasks
from ...transfer.markers import discard, forget_markers, fresh_load_id, new_load_id
from ...transfer.partitions import KeyRange, range_predicate
from ..context import KeyBounds
from ..scripts import (
    DestinationFacts,
    DirectBatch,
    direct_batch,
    drop_staging_steps,
    staging_steps,
)
from .merge_pipeline import copy_and_merge, merge_errors, part_rows

log = logging.getLogger(__name__)
PART_ALIAS = "_replicator_part"


@dataclass(frozen=True)
class IncrementalResult:
    rows_read: int
    rows_merged: int
    bytes: int
    cursor: Cursor | None
    pending: Pending | None
    window: Window | None
    versions: Versions | None = None  # written in the table's history table


def batch_size(conn: psycopg.Connection[Any], built: TableSql, state: TableState) -> int:
    """The exact number of rows at or past the cursor (a probe stops counting early)."""
    (rows, _) = execute(
        conn, sql.SQL("SELECT ") + count_and_newest(built, state.cursor, None)
    ).fetchone()
    return int(rows)


@dataclass(frozen=True)
class Batch:
    """One incremental read: the model's rows at or past the cursor (or a re-sync's key
    range), how many the probe counted, and whether this process copies them. `keyed` is
    the same rows less those with a NULL key: the newest key is read from it, where the
    index on the key can answer (an `OR key IS NULL` would stop it). `part_rows`: the rows
    of each part it is staged and merged in (merge_pipeline.py), 0 for whole."""

    query: sql.Composable
    keyed: sql.Composable
    key: str
    key_type: str
    rows: int
    in_process: bool
    part_rows: int = 0
    direct: bool = False  # copied whole by this process, on the run's sessions

    @property
    def parts(self) -> int:
        """How many staging tables the batch is copied into."""
        return MAX_STAGING_PARTS if self.part_rows else 1


@dataclass(frozen=True)
class BatchRead:
    """What reading a batch copied, and where the cursor goes after it."""

    copied: CopyResult
    cursor: Cursor | None
    pending: Pending | None
    window: Window | None
    merged: int | None = None  # staged in parts: the rows their merges inserted or changed
    taken_at: datetime | None = None  # the snapshot's time (postgres/snapshot.py)


def batch_for(
    built: TableSql, state: TableState, rows: int, in_process: bool, resync: KeyBounds | None
) -> Batch:
    key, key_type = built.table.replication_key, built.replication_key_type
    assert key is not None
    since, until = (
        (resync.since, resync.until)
        if resync is not None
        else (state.cursor.value if state.cursor else None, None)
    )
    # A re-sync reads a key range; a sync also the rows no cursor can order (NULL keys).
    with_nulls = resync is None and built.key_can_be_null
    query = batch_query(built.model.sql, key, key_type, since, until, with_nulls=with_nulls)
    keyed = batch_query(built.model.sql, key, key_type, since, until) if with_nulls else query
    each = part_rows(built, rows or _previous_batch(state), in_process)
    direct = in_process and not each and not built.copies_as_text
    return Batch(query, keyed, key, key_type, rows, in_process, each, direct)


def _previous_batch(state: TableState) -> int:
    """The rows the last incremental batch read: what a batch of unknown size is taken to be
    (a probe stops counting at the first rows past the cursor's; counting a batch whose
    rows were just written reads every one of them, a heap fetch each)."""
    return state.batch_rows or 0


def incremental_sync(
    ends: Endpoints,
    built: TableSql,
    state: TableState,
    spark: SparkRunner,
    batch_rows: int,
    progress: Sink = NO_PROGRESS,
    resync: KeyBounds | None = None,
    leftovers: frozenset[TableName] = frozenset(),
) -> IncrementalResult:
    """Read the batch (rows at or past the cursor) and merge it; return the new cursor.

    With `resync`, read that key range instead and leave cursor, pending and window as the
    state has them (a bounded re-sync never moves the cursor). `leftovers`: the staging
    tables and retired copies a killed run left (plan/read_ahead.py), which the direct way
    drops (the general way drops them whether they are there or not)."""
    assert built.merge is not None
    batch = batch_for(built, state, batch_rows, not spark.needed_for(batch_rows), resync)
    if batch.direct:
        return _direct(ends, built, state, batch, progress, resync, leftovers)
    if not batch.in_process:
        spark.warm_up()  # the JVM starts while the staging table is prepared
    facts = DestinationFacts.read(ends.source, ends.dest, built, types=False)
    run_steps(ends.dest, staging_steps(built, facts, batch.parts))
    try:
        read = _read_batch(ends, built, state, spark, batch, progress, resync)
        merged, versions = read.merged, None
        if merged is None:  # staged whole: merged now
            failpoint("after-staging-copy")
            progress.phase("merging")
            merged, versions = _merge(ends.dest, built, read.taken_at)
    except BaseException:
        discard(ends.dest, built.table.target, staging_tables(built.table.target, batch.parts))
        raise
    run_steps(ends.dest, drop_staging_steps(built, batch.parts))
    copied = read.copied
    return IncrementalResult(
        copied.rows, merged, copied.bytes, read.cursor, read.pending, read.window, versions
    )


def _direct(
    ends: Endpoints,
    built: TableSql,
    state: TableState,
    batch: Batch,
    progress: Sink,
    resync: KeyBounds | None,
    leftovers: frozenset[TableName],
) -> IncrementalResult:
    """The direct way: copied and merged on the run's two sessions (see above)."""
    script = direct_batch(built, batch.query, leftovers)
    dest, source = ends.dest, ends.source
    if script.drop is not None:
        run_steps(dest, [script.drop])
    with transaction(dest):
        run_steps(dest, [script.create])
        with transaction(source, SOURCE_BEGIN, rollback=True):
            seen = look(source)  # right after the snapshot: open_transactions.py
            taken_at = None
            if built.history is not None:  # the transaction's start: before its snapshot
                (taken_at,) = execute(source, "SELECT now()").fetchone()
            progress.phase("reading the batch's newest key from the model")
            hwm = newest_key(source, batch.keyed, batch.key, batch.key_type)
            progress.phase("copying")
            copied = _copy_directly(ends, script, batch.rows, progress)
            cursor, pending, window = state.cursor, state.pending, state.window
            if resync is None:
                progress.phase("computing the new cursor")
                cursor, pending = advance(
                    source, batch.key_type, cursor, pending, hwm, seen, built.table.lookback
                )
                window = fingerprint(source, built, cursor)
        failpoint("after-staging-copy")
        progress.phase("merging")
        _say_repeated_keys(dest, built, script.staging)
        with merge_errors(built):
            merged = execute(dest, script.merge.statement).rowcount
            failpoint("mid-merge")
        versions = _write_versions(dest, built, script.staging.identifier(), taken_at)
    log.debug("%s: merged, %d row(s) inserted or changed", built.table.written_name, merged)
    return IncrementalResult(copied.rows, merged, copied.bytes, cursor, pending, window, versions)


def _write_versions(
    dest: psycopg.Connection[Any],
    built: TableSql,
    staged: sql.Composable,
    taken_at: datetime | None,
) -> Versions | None:
    """The batch's versions in the table's history table, in the merge's transaction."""
    history = built.history
    if history is None:
        return None
    assert taken_at is not None
    written = batch_steps(
        history,
        staged,
        taken_at,
        built.table.replication_key,
        built.replication_key_type,
        append=built.table.mode == "incremental-append",
    )
    counts = {}
    for step in written.steps:
        counts[id(step)] = execute(dest, step.statement, step.params).rowcount
    return Versions(
        added=max(counts[id(written.open)], 0), closed=max(counts[id(written.close)], 0)
    )


def _copy_directly(ends: Endpoints, script: DirectBatch, rows: int, progress: Sink) -> CopyResult:
    """The batch streamed from the source's transaction into the destination's."""
    started = time.monotonic()
    pid = ends.dest.info.backend_pid  # a temporary table: the watcher finds its COPY so
    with (
        watch_copy(ends.dest_url, script.staging, "", 1, rows, progress, pid=pid),
        copy_errors(script.origin),
    ):
        copied, size = stream_between(
            ends.source, ends.dest, script.copy_out.text, script.copy_in.text
        )
    return CopyResult(0, copied, size, time.monotonic() - started)


def batch_tasks(
    conn: psycopg.Connection[Any],
    snapshot: str,
    urls: tuple[str, str],
    built: TableSql,
    batch: Batch,
    load_id: str,
    parallelism: int,
) -> list[CopyTask]:
    """The batch's COPY tasks into staging, split by key range when it is big (ranges read
    through `conn`: inside the snapshot for a sync, outside it for `compile`): for Spark,
    into one staging table; in parts (merge_pipeline.py), each into its own."""
    target, columns = built.table.target, [c.name for c in built.columns]
    if batch.parts > 1:  # one COPY out, cut into the parts' tables as it comes
        return [
            task
            for part, table in enumerate(staging_tables(target, batch.parts))
            for task in copy_tasks(
                load_id,
                *urls,
                snapshot,
                [batch.query],
                (table.schema, table.name),
                columns,
                origin=built.model.origin,
                parts=[part],
            )
        ]
    staging = staging_table(target)
    parts = 1 if batch.in_process else _batch_partitions(built, batch.rows, parallelism)
    return copy_tasks(
        load_id,
        *urls,
        snapshot,
        _split_batch(conn, batch.query, batch.keyed, batch.key, batch.key_type, parts),
        (staging.schema, staging.name),
        columns,
        origin=built.model.origin,
        text=built.copies_as_text,
    )


def _read_batch(
    ends: Endpoints,
    built: TableSql,
    state: TableState,
    spark: SparkRunner,
    batch: Batch,
    progress: Sink,
    resync: KeyBounds | None,
) -> BatchRead:
    """Copy the batch into staging inside one exported snapshot; compute the new cursor."""
    target = built.table.target
    staging = staging_table(target)
    in_parts = batch.parts > 1  # read by this process alone, on the run's session
    with SessionSnapshot(ends.source) if in_parts else ExportedSnapshot(ends.source_url) as snap:
        assert snap.conn is not None
        seen = look(snap.conn)  # right after the snapshot: open_transactions.py
        progress.phase("reading the batch's newest key from the model")
        hwm = newest_key(snap.conn, batch.keyed, batch.key, batch.key_type)
        load_id = fresh_load_id(target) if in_parts else new_load_id(ends.dest, target)
        if not batch.in_process:
            progress.phase("starting Spark")
        parallelism = 1 if batch.in_process else spark.parallelism()
        urls = (ends.source_url, ends.dest_url)
        tasks = batch_tasks(snap.conn, snap.snapshot_id, urls, built, batch, load_id, parallelism)
        progress.phase("copying" if batch.parts == 1 else "copying and merging")
        with watch_copy(ends.dest_url, staging, load_id, len(tasks), batch.rows, progress):
            results, merged = _copy(ends, built, spark, batch, tasks)
        copied = _combined(results)
        log.debug(
            "%s: batch of %d row(s) read in %d partition(s)%s",
            built.table.written_name,
            copied.rows,
            len(tasks),
            " in-process" if batch.in_process else " on Spark",
        )
        if not in_parts:  # the parts keep no markers
            forget_markers(ends.dest, load_id)
        _say_repeated_keys(ends.dest, built, staging)
        if resync is not None:
            return BatchRead(
                copied, state.cursor, state.pending, state.window, merged, snap.taken_at
            )
        progress.phase("computing the new cursor")
        cursor, pending = advance(
            snap.conn, batch.key_type, state.cursor, state.pending, hwm, seen, built.table.lookback
        )
        window = fingerprint(snap.conn, built, cursor)
    return BatchRead(copied, cursor, pending, window, merged, snap.taken_at)


def _copy(
    ends: Endpoints, built: TableSql, spark: SparkRunner, batch: Batch, tasks: list[CopyTask]
) -> tuple[list[CopyResult], int | None]:
    """Run the batch's copy tasks; staged in parts, merge each as it lands (the rows merged,
    else None: the batch is merged whole afterwards)."""
    if batch.parts == 1:
        return spark.run_copy_tasks(tasks, in_process=batch.in_process), None
    staged = staging_tables(built.table.target, len(tasks))
    merges = [built.merge_from(table) or "" for table in staged]
    result, merged = copy_and_merge(ends.source, ends.dest, built, tasks, merges, batch.part_rows)
    spark.choice.record(IN_PROCESS, result.rows, result.seconds)
    return [result], merged


ROWS_PER_PARTITION = 250_000
_SPLITTABLE = ("timestamp", "date", "smallint", "integer", "bigint", "numeric")


def _batch_partitions(built: TableSql, batch_rows: int, parallelism: int) -> int:
    """The table's `partitions` setting, else one per 250,000 rows, at most one per core."""
    if built.table.partitions:
        return built.table.partitions
    return max(1, min(parallelism, batch_rows // ROWS_PER_PARTITION))


def _split_batch(
    conn: psycopg.Connection[Any],
    query: sql.Composable,
    keyed: sql.Composable,
    key: str,
    key_type: str,
    parts: int,
) -> list[sql.Composable]:
    """Equal ranges of the replication key over the batch (each an index range scan). The
    ends are read from `keyed` (the batch's rows with a key) as its first and last rows in
    key order, the index's two ends: a min() and max() would read every row of the batch
    while the statistics are older than its rows (cursor.newest_key)."""
    key_type = base_type(conn, key_type)  # a domain splits as what it stands on
    if parts <= 1 or not key_type.startswith(_SPLITTABLE):
        return [query]
    # Counts inlined as literals: the model text is the user's and may contain `%`. The
    # ranges span the finite keys (the first and last ranges are open: they take the rest).
    ref = sql.SQL("b.{}").format(sql.Identifier(key))
    first = sql.SQL("(SELECT {r} FROM ({q}) AS b WHERE {w} ORDER BY {r} {o} LIMIT 1)")
    lo, hi = (
        first.format(r=ref, q=keyed, w=set_and_finite(key_type, ref), o=sql.SQL(order))
        for order in ("ASC", "DESC")
    )
    (bounds,) = execute(
        conn,
        sql.SQL(
            "SELECT array_agg(DISTINCT (lo + (hi - lo) * i / {n})::text) "
            "FROM (SELECT {lo} AS lo, {hi} AS hi) AS r, "
            "generate_series(1, {n} - 1) AS i WHERE lo < hi"
        ).format(lo=lo, hi=hi, n=sql.Literal(parts)),
    ).fetchone()
    if not bounds:
        return [query]
    ordered = execute(
        conn,
        sql.SQL("SELECT array_agg(b::text ORDER BY b::{t}) FROM unnest(%s::text[]) AS b").format(
            t=sql.SQL(key_type)
        ),
        (bounds,),
    ).fetchone()[0]
    edges: list[str | None] = [None, *ordered, None]
    return [
        sql.SQL("SELECT * FROM ({}) AS {} WHERE {}").format(
            query,
            sql.Identifier(PART_ALIAS),
            range_predicate(key, key_type, KeyRange(edges[i], edges[i + 1], nulls=i == 0))
            or sql.SQL("true"),
        )
        for i in range(len(edges) - 1)
    ]


def _say_repeated_keys(dest: psycopg.Connection[Any], built: TableSql, staging: TableName) -> None:
    """Rows of the batch that share their primary key with another: the merge keeps the
    newest of each, as a full load does, and says so as it does. Asked only where the
    source does not hold the key unique itself (a `primary_key` of the config, a model)."""
    if built.table.mode == "incremental-append" or (
        built.key.origin != "config" and built.model.reads_table_as_is
    ):
        return
    keys = sql.SQL(", ").join(map(sql.Identifier, built.primary_key))
    (repeated,) = execute(
        dest,
        sql.SQL("SELECT count(*) - count(DISTINCT ({})) FROM {}").format(
            keys, sql.Identifier(staging.schema, staging.name)
        ),
    ).fetchone()
    if repeated:
        say_repeated_keys(built, repeated)


def say_repeated_keys(built: TableSql, count: int) -> None:
    """What a load or a batch that kept one row of each key says (full_load.py's too)."""
    log.warning(
        "%s: the model returned %d row(s) whose primary key another row also has; kept the "
        "newest version of each key (`replicator verify` names the keys)",
        built.table.written_name,
        count,
    )


def _combined(results: list[CopyResult]) -> CopyResult:
    return CopyResult(
        -1,
        sum(r.rows for r in results),
        sum(r.bytes for r in results),
        max(r.seconds for r in results),
    )


def _merge(
    dest: psycopg.Connection[Any], built: TableSql, taken_at: datetime | None
) -> tuple[int, Versions | None]:
    """The merge macro in one destination transaction, with the batch's versions; rows
    inserted or changed."""
    assert built.merge is not None
    with merge_errors(built), transaction(dest):
        cursor = execute(dest, built.merge)
        failpoint("mid-merge")
        staged = staging_table(built.table.target).identifier()
        versions = _write_versions(dest, built, staged, taken_at)
    log.debug(
        "%s: merged, %d row(s) inserted or changed", built.table.written_name, cursor.rowcount
    )
    return cursor.rowcount, versions
