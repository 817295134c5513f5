"""Which rows of a `cdc` table have changes in the slot that its copy has not applied yet:
`verify` counts a difference on such a row as not yet synced, as it does for a row a cursor
has yet to reach (docs/architecture.md: Verifying a copy).

The slot is peeked, never consumed: every transaction it still holds whose commit starts at
or after the table's applied position is read, and the keys its changes touch (an update's
old key too) are collected. A pending TRUNCATE of the table touches every key.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import psycopg

from ..base.errors import DatabaseError, TableProblem
from ..base.identifiers import TableName, quote_ident
from ..postgres.database import connect, fetch_all, note
from .source.pgoutput import Begin, Delete, Insert, Message, Relation, Row, Truncate, Update, decode

Key = tuple[Any, ...]
OBJECT_IN_USE = psycopg.errors.ObjectInUse.sqlstate
BUSY_SECONDS = 30.0  # how long a slot in use by a running sync is waited for
_PEEK = (
    "SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
    "'proto_version', '1', 'publication_names', %s)"
)


def pending_keys(
    source_url: str,
    slot: str,
    publication: str,
    table: TableName,
    key: Sequence[str],
    since: int,
    wanted: Collection[Key],
) -> set[Key] | None:
    """The keys among `wanted` that pending changes of `table` touch; None when a pending
    TRUNCATE touches them all. `since`: the table's applied position."""
    touched = _Touched(table, tuple(key), since)
    for message in _peeked(source_url, slot, publication):
        if touched.take(message):
            return None
    return touched.keys & set(wanted)


def _peeked(source_url: str, slot: str, publication: str) -> Iterator[Message]:
    """Every message the slot holds, oldest first; while a sync reads the slot (it is
    "active" then), its read is waited for. The log is read up to where it is flushed: a
    commit verify's snapshot saw may not be yet, on a source with `synchronous_commit` off
    (the WAL writer flushes it within wal_writer_delay), so that position is waited for."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            with connect(source_url, "source") as source:
                _flushed(source, deadline)
                note(source, _PEEK)
                with source.cursor(name="replicator_pending", binary=True, withhold=True) as rows:
                    rows.itersize = 5_000
                    rows.execute(_PEEK, (slot, quote_ident(publication)))  # a list of identifiers
                    yield from (decode(data) for (data,) in rows)
                    return
        except psycopg.Error as exc:
            if exc.sqlstate != OBJECT_IN_USE or time.monotonic() > deadline:
                raise TableProblem(
                    f"cannot read replication slot {slot} to tell changes not yet applied "
                    f"from differences: {exc.diag.message_primary or exc}"
                ) from None
        except DatabaseError as exc:  # connecting
            raise TableProblem(f"cannot read replication slot {slot}: {exc}") from None
        time.sleep(0.2)


def _flushed(source: psycopg.Connection[Any], deadline: float) -> None:
    """Wait until the log is flushed up to where it was written now (every commit before
    this moment is then where a peek reads)."""
    ((written,),) = fetch_all(source, "SELECT pg_catalog.pg_current_wal_insert_lsn()")
    flushed = "SELECT pg_catalog.pg_current_wal_flush_lsn() >= %s::pg_lsn"
    while not fetch_all(source, flushed, (written,))[0][0]:
        if time.monotonic() > deadline:
            return  # the peek says what it can; a difference left is said as one
        time.sleep(0.02)


class _Touched:
    """The keys of `table` that transactions committed at or after `since` touch."""

    def __init__(self, table: TableName, key: tuple[str, ...], since: int) -> None:
        self.table, self.key, self.since = table, key, since
        self.keys: set[Key] = set()
        self._positions: dict[int, tuple[int, ...]] = {}  # relation oid -> key positions
        self._final_lsn = 0

    def take(self, message: Message) -> bool:
        """Note one message; True when it truncates the table (every key touched)."""
        if isinstance(message, Begin):
            self._final_lsn = message.final_lsn
        elif isinstance(message, Relation):
            if TableName(message.schema, message.name) == self.table:
                names = [c.name for c in message.columns]
                self._positions[message.oid] = tuple(names.index(k) for k in self.key)
        elif self._final_lsn < self.since:
            return False  # in the copy already
        elif isinstance(message, Truncate):
            return any(oid in self._positions for oid in message.relations)
        elif isinstance(message, Insert | Update | Delete):
            self.keys.update(self._keys(message))
        return False

    def _keys(self, message: Insert | Update | Delete) -> list[Key]:
        where = self._positions.get(message.relation)
        if where is None:
            return []
        rows: list[Row] = []
        if isinstance(message, Insert | Update):
            rows.append(message.new)
        if isinstance(message, Update | Delete) and message.old is not None:
            rows.append(message.old)
        return [tuple(row[i] for i in where) for row in rows]
