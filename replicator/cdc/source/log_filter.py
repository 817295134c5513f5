"""What the publication does for a `cdc` table's `columns` and `where` (PostgreSQL 15): a
column list keeps excluded columns in the source, and a row filter sends only the rows the
filter keeps, turning an update that takes a row out of it into a delete and one that
brings a row into it into an insert, so the copy holds exactly the rows the filter keeps.

Both lean on the replica identity, which PostgreSQL checks at every UPDATE and DELETE of
the source, not when the publication is made: a column list must hold the identity's
columns (so under REPLICA IDENTITY FULL there is none, and the drain drops excluded
columns itself), and a row filter may read only identity columns. preflight.py refuses a
table whose identity would make the source refuse its writes, before it joins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import DatabaseError
from ...postgres.catalog import TableInfo
from ...postgres.database import execute, fetch_all, transaction

_VIEW = "replicator_filter"
# The columns a filter reads, as PostgreSQL resolved them (a view's dependencies).
_WHERE_COLUMNS = f"""
SELECT DISTINCT a.attname::text
FROM pg_catalog.pg_depend d
JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE r.ev_class = '{_VIEW}'::regclass AND d.refobjid = %s AND d.refobjsubid > 0
"""


@dataclass(frozen=True)
class PublishedAs:
    """How a table is listed in the tool's publication: a column list (None: every column)
    and a row filter (None: every row)."""

    columns: tuple[str, ...] | None = None
    where: str | None = None
    # `ONLY table`: a table others inherit from is published alone, as it is copied
    # (postgres/catalog.TableInfo.has_children); listed whole, its children would join the
    # publication, and the source would refuse their UPDATEs without a replica identity.
    alone: bool = False

    def element(self, table: sql.Composable) -> sql.Composable:
        """`[ONLY ]table (a, b) WHERE (...)` for CREATE or ALTER PUBLICATION."""
        parts: list[sql.Composable] = [sql.SQL("ONLY "), table] if self.alone else [table]
        if self.columns is not None:
            parts.append(
                sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.columns)))
            )
        if self.where is not None:
            parts.append(sql.SQL(" WHERE ({}\n)").format(sql.SQL(self.where)))
        return sql.Composed(parts)

    def describe(self) -> str:
        """A stable text for cdc.json: what the publication was last given for the table."""
        columns = "all" if self.columns is None else ", ".join(self.columns)
        return f"columns: {columns}; where: {self.where or 'none'}"

    @property
    def plain(self) -> bool:
        return self.columns is None and self.where is None


def published_as(
    identity: str,
    info: TableInfo,
    exclude: tuple[str, ...],
    where: str | None,
    allow_list: bool = False,
) -> PublishedAs:
    """The listing a table with these `columns.exclude` and `where` gets (identity: the
    table's relreplident; under FULL no column list is possible). `allow_list`
    (`columns.include`): a column list even when it names every column, so that a column
    the source gains later stays out of the log."""
    columns = None
    if (exclude or allow_list) and identity != "f":
        columns = tuple(c.name for c in info.columns if c.name not in exclude)
    return PublishedAs(columns, where, info.has_children)


def where_columns(source: psycopg.Connection[Any], info: TableInfo, where: str) -> list[str]:
    """The table's columns the filter reads (PostgreSQL resolves the names)."""
    with transaction(source, rollback=True):
        execute(
            source,
            sql.SQL("CREATE TEMPORARY VIEW {} AS SELECT 1 FROM {} WHERE ({}\n)").format(
                sql.Identifier(_VIEW), info.name.identifier(), sql.SQL(where)
            ),
        )
        return sorted(row[0] for row in fetch_all(source, _WHERE_COLUMNS, (info.oid,)))


def row_filter_problem(source: psycopg.Connection[Any], info: TableInfo, where: str) -> str | None:
    """PostgreSQL's objection to the filter as a publication's row filter (a function that
    is not immutable, say), tried in a transaction rolled back; None when it takes it (or
    the role may not make publications: the DBA's publication is checked instead)."""
    try:
        with transaction(source, rollback=True):
            execute(
                source,
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier("replicator_probe"),
                    PublishedAs(where=where, alone=info.has_children).element(
                        info.name.identifier()
                    ),
                ),
            )
    except DatabaseError as exc:
        if exc.sqlstate == "42501":
            return None
        return str(exc).removeprefix("source: ")
    return None
