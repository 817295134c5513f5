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
from psycopg import pq, sql

from .failpoints import failpoint
from .pgsession import pin_session

MARKER_TABLE = ("_replicator", "loaded_partitions")
WRITE_BLOCK = 1 << 20


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
    # A load's only task may empty the table in its own transaction first: that lets its
    # COPY FREEZE (rows written frozen and all-visible: no hint bits to set and write back
    # when the key is built, nothing for vacuum to do later).
    truncate: str | None = None

    def __repr__(self) -> str:  # never print connection strings
        return f"CopyTask({self.load_id!r}, {self.index})"


@dataclass(frozen=True)
class CopyResult:
    index: int
    rows: int
    bytes: int
    seconds: float


def copy_tasks(
    load_id: str,
    source_url: str,
    dest_url: str,
    snapshot: str,
    queries: list[sql.Composable],
    table: tuple[str, str],
    columns: list[str],
    *,
    freeze: bool = False,
) -> list[CopyTask]:
    """One task per query: binary COPY of its rows into `table` (schema, name).

    `freeze`: the table is this load's alone; a single task truncates it and copies frozen."""
    freeze = freeze and len(queries) == 1
    copy_in = (
        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary{})")
        .format(
            sql.Identifier(*table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", FREEZE" if freeze else ""),
        )
        .as_string(None)
    )
    truncate = (
        sql.SQL("TRUNCATE {}").format(sql.Identifier(*table)).as_string(None) if freeze else None
    )
    return [
        CopyTask(
            load_id,
            index,
            source_url,
            dest_url,
            snapshot,
            sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query).as_string(None),
            copy_in,
            truncate,
        )
        for index, query in enumerate(queries)
    ]


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
        if task.truncate:
            dest.execute(task.truncate)
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
    """Read COPY data with libpq directly and write it on in 1 MiB blocks.

    psycopg's Copy iterator costs Python work per row; raw get_copy_data() plus large
    writes halves the CPU a task spends, which is what limits a load on a small machine.
    """
    size = 0
    # autocommit + explicit BEGIN: SET TRANSACTION SNAPSHOT must be the first statement.
    with psycopg.connect(
        task.source_url, application_name="replicator-task", autocommit=True
    ) as source:
        pin_session(source)
        source.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        source.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot)))
        in_cursor = dest.cursor()
        with in_cursor.copy(task.copy_in) as into:
            pgconn = source.pgconn
            pgconn.send_query(task.copy_out.encode())
            _expect(pgconn.get_result(), pq.ExecStatus.COPY_OUT)
            buffer, read = bytearray(), pgconn.get_copy_data
            while True:
                count, data = read(0)
                if count < 0:
                    break
                buffer += data
                if len(buffer) >= WRITE_BLOCK:
                    size += len(buffer)
                    into.write(buffer)
                    buffer = bytearray()
            failpoint("mid-extract")  # read, not all of it written: outside the hot loop
            if buffer:
                size += len(buffer)
                into.write(buffer)
            _expect(pgconn.get_result(), pq.ExecStatus.COMMAND_OK)
            while pgconn.get_result() is not None:
                pass
        source.execute("ROLLBACK")
    return in_cursor.rowcount, size


def _expect(result: pq.abc.PGresult | None, status: pq.ExecStatus) -> None:
    if result is None or result.status != status:
        message = result.error_message.decode(errors="replace") if result else "no result"
        raise psycopg.OperationalError(f"source COPY failed: {message.strip()}")
