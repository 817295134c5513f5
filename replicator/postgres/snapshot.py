"""An exported snapshot: one REPEATABLE READ transaction that Spark tasks import.

It stays open until every task has imported it; the cursor and partition bounds are read
inside it, so they describe exactly the rows the tasks copy.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..base.failpoints import failpoint
from .database import connect, execute


class ExportedSnapshot:
    """`with ExportedSnapshot(url) as snap:` holds the snapshot open for the block."""

    def __init__(self, source_url: str, side: str = "source") -> None:
        self.source_url = source_url
        self.side = side  # a comparison holds one on the destination too
        self.conn: psycopg.Connection[Any] | None = None
        self.snapshot_id = ""

    def __enter__(self) -> ExportedSnapshot:
        self.conn = connect(self.source_url, self.side)
        execute(self.conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        (self.snapshot_id,) = execute(self.conn, "SELECT pg_export_snapshot()").fetchone()
        failpoint("after-snapshot-export")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.conn is not None:
            try:
                with contextlib.suppress(DatabaseError):  # a dead connection ends it anyway
                    execute(self.conn, "ROLLBACK")
            finally:
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
        execute(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        execute(conn, sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_id)))
    except BaseException:
        conn.close()
        raise
    return conn
