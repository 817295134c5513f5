"""Comparing a table on both sides the way a user would: md5 of every row's text, by key."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.postgres.naming import MARKER_TABLE, RESUME_TABLE, retired_table, staging_tables
from replicator.sync.scripts import side_table
from replicator.transfer.markers import load_id_prefix


def row_hashes(conn: psycopg.Connection[Any], schema: str, table: str, key: str = "id") -> dict:
    """{key: md5(row::text)} for every row; a key held by more than one row fails (a copy
    that repeats a key would otherwise compare equal by its last row)."""
    rows = conn.execute(
        sql.SQL("SELECT {k}::text, md5(t::text) FROM {t} AS t").format(
            k=sql.Identifier(key), t=sql.Identifier(schema, table)
        )
    ).fetchall()
    hashes = dict(rows)
    assert len(hashes) == len(rows), f"{schema}.{table}: {len(rows) - len(hashes)} repeated key(s)"
    return hashes


def column_types(conn: psycopg.Connection[Any], schema: str, table: str) -> list[tuple]:
    return conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (sql.Identifier(schema, table).as_string(conn),),
    ).fetchall()


def assert_same_table(source, dest, schema: str, table: str, key: str = "id") -> int:
    """Same columns, types and rows on both sides; returns the row count."""
    assert column_types(source, schema, table) == column_types(dest, schema, table)
    left, right = row_hashes(source, schema, table, key), row_hashes(dest, schema, table, key)
    missing = left.keys() - right.keys()
    extra = right.keys() - left.keys()
    changed = [k for k in left.keys() & right.keys() if left[k] != right[k]]
    assert not missing and not extra and not changed, (
        f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, changed {changed[:5]}"
    )
    return len(left)


def leftovers(dest, targets: list[TableName]) -> list[str]:
    """What loads of `targets` left behind: side or staging tables, a replaced table not yet
    dropped, partition markers, a resumable load's record. Empty after a successful run,
    whatever an earlier run died doing."""
    names = [
        (t.schema, t.name)
        for target in targets
        for t in (side_table(target), *staging_tables(target), retired_table(target))
    ]
    rows = dest.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([n[0] for n in names], [n[1] for n in names]),
    ).fetchall()
    markers = dest.execute(
        sql.SQL(
            "SELECT load_id FROM {} WHERE EXISTS "
            "(SELECT FROM unnest(%s::text[]) AS p WHERE starts_with(load_id, p))"
        ).format(MARKER_TABLE.identifier()),
        ([load_id_prefix(target) for target in targets],),
    ).fetchall()
    (has_resumes,) = dest.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (RESUME_TABLE.sql(),)
    ).fetchone()
    resumes = (
        dest.execute(
            sql.SQL("SELECT target FROM {} WHERE target = ANY(%s)").format(
                RESUME_TABLE.identifier()
            ),
            ([target.sql() for target in targets],),
        ).fetchall()
        if has_resumes
        else []
    )
    return (
        [r[0] for r in rows]
        + [f"marker {r[0]}" for r in markers]
        + [f"resumable load of {r[0]}" for r in resumes]
    )


def pausing_scans(source, schema: str) -> int:
    """Source sessions sleeping in a pausing model's scan (pg_sleep) of `schema`'s tables."""
    (count,) = source.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
        "AND query LIKE %s AND pid <> pg_backend_pid()",
        (f"%{schema}%",),
    ).fetchone()
    return count
