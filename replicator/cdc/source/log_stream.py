"""The slot's changes streamed over the replication protocol, as a subscription reads them.

`pg_logical_slot_peek_binary_changes` decodes its whole range before it returns the first
row, and every call decodes again from the slot's position; a walsender decodes while the
changes are applied, once per drain. psycopg 3 has no replication API (psycopg/psycopg#71),
but its libpq layer (`psycopg.pq`) speaks COPY BOTH, which is all the protocol needs:
`START_REPLICATION SLOT ... LOGICAL` on a `replication=database` connection, then XLogData
('w') and keepalive ('k') messages from the server, and standby status updates ('r') from us.

The slot only moves when a status update says how far the destination holds the changes
(`confirm`): a crash before it re-reads them next run, and the applied positions skip them.
A drain ends at the first transaction that commits after `upto` (the WAL flushed when it
began), or when the server says it has decoded past `upto` between two transactions.

The walsender prints values with the session's settings: it gets the ones every session of
the tool pins (pgsession.py) and the source's encoding, as the peek's session had.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...base.errors import DatabaseError
from ...base.identifiers import quote_ident
from ...base.interrupts import raise_if_requested
from ...base.libpq_options import option_setting
from ...base.readable import readable
from ...base.redact import redact
from ...postgres.database import SESSION_SETTINGS
from .slot import lsn_text

_XLOG_DATA, _KEEPALIVE = ord("w"), ord("k")
_BEGIN, _COMMIT = ord("B"), ord("C")
_HEADER = 25  # 'w', start LSN, end of WAL, send time
_KEEPALIVE_SHAPE = struct.Struct("!QqB")  # end of WAL, send time, reply requested
_STATUS = struct.Struct("!cQQQqB")
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_WAIT_S = 1.0  # without a message for this long, ask the server how far it has decoded
_BUSY_SQLSTATE = psycopg.errors.ObjectInUse.sqlstate  # the slot is active for another process
_BUSY_WAIT_S = 15.0  # a walsender whose client died lets go of the slot within moments
_CLOSE_WAIT_S = 10.0
# Once the socket has something, let the walsender put more in it, then read all it holds:
# woken at each of its sends, the reader would take one message per read (a poll and a
# recv each: 1M changes cost the reader 5.7-6.2 CPU-seconds with a consumer that did
# nothing, 1.8-2.1 with this; at most a millisecond later)
_NAP_S = 0.001
_READS = 16  # libpq reads up to about 8 kB at a time


class LogStream:
    """One drain's replication connection: `chunks` hands out pgoutput messages up to
    the drain's end, `confirm` lets the slot go up to a position."""

    def __init__(
        self,
        source_url: str,
        slot: str,
        publication: str,
        upto: int,
        encoding: str,
        *,
        binary: bool = False,
    ):
        self.upto = upto
        self.done = False
        self.confirmed = 0
        self.released = False  # the server said it let go of the slot (close)
        self._in_transaction = False
        self._cut = False  # stopped inside a transaction the server is still sending
        self._conn = _connect(source_url, encoding)
        self._statement = _start_statement(slot, publication, binary)

    def start(self, position: int) -> str:
        """Start streaming from the slot's position; returns the statement sent."""
        statement = self._statement.replace("{lsn}", lsn_text(position))
        deadline = time.monotonic() + _BUSY_WAIT_S
        while True:
            self._conn.send_query(statement.encode())
            result = self._conn.get_result()
            if result is not None and result.status == pq.ExecStatus.COPY_BOTH:
                self.confirmed = position
                return statement
            while self._conn.get_result() is not None:  # the rest of a failed command
                pass
            state = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
            if state == _BUSY_SQLSTATE.encode() and time.monotonic() < deadline:
                time.sleep(0.05)  # our own walsender of a killed run, on its way out
                continue
            self.released = True  # never held: nothing to wait for
            raise DatabaseError(f"source: {self._error(result)}")

    def chunks(self) -> Iterator[list[bytes]]:
        """The messages up to the drain's end, a list of them at a time: those libpq holds
        at once (the reader then switches to this generator once per list, not once per
        message)."""
        conn, upto = self._conn, self.upto
        get = conn.get_copy_data
        chunk: list[bytes] = []
        add = chunk.append
        while not self.done:
            size, buffer = get(1)
            if size > 0:
                kind = buffer[0]
                if kind == _XLOG_DATA:
                    data = bytes(buffer[_HEADER:])
                    tag = data[0]
                    if tag == _COMMIT:
                        self._in_transaction = False
                        add(data)
                        if int.from_bytes(data[10:18], "big") >= upto:  # its end LSN
                            self.done = True
                        continue
                    if tag == _BEGIN:
                        if int.from_bytes(data[1:9], "big") >= upto:  # committed later
                            self.done = self._cut = True
                            break
                        self._in_transaction = True
                    add(data)
                elif kind == _KEEPALIVE:
                    wal_end, _, reply = _KEEPALIVE_SHAPE.unpack_from(buffer, 1)
                    if wal_end >= upto and not self._in_transaction:
                        self.done = True  # decoded past the end: nothing more to come
                    elif reply:
                        self._status(reply=False)
            elif size == 0:
                if chunk:
                    yield chunk
                    chunk = []
                    add = chunk.append
                self._wait()
            else:
                self._ended(size)
        if chunk:
            yield chunk

    def confirm(self, position: int) -> None:
        """The destination holds every change before `position`: the slot may let them go."""
        if position > self.confirmed:
            self.confirmed = position
            self._status(reply=False)

    def ping(self) -> None:
        """A status update while the reader waits: the server's wal_sender_timeout counts
        from the last one."""
        self._status(reply=False)

    def close(self) -> None:
        """End the stream and disconnect; `released` says whether the server confirmed it let
        go of the slot. A stream stopped at the Begin of a transaction past the end is cut:
        its walsender reads nothing from us until it has sent the whole transaction (the
        drain then waits for the slot itself). The waits are bounded, and never block in
        libpq, which would hold the GIL."""
        conn = self._conn
        try:
            streaming = conn.transaction_status == pq.TransactionStatus.ACTIVE
            if not self._cut and conn.status == pq.ConnStatus.OK and streaming:
                conn.put_copy_end()
                conn.flush()
                self.released = self._finish_copy(time.monotonic() + _CLOSE_WAIT_S)
        except psycopg.Error:
            pass  # the connection is going anyway; its error is not the run's
        finally:
            conn.finish()

    def _finish_copy(self, deadline: float) -> bool:
        """What the server sent before our CopyDone, then its own and the command's end."""
        conn = self._conn
        while time.monotonic() < deadline:
            size, _ = conn.get_copy_data(1)
            if size < 0:
                break
            if size == 0:
                readable(conn.socket, _WAIT_S)
                conn.consume_input()
        while time.monotonic() < deadline:
            if conn.is_busy():
                readable(conn.socket, _WAIT_S)
                conn.consume_input()
            elif conn.get_result() is None:
                return True
        return False

    def _status(self, reply: bool) -> None:
        at = self.confirmed
        now = int((datetime.now(UTC) - _EPOCH).total_seconds() * 1_000_000)
        try:
            self._conn.put_copy_data(_STATUS.pack(b"r", at, at, at, now, reply))
            self._conn.flush()
        except psycopg.Error as exc:
            raise DatabaseError(f"source: the replication connection was lost: {exc}") from None

    def _wait(self) -> None:
        """Until the socket has more, then as much as it holds (see _NAP_S): a read that
        waits for the walsender to fill it costs far less than one per message (a blocking
        read per message spends ten times the time in the kernel)."""
        raise_if_requested()
        if not readable(self._conn.socket, _WAIT_S):
            self._status(reply=True)  # asks for a keepalive with how far it decoded
        time.sleep(_NAP_S)
        self._conn.consume_input()
        for _ in range(_READS):
            if not readable(self._conn.socket, 0):
                break
            self._conn.consume_input()

    def _ended(self, size: int) -> None:
        result = self._conn.get_result()
        raise DatabaseError(
            f"source: the replication stream ended before the drain's end ({lsn_text(self.upto)})"
            f": {self._error(result)}"
            if size == -1
            else f"source: {self._error(result)}"
        )

    def _error(self, result: pq.abc.PGresult | None) -> str:
        """The server's message (without libpq's `ERROR:` prefix), or libpq's own."""
        primary = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) if result else None
        text = (primary or self._conn.error_message).decode(errors="replace").strip()
        return redact(text.splitlines()[0] if text else "the connection was lost")


def _connect(source_url: str, encoding: str) -> pq.PGconn:
    params = conninfo_to_dict(source_url)
    pinned = " ".join(option_setting(name, value) for name, value in SESSION_SETTINGS.items())
    # The server's default timeout unless the URL's options set one: the reader pings while
    # it waits (stage.wait_for). 0 would cost the walsender a read of our socket per message.
    own = params.get("options") or os.environ.get("PGOPTIONS", "")  # what libpq would use
    timeout = "" if "wal_sender_timeout" in own else "-c wal_sender_timeout=60s"
    params["options"] = " ".join(part for part in (own, pinned, timeout) if part)
    params.update(
        replication="database",
        application_name="replicator",
        client_encoding=encoding,
        connect_timeout=params.get("connect_timeout", 15),
    )
    conn = pq.PGconn.connect(make_conninfo("", **params).encode())
    if conn.status != pq.ConnStatus.OK:
        text = conn.error_message.decode(errors="replace").strip()
        conn.finish()
        raise DatabaseError(
            "cannot open a replication connection to the source database: "
            + redact(text.splitlines()[-1] if text else "refused")
        )
    return conn


def _start_statement(slot: str, publication: str, binary: bool) -> str:
    """START_REPLICATION (the replication grammar: a quoted slot name, string literals
    doubling their quotes); `{lsn}` is filled in by `start`. `binary`: values in their
    types' binary form (cdc/rows/binary_values.py)."""
    # publication_names is a comma-separated list of identifiers: ours quoted
    names = quote_ident(publication).replace("'", "''")
    options = f"proto_version '1', publication_names '{names}'"
    if binary:
        options += ", binary 'true'"
    return f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {{lsn}} ({options})"
