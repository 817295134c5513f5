"""How a partitioned table's leaves changed since its copy was last synced, and which of
those changes the copy cannot follow without a reload (pure).

A copy reads the table through its root, so a leaf's rows are the table's rows. Some leaf
changes move rows in or out of the table with nothing a run reads seeing it:

- a leaf attached with rows (ATTACH PARTITION): the log carries no INSERT for them, and a
  cursor never reads their keys when they are behind it. A leaf that holds no such row when
  the run looks (made by CREATE TABLE ... PARTITION OF, say) is no change: every row it gets
  later passes through the log, or the cursor, like any other. For a cursor table whose
  model reads the table as it is, only rows behind the cursor count: the next read takes
  the others (a monthly partition filling with new rows reloads nothing).
- a leaf detached or dropped: the log carries no DELETE, and a cursor sees no delete; the
  copy would keep its rows for ever.
- for `cdc`, a leaf truncated: a publication that publishes through the root does not send
  a TRUNCATE of one partition. Its storage (relfilenode) is new, as after VACUUM FULL or
  CLUSTER, which cannot be told apart and reload too. (A cursor table treats a partition's
  TRUNCATE as any delete: its `deletes` setting decides.)

A leaf is the same while its OID and its attachment (the pg_inherits rows up to the root)
are: one detached and attached again is gone and back, so its rows may have changed
meanwhile. Each of these reloads the table, with the reason `partitions changed: ...`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from psycopg import sql

from ..base.identifiers import TableName
from ..project.state import Cursor
from .schema_diff import Change
from .signature import Signature, SignedLeaf
from .table_sql import TableSql


@dataclass(frozen=True)
class LeafChanges:
    """The leaves gained, lost and (for `cdc`) rewritten between two signatures."""

    gained: tuple[SignedLeaf, ...] = ()
    lost: tuple[SignedLeaf, ...] = ()
    rewritten: tuple[SignedLeaf, ...] = ()

    def gained_names(self) -> list[TableName]:
        return [TableName(leaf.schema, leaf.name) for leaf in self.gained]

    def gained_oids(self) -> list[tuple[TableName, int]]:
        return [(TableName(leaf.schema, leaf.name), leaf.oid) for leaf in self.gained]


@dataclass(frozen=True)
class PartitionsChanged(Change):
    """Leaf changes the copy cannot follow: the table reloads."""

    kind: ClassVar[str] = "partitions changed"
    attached: tuple[str, ...]
    detached: tuple[str, ...]
    rewritten: tuple[str, ...]
    rows: str = "rows"  # which of an attached leaf's rows count: "rows behind the cursor"

    def detail(self) -> str:
        return ", ".join(
            [
                *(f"{name} attached with {self.rows}" for name in self.attached),
                *(f"{name} detached or dropped" for name in self.detached),
                *(f"{name} truncated or rewritten" for name in self.rewritten),
            ]
        )


def leaf_changes(old: Signature, new: Signature, log_based: bool) -> LeafChanges:
    """What differs between the leaves the copy last saw and the leaves now (nothing when
    either signature has none). `log_based`: a `cdc` table, which also misses a leaf's
    TRUNCATE."""
    if old.partitions is None or new.partitions is None:
        return LeafChanges()
    before = {(leaf.oid, leaf.attached): leaf for leaf in old.partitions}
    now = {(leaf.oid, leaf.attached): leaf for leaf in new.partitions}
    rewritten = [
        leaf for key, leaf in now.items() if key in before and before[key].storage != leaf.storage
    ]
    return LeafChanges(
        gained=tuple(leaf for key, leaf in now.items() if key not in before),
        lost=tuple(leaf for key, leaf in before.items() if key not in now),
        rewritten=tuple(rewritten) if log_based else (),
    )


def partitions_change(
    changes: LeafChanges, holding_rows: list[TableName], rows: str = "rows"
) -> PartitionsChanged | None:
    """The change that reloads the table; None when there is none. `holding_rows`: those of
    the gained leaves that hold a row now (`rows`: which rows were looked for)."""
    attached = tuple(str(name) for name in changes.gained_names() if name in set(holding_rows))
    if not (attached or changes.lost or changes.rewritten):
        return None
    return PartitionsChanged(attached, _names(changes.lost), _names(changes.rewritten), rows)


def _names(leaves: tuple[SignedLeaf, ...]) -> tuple[str, ...]:
    return tuple(str(TableName(leaf.schema, leaf.name)) for leaf in leaves)


def behind_cursor(built: TableSql, cursor: Cursor | None) -> sql.Composable | None:
    """For a cursor table whose model reads the table as it is, the rows of a new leaf that
    its reads would never take: `key < cursor` (none without a cursor: the next read takes
    every row). None: every row counts (`cdc`, or a model)."""
    key = built.table.replication_key
    if key is None or built.table.mode == "cdc" or not built.model.reads_table_as_is:
        return None
    if cursor is None:
        return sql.SQL("false")
    return sql.SQL("{} < {}::{}").format(
        sql.Identifier(key), sql.Literal(cursor.value), sql.SQL(built.replication_key_type)
    )
