"""What each Spark task runs: stream one partition from source to destination with COPY.

The bytes go from `COPY (...) TO STDOUT` straight into `COPY ... FROM STDIN` without being
parsed, inside a source transaction that imported the run's exported snapshot. The
destination transaction also records the partition in a marker table, so a task that Spark
runs twice loads its rows once. Its statements go through the executor like the driver's
(postgres/database.py); the COPY streams are driven through libpq, and noted there. Imports
stay light: this runs in Spark's Python workers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql

from ..base.errors import DatabaseError, TaskError
from ..base.failpoints import failpoint
from ..base.identifiers import quote_ident
from ..base.readable import readable
from ..postgres.database import Step, connect, execute, note, transaction
from ..postgres.snapshot import BOUNDED_LOCK_WAIT, GAVE_WAY, LOCK_TIMEOUT_SQLSTATE, SOURCE_BEGIN

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
    marker: tuple[str, str]  # the marker table (schema, name): one row per finished task
    # A load's only task may empty the table in its own transaction first: that lets its
    # COPY FREEZE (rows written frozen and all-visible: no hint bits to set and write back
    # when the key is built, nothing for vacuum to do later).
    truncate: str | None = None
    origin: str = ""  # the model the rows come from, for error messages
    # In COPY's text form, with names of objects (regclass...): the destination reads them
    # under the source session's search_path (`SEARCH_PATH`), so a name printed without its
    # schema means the same object there.
    names: bool = False

    def __repr__(self) -> str:  # never print connection strings
        return f"CopyTask({self.load_id!r}, {self.index})"


@dataclass(frozen=True)
class CopyResult:
    index: int
    rows: int
    bytes: int
    seconds: float


SCHEMAS = "SELECT pg_catalog.current_schemas(false)::text[]"
SEARCH_PATH = "SELECT pg_catalog.set_config('search_path', %s, true)"
# A task killed mid-query (its Spark job cancelled, its worker gone) is noticed by the server
# within seconds, instead of when the query next sends a row (PostgreSQL 14 and later).
CHECK_CLIENT = "SET client_connection_check_interval = '2s'"


def claim_step(task: CopyTask) -> Step:
    """The task's marker, inserted first: a retried task that finds it committed stops."""
    return Step(
        "destination",
        sql.SQL(
            "INSERT INTO {} (load_id, part) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING part"
        ).format(sql.Identifier(*task.marker)),
        (task.load_id, task.index),
    )


def record_step(task: CopyTask, rows: int | str, size: int | str) -> Step:
    """The rows and bytes the task copied, on its marker, before its commit."""
    return Step(
        "destination",
        sql.SQL("UPDATE {} SET rows = %s, bytes = %s WHERE load_id = %s AND part = %s").format(
            sql.Identifier(*task.marker)
        ),
        (rows, size, task.load_id, task.index),
    )


def snapshot_step(task: CopyTask) -> Step:
    return Step("source", sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot)))


def task_steps(task: CopyTask, source_version: int) -> list[Step]:
    """Every statement a task runs, in order, as `compile` prints it (its rows and bytes,
    known only once it ran, as placeholders)."""
    check = [Step("source", CHECK_CLIENT)] if source_version >= 140000 else []
    return [
        Step("destination", "BEGIN"),
        claim_step(task),
        *([Step("destination", task.truncate)] if task.truncate else []),
        *check,
        Step("source", SOURCE_BEGIN),
        snapshot_step(task),
        Step("source", BOUNDED_LOCK_WAIT),
        *(
            [Step("source", SCHEMAS), Step("destination", SEARCH_PATH, ("<source's schemas>",))]
            if task.names
            else []
        ),
        Step("destination", task.copy_in),
        Step("source", task.copy_out),
        Step("source", "ROLLBACK"),
        record_step(task, "<rows>", "<bytes>"),
        Step("destination", "COMMIT"),
    ]


def run_copy_task(task: CopyTask) -> CopyResult:
    """Copy one partition exactly once (a repeated attempt finds the marker and stops)."""
    with task_errors(task):
        return _copy_once(task)


def task_errors(task: CopyTask) -> contextlib.AbstractContextManager[None]:
    """A task's failure as a TaskError that names its side (and the model read)."""
    return copy_errors(task.origin)


@contextlib.contextmanager
def copy_errors(origin: str) -> Iterator[None]:
    """A copy's failure as a TaskError that names its side (and `origin`, the model read)."""
    where = f" (reading {origin})" if origin else ""
    try:
        yield
    except _SourceFailure as exc:
        gave_way = f"; {GAVE_WAY}" if exc.sqlstate == LOCK_TIMEOUT_SQLSTATE else ""
        raise TaskError(f"source: {exc}{where}{gave_way}", exc.sqlstate) from None
    except DatabaseError as exc:  # from the executor: it names the side already
        text = str(exc)
        source = text.startswith("source: ")
        raise TaskError(text + where if source else text, exc.sqlstate) from None
    except psycopg.Error as exc:  # the COPY into the destination
        raise TaskError(f"destination: {_first_line(exc)}", exc.sqlstate) from None


class _SourceFailure(Exception):
    """A libpq error while streaming from the source, told apart from the destination's."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _source_failure(exc: psycopg.Error) -> _SourceFailure:
    return _SourceFailure(_first_line(exc), exc.sqlstate)


def _first_line(exc: BaseException | str) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].removeprefix("ERROR:").strip() if lines else type(exc).__name__


def _copy_once(task: CopyTask) -> CopyResult:
    started = time.monotonic()
    marker = sql.Identifier(*task.marker)
    with (
        connect(task.dest_url, "destination", application_name="replicator-task") as dest,
        transaction(dest),
    ):
        claim = claim_step(task)
        claimed = execute(dest, claim.statement, claim.params).fetchone()
        if claimed is None:  # an earlier attempt of this task committed already
            rows, size = execute(
                dest,
                sql.SQL("SELECT rows, bytes FROM {} WHERE load_id = %s AND part = %s").format(
                    marker
                ),
                (task.load_id, task.index),
            ).fetchone()
            return CopyResult(task.index, rows, size, time.monotonic() - started)
        if task.truncate:
            execute(dest, task.truncate)
        rows, size = _stream(task, dest)
        record = record_step(task, rows, size)
        execute(dest, record.statement, record.params)
        failpoint("task-before-commit")  # the COMMIT follows, as the block ends
    return CopyResult(task.index, rows, size, time.monotonic() - started)


@contextlib.contextmanager
def _source_snapshot(task: CopyTask) -> Iterator[psycopg.Connection]:
    """A source session inside the run's exported snapshot."""
    with connect(task.source_url, "source", application_name="replicator-task") as source:
        if source.info.server_version >= 140000:
            execute(source, CHECK_CLIENT)
        # SET TRANSACTION SNAPSHOT must be the transaction's first statement.
        with transaction(source, SOURCE_BEGIN, rollback=True):
            execute(source, snapshot_step(task).statement)
            execute(source, BOUNDED_LOCK_WAIT)  # never queue behind an ALTER forever
            yield source


def _stream(task: CopyTask, dest: psycopg.Connection) -> tuple[int, int]:
    """The task's partition, read inside the run's snapshot and written into `dest`."""
    with _source_snapshot(task) as source:
        if task.names:
            (schemas,) = execute(source, SCHEMAS).fetchone()
            execute(dest, SEARCH_PATH, (_quoted_path(schemas),))
        return stream_between(source, dest, task.copy_out, task.copy_in)


def stream_between(
    source: psycopg.Connection, dest: psycopg.Connection, copy_out: str, copy_in: str
) -> tuple[int, int]:
    """Run `copy_out` on the source and `copy_in` on the destination, each in the
    transaction its connection is in, the bytes passed on unparsed; the rows and bytes.

    Read with libpq directly and written on in 1 MiB blocks: psycopg's Copy iterator costs
    Python work per row, and raw get_copy_data() plus large writes halves the CPU a copy
    spends, which is what limits a load on a small machine. Errors of the source's libpq
    calls become _SourceFailure; the rest are the destination's."""
    size = 0
    in_cursor = dest.cursor()
    note(dest, copy_in)
    with in_cursor.copy(copy_in) as into:
        pgconn = _start_copy_out(source, copy_out)
        buffer, read, consume = bytearray(), pgconn.get_copy_data, pgconn.consume_input
        while True:
            try:
                count, data = read(1)
                if count == 0:  # libpq's buffer is empty: wait for the socket
                    _wait_readable(pgconn)
                    consume()
                    continue
            except psycopg.Error as exc:
                raise _source_failure(exc) from None
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
        _end_copy_out(pgconn)
    return in_cursor.rowcount, size


def _start_copy_out(source: psycopg.Connection, copy_out: str) -> pq.abc.PGconn:
    """Send the source's COPY ... TO STDOUT; its libpq connection, in COPY_OUT."""
    pgconn = source.pgconn
    try:
        note(source, copy_out)
        pgconn.send_query(copy_out.encode())
        _expect(_next_result(pgconn), pq.ExecStatus.COPY_OUT)
    except psycopg.Error as exc:
        raise _source_failure(exc) from None
    return pgconn


def _end_copy_out(pgconn: pq.abc.PGconn) -> None:
    """The COPY's outcome once its data is read (a source error raised now)."""
    try:
        _expect(_next_result(pgconn), pq.ExecStatus.COMMAND_OK)
        while _next_result(pgconn) is not None:
            pass
    except psycopg.Error as exc:
        raise _source_failure(exc) from None


# COPY's binary form: a header before the first row, a trailer after the last. The source
# sends the header with the first row's message and the trailer as a message of its own.
BINARY_HEADER_BYTES = 19
BINARY_TRAILER = b"\xff\xff"


def stream_in_parts(
    source: psycopg.Connection,
    tasks: list[CopyTask],
    part_rows: int,
    landed: Callable[[int], None],
    stop: threading.Event,
) -> CopyResult:
    """One COPY out of `source` (a session of the caller's, in the transaction whose
    snapshot the batch is read in; the tasks share it, and one destination connection), its
    rows into each task's table in turn: `part_rows` rows each, the rest into the last. Each
    part commits, then `landed(part)` tells. `stop` set ends it early, the COPY out
    cancelled so that `source` can go on. No markers: a batch copied in this process is not
    retried (sync/incremental/merge_pipeline.py)."""
    started = time.monotonic()
    with task_errors(tasks[0]):
        rows, size = _stream_parts(source, tasks, part_rows, landed, stop)
    return CopyResult(0, rows, size, time.monotonic() - started)


def _stream_parts(
    source: psycopg.Connection,
    tasks: list[CopyTask],
    part_rows: int,
    landed: Callable[[int], None],
    stop: threading.Event,
) -> tuple[int, int]:
    first, rows, size = tasks[0], 0, 0
    binary = first.copy_in.endswith("(FORMAT binary)")
    with (  # the source starts sending while the destination's connection is made
        _copy_out_ended(source, first.copy_out) as pgconn,
        connect(first.dest_url, "destination", application_name="replicator-task") as dest,
    ):
        header, ended = b"", False
        for part, task in enumerate(tasks):
            last = part == len(tasks) - 1
            if stop.is_set():
                raise TaskError("stopped: the merge failed")
            with transaction(dest):
                into_cursor = dest.cursor()
                note(dest, task.copy_in)
                with into_cursor.copy(task.copy_in) as into:
                    buffer, count = bytearray(header), 0
                    while last or count < part_rows:
                        data = _next_copy_data(pgconn)
                        if data is None:
                            ended = True
                            break
                        if binary and not header:
                            header = bytes(data[:BINARY_HEADER_BYTES])
                        buffer += data
                        if not (binary and data == BINARY_TRAILER):  # the end follows it
                            count += 1
                        if len(buffer) >= WRITE_BLOCK:
                            if stop.is_set():
                                raise TaskError("stopped: the merge failed")
                            size += len(buffer)
                            into.write(buffer)
                            buffer = bytearray()
                    if binary and not ended:
                        buffer += BINARY_TRAILER
                    size += len(buffer)
                    into.write(buffer)
                failpoint("task-before-commit")
            rows += into_cursor.rowcount
            landed(part)
            if ended:
                break
    return rows, size


@contextlib.contextmanager
def _copy_out_ended(source: psycopg.Connection, copy_out: str) -> Iterator[pq.abc.PGconn]:
    """`copy_out` started on `source`, and ended when the block does: read to its end
    (its error raised), or, when the block raises before, cancelled and its rest read and
    dropped, leaving the session in its transaction (closed if even that fails)."""
    pgconn = _start_copy_out(source, copy_out)
    try:
        yield pgconn
    except BaseException:
        with contextlib.suppress(_SourceFailure, psycopg.Error):  # the cancellation's own
            source.cancel_safe()
            while _next_copy_data(pgconn) is not None:
                pass
        with contextlib.suppress(psycopg.Error):
            while _next_result(pgconn) is not None:  # the COPY's error, then the end
                pass
        if pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
            source.close()
        raise
    _end_copy_out(pgconn)


def _next_copy_data(pgconn: pq.abc.PGconn) -> memoryview | bytes | None:
    """The source's next COPY message (one row), None at its end."""
    try:
        while True:
            count, data = pgconn.get_copy_data(1)
            if count < 0:
                return None
            if count > 0:
                return data
            _wait_readable(pgconn)  # libpq's buffer is empty: wait for the socket
            pgconn.consume_input()
    except psycopg.Error as exc:
        raise _source_failure(exc) from None


def _wait_readable(pgconn: pq.abc.PGconn) -> None:
    """Wait for data in poll, not inside libpq: a blocking libpq read holds the GIL, so
    neither a signal handler nor any other thread could run until the server sent rows
    (measured: a slow source query made SIGTERM wait for it)."""
    readable(pgconn.socket)


def _next_result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """PQgetResult without blocking inside libpq (see `_wait_readable`)."""
    pgconn.consume_input()
    while pgconn.is_busy():
        _wait_readable(pgconn)
        pgconn.consume_input()
    return pgconn.get_result()


def _expect(result: pq.abc.PGresult | None, status: pq.ExecStatus) -> None:
    if result is None or result.status != status:
        message = result.error_message.decode(errors="replace") if result else "no result"
        code = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
        raise _SourceFailure(
            _first_line(message) if message.strip() else "COPY failed",
            code.decode() if code else None,
        )


def _quoted_path(schemas: list[str]) -> str:
    """current_schemas' names as a search_path value: each quoted."""
    return ", ".join(map(quote_ident, schemas))


def stream_steps(tasks: list[CopyTask]) -> list[Step]:
    """What `stream_in_parts` runs, as `compile` prints it: one COPY out of the source, in
    the transaction of the batch's reads, its rows into each task's table in a destination
    transaction of its own."""
    first = tasks[0]
    parts = [
        step
        for task in tasks
        for step in (
            Step("destination", "BEGIN"),
            Step("destination", task.copy_in),
            Step("destination", "COMMIT"),
        )
    ]
    return [
        Step("source", SOURCE_BEGIN),
        Step("source", first.copy_out),
        *parts,
        Step("source", "ROLLBACK"),
    ]
