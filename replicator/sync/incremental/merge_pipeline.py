"""A big batch copied in this process is staged in parts and merged part by part, in one
destination transaction: part k merges while part k+1 copies.

Copied whole and then merged, a batch keeps one side waiting: the source and the staging
COPY work while the destination's merge has nothing to do, then the other way round. The
batch is still read by one COPY out of the source, in one snapshot (a transaction of the
run's own source session); the copy cuts its rows
into up to four staging tables as they come (transfer/copy_stream.stream_in_parts), each
part committed when it is full, and this module merges each part as soon as it lands. The
parts are disjoint, so merging them one after another in one transaction writes what one
merge of the whole batch writes, and nothing is visible before the COMMIT. That holds where
each key is in the batch once (TableSql.unique_keys) and for the built-in macro; a project's
own merge macro, or a batch that may repeat a key, is merged whole. Parts are cut by rows,
not key ranges: the rows of a batch crowd in whatever part of its key range was written
last (a burst of writes before the run), which equal ranges of the key would put in one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg

from ...base.errors import DatabaseError, ReplicatorError
from ...base.failpoints import failpoint
from ...base.interrupts import raise_if_requested
from ...plan.table_sql import TableSql
from ...postgres.database import execute, transaction
from ...postgres.naming import MAX_STAGING_PARTS
from ...transfer.copy_stream import CopyResult, CopyTask, TaskError, stream_in_parts
from ..scripts import PARTS_BEGIN, PARTS_NEVER_IDLE_OUT

# A part smaller than this costs more in its own staging table than its overlap saves.
PART_ROWS = 10_000


def part_rows(built: TableSql, rows: int, in_process: bool) -> int:
    """How many rows each part of a batch of about `rows` rows holds (the last takes the
    rest); 0: the batch is staged whole."""
    whole = not in_process or not built.merge_is_builtin or not built.unique_keys
    whole = whole or built.history is not None  # its versions are read from the whole batch
    if whole or built.copies_as_text or rows < 2 * PART_ROWS:
        return 0
    return max(PART_ROWS, rows // MAX_STAGING_PARTS + 1)


def copy_and_merge(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    built: TableSql,
    tasks: list[CopyTask],
    merges: list[str],
    rows: int,
) -> tuple[CopyResult, int]:
    """Stream the batch out of `source` (in the batch's snapshot; the second thread has it
    to itself until the copy ends) into the tasks' staging tables, `rows` rows each (the
    last takes the rest), on a second thread, and merge each part (`merges`, one per task)
    on `dest` as soon as it is committed; commit once all are. The copy's result and the
    rows the merges inserted or changed."""
    landed: queue.Queue[int | None] = queue.Queue()
    stop = threading.Event()

    def relay() -> CopyResult:
        try:
            return stream_in_parts(source, tasks, rows, landed.put, stop)
        finally:
            landed.put(None)

    merged = 0
    with ThreadPoolExecutor(max_workers=1) as copier, transaction(dest, PARTS_BEGIN):
        execute(dest, PARTS_NEVER_IDLE_OUT)
        copying = copier.submit(relay)
        try:
            while (part := landed.get()) is not None:
                with merge_errors(built):
                    merged += execute(dest, merges[part]).rowcount
        except BaseException:
            stop.set()
            copying.exception()  # the copy ends first; the merge's error is the news
            raise
        result = _outcome(copying)
        failpoint("after-staging-copy")
        failpoint("mid-merge")
    return result, merged


def _outcome(copying: Future[CopyResult]) -> CopyResult:
    """The copy's result; its error as the run's (unless the run was interrupted)."""
    try:
        return copying.result()
    except TaskError as exc:
        raise_if_requested()  # a query cancelled by the interruption
        raise ReplicatorError(str(exc)) from None


@contextlib.contextmanager
def merge_errors(built: TableSql) -> Iterator[None]:
    """A database error of the merge, said to be the merge's and named by its macro."""
    try:
        yield
    except DatabaseError as exc:
        raise DatabaseError(f"{exc} (in the merge, {built.merge_origin})", exc.sqlstate) from None
