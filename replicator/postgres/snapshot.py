"""An exported snapshot: one REPEATABLE READ transaction that Spark tasks import.

It stays open until every task has imported it; the cursor and partition bounds are read
inside it, so they describe exactly the rows the tasks copy. A read no other session joins
(a batch this process streams in parts) takes its snapshot on the run's own source session
instead (`SessionSnapshot`): nothing exported or imported, and no new backend whose first
catalog reads are slow.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..base.failpoints import failpoint
from .database import connect, execute

# A session that imports a run's snapshot (a copy task, a comparison's read) waits this long
# at most for a table lock. The exporting session holds a share lock on every table it read;
# an ALTER TABLE (or an ATTACH PARTITION beside a DEFAULT partition) that then asks for an
# exclusive lock waits for it, and PostgreSQL queues the importing session's share lock
# behind the ALTER. Each then waits for the other, and the server cannot see it: the
# exporter waits on its client, not on a lock. Measured: a run and the application's DDL
# stood still for 11 minutes, until the run was killed.
IMPORTER_LOCK_TIMEOUT = "5s"
SOURCE_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
BOUNDED_LOCK_WAIT = f"SET LOCAL lock_timeout = '{IMPORTER_LOCK_TIMEOUT}'"
LOCK_TIMEOUT_SQLSTATE = "55P03"
GAVE_WAY = (
    f"waited {IMPORTER_LOCK_TIMEOUT.removesuffix('s')} s for a table lock, most likely "
    "queued behind another session's exclusive lock request (an ALTER TABLE, an ATTACH "
    "PARTITION, a TRUNCATE...) that itself waits for this run's snapshot: the read gave "
    "way and ended the snapshot so that neither waits for the other forever (such a "
    "session waits for any long read of the table); the next run reads the table again"
)


class ExportedSnapshot:
    """`with ExportedSnapshot(url) as snap:` holds the snapshot open for the block."""

    def __init__(self, source_url: str, side: str = "source") -> None:
        self.source_url = source_url
        self.side = side  # a comparison holds one on the destination too
        self.conn: psycopg.Connection[Any] | None = None
        self.snapshot_id = ""
        # the source's clock at most as late as the snapshot (its transaction's start): a
        # history table's first versions are valid from then (postgres/history_tables.py)
        self.taken_at: datetime | None = None

    def __enter__(self) -> ExportedSnapshot:
        self.conn = connect(self.source_url, self.side)
        execute(self.conn, SOURCE_BEGIN)
        (self.snapshot_id, self.taken_at) = execute(
            self.conn, "SELECT pg_export_snapshot(), now()"
        ).fetchone()
        failpoint("after-snapshot-export")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def _end(self) -> None:
        """The read ended, and its connection closed."""
        if self.conn is not None:
            try:
                with contextlib.suppress(DatabaseError):  # a dead connection ends it anyway
                    execute(self.conn, "ROLLBACK")
            finally:
                self.conn.close()


class SessionSnapshot(ExportedSnapshot):
    """A snapshot of a session the caller keeps (`conn`, the run's, idle): a REPEATABLE READ
    transaction on it, rolled back after the block, the session left open; nothing is
    exported (`snapshot_id` is empty) and `taken_at` is not read (no history table is
    written from such a read)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__("")  # no URL: nothing is connected
        self.conn = conn

    def __enter__(self) -> SessionSnapshot:
        execute(self.conn, SOURCE_BEGIN)
        return self

    def _end(self) -> None:
        """The read ended; the session stays open for the run."""
        try:
            execute(self.conn, "ROLLBACK")
        except DatabaseError:  # a session that cannot end its read is no use to the run
            self.conn.close()


class ImportedSnapshot(ExportedSnapshot):
    """A snapshot exported elsewhere (a slot's, whose exporter must stay open), imported
    into a transaction of our own: read like an ExportedSnapshot, and its tasks import the
    same id."""

    def __init__(self, source_url: str, snapshot_id: str, side: str = "source") -> None:
        super().__init__(source_url, side)
        self.snapshot_id = snapshot_id

    def __enter__(self) -> ImportedSnapshot:
        try:
            self.conn = import_snapshot(self.source_url, self.side, self.snapshot_id)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self


def import_snapshot(url: str, side: str, snapshot_id: str) -> psycopg.Connection[Any]:
    """A new connection in a read-only transaction of the exported snapshot `snapshot_id`
    (closed again when that fails)."""
    conn = connect(url, side)
    try:
        execute(conn, SOURCE_BEGIN)
        execute(conn, sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_id)))
    except BaseException:
        conn.close()
        raise
    return conn
