"""DDL as psycopg.sql statements: every identifier quoted, every type PostgreSQL's own text.

Built with psycopg.sql rather than sqlglot: every run creates and drops tables, and a run
that parses no SQL (no model, no drift) then never loads sqlglot, a fifth of its start.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql

from ..base.identifiers import TableName
from .catalog import Column


def column_def(column: Column) -> sql.Composed:
    """`"name" type [COLLATE collation] [NOT NULL]`; the type kept verbatim: format_type()
    output is already valid, exact PostgreSQL (the collation is quoted by the catalog)."""
    not_null = sql.SQL(" NOT NULL") if column.not_null else sql.SQL("")
    return sql.SQL("{} {}{}").format(
        sql.Identifier(column.name), sql.SQL(column.declared_type()), not_null
    )


def create_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))


def create_table(
    name: TableName,
    columns: Iterable[Column],
    primary_key: Iterable[str] = (),
    *,
    unlogged: bool = False,
    if_not_exists: bool = False,
) -> sql.Composed:
    """CREATE [UNLOGGED] TABLE with the columns in order and, if given, the primary key."""
    parts = [column_def(c) for c in columns]
    key = [sql.Identifier(c) for c in primary_key]
    if key:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(key)))
    return sql.SQL("CREATE {}TABLE {}{} ({})").format(
        sql.SQL("UNLOGGED " if unlogged else ""),
        sql.SQL("IF NOT EXISTS " if if_not_exists else ""),
        name.identifier(),
        sql.SQL(", ").join(parts),
    )


def drop_table(name: TableName, *, if_exists: bool = True) -> sql.Composed:
    return sql.SQL("DROP TABLE {}{}").format(
        sql.SQL("IF EXISTS " if if_exists else ""), name.identifier()
    )


def drop_tables(names: Iterable[TableName]) -> sql.Composed:
    """One DROP TABLE IF EXISTS of them all."""
    return sql.SQL("DROP TABLE IF EXISTS {}").format(
        sql.SQL(", ").join(name.identifier() for name in names)
    )


def create_temporary_table(name: str, columns: Iterable[Column]) -> sql.Composed:
    """A table of the session's own, dropped as its transaction ends (COMMIT or not)."""
    return sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
        sql.Identifier(name), sql.SQL(", ").join(column_def(c) for c in columns)
    )
