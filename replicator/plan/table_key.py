"""Which columns key a table's copy, and where they come from.

In order: `primary_key` in tables-config.json, the source table's primary key, else a unique
index over NOT NULL columns (`postgres/catalog.py` says which qualify). Such an index names
each row exactly as a primary key would, so every mode can merge, append, delete and verify
by it; the copy gets a primary key on those columns. A table with none of them has no key:
`full-refresh` copies it as it is and `verify` compares it as a multiset of rows; the modes
that match rows by key refuse it, saying how to give it one.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from ..base.errors import TableProblem
from ..base.identifiers import display_ident
from ..postgres.catalog import TableInfo
from ..project.config import TableConfig
from .column_hint import columns_hint

KeyOrigin = Literal["config", "primary key", "unique index", "none"]

# What each mode that matches rows by key does with it (for the refusal of a keyless table).
_KEY_USES = {
    "incremental-deduped": "to merge each changed row into its copy",
    "incremental-append": "to append each row exactly once",
    "cdc": "to apply each logged change to its row",
}


@dataclass(frozen=True)
class TableKey:
    """The key columns of a table's copy, and where they come from."""

    columns: tuple[str, ...]
    origin: KeyOrigin
    index: str | None = None  # the unique index (origin "none": one the model leaves out)

    def describe(self) -> str:
        """As `check` and `compile` print it."""
        names = ", ".join(map(display_ident, self.columns))
        if self.origin == "unique index":
            return f"key from unique index {display_ident(self.index or '')} ({names})"
        if self.origin == "none" and self.index is not None:
            index = display_ident(self.index)
            return f"no key (the model leaves out columns of unique index {index})"
        if self.origin == "none":
            return "no key (no primary key, no unique index over NOT NULL columns)"
        return f"primary key ({names})"


def preferred_key(table: TableConfig, source: TableInfo) -> tuple[str, ...]:
    """The columns that key the copy when its model keeps them, in `resolve_key`'s order:
    the config's `primary_key`, the source's primary key, else its usable unique index."""
    index = source.unique_index
    return tuple(table.primary_key or source.primary_key or (index.columns if index else ()))


def resolve_key(table: TableConfig, source: TableInfo, model_columns: Collection[str]) -> TableKey:
    """The key of the table's copy; TableProblem when the configured one names a column the
    source lacks, or when the mode needs a key and the table has none."""
    if table.primary_key:
        missing = [c for c in table.primary_key if source.column(c) is None]
        if missing:
            raise TableProblem(
                f"{table.written_name}: primary_key column "
                f"{', '.join(map(display_ident, missing))} does not exist in the source table"
                f"{columns_hint(missing, source)}{table.pattern_fix()}"
            )
        return TableKey(tuple(table.primary_key), "config")
    if source.primary_key:
        return TableKey(source.primary_key, "primary key")
    index = source.unique_index
    # A full-refresh model may leave the index's columns out: it is then copied without a key
    # (the other modes need it, and say that the model must keep it).
    if index is not None and (
        table.mode != "full-refresh" or set(index.columns) <= set(model_columns)
    ):
        return TableKey(index.columns, "unique index", index.name)
    if table.mode != "full-refresh":
        raise TableProblem(
            f"{table.written_name}: the source table has no primary key, which mode "
            f"{table.mode} needs ({_KEY_USES.get(table.mode, 'to match rows')}), and no unique "
            "index over NOT NULL columns (valid, not partial, not on expressions, comparing "
            "values as its columns do) to use instead: add a primary key or such an index to "
            "the source table, set "
            '"primary_key" in tables-config.json (columns that identify a row), or use '
            f'"mode": "full-refresh"{table.pattern_fix()}'
        )
    return TableKey((), "none", index.name if index is not None else None)
