"""What a source table must be for `mode: "cdc"`, checked before it joins the publication
(a table with no replica identity in a publication would make the source refuse its UPDATEs
and DELETEs: that must never be the tool's doing).

- the built-in model: the log carries the table's rows, and a model's SELECT cannot be
  applied to a change;
- a plain or partitioned table (PostgreSQL 13+, whose publications send a partition's
  changes under its root's name), without generated columns (the log does not carry them);
- a replica identity that names the rows by the table's key: the primary key (the default),
  or REPLICA IDENTITY FULL with `primary_key` set; for a partitioned table, on every leaf
  too (the leaves' own setting decides what their updates and deletes log).
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..base.identifiers import TableName, display_ident
from ..plan.table_sql import TableSql
from ..postgres.catalog import TableInfo
from ..postgres.database import fetch_all
from ..postgres.partition_tree import PARTITIONED, leaves

_IDENTITIES = """
SELECT c.oid, c.relreplident::text,
       (SELECT array_agg(a.attname::text ORDER BY a.attname)
          FROM pg_catalog.pg_index i
          JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = c.oid
           AND (CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END)),
       (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attgenerated <> '')
FROM pg_catalog.pg_class c WHERE c.oid = ANY(%s)
"""
_VIA_ROOT_SINCE = 130000  # publish_via_partition_root

IDENTITY_NAMES = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


def replica_identity(source: psycopg.Connection[Any], info: TableInfo) -> tuple[str, list[str]]:
    """The table's replica identity (d, f, i, n) and the key columns it names."""
    _, identity, keys, _ = fetch_all(source, _IDENTITIES, ([info.oid],))[0]
    return identity, keys or []


def capture_problem(
    source: psycopg.Connection[Any], info: TableInfo, built: TableSql
) -> str | None:
    """Why the table cannot be captured from the log, with the fix; None when it can."""
    name = built.table.written_name
    if not built.model.reads_table_as_is:
        return (
            f"{name}: mode cdc copies the table as the log carries it, and a model "
            f"({built.model.origin}) cannot be applied to a change: remove the model file, "
            "or use a cursor mode"
        )
    partitioned = info.kind == PARTITIONED
    if info.kind != "table" and not partitioned:
        return (
            f"{name}: mode cdc reads a table's changes from the log, and this is a "
            f"{info.kind}, which it cannot read yet: use a cursor mode (replication_key), "
            "or full-refresh"
        )
    if partitioned and source.info.server_version < _VIA_ROOT_SINCE:
        return (
            f"{name}: mode cdc on a partitioned table needs PostgreSQL 13 or later (a "
            "publication that sends its partitions' changes under its name): use a cursor "
            "mode, or full-refresh"
        )
    _, identity, keys, generated = fetch_all(source, _IDENTITIES, ([info.oid],))[0]
    if generated:
        columns = ", ".join(map(display_ident, generated))
        return (
            f"{name}: generated column(s) {columns} are not in the log (PostgreSQL 15): "
            "mode cdc cannot copy them; use a cursor mode"
        )
    problem = _identity_problem(name, built, built.table.name, identity, keys)
    if problem is not None or not partitioned:
        return problem
    found = leaves(source, info.oid)
    identities = {
        oid: (identity, keys)
        for oid, identity, keys, _ in fetch_all(source, _IDENTITIES, ([f.oid for f in found],))
    }
    for leaf in found:
        subject = f"{name}: partition {leaf.name}"
        if leaf.foreign:
            return (
                f"{subject} is a foreign table, whose changes are not in the log: use a "
                "cursor mode, or full-refresh"
            )
        problem = _identity_problem(subject, built, leaf.name, *identities[leaf.oid])
        if problem is not None:
            return problem
    return None


def _identity_problem(
    subject: str, built: TableSql, table: TableName, identity: str, keys: list[str] | None
) -> str | None:
    """Why the table's (or a leaf's) replica identity does not name rows by the copy's key."""
    fix_full = f"ALTER TABLE {table} REPLICA IDENTITY FULL"
    if identity == "f":
        return None
    if identity == "n":
        return (
            f"{subject}: replica identity NOTHING: the log names no row of an update or delete; "
            f"run `{fix_full}` in the source (and set primary_key)"
        )
    if sorted(keys or []) != sorted(built.primary_key):
        wanted = ", ".join(map(display_ident, built.primary_key))
        have = ", ".join(map(display_ident, keys or [])) or "none"
        return (
            f"{subject}: the log names rows by ({have}), the copy by its primary key ({wanted}): "
            f"run `{fix_full}` in the source, or set primary_key to the source's key"
        )
    return None
