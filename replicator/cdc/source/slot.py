"""The project's replication slot and publication on the source: created when missing (when
the tool may), kept listing exactly the `cdc` tables, looked at, advanced and dropped.

Order matters: pgoutput looks publications up as of each change's position in the log, so
the publication is created before the slot (a slot older than its publication fails to
decode), and a table is added to the publication before the snapshot of its load is taken
(its changes are published only from the ALTER PUBLICATION on).

The publication publishes through the partition root (`publish_via_partition_root`,
PostgreSQL 13+): a partitioned table's changes arrive under its own name, whichever leaf
they touched, and a row that moves to another partition is a delete and an insert of the
root. It changes nothing for a plain table; a publication made before the tool set it gets
it before any partitioned table joins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import DatabaseError, TableProblem
from ...base.identifiers import TableName
from ...postgres.database import execute, fetch_all, transaction
from ...postgres.open_transactions import waits_said
from ...project.cdc_state import CaptureState
from .log_filter import PublishedAs

log = logging.getLogger("replicator.cdc")

PLUGIN = "pgoutput"
VIA_ROOT = sql.SQL("publish_via_partition_root = true")
VIA_ROOT_SINCE = 130000  # server_version_num of PostgreSQL 13


@dataclass(frozen=True)
class SlotInfo:
    """A slot as pg_replication_slots shows it (LSNs as integers)."""

    name: str
    plugin: str | None
    confirmed: int | None  # confirmed_flush_lsn: changes before it were consumed
    wal_status: str | None  # reserved, extended, unreserved, lost
    retained_bytes: int  # WAL the server keeps for it (from restart_lsn)
    lag_bytes: int  # flushed WAL not yet consumed (from confirmed_flush_lsn)
    active_pid: int | None

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"


WAL_LEVEL_FIX = "ALTER SYSTEM SET wal_level = logical; then restart the source server"


def wal_level_problem(source: psycopg.Connection[Any]) -> str | None:
    """Why the source cannot have a logical slot (None: it can): asked before the set-up
    makes anything, so a refused slot leaves no publication behind."""
    (level,) = execute(source, "SELECT current_setting('wal_level')").fetchone()
    if level == "logical":
        return None
    return (
        f"the source's wal_level is {level}: log capture needs logical (a replication slot "
        f"decodes the log); run {WAL_LEVEL_FIX}"
    )


def slot_info(source: psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    rows = fetch_all(
        source,
        "SELECT slot_name, plugin, confirmed_flush_lsn - '0/0'::pg_lsn, wal_status, "
        "coalesce(pg_current_wal_lsn() - restart_lsn, 0), "
        "coalesce(pg_current_wal_flush_lsn() - confirmed_flush_lsn, 0), active_pid "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    if not rows:
        return None
    name, plugin, confirmed, status, retained, lag, pid = rows[0]
    return SlotInfo(
        name,
        plugin,
        int(confirmed) if confirmed is not None else None,
        status,
        max(int(retained), 0),
        max(int(lag), 0),
        pid,
    )


def wrong_plugin(info: SlotInfo) -> str:
    """Why a slot of another output plugin cannot serve, and how to make it again."""
    return (
        f"replication slot {info.name} decodes with the {info.plugin} plugin; replicator reads "
        f"{PLUGIN} (every managed PostgreSQL has it): make it again with "
        f"{drop_slot_statement(info.name)}; {create_slot_statement(info.name)} (the next sync "
        "then reloads every cdc table)"
    )


def flushed_lsn(source: psycopg.Connection[Any]) -> int:
    """The WAL position flushed now: logical decoding reads only flushed WAL, so a run reads
    up to here (a later commit is the next run's)."""
    (lsn,) = execute(source, "SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn").fetchone()
    return int(lsn)


def publication_exists(source: psycopg.Connection[Any], publication: str) -> bool:
    rows = fetch_all(
        source, "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", (publication,)
    )
    return bool(rows)


def can_publish_via_root(source: psycopg.Connection[Any]) -> bool:
    return source.info.server_version >= VIA_ROOT_SINCE


def publishes_via_root(source: psycopg.Connection[Any], publication: str) -> bool:
    """Whether the publication sends a partition's changes under its root's name."""
    if not can_publish_via_root(source):
        return False
    query = "SELECT pubviaroot FROM pg_catalog.pg_publication WHERE pubname = %s"
    rows = fetch_all(source, query, (publication,))
    return bool(rows and rows[0][0])


def published_tables(source: psycopg.Connection[Any], publication: str) -> set[TableName]:
    rows = fetch_all(
        source,
        "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = %s",
        (publication,),
    )
    return {TableName(schema, name) for schema, name in rows}


PLAIN = PublishedAs().describe()  # a table listed whole


def ensure_publication(
    source: psycopg.Connection[Any],
    names: CaptureState,
    tables: Sequence[TableName],
    keep: set[TableName],
    before_adding: Callable[[list[TableName]], None],
    listings: Mapping[TableName, PublishedAs] | None = None,
) -> bool:
    """The publication lists `tables` (the `cdc` tables ready to be captured), and no table
    outside `keep` (every `cdc` table of the config). Returns True when it was created now
    (the slot must then be made after it). A publication the tool did not create is only
    checked (that it exists).

    `before_adding` runs before tables join an existing publication: their changes while
    they were out of it are not in the log, so their copies' positions must go first (a
    crash between the two then costs a reload, never a change).

    `listings`: a table's column list and row filter (cdc/source/log_filter.py); a table whose
    listing differs from the one cdc.json says it was given is listed again (its `columns`
    or `where` changed, so its copy reloads anyway)."""
    ident = sql.Identifier(names.publication)
    listings = listings or {}

    def listed(table: TableName) -> sql.Composable:
        return listings.get(table, PublishedAs()).element(table.identifier())

    if not publication_exists(source, names.publication):
        if not tables:
            raise TableProblem("no cdc table can be captured (the tables' errors say why)")
        if not names.created:
            raise TableProblem(
                f"publication {names.publication} (named in tables-config.json `cdc`) does not "
                f"exist in the source: create it (CREATE PUBLICATION {ident.as_string(None)} "
                'FOR TABLE ...), or remove "create": false to let replicator make one'
            )
        create = create_publication_statement(
            names.publication, tables, via_root=can_publish_via_root(source), listings=listings
        )
        execute(source, create)
        log.info("source: created publication %s for %d table(s)", names.publication, len(tables))
        return True
    if not names.created:
        return False
    if can_publish_via_root(source) and not publishes_via_root(source, names.publication):
        execute(source, via_root_statement(names.publication))  # made by an earlier version
    current = published_tables(source, names.publication)
    added = [t for t in tables if t not in current]
    removed = sorted(current - keep, key=str)
    if added:
        before_adding(added)
        execute(
            source,
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                ident, sql.SQL(", ").join(listed(t) for t in added)
            ),
        )
        log.info("source: publication %s: added %s", names.publication, ", ".join(map(str, added)))
    for table in tables:
        wanted = listings.get(table, PublishedAs())
        if table in added or names.listings.get(str(table), PLAIN) == wanted.describe():
            continue
        with transaction(source):
            execute(
                source,
                sql.SQL("ALTER PUBLICATION {} DROP TABLE ONLY {}").format(
                    ident, table.identifier()
                ),
            )
            execute(
                source, sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(ident, listed(table))
            )
        log.info(
            "source: publication %s: %s now listed with %s",
            names.publication,
            table,
            wanted.describe(),
        )
    if removed:
        execute(
            source,
            # ONLY: a table listed alone has children outside the publication, which a
            # DROP without it would look for ("relation c is not part of the publication")
            sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                ident,
                sql.SQL(", ").join(sql.SQL("ONLY {}").format(t.identifier()) for t in removed),
            ),
        )
        log.info(
            "source: publication %s: removed %s (no longer cdc tables in the config, or "
            "tables whose UPDATEs the source would refuse: their errors say why)",
            names.publication,
            ", ".join(map(str, removed)),
        )
    return False


def create_slot(source: psycopg.Connection[Any], slot: str, url: str, every: float = 10.0) -> int:
    """A new logical slot; its position (changes committed after it are kept for us). The
    wait for the source's open transactions is said every `every` seconds (`url`: the
    source's, for the connection that looks)."""
    log.info(
        "source: creating replication slot %s (it waits for the transactions open in the "
        "source to end)",
        slot,
    )
    with waits_said(url, f"creating replication slot {slot}", every):
        (lsn,) = execute(
            source,
            "SELECT lsn - '0/0'::pg_lsn FROM pg_catalog.pg_create_logical_replication_slot(%s, %s)",
            (slot, PLUGIN),
        ).fetchone()
    log.info("source: created replication slot %s at %s", slot, lsn_text(int(lsn)))
    return int(lsn)


def drop_slot(source: psycopg.Connection[Any], slot: str) -> bool:
    if slot_info(source, slot) is None:
        return False
    execute(source, "SELECT pg_catalog.pg_drop_replication_slot(%s)", (slot,))
    return True


def drop_publication(source: psycopg.Connection[Any], publication: str) -> bool:
    if not publication_exists(source, publication):
        return False
    execute(source, sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(publication)))
    return True


def emit_heartbeat(source: psycopg.Connection[Any]) -> None:
    """A transactional logical message, flushed at once: a drain reads up to the flushed
    WAL, and a slot only moves when that is past its position, so on a source idle since
    the last run (its WAL written by other databases, or not at all) the slot still moves,
    and its restart point passes the snapshot records the last run read over (restart_lsn
    only moves to one of those). pgoutput sends no message unless asked: the drain sees an
    empty stretch of log."""
    try:
        with transaction(source):
            execute(source, "SET LOCAL synchronous_commit = on")
            execute(source, "SELECT pg_catalog.pg_logical_emit_message(true, 'replicator', '')")
    except DatabaseError as exc:  # a role that may not: the slot moves when the source writes
        log.debug("source: no heartbeat message: %s", exc)


def advance_slot(source: psycopg.Connection[Any], slot: str, lsn: int) -> None:
    """Let the server forget the changes before `lsn`: only once they are committed in the
    destination (a crash between the two re-reads them, and the applied positions skip
    them)."""
    execute(
        source,
        "SELECT pg_catalog.pg_replication_slot_advance(%s, %s::pg_lsn)",
        (slot, lsn_text(lsn)),
    )


# The statements a hint tells a DBA to run, rendered with the names quoted (never executed).


def create_slot_statement(slot: str) -> str:
    return (
        sql.SQL("SELECT pg_create_logical_replication_slot({}, 'pgoutput')")
        .format(sql.Literal(slot))
        .as_string(None)
    )


def drop_slot_statement(slot: str) -> str:
    return sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(slot)).as_string(None)


def add_table_statement(publication: str, table: TableName, alone: bool = False) -> str:
    """`alone`: the table has child tables (INHERITS), which stay out (log_filter.PublishedAs)."""
    return (
        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}")
        .format(sql.Identifier(publication), PublishedAs(alone=alone).element(table.identifier()))
        .as_string(None)
    )


def create_publication_statement(
    publication: str,
    tables: Sequence[TableName],
    via_root: bool = True,
    listings: Mapping[TableName, PublishedAs] | None = None,
) -> str:
    """`listings`: a table's column list and row filter (cdc/source/log_filter.py)."""
    listings = listings or {}
    return (
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}")
        .format(
            sql.Identifier(publication),
            sql.SQL(", ").join(
                listings.get(t, PublishedAs()).element(t.identifier()) for t in tables
            ),
            sql.SQL(" WITH ({})").format(VIA_ROOT) if via_root else sql.SQL(""),
        )
        .as_string(None)
    )


def via_root_statement(publication: str) -> str:
    return (
        sql.SQL("ALTER PUBLICATION {} SET ({})")
        .format(sql.Identifier(publication), VIA_ROOT)
        .as_string(None)
    )


def drop_publication_statement(publication: str) -> str:
    return sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(publication)).as_string(None)


def lsn_text(lsn: int) -> str:
    """A log position (an integer) in PostgreSQL's notation, `16/B374D848`."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """PostgreSQL's notation of a log position as the integer it stands for."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
