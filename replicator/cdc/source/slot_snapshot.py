"""The snapshot a `cdc` table is loaded from, with its exact position in the log.

A temporary logical slot created with `(SNAPSHOT 'export')` on a replication connection
returns its consistent point and a snapshot holding exactly the transactions that committed
before it: decoding outputs a transaction when its commit record starts at or after that
point, and the snapshot is built from the same log. So a table loaded from the snapshot and
then given every change whose commit starts at or after the point has each change once. A
plain `pg_export_snapshot()` has no such position (a commit can be in the log before the
snapshot yet invisible to it).

psycopg has no replication-stream API, but the slot command is a simple query on a
`replication=database` connection (`pgconn.exec_`). The snapshot lives while that connection
is open and idle; the load imports it on ordinary connections (the same interface as
postgres/snapshot.ExportedSnapshot). The temporary slot vanishes when the connection closes.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import psycopg
from psycopg import pq, sql

from ...base.errors import DatabaseError
from ...base.failpoints import failpoint
from ...base.redact import redact
from ...postgres.open_transactions import waits_said
from ...postgres.snapshot import ExportedSnapshot, import_snapshot
from .slot import PLUGIN, parse_lsn

_CLOCK = b"SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"


class SlotSnapshot(ExportedSnapshot):
    """`with SlotSnapshot(url) as snap:`: `snap.snapshot_id` for the copy tasks, `snap.conn`
    a transaction in the snapshot (as ExportedSnapshot's), `snap.lsn` its position in the
    log."""

    def __init__(self, source_url: str, slot: str | None = None) -> None:
        """`slot`: a lasting slot of that name (`cdc restart`'s new project slot); None: a
        temporary one, gone with the connection (a load's)."""
        super().__init__(source_url)
        self.lsn = 0
        self.slot = slot
        self._replication: psycopg.Connection[Any] | None = None

    def __enter__(self) -> SlotSnapshot:
        try:
            self._replication = psycopg.connect(
                self.source_url,
                autocommit=True,
                replication="database",
                application_name="replicator",
                connect_timeout=15,
            )
        except psycopg.Error as exc:
            raise DatabaseError(
                f"source: cannot open a replication connection: {redact(str(exc).strip())} "
                "(the role needs the REPLICATION attribute, and pg_hba.conf must allow it: "
                "`replicator check` says which)"
            ) from None
        try:
            with waits_said(self.source_url, "taking the load's log snapshot"):
                self._create_slot()
            self.conn = import_snapshot(self.source_url, "source", self.snapshot_id)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        failpoint("after-snapshot-export")
        return self

    def _create_slot(self) -> None:
        assert self._replication is not None
        name = self.slot or f"replicator_load_{secrets.token_hex(6)}"
        # the source's clock before the slot's snapshot: the snapshot's time as a history
        # table takes it (a command on this connection after the slot's ends its snapshot)
        clock = self._replication.pgconn.exec_(_CLOCK)
        if clock.status == pq.ExecStatus.TUPLES_OK:
            self.taken_at = datetime.strptime(
                clock.get_value(0, 0).decode(), "%Y-%m-%d %H:%M:%S.%f"
            ).replace(tzinfo=UTC)
        command = sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL {} (SNAPSHOT 'export')").format(
            sql.Identifier(name),
            sql.SQL("" if self.slot else "TEMPORARY "),
            sql.Identifier(PLUGIN),
        )
        result = self._replication.pgconn.exec_(command.as_bytes(self._replication))
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise DatabaseError(f"source: cannot create replication slot {name}: {message}")
        self.lsn = parse_lsn(result.get_value(0, 1).decode())
        self.snapshot_id = result.get_value(0, 2).decode()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(kind, value, tb)
        finally:
            if self._replication is not None:
                self._replication.close()  # the temporary slot goes with it
