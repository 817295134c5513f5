"""Who could still commit rows a read did not see: the source's transactions open at a
snapshot, looked at from inside it, right after it was taken.

A snapshot's own list (`pg_snapshot_xip`) is not enough. Its xmax is the newest *completed*
xid + 1, so a transaction whose xid is at or past xmax is running but not listed: the newest
writer, whenever nothing committed after it took its xid. On a standby the list is always
empty. And a transaction that has not written yet has no xid at all, yet may later commit a
row stamped with its start (`now()`) or with a sequence value it drew before the read.

So a look (`look`) reads three things, in this order:
1. the open transactions, from `pg_locks` (each holds a lock on its own virtual id, and on
   its xid once it has one; no privilege is needed to see them): with `pg_stat_activity`
   for their database and, where the role may see it, their start;
2. the snapshot's xmin, xmax and list;
3. the next xid to be assigned, from `age()` (which reads it without assigning one, on a
   primary and on a standby alike).

Every xid below the next one had started by 3, so "every xid below it has ended" covers
every writer of the snapshot. A transaction that ended between the snapshot and 1 is caught
by 2 and 3: its xid is among those in progress at the snapshot, and no open transaction
holds it at 1. The order matters: the next xid is read after the locks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from ..base.errors import ReplicatorError
from ..project.state import Pending
from .database import connect, execute, fetch_all

# The open transactions, one row per lock: its own virtual id (`virtualxid`) or its xid
# (`transactionid`, also held by a prepared transaction, which has no session). `here`: in
# this database (a session of another cannot write its tables), true when unknown. A
# session without a role (an autovacuum worker) never writes a table's rows. `start`: NULL
# where pg_stat_activity hides it from this role.
_LOCKS = """
SELECT l.locktype, l.virtualxid, l.transactionid::text,
       a.pid IS NULL OR a.datname IS NULL OR a.datname = current_database(),
       a.state IS NOT NULL, a.xact_start, l.pid IS NULL, l.pid
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.granted AND l.mode = 'ExclusiveLock'
  AND l.locktype IN ('virtualxid', 'transactionid')
  AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
  AND (a.pid IS NULL OR a.usesysid IS NOT NULL)
"""

# xmin, xmax, the list and the next xid. age(x) is the next xid less x (on 32 bits): x is
# xmax, or an xid a little below it when xmax's low 32 bits are a special id (0-2), which
# age() does not measure.
_SNAPSHOT = """
SELECT n.xmin::text, n.xmax::text, n.xip, n.replica,
       (n.ref + pg_catalog.age((n.ref % 4294967296)::text::xid))::text
FROM (
    SELECT pg_catalog.pg_snapshot_xmin(s)::text::numeric AS xmin,
           pg_catalog.pg_snapshot_xmax(s)::text::numeric AS xmax,
           ARRAY(SELECT x::text FROM pg_catalog.pg_snapshot_xip(s) AS x) AS xip,
           pg_catalog.pg_is_in_recovery() AS replica,
           CASE WHEN pg_catalog.pg_snapshot_xmax(s)::text::numeric % 4294967296 >= 3
                THEN pg_catalog.pg_snapshot_xmax(s)::text::numeric
                ELSE pg_catalog.pg_snapshot_xmax(s)::text::numeric - 3 END AS ref
    FROM pg_catalog.pg_current_snapshot() AS s
) AS n
"""

_XID_SPACE = 1 << 32
log = logging.getLogger("replicator.sync")


@dataclass(frozen=True)
class OpenTransactions:
    """What was open on the source at a snapshot (`look`). xids are 64-bit (xid8)."""

    xmin: int  # every xid below it had ended at the snapshot
    next_xid: int  # every xid at or past it started after the look
    running: frozenset[int]  # xids that may have been in progress at the snapshot (primary)
    held: frozenset[int]  # xids still held at the look (by a session or a prepared one)
    sessions: frozenset[str]  # virtual ids of the transactions open at the look, here
    starts: tuple[datetime, ...] | None  # their starts; None where one is hidden or unknown
    holders_seen: bool  # every xid of `running` is held by a session this role sees
    replica: bool  # the source is a standby: its primary's sessions cannot be seen
    pids: frozenset[int] = frozenset()  # the open transactions' sessions, here

    @property
    def nothing_open(self) -> bool:
        """No transaction was open at the snapshot that could still commit a row."""
        if self.replica:
            return self.xmin >= self.next_xid
        return not self.running and not self.sessions

    @property
    def oldest_start(self) -> str | None:
        """The start of the oldest transaction open at the snapshot, when this role sees
        every one of them (superuser, pg_read_all_stats) on a primary: a row that one of
        them commits later is stamped at or after its start (`now()`). None otherwise."""
        if self.replica or self.starts is None or not self.holders_seen or not self.starts:
            return None
        return min(self.starts).isoformat()

    def pending(self, value: str, since: str) -> Pending:
        """`value` waits for every transaction open at the snapshot to end (`since`: when
        the cursor began waiting for them)."""
        return Pending(
            value=value,
            before=str(self.next_xid),
            sessions=sorted(self.sessions),
            since=since,
            pids=sorted(self.pids),
        )

    def still_open(self, pending: Pending) -> bool:
        """Whether a transaction `pending` waits for may still be open at this snapshot.

        Its xids: all below `before` have ended once this snapshot's xmin is past it. Its
        sessions: gone from the locks, and every xid in progress at this snapshot still
        held at the look, so that none of them is one of those sessions, which took an xid
        since and committed between this snapshot and the look (unseen by it)."""
        if self.xmin < int(pending.before):
            return True
        if not pending.sessions:
            return False
        return bool(set(pending.sessions) & self.sessions) or not self.running <= self.held


def look(conn: psycopg.Connection[Any]) -> OpenTransactions:
    """The open transactions, seen from the snapshot of `conn`'s transaction: call it right
    after the snapshot is taken, before anything else reads the source in it."""
    locks = execute(conn, _LOCKS).fetchall()
    xmin_text, xmax_text, xip, replica, next_text = execute(conn, _SNAPSHOT).fetchone()
    xmin, xmax, next_xid = int(xmin_text), int(xmax_text), int(next_text)
    held = frozenset(
        widen(int(xid), next_xid) for kind, _, xid, *_ in locks if kind == "transactionid"
    )
    seen_holders = frozenset(
        widen(int(xid), next_xid)
        for kind, _, xid, _, seen, _, prepared, _ in locks
        if kind == "transactionid" and seen and not prepared
    )
    mine = [row for row in locks if row[0] == "virtualxid" and row[3]]
    running = frozenset() if replica else frozenset(map(int, xip)) | set(range(xmax, next_xid))
    starts = tuple(row[5] for row in mine)
    return OpenTransactions(
        xmin=xmin,
        next_xid=next_xid,
        running=running,
        held=held,
        sessions=frozenset() if replica else frozenset(row[1] for row in mine),
        starts=None if any(not row[4] or row[5] is None for row in mine) else starts,
        holders_seen=running <= seen_holders,
        replica=bool(replica),
        pids=frozenset() if replica else frozenset(row[7] for row in mine),
    )


def snapshot_xmax(conn: psycopg.Connection[Any]) -> str:
    """The xmax of a snapshot taken now (of the caller's transaction, in one): every row a
    transaction at or past it writes was not there yet."""
    (xmax,) = execute(
        conn, "SELECT pg_catalog.pg_snapshot_xmax(pg_current_snapshot())::text"
    ).fetchone()
    return str(xmax)


def widen(xid: int, near: int) -> int:
    """A 32-bit xid (a row's xmin, pg_locks) as the 64-bit one: the nearest at or below
    `near`, an xid8 of a snapshot taken since it was assigned."""
    return near - ((near - xid) % _XID_SPACE)


# The transactions with an xid, oldest first: those a slot's creation (and a log snapshot)
# waits for, the snapshot's builder waiting until every one that was running has ended.
_WRITERS = """
SELECT pid, state, xact_start::text
FROM pg_catalog.pg_stat_activity
WHERE backend_xid IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
ORDER BY age(backend_xid) DESC
LIMIT 5
"""


@contextlib.contextmanager
def waits_said(url: str, what: str, every: float = 10.0) -> Iterator[None]:
    """While the block waits for the source's open transactions (a replication slot's
    creation, a log snapshot), say every `every` seconds which ones: their pid, and where the
    role may see them, their state and start. A session idle in a transaction would make it
    wait without a word otherwise."""
    stop = threading.Event()

    def watch() -> None:
        started = time.monotonic()
        conn = None  # opened only once the wait is long enough to be said
        try:
            while not stop.wait(every):
                conn = conn or connect(url, "source")
                rows = fetch_all(conn, _WRITERS)
                log.info(
                    "source: %s: still waiting after %.0f s for the transaction(s) open in "
                    "the source: %s",
                    what,
                    time.monotonic() - started,
                    ", ".join(_session(*row) for row in rows) or "none left",
                )
        except ReplicatorError as exc:  # saying it must never fail what it watches
            log.debug("source: %s: waits not watched: %s", what, exc)
        finally:
            if conn is not None:
                conn.close()

    watcher = threading.Thread(target=watch, name="replicator-waits", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=5)


def _session(pid: int, state: str | None, start: str | None) -> str:
    if state is None:  # another role's session, not shown to this one
        return f"pid {pid}"
    return f"pid {pid} ({state}, its transaction since {start})"
