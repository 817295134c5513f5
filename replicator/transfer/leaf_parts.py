"""How a partitioned table's load is split: by leaf partition, since each leaf has pages of
its own (a `ctid` range on the root would take the same pages of every leaf).

Leaves are planned inside the load's snapshot (postgres/partition_tree.py) and packed into
parts of about equal size: a leaf larger than a part is cut into page ranges of its own,
smaller ones go together (one COPY of their UNION ALL) until a part is full. Each part reads
the leaves directly, with the model's table swapped for the leaf: only for the built-in
model, which reads the table's rows one by one as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg import sql

from ..base.identifiers import TableName
from ..postgres.partition_tree import Leaf
from .partitions import PageRange, page_predicate, partition_count

if TYPE_CHECKING:  # loaded when a partitioned table's load is planned
    from sqlglot import exp


@dataclass(frozen=True)
class LeafPages:
    """Pages `first <= page < end` of one leaf (`end` None: to its last page)."""

    leaf: TableName
    first: int = 0
    end: int | None = None


@dataclass(frozen=True)
class LeafRange:
    """One part of a partitioned table's load: whole leaves, or a page range of one."""

    pieces: tuple[LeafPages, ...]


def split_leaves(
    found: Sequence[Leaf], parallelism: int, requested: int | None
) -> list[LeafRange] | None:
    """The parts, or None when one part would hold everything (the root is then read as
    it is). `requested` (the table's `partitions` setting) replaces the size-based count."""
    total = sum(leaf.bytes for leaf in found)
    count = requested or partition_count(total, parallelism)
    if count <= 1 or not found:
        return None
    target = max(1, math.ceil(total / count))
    parts: list[LeafRange] = []
    group: list[LeafPages] = []
    filled = 0
    for leaf in found:
        if leaf.bytes > target and not leaf.foreign and leaf.pages > 1:
            parts += [LeafRange((piece,)) for piece in _page_ranges(leaf, target)]
            continue
        if group and filled + leaf.bytes > target:
            parts.append(LeafRange(tuple(group)))
            group, filled = [], 0
        group.append(LeafPages(leaf.name))
        filled += leaf.bytes
    if group:
        parts.append(LeafRange(tuple(group)))
    return parts


def _page_ranges(leaf: Leaf, target: int) -> list[LeafPages]:
    """Equal page ranges over one large leaf; the last one open-ended (it may grow)."""
    count = min(math.ceil(leaf.bytes / target), leaf.pages)
    step = math.ceil(leaf.pages / count)
    edges = list(range(0, leaf.pages, step))
    return [
        LeafPages(leaf.name, first, edges[i + 1] if i + 1 < len(edges) else None)
        for i, first in enumerate(edges)
    ]


def leaf_model(model_sql: str, root: TableName, leaf: TableName) -> str:
    """The model with its table, the root, swapped for one leaf."""
    from sqlglot import exp, parse_one

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and (node.db, node.name) == (root.schema, root.name):
            return leaf.table()
        return node

    return parse_one(model_sql, dialect="postgres").transform(swap).sql(dialect="postgres")


def leaf_range_query(model_sql: str, root: TableName, part: LeafRange) -> sql.Composable:
    """The SELECT of one part: each piece's leaf with its page bounds, in one UNION ALL."""
    selects = []
    for piece in part.pieces:
        select: sql.Composable = sql.SQL(leaf_model(model_sql, root, piece.leaf))
        predicate = page_predicate(PageRange(piece.first, piece.end))
        if predicate is not None:
            select = sql.SQL("{} WHERE {}").format(select, predicate)
        selects.append(select)
    return sql.SQL(" UNION ALL ").join(selects)
