"""A full load's partitions, planned inside its snapshot, and the COPY task of each.

- the built-in model on a table: page ranges of the table (transfer/partitions.py);
- the built-in model on a partitioned table: leaf partitions and page ranges inside the large
  ones (transfer/leaf_parts.py), when the role may read the leaves directly;
- otherwise key ranges of the model, the table's size being its leaves' for a partitioned one.

The size estimate (the rows that decide between this process and Spark) is the table's, or
the sum of its leaves': a partitioned table has no statistics of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ...plan.table_sql import MODEL_ALIAS, TableSql
from ...postgres import partition_tree
from ...postgres.catalog import TableInfo
from ...postgres.database import execute
from ...transfer.copy_stream import CopyTask
from ...transfer.copy_tasks import copy_tasks
from ...transfer.leaf_parts import LeafRange, leaf_range_query, split_leaves
from ...transfer.partitions import (
    KeyRange,
    PageRange,
    page_predicate,
    plan_key_ranges,
    plan_page_ranges,
    range_predicate,
)
from ..scripts import side_table

Part = PageRange | KeyRange | LeafRange


def estimated_rows(conn: psycopg.Connection[Any], source: TableInfo) -> int:
    """pg_class's row estimate (from the size when the table was never analyzed); for a
    partitioned table, the sum of its leaves' at every level."""
    if source.kind == partition_tree.PARTITIONED:
        return partition_tree.estimated_rows(conn, source.oid)
    (estimate,) = execute(
        conn,
        "SELECT CASE WHEN reltuples >= 0 THEN reltuples::bigint "
        "ELSE pg_relation_size(oid) / 100 END FROM pg_catalog.pg_class WHERE oid = %s",
        (source.oid,),
    ).fetchone()
    return int(estimate)


def plan_parts(
    conn: psycopg.Connection[Any], built: TableSql, source: TableInfo, parallelism: int
) -> list[PageRange] | list[KeyRange] | list[LeafRange]:
    """The load's partitions (read inside the caller's snapshot)."""
    requested = built.table.partitions
    as_is = built.model.reads_table_as_is
    if as_is and source.kind == "table":
        return plan_page_ranges(conn, source, parallelism, requested)
    size = None
    if source.kind == partition_tree.PARTITIONED:
        leaves = partition_tree.leaves(conn, source.oid)
        if as_is and all(leaf.readable for leaf in leaves):
            whole = [KeyRange(None, None, nulls=True)]  # one part: the root as it is
            return split_leaves(leaves, parallelism, requested) or whole
        size = sum(leaf.bytes for leaf in leaves), sum(leaf.estimated_rows for leaf in leaves)
    key = built.primary_key[0] if built.primary_key else None
    key_type = built.type_of(key or "")
    return plan_key_ranges(conn, source, key, key_type, parallelism, requested, size)


def part_tasks(
    snapshot: str,
    urls: tuple[str, str],
    built: TableSql,
    load_id: str,
    parts: Sequence[Part],
    todo: list[int],
) -> list[CopyTask]:
    """The tasks of the partitions `todo` (all of them for a fresh load; a single one then
    empties the side table and copies frozen)."""
    side = side_table(built.table.target)
    queries = part_queries(built, parts)
    return copy_tasks(
        load_id,
        *urls,
        snapshot,
        [queries[i] for i in todo],
        (side.schema, side.name),
        [c.name for c in built.columns],
        freeze=len(todo) == len(parts),
        origin=built.model.origin,
        parts=todo,
        text=built.copies_as_text,
    )


def part_queries(built: TableSql, parts: Sequence[Part]) -> list[sql.Composable]:
    """One SELECT per partition."""
    return [_part_query(built, part) for part in parts]


def _part_query(built: TableSql, part: Part) -> sql.Composable:
    model = sql.SQL(built.model.sql)
    if isinstance(part, LeafRange):
        return leaf_range_query(built.model.sql, built.table.name, part)
    if isinstance(part, PageRange):
        predicate = page_predicate(part)
        # The built-in model is `SELECT <columns> FROM <table>`: the bounds go straight on.
        return model if predicate is None else sql.SQL("{} WHERE {}").format(model, predicate)
    key = built.primary_key[0] if built.primary_key else None
    predicate = range_predicate(key, built.type_of(key), part) if key else None
    if predicate is None:
        return model
    return sql.SQL("SELECT * FROM ({}) AS {} WHERE {}").format(
        model, sql.Identifier(MODEL_ALIAS), predicate
    )
