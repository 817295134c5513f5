"""How a partitioned table's leaves changed since its copy was last synced, and which of
those changes the copy cannot follow without a reload (pure).

A copy reads the table through its root, so a leaf's rows are the table's rows. Some leaf
changes move rows in or out of the table with nothing a run reads seeing it:

- a leaf attached with rows (ATTACH PARTITION): the log carries no INSERT for them, and a
  cursor never reads their keys when they are behind it. A leaf that holds no row when the
  run looks (made by CREATE TABLE ... PARTITION OF, say) is no change: every row it gets
  later passes through the log, or the cursor, like any other.
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

from ..base.identifiers import TableName
from .schema_diff import Change
from .signature import Signature, SignedLeaf


@dataclass(frozen=True)
class LeafChanges:
    """The leaves gained, lost and (for `cdc`) rewritten between two signatures."""

    gained: tuple[SignedLeaf, ...] = ()
    lost: tuple[SignedLeaf, ...] = ()
    rewritten: tuple[SignedLeaf, ...] = ()

    def gained_names(self) -> list[TableName]:
        return [TableName(leaf.schema, leaf.name) for leaf in self.gained]


@dataclass(frozen=True)
class PartitionsChanged(Change):
    """Leaf changes the copy cannot follow: the table reloads."""

    kind: ClassVar[str] = "partitions changed"
    attached: tuple[str, ...]
    detached: tuple[str, ...]
    rewritten: tuple[str, ...]

    def detail(self) -> str:
        return ", ".join(
            [
                *(f"{name} attached with rows" for name in self.attached),
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
    changes: LeafChanges, holding_rows: list[TableName]
) -> PartitionsChanged | None:
    """The change that reloads the table; None when there is none. `holding_rows`: those of
    the gained leaves that hold a row now."""
    attached = tuple(str(name) for name in changes.gained_names() if name in set(holding_rows))
    if not (attached or changes.lost or changes.rewritten):
        return None
    return PartitionsChanged(attached, _names(changes.lost), _names(changes.rewritten))


def _names(leaves: tuple[SignedLeaf, ...]) -> tuple[str, ...]:
    return tuple(str(TableName(leaf.schema, leaf.name)) for leaf in leaves)
