"""What a table looks like, read from pg_catalog: columns, exact types, keys, indexes.

Types are PostgreSQL's own `format_type()` text, used verbatim in DDL: parsing them (through
sqlglot or anything else) loses detail such as `bit varying(5)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..base.identifiers import TableName
from .database import execute, fetch_all, transaction


@dataclass(frozen=True)
class Column:
    """A column; `type` is format_type() text with user-defined types schema-qualified;
    `collation` its own collation, qualified and quoted, when it is not its type's."""

    name: str
    type: str
    not_null: bool = False
    type_oid: int = 0
    attnum: int = 0  # the source table's column number; 0 for a query's output
    collation: str | None = None

    def declared_type(self) -> str:
        """The type as a column declares it: with its collation (`text COLLATE "C"`)."""
        return f"{self.type} COLLATE {self.collation}" if self.collation else self.type


@dataclass(frozen=True)
class UniqueIndex:
    """A unique index that can stand in for a missing primary key (`_UNIQUE_KEY`)."""

    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class TableInfo:
    """A table (or view) as the catalog describes it."""

    name: TableName
    oid: int
    kind: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    # Without a primary key: the unique index that keys the rows as well, if there is one.
    unique_index: UniqueIndex | None = None
    # A table (not a partitioned one) other tables inherit from (`CREATE TABLE c () INHERITS
    # (t)`): `FROM t` reads their rows too, where t's own key does not hold, so it is read
    # and published alone (`ONLY t`), as pg_dump copies it; the children are tables of
    # their own.
    has_children: bool = False
    # An ordinary table's storage (relfilenode; a rewrite gives it a new one; a partitioned
    # table's: its leaves' summed) and each column's catalog row version (pg_attribute's
    # xmin; ALTER COLUMN TYPE writes a new one, even to the same type, on a partitioned
    # table's root too), as `xmin/atthasmissing/its default's xmin`: a rewrite with a
    # column's row new is a column whose values were rewritten in place
    # (plan/column_rewrite.py). None: a view or foreign table.
    storage: int | None = None
    column_versions: tuple[tuple[str, str], ...] | None = None
    # Its indexes, by name (a copy's that `tables[].indexes` asks for are built when missing)
    index_names: frozenset[str] = frozenset()

    @property
    def read_as(self) -> str:
        """The table's name as a FROM clause reads it (and a publication lists it)."""
        return f"ONLY {self.name.sql()}" if self.has_children else self.name.sql()

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


# A column's collation when it is not its type's default (`COLLATE "C"` on a text column).
_COLLATION = """(SELECT pg_catalog.quote_ident(cn.nspname) || '.'
          || pg_catalog.quote_ident(co.collname)
   FROM pg_catalog.pg_collation co
   JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace
   JOIN pg_catalog.pg_type ct ON ct.oid = a.atttypid
   WHERE co.oid = a.attcollation AND a.attcollation <> ct.typcollation)"""
_COLUMNS = f"""
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atttypid,
       a.attnum, {_COLLATION}
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# A unique index names each row as a primary key would when it is valid, immediate (a
# deferred one may hold duplicates inside a transaction, and cannot be a replica identity),
# not partial, on columns only (no expression, INCLUDE columns left out) and every one NOT
# NULL (NULLs are never equal, so they would repeat), comparing values as the column does:
# an index COLLATE "C" over a case-insensitive (nondeterministic) column holds 'Bob' and
# 'bob', which the copy's key, made with the column's collation, takes for one row (two
# deterministic collations are equal exactly when the bytes are). The replica identity's
# index first (the log then names rows by the same key), then the fewest columns, then the
# name.
_UNIQUE_KEY = """
SELECT ci.relname, array_agg(a.attname::text ORDER BY k.ord) AS columns
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ci ON ci.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = c.oid AND i.indisunique AND i.indisvalid AND i.indimmediate
  AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts
GROUP BY ci.relname, i.indisreplident
HAVING bool_and(a.attnotnull)
   AND bool_and(i.indcollation[k.ord - 1] = a.attcollation
                OR NOT EXISTS (SELECT FROM pg_catalog.pg_collation co
                               WHERE co.oid IN (i.indcollation[k.ord - 1], a.attcollation)
                                 AND NOT co.collisdeterministic))
ORDER BY i.indisreplident DESC, count(*), ci.relname
LIMIT 1
"""
# A partitioned table's storage: its leaves' relfilenodes, summed (a rewritten leaf gets a
# new, higher one), read in the same statement as the root's column rows, so that a
# rewrite through the root is seen whole or not at all.
_LEAF_STORAGE = """
WITH RECURSIVE tree(oid) AS (
    SELECT c.oid
  UNION ALL
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid
)
SELECT sum(l.relfilenode::int8)::int8 FROM tree JOIN pg_catalog.pg_class l ON l.oid = tree.oid
WHERE l.relkind = 'r'
"""
# All of a table's facts in one round trip. format_type() qualifies a type only when the
# session's search_path would not find it: a user's or an extension's type (OID from
# FIRST_NORMAL_OID on) is read again with only pg_catalog on the path (`_columns`).
_DESCRIBE = f"""
SELECT c.oid, c.relkind,
  (SELECT json_agg(json_build_array(a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
                                    a.attnotnull, a.atttypid::int8, a.attnum, {_COLLATION})
                    ORDER BY a.attnum)
   FROM pg_catalog.pg_attribute a
   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
  (SELECT array_agg(a.attname::text ORDER BY k.ord)
   FROM pg_catalog.pg_index i
   CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
   JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
   WHERE i.indrelid = c.oid AND i.indisprimary AND k.ord <= i.indnkeyatts),
  u.relname, u.columns,
  c.relkind IN ('r', 'f')
    AND EXISTS (SELECT FROM pg_catalog.pg_inherits h WHERE h.inhparent = c.oid),
  CASE WHEN c.relkind = 'r' THEN c.relfilenode::int8
       WHEN c.relkind = 'p' THEN ({_LEAF_STORAGE}) END,
  CASE WHEN c.relkind IN ('r', 'p') THEN
    (SELECT json_agg(json_build_array(a.attname, a.xmin::text || '/' || a.atthasmissing::text
                                                 || '/' || coalesce(d.xmin::text, ''))
                     ORDER BY a.attnum)
     FROM pg_catalog.pg_attribute a
     LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) END,
  (SELECT array_agg(ic.relname::text) FROM pg_catalog.pg_index i
   JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL ({_UNIQUE_KEY}) u ON true
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
"""
_DESCRIBE_MANY = _DESCRIBE.replace(
    "SELECT c.oid, c.relkind,", "SELECT n.nspname, c.relname, c.oid, c.relkind,", 1
).replace(
    "WHERE n.nspname = %s AND c.relname = %s",
    "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
)
FIRST_NORMAL_OID = 16384
_LEADING_INDEXED = """
SELECT DISTINCT a.attname
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = %s AND i.indisvalid AND i.indpred IS NULL
"""
KINDS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
}


def describe_table(conn: psycopg.Connection[Any], name: TableName) -> TableInfo | None:
    """The table's columns and primary key (else its usable unique index); None when it
    does not exist."""
    rows = fetch_all(conn, _DESCRIBE, (name.schema, name.name))
    if not rows:
        return None
    return _info(conn, name, *rows[0])


def describe_tables(
    conn: psycopg.Connection[Any], names: Sequence[TableName]
) -> dict[TableName, TableInfo | None]:
    """`describe_table` of these tables in one round trip."""
    if not names:
        return {}
    rows = fetch_all(conn, _DESCRIBE_MANY, ([n.schema for n in names], [n.name for n in names]))
    found = {
        TableName(row[0], row[1]): _info(conn, TableName(row[0], row[1]), *row[2:]) for row in rows
    }
    return {name: found.get(name) for name in names}


def _info(
    conn: psycopg.Connection[Any],
    name: TableName,
    oid: int,
    kind: str,
    attributes: list[list[Any]] | None,
    key: list[str] | None,
    index_name: str | None,
    index_columns: list[str] | None,
    has_children: bool,
    storage: int | None = None,
    versions: list[list[str]] | None = None,
    index_names: list[str] | None = None,
) -> TableInfo:
    columns = tuple(Column(*attribute) for attribute in attributes or ())
    if any(c.type_oid >= FIRST_NORMAL_OID for c in columns):
        columns = _columns(conn, oid)  # the type names qualified, whatever the search_path
    primary_key = tuple(key or ())
    unique = None
    if not primary_key and index_name is not None and index_columns is not None:
        unique = UniqueIndex(index_name, tuple(index_columns))
    column_versions = tuple((str(n), str(x)) for n, x in versions) if versions is not None else None
    return TableInfo(
        name,
        oid,
        KINDS[kind],
        columns,
        primary_key,
        unique,
        has_children,
        storage,
        column_versions,
        frozenset(index_names or ()),
    )


def leading_index_columns(conn: psycopg.Connection[Any], oid: int) -> set[str]:
    """Columns that lead a valid, non-partial index: a range scan on them can use it."""
    return {row[0] for row in fetch_all(conn, _LEADING_INDEXED, (oid,))}


def describe_query(conn: psycopg.Connection[Any], query: str) -> tuple[Column, ...]:
    """The output columns and exact types of a SELECT, without running it.

    PostgreSQL types a temporary view of the query; the transaction is rolled back, so
    nothing is left behind and no row is read.
    """
    view = sql.Identifier("replicator_describe")
    with transaction(conn, rollback=True):
        execute(conn, sql.SQL("CREATE TEMPORARY VIEW {} AS {}").format(view, sql.SQL(query)))
        (oid,) = execute(conn, "SELECT 'replicator_describe'::regclass::oid").fetchone()
        columns = _columns(conn, oid)
    if not columns:
        raise DatabaseError("the query returns no columns")
    return tuple(Column(c.name, c.type, False, c.type_oid, 0, c.collation) for c in columns)


def _columns(conn: psycopg.Connection[Any], oid: int) -> tuple[Column, ...]:
    """Columns in order. With only pg_catalog on the search_path, format_type() qualifies
    every other type, so the text means the same type in any database and session."""
    with transaction(conn):
        execute(conn, "SET LOCAL search_path = pg_catalog, pg_temp")
        return tuple(Column(*row) for row in fetch_all(conn, _COLUMNS, (oid,)))


_RELATION_NAMES = """
SELECT c.relname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = ANY(%s)
"""


def taken_names(conn: psycopg.Connection[Any], schema: str, names: Sequence[str]) -> set[str]:
    """Those of `names` that a relation (table, index, view...) of `schema` has."""
    return {row[0] for row in fetch_all(conn, _RELATION_NAMES, (schema, list(names)))}
