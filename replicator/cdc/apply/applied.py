"""Where each `cdc` table's destination copy is in the log: `_replicator.cdc_applied`, written
in the transaction that changes the table (an apply, or the swap of a reload), so the copy and
its position never disagree. A change whose commit starts before a table's position is
already in the table and is skipped: re-reading the slot after a crash applies nothing twice.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ...base.identifiers import INTERNAL_SCHEMA, TableName
from ...postgres.database import Step, execute, fetch_all
from ...postgres.dest_schema import ensure_bookkeeping
from ..source.slot import lsn_text

APPLIED_TABLE = TableName(INTERNAL_SCHEMA, "cdc_applied")
APPLIED_DDL = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} (schema_name text NOT NULL, table_name text NOT NULL, "
    "applied_lsn pg_lsn NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), "
    "PRIMARY KEY (schema_name, table_name))"
).format(APPLIED_TABLE.identifier())


def record_applied_step(target: TableName, lsn: int | str) -> Step:
    """The statement that records `lsn` as the table's position (inside its transaction);
    text is an LSN as PostgreSQL writes it (or `compile`'s placeholder)."""
    return Step(
        "destination",
        sql.SQL(
            "INSERT INTO {} AS a (schema_name, table_name, applied_lsn) VALUES (%s, %s, %s) "
            "ON CONFLICT (schema_name, table_name) DO UPDATE SET applied_lsn = "
            "EXCLUDED.applied_lsn, applied_at = now()"
        ).format(APPLIED_TABLE.identifier()),
        (target.schema, target.name, lsn if isinstance(lsn, str) else lsn_text(lsn)),
    )


def ensure_applied_table(dest: psycopg.Connection[Any]) -> None:
    """`_replicator` (when missing) and the positions table."""
    ensure_bookkeeping(dest)
    execute(dest, APPLIED_DDL)


def applied_positions(dest: psycopg.Connection[Any]) -> dict[TableName, int]:
    """Every recorded position (none when the table does not exist yet)."""
    (exists,) = execute(
        dest, "SELECT to_regclass(%s) IS NOT NULL", (APPLIED_TABLE.sql(),)
    ).fetchone()
    if not exists:
        return {}
    rows = fetch_all(
        dest,
        sql.SQL("SELECT schema_name, table_name, applied_lsn - '0/0'::pg_lsn FROM {}").format(
            APPLIED_TABLE.identifier()
        ),
    )
    return {TableName(schema, name): int(lsn) for schema, name, lsn in rows}


def forget_applied(dest: psycopg.Connection[Any], target: TableName) -> None:
    if not applied_positions(dest):
        return
    execute(
        dest,
        sql.SQL("DELETE FROM {} WHERE schema_name = %s AND table_name = %s").format(
            APPLIED_TABLE.identifier()
        ),
        (target.schema, target.name),
    )
