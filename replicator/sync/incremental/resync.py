"""`sync -s T --since V [--until V]`: the key range a bounded re-sync reads, checked before
anything is touched (exit 2 for bad usage or a value that is not of the key's type)."""

from __future__ import annotations

from psycopg import sql

from ...base.errors import UsageError
from ...plan.cursor import canonical_value
from ...postgres.catalog import describe_table
from ...postgres.database import connect, execute
from ...project.config import TableConfig
from ..context import KeyBounds


def resync_bounds(
    tables: tuple[TableConfig, ...],
    names: tuple[str, ...],
    full_refresh: bool,
    since: str | None,
    until: str | None,
    source_url: str,
) -> KeyBounds | None:
    """--since/--until checked before anything is touched: one incremental table, values of
    its replication key's type (printed back as PostgreSQL prints them). Exit 2 otherwise."""
    if since is None:
        if until is not None:
            raise UsageError("--until needs --since (the start of the range to re-sync)")
        return None
    if full_refresh:
        raise UsageError("--since re-syncs a key range; it cannot be combined with -f")
    if len(names) != 1 or len(tables) != 1:
        raise UsageError("--since re-syncs one table: name it with -s TABLE")
    (table,) = tables
    if table.mode == "full-refresh" or table.replication_key is None:
        raise UsageError(f"{table.written_name}: mode {table.mode} has no key range to re-sync")
    with connect(source_url, "source") as conn:
        source = describe_table(conn, table.name)
        column = source.column(table.replication_key) if source else None
        if column is None:
            raise UsageError(f"{table.written_name}: replication key not found in the source table")
        bounds = KeyBounds(
            canonical_value(conn, since, column.type, f"{table.written_name}: --since"),
            canonical_value(conn, until, column.type, f"{table.written_name}: --until")
            if until is not None
            else None,
        )
        if bounds.until is not None:
            (ordered,) = execute(
                conn,
                sql.SQL("SELECT %s::{t} <= %s::{t}").format(t=sql.SQL(column.type)),
                (bounds.since, bounds.until),
            ).fetchone()
            if not ordered:
                raise UsageError(
                    f"{table.written_name}: --since {bounds.since} is after --until {bounds.until}"
                )
    return bounds
