"""One destination table is synced by one replicator at a time, across hosts.

Two copies of a project (say, an old and a new host during a move) share no run lock, but
they share the destination: each table's sync holds a transaction-scoped advisory lock there,
on a connection of its own, for as long as it works on the table. Transaction-scoped, so it
also works through PgBouncer in transaction mode; released by the server when the holder
dies. The transaction holds no snapshot between statements and writes nothing.

A run locks its tables one after another: the lock's connection is kept for the next table
(`lock_connections`), so a run of 1,000 tables opens one, not 1,000. A run that has tables
to sync opens it on a thread while it plans the first (`open_ahead`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg

from ..base.errors import TableLocked
from ..base.identifiers import TableName
from .database import connect, execute, idle, transaction


def lock_key(target: TableName) -> int:
    """A stable signed 64-bit key for the destination table."""
    digest = hashlib.sha256(f"replicator\0{target.schema}\0{target.name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Idle lock connections of the run under way, by destination URL (lock_connections()), and
# those being opened ahead (open_ahead).
_idle: dict[str, list[psycopg.Connection[Any]]] | None = None
_ahead: dict[str, Future[psycopg.Connection[Any]]] = {}


@contextlib.contextmanager
def lock_connections() -> Iterator[None]:
    """Keep lock connections for the next table during the block (a run); closed after."""
    global _idle
    outer, _idle = _idle, {} if _idle is None else _idle
    try:
        yield
    finally:
        if outer is None:
            for url in list(_ahead):
                with contextlib.suppress(Exception):
                    _idle.setdefault(url, []).append(_ahead.pop(url).result())
            for pool in _idle.values():
                for conn in pool:
                    conn.close()
            _idle = None


def open_ahead(dest_url: str) -> None:
    """Open a lock connection to `dest_url` on a thread, for the block's first lock there
    (it waits for it then; an error opening it is that lock's). Only inside
    `lock_connections`, and only when none is idle or opening already."""
    if _idle is None or _idle.get(dest_url) or dest_url in _ahead:
        return
    opener = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replicator-lock")
    _ahead[dest_url] = opener.submit(_new_lock_connection, dest_url)
    opener.shutdown(wait=False)


@contextlib.contextmanager
def _lock_connection(dest_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection for one lock: an idle one of the run's if any, else a new one; back to
    the run's idle ones when the block ends cleanly, closed otherwise."""
    pool = _idle.setdefault(dest_url, []) if _idle is not None else None
    if pool:
        conn = pool.pop()
    elif (opening := _ahead.pop(dest_url, None)) is not None:
        conn = opening.result()
    else:
        conn = _new_lock_connection(dest_url)
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    if pool is None or not idle(conn):
        conn.close()
    else:
        pool.append(conn)


def _new_lock_connection(dest_url: str) -> psycopg.Connection[Any]:
    """A connection that only ever holds lock transactions: never timed out while idle in
    one (the table's work may take hours)."""
    conn = connect(dest_url, "destination")
    execute(conn, "SET idle_in_transaction_session_timeout = 0")
    return conn


@contextlib.contextmanager
def table_lock(
    dest_url: str,
    target: TableName,
    subject: str,
    then: str = "skipped, the next run retries",
) -> Iterator[None]:
    """Hold the table's destination lock for the block; TableLocked when another has it,
    saying `then` (what becomes of this run's work on the table)."""
    with _lock_connection(dest_url) as conn, transaction(conn, rollback=True):
        (held,) = execute(
            conn, "SELECT pg_try_advisory_xact_lock(%s::bigint)", (lock_key(target),)
        ).fetchone()
        if not held:
            raise TableLocked(
                f"{subject}: another replicator run (a sync, `sync --follow` or `verify "
                "--repair` of this project, a copy of it or another host) is syncing "
                f"destination table {target}; {then}"
            )
        yield
