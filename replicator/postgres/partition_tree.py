"""The leaf partitions of a partitioned table, every level down, as the catalog says.

Read from pg_inherits with the caller's snapshot: inside a load's exported snapshot the
leaves are the ones its rows belong to (pg_partition_tree() reads the latest catalog
instead). A leaf is a table (or a foreign table) without partitions of its own; partitioned
tables in between hold no rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import TableName
from .database import fetch_all

PARTITIONED = "partitioned table"  # catalog.KINDS["p"]

_LEAVES = """
WITH RECURSIVE tree(oid, attached) AS (
    SELECT i.inhrelid, i.xmin::text FROM pg_catalog.pg_inherits i WHERE i.inhparent = %s
    UNION ALL
    SELECT i.inhrelid, t.attached || '/' || i.xmin::text
    FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent = t.oid
)
SELECT n.nspname, c.relname, c.oid, t.attached, c.relfilenode, c.relkind = 'f',
       pg_catalog.pg_relation_size(c.oid),
       pg_catalog.pg_relation_size(c.oid) / current_setting('block_size')::int,
       CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
            ELSE pg_catalog.pg_relation_size(c.oid) / 100 END,
       pg_catalog.has_table_privilege(c.oid, 'SELECT')
FROM tree t
JOIN pg_catalog.pg_class c ON c.oid = t.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'f')
ORDER BY n.nspname, c.relname
"""


@dataclass(frozen=True)
class Leaf:
    """One leaf partition."""

    name: TableName
    oid: int
    # The xmin of each pg_inherits row from the leaf up to the root: an ATTACH at any level
    # (a table detached and attached again included) gives a new one.
    attached: str
    storage: int  # relfilenode: TRUNCATE, VACUUM FULL and CLUSTER give it a new one
    foreign: bool  # a foreign table: no pages to split
    bytes: int
    pages: int
    estimated_rows: int  # reltuples; from the size when never analyzed
    readable: bool  # the role may SELECT from it directly (a grant on the root is not enough)


def leaves(conn: psycopg.Connection[Any], root_oid: int) -> list[Leaf]:
    """The table's leaf partitions at every level, by name."""
    rows = fetch_all(conn, _LEAVES, (root_oid,))
    return [Leaf(TableName(schema, name), *rest) for schema, name, *rest in rows]


def estimated_rows(conn: psycopg.Connection[Any], root_oid: int) -> int:
    """The sum of the leaves' estimates: the root itself has none (reltuples -1 or 0)."""
    return sum(leaf.estimated_rows for leaf in leaves(conn, root_oid))


def storage_digest(found: Sequence[Leaf]) -> int:
    """One number that changes when a leaf comes, goes, is renamed, attached again or
    rewritten: what a resumed load of page ranges must find unchanged."""
    facts = "\n".join(f"{lf.oid} {lf.name} {lf.attached} {lf.storage}" for lf in found)
    return int(hashlib.sha256(facts.encode()).hexdigest()[:15], 16)


def holding_rows(
    conn: psycopg.Connection[Any],
    root: TableName,
    leaves: Sequence[tuple[TableName, int]],
    where: sql.Composable | None = None,
) -> list[TableName]:
    """Those of the leaves (name, OID) that hold at least one row (`where` it holds), one
    read each at most. A leaf the role may read is read itself. One it may not (a grant on
    the schema's tables does not reach a partition created later) is read through the root,
    which the role may read, limited to the leaf's own partition bound so that the planner
    prunes every other partition away, and to its rows (`tableoid`)."""
    held = []
    for name, oid in leaves:
        (readable, bound) = fetch_all(
            conn,
            "SELECT has_table_privilege(%s::oid, 'SELECT'), "
            "pg_catalog.pg_get_partition_constraintdef(%s::oid)",
            (oid, oid),
        )[0]
        tests = [] if where is None else [where]
        if readable:
            table = name.identifier()
        else:
            table = root.identifier()
            # PostgreSQL's own text of the bound: its identifiers come quoted by the server
            tests += [sql.SQL(bound)] if bound else []
            tests.append(sql.SQL("tableoid = {}").format(sql.Literal(oid)))
        query = sql.SQL("SELECT EXISTS (SELECT FROM {}{})").format(
            table,
            sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(tests)) if tests else sql.SQL(""),
        )
        if fetch_all(conn, query)[0][0]:
            held.append(name)
    return held
