"""What each Spark task runs: stream one partition from source to destination with COPY.

The bytes go from `COPY (...) TO STDOUT` straight into `COPY ... FROM STDIN` without being
parsed, inside a source transaction that imported the run's exported snapshot. The
destination transaction also records the partition in a marker table, so a task that Spark
runs twice loads its rows once. Imports stay light: this runs in Spark's Python workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from .failpoints import failpoint
from .pgsession import pin_session

MARKER_TABLE = ("_replicator", "loaded_partitions")


@dataclass(frozen=True)
class CopyTask:
    """One partition's work; pickled to the executor that runs it."""

    load_id: str
    index: int
    source_url: str
    dest_url: str
    snapshot: str
    copy_out: str
    copy_in: str

    def __repr__(self) -> str:  # never print connection strings
        return f"CopyTask({self.load_id!r}, {self.index})"


@dataclass(frozen=True)
class CopyResult:
    index: int
    rows: int
    bytes: int
    seconds: float


def run_copy_task(task: CopyTask) -> CopyResult:
    """Copy one partition exactly once (a repeated attempt finds the marker and stops)."""
    started = time.monotonic()
    marker = sql.Identifier(*MARKER_TABLE)
    with psycopg.connect(task.dest_url, application_name="replicator-task") as dest:
        pin_session(dest)
        dest.commit()
        claimed = dest.execute(
            sql.SQL(
                "INSERT INTO {} (load_id, part) VALUES (%s, %s) ON CONFLICT DO NOTHING "
                "RETURNING part"
            ).format(marker),
            (task.load_id, task.index),
        ).fetchone()
        if claimed is None:  # an earlier attempt of this task committed already
            dest.rollback()
            row = dest.execute(
                sql.SQL("SELECT rows, bytes FROM {} WHERE load_id = %s AND part = %s").format(
                    marker
                ),
                (task.load_id, task.index),
            ).fetchone()
            return CopyResult(task.index, row[0], row[1], time.monotonic() - started)
        rows, size = _stream(task, dest)
        dest.execute(
            sql.SQL("UPDATE {} SET rows = %s, bytes = %s WHERE load_id = %s AND part = %s").format(
                marker
            ),
            (rows, size, task.load_id, task.index),
        )
        failpoint("task-before-commit")
        dest.commit()
    return CopyResult(task.index, rows, size, time.monotonic() - started)


def _stream(task: CopyTask, dest: psycopg.Connection) -> tuple[int, int]:
    size = 0
    # autocommit + explicit BEGIN: SET TRANSACTION SNAPSHOT must be the first statement.
    with psycopg.connect(
        task.source_url, application_name="replicator-task", autocommit=True
    ) as source:
        pin_session(source)
        source.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        source.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot)))
        out_cursor, in_cursor = source.cursor(), dest.cursor()
        with out_cursor.copy(task.copy_out) as out, in_cursor.copy(task.copy_in) as into:
            for chunk in out:
                size += len(chunk)
                into.write(chunk)
        source.execute("ROLLBACK")
    return in_cursor.rowcount, size
