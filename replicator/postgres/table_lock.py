"""One destination table is synced by one replicator at a time, across hosts.

Two copies of a project (say, an old and a new host during a move) share no run lock, but
they share the destination: each table's sync holds a transaction-scoped advisory lock there,
on a connection of its own, for as long as it works on the table. Transaction-scoped, so it
also works through PgBouncer in transaction mode; released by the server when the holder
dies. The transaction holds no snapshot between statements and writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

from ..base.errors import TableLocked
from ..base.identifiers import TableName
from .database import connect, execute, transaction


def lock_key(target: TableName) -> int:
    """A stable signed 64-bit key for the destination table."""
    digest = hashlib.sha256(f"replicator\0{target.schema}\0{target.name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def table_lock(dest_url: str, target: TableName, subject: str) -> Iterator[None]:
    """Hold the table's destination lock for the block; TableLocked when another has it."""
    with connect(dest_url, "destination") as conn, transaction(conn, rollback=True):
        execute(conn, "SET LOCAL idle_in_transaction_session_timeout = 0")
        (held,) = execute(
            conn, "SELECT pg_try_advisory_xact_lock(%s::bigint)", (lock_key(target),)
        ).fetchone()
        if not held:
            raise TableLocked(
                f"{subject}: another replicator (another host or a copy of this project) "
                f"is syncing destination table {target}; skipped, the next run retries"
            )
        yield
