"""Which rows of a `cdc` table have changes in the slot that its copy has not applied yet:
`verify` counts a difference on such a row as not yet synced, as it does for a row a cursor
has yet to reach (docs/architecture.md: Verifying a copy).

The slot is peeked, never consumed: every transaction it still holds whose commit starts at
or after the table's applied position is read, and the keys its changes touch (an update's
old key too) are collected. A pending TRUNCATE of the table touches every key.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import psycopg

from ..base.errors import DatabaseError, TableProblem
from ..base.identifiers import TableName
from ..postgres.database import connect, note
from .pgoutput import Begin, Delete, Insert, Relation, Row, Truncate, Update, decode
from .read import quote_publication

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
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            return _peek(source_url, slot, publication, table, key, since, set(wanted))
        except DatabaseError as exc:
            if exc.sqlstate != OBJECT_IN_USE or time.monotonic() > deadline:
                raise TableProblem(
                    f"cannot read replication slot {slot} to tell changes not yet applied "
                    f"from differences: {exc}"
                ) from None
            time.sleep(0.2)  # a sync is reading the slot: it lets go within its read


def _peek(
    source_url: str,
    slot: str,
    publication: str,
    table: TableName,
    key: Sequence[str],
    since: int,
    wanted: set[Key],
) -> set[Key] | None:
    found: set[Key] = set()
    positions: dict[int, tuple[int, ...]] = {}  # relation oid -> key column positions
    final_lsn = 0
    with connect(source_url, "source") as source:
        note(source, _PEEK)
        with source.cursor(name="replicator_pending", binary=True, withhold=True) as cursor:
            cursor.itersize = 5_000
            try:
                cursor.execute(_PEEK, (slot, quote_publication(publication)))
                for (data,) in cursor:
                    message = decode(data)
                    if isinstance(message, Begin):
                        final_lsn = message.final_lsn
                    elif isinstance(message, Relation):
                        if TableName(message.schema, message.name) == table:
                            names = [c.name for c in message.columns]
                            positions[message.oid] = tuple(names.index(k) for k in key)
                    elif final_lsn >= since and _touches_all(message, positions):
                        return None
                    elif final_lsn >= since:
                        found.update(_keys(message, positions))
            except psycopg.Error as exc:
                raise DatabaseError(
                    f"source: {exc.diag.message_primary or exc}", exc.sqlstate
                ) from None
    return found & wanted


def _touches_all(message: Any, positions: dict[int, tuple[int, ...]]) -> bool:
    return isinstance(message, Truncate) and any(oid in positions for oid in message.relations)


def _keys(message: Any, positions: dict[int, tuple[int, ...]]) -> list[Key]:
    """The keys an insert, update or delete of the table touches."""
    if not isinstance(message, Insert | Update | Delete):
        return []
    where = positions.get(message.relation)
    if where is None:
        return []
    rows: list[Row] = []
    if isinstance(message, Insert | Update):
        rows.append(message.new)
    if isinstance(message, Update | Delete) and message.old is not None:
        rows.append(message.old)
    return [tuple(row[i] for i in where) for row in rows]
