"""How far a load's copy is, read from the destination while its tasks run.

Finished partitions are the committed markers (each holds its rows and bytes); running ones
are PostgreSQL's own `pg_stat_progress_copy` rows for the COPY into the side or staging table
(rows and bytes received so far). Both are visible to the driver wherever the tasks run (this
process, local Spark workers, a cluster's executors), so the tasks report nothing
themselves. A thread polls them and hands the counts to a sink: the live display on a
terminal, a log line every few seconds otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError
from ..base.identifiers import TableName
from ..postgres.database import connect, fetch_all
from ..postgres.naming import MARKER_TABLE

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5

_FINISHED = sql.SQL(
    "SELECT count(*), coalesce(sum(rows), 0), coalesce(sum(bytes), 0) FROM {} WHERE load_id = %s"
).format(MARKER_TABLE.identifier())
_RUNNING = (
    "SELECT coalesce(sum(tuples_processed), 0), coalesce(sum(bytes_processed), 0) "
    "FROM pg_catalog.pg_stat_progress_copy WHERE relid = to_regclass(%s) OR pid = %s"
)


@dataclass(frozen=True)
class Counts:
    """A copy's progress: rows and bytes so far, partitions finished of all."""

    rows: int
    bytes: int
    parts_done: int
    parts: int
    seconds: float
    estimated_rows: int | None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current rate, when the estimate is still ahead."""
        if not self.estimated_rows or self.rows >= self.estimated_rows or self.rate <= 0:
            return None
        return (self.estimated_rows - self.rows) / self.rate


class Sink:
    """Where a table's progress goes (SyncOutput makes one per table); this one discards
    it (-q)."""

    active = False  # whether a copy is worth watching for it

    def phase(self, text: str) -> None:
        """What the load is doing now, before or after the copy (`reading the cursor`)."""

    def update(self, counts: Counts) -> None:
        """How far the copy is."""


NO_PROGRESS = Sink()


@contextlib.contextmanager
def watch_copy(
    dest_url: str,
    table: TableName,
    load_id: str,
    parts: int,
    estimated_rows: int | None,
    sink: Sink,
    *,
    pid: int | None = None,
) -> Iterator[None]:
    """Report the copy into `table` to `sink` until the block ends. `pid`: the session that
    copies, for a temporary table (which no other session finds by its name)."""
    if not sink.active:
        yield
        return
    watcher = _Watcher(dest_url, table, load_id, parts, estimated_rows, sink, pid)
    watcher.start()
    try:
        yield
    finally:
        watcher.stop()


class _Watcher:
    def __init__(
        self,
        dest_url: str,
        table: TableName,
        load_id: str,
        parts: int,
        estimated_rows: int | None,
        sink: Sink,
        pid: int | None = None,
    ) -> None:
        self.dest_url, self.table, self.load_id, self.pid = dest_url, table, load_id, pid
        self.parts, self.estimated_rows, self.sink = parts, estimated_rows, sink
        self.started = time.monotonic()
        self.best = (0, 0)  # counts only grow: a task that just finished is in neither view
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="copy-progress", daemon=True)

    def start(self) -> None:
        self.sink.update(self._counts(0, 0, 0))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        if self._stop.wait(POLL_SECONDS):  # a copy over by its first poll needs no session
            return
        try:
            with connect(self.dest_url, "destination") as conn:
                self.sink.update(self._poll(conn))
                while not self._stop.wait(POLL_SECONDS):
                    self.sink.update(self._poll(conn))
        except (ReplicatorError, psycopg.Error) as exc:  # progress is never worth a failure
            log.debug("progress of %s not shown: %s", self.table, exc)

    def _poll(self, conn: psycopg.Connection[Any]) -> Counts:
        done, rows, size = fetch_all(conn, _FINISHED, (self.load_id,))[0]
        try:
            running_rows, running_bytes = fetch_all(conn, _RUNNING, (self.table.sql(), self.pid))[0]
        except ReplicatorError:  # PostgreSQL before 14 has no COPY progress view
            running_rows = running_bytes = 0
        return self._counts(int(rows + running_rows), int(size + running_bytes), int(done))

    def _counts(self, rows: int, size: int, done: int) -> Counts:
        self.best = (max(self.best[0], rows), max(self.best[1], size))
        return Counts(
            self.best[0],
            self.best[1],
            done,
            self.parts,
            time.monotonic() - self.started,
            self.estimated_rows,
        )
