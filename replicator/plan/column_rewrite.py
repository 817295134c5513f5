"""A column whose values a rewrite of the table changed in place: `ALTER COLUMN ... TYPE
... USING`, even to the same type, writes nothing to the log and moves no cursor, and the
columns' names and types stay as they were. The table's storage and the column's catalog
row, both new, tell it (postgres/catalog.TableInfo.storage, column_versions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base.identifiers import display_ident
from .schema_diff import Change, TypeChanged
from .signature import Signature


@dataclass(frozen=True)
class ColumnRewritten(Change):
    kind: ClassVar[str] = "column rewritten"
    name: str

    def detail(self) -> str:
        return (
            f"{display_ident(self.name)} (the table was rewritten with its column altered, as "
            "ALTER COLUMN ... TYPE ... USING does: its values may have changed where no log "
            "entry or cursor says so)"
        )


def rewritten_columns(old: Signature, new: Signature, found: list[Change]) -> list[Change]:
    """Columns whose values a rewrite of the table changed in place: the table (or a leaf
    partition) has new storage, and their catalog rows are new too (`ALTER COLUMN ... TYPE
    ... USING`, even to the same type, writes nothing to the log and moves no cursor). A
    rewrite alone (VACUUM FULL, CLUSTER) changes no column; a retyped column is said as a
    type change. Every column of the table counts, not only the copy's: a model or a
    `where` may read one the copy does not hold."""
    if old.column_versions is None or new.column_versions is None:
        return []
    if old.table_oid != new.table_oid:  # recreated: said as such
        return []
    if not _new_storage(old, new):
        return []
    retyped = {c.name for c in found if isinstance(c, TypeChanged)}
    before = dict(old.column_versions)
    return [
        ColumnRewritten(name)
        for name, version in new.column_versions
        if name not in retyped and _row_rewritten(before.get(name, version), version)
    ]


def _row_rewritten(old: str, new: str) -> bool:
    """A column's catalog row written again by ALTER COLUMN TYPE (catalog.TableInfo's
    `xmin/atthasmissing/default's xmin`). A rewrite of the table (VACUUM FULL, CLUSTER)
    writes again the row of a column added with a default and never rewritten since (its
    `atthasmissing` cleared), and nothing else: ALTER COLUMN TYPE writes its default again
    too, so a row whose only change is that clearing, with the same default, is no
    rewrite. A version of another form (written by an earlier build) is never a change."""
    if old == new or old.count("/") != 2 or new.count("/") != 2:
        return False
    old_xmin, old_missing, old_default = old.split("/")
    new_xmin, new_missing, new_default = new.split("/")
    cleared = old_missing == "true" and new_missing == "false" and old_default == new_default
    return old_xmin != new_xmin and not cleared


def _new_storage(old: Signature, new: Signature) -> bool:
    """The table, or one of its leaf partitions, was rewritten (or truncated)."""
    return old.storage is not None and new.storage is not None and old.storage != new.storage
