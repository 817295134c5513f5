"""Schemas in the destination and replicator's bookkeeping tables, created only when missing.

`CREATE SCHEMA IF NOT EXISTS` checks the CREATE privilege on the database before it looks
whether the schema exists, so a loading role that owns pre-created schemas but may not create
new ones would fail every sync with it. The catalog is asked first; CREATE SCHEMA runs only
for a schema that is really missing. The bookkeeping tables live in `_replicator`: the
partition markers that make copy tasks exactly-once, and the records of the tables the tool
owns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import TableName
from .database import Step, execute, fetch_all, run_steps
from .ddl import create_schema
from .naming import INTERNAL_SCHEMA, MARKER_TABLE, OWNED_TABLE, RESUME_TABLE

MARKER_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (load_id text NOT NULL, part int NOT NULL, "
    "rows bigint NOT NULL DEFAULT 0, bytes bigint NOT NULL DEFAULT 0, "
    "PRIMARY KEY (load_id, part))"
).format(MARKER_TABLE.identifier())
OWNED_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (table_oid oid PRIMARY KEY, schema_name text NOT NULL, "
    "table_name text NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now(), "
    "project_id text)"
).format(OWNED_TABLE.identifier())

RESUME_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (target text PRIMARY KEY, load_id text NOT NULL, "
    "plan jsonb NOT NULL, started_at timestamptz NOT NULL DEFAULT now())"
).format(RESUME_TABLE.identifier())


def missing_schemas(conn: psycopg.Connection[Any], schemas: Iterable[str]) -> list[str]:
    """The schemas of `schemas` that do not exist, in the order given."""
    wanted = list(dict.fromkeys(schemas))
    rows = fetch_all(
        conn, "SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname = ANY(%s)", (wanted,)
    )
    existing = {row[0] for row in rows}
    return [s for s in wanted if s not in existing]


BOOKKEEPING = ((MARKER_TABLE, MARKER_DDL), (OWNED_TABLE, OWNED_DDL), (RESUME_TABLE, RESUME_DDL))


def missing_objects(
    conn: psycopg.Connection[Any], schemas: Iterable[str]
) -> tuple[list[str], list[TableName]]:
    """The schemas of `schemas` that do not exist, in the order given, and the bookkeeping
    tables that do not, in one statement."""
    wanted = list(dict.fromkeys(schemas))
    existing, absent = execute(
        conn,
        "SELECT ARRAY(SELECT nspname::text FROM pg_catalog.pg_namespace "
        "WHERE nspname = ANY(%s)), "
        "ARRAY(SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL)",
        (wanted, [table.sql() for table, _ in BOOKKEEPING]),
    ).fetchone()
    gone = set(absent)
    return (
        [s for s in wanted if s not in set(existing)],
        [table for table, _ in BOOKKEEPING if table.sql() in gone],
    )


def schema_steps(missing: Iterable[str]) -> list[Step]:
    """CREATE SCHEMA for each schema found missing (only those need CREATE on the database)."""
    return [Step("destination", create_schema(schema)) for schema in missing]


def bookkeeping_steps(
    missing: Iterable[str], tables: Iterable[TableName] | None = None
) -> list[Step]:
    """`_replicator` (when it is among the missing schemas) with the bookkeeping `tables`
    found missing (`missing_objects`; all three when not looked for): created once per
    database, not once per table."""
    absent = None if tables is None else set(tables)
    return [
        *schema_steps(s for s in missing if s == INTERNAL_SCHEMA),
        *(
            Step("destination", ddl)
            for table, ddl in BOOKKEEPING
            if absent is None or table in absent
        ),
    ]


def ensure_schemas(conn: psycopg.Connection[Any], schemas: Iterable[str]) -> None:
    """Create the schemas that are missing."""
    run_steps(conn, schema_steps(missing_schemas(conn, schemas)))


def ensure_bookkeeping(conn: psycopg.Connection[Any]) -> None:
    """`_replicator` with its bookkeeping tables, each created where it is missing."""
    run_steps(conn, bookkeeping_steps(*missing_objects(conn, [INTERNAL_SCHEMA])))
