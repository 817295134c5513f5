"""A `cdc` table as the drain sees it: what it copies, where its copy is current to, and what
the drain did to it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..base.identifiers import TableName
from ..plan.table_sql import TableSql
from .rows.shaped_log import LogShape, LogShaping


@dataclass
class CaptureTable:
    """A `cdc` table the drain feeds (or only watches, `apply` False: not selected this run)."""

    name: TableName  # the source table, as the log names it
    built: TableSql | None  # None for a table only watched
    applied: int  # commits starting before this are in the destination already
    apply: bool = True
    # what this drain did to it
    changes: int = 0
    upserted: int = 0
    deleted: int = 0
    truncated: bool = False
    drift: str | None = None  # the log's shape of the table differs from the copy's
    error: str | None = None
    holds: bool = False  # failed, and its position could not be forgotten: keeps its changes
    forgotten: bool = False  # its position was removed from the destination (it reloads)
    position: int = 0  # where its copy is current to after the drain
    key_positions: tuple[int, ...] = field(default=())
    # `columns.exclude` / `hash` applied to the logged tuples (cdc/rows/shaped_log.py), and
    # the shape of the relation the log described last
    shaping: LogShaping | None = None
    shape: LogShape | None = None
    # the `where` its apply runs over each change's new row (preflight.applied_where): the
    # publication sends every row of such a table
    where: str | None = None

    def __post_init__(self) -> None:
        names = list(self.columns)
        key = self.built.primary_key if self.built else ()
        self.key_positions = tuple(names.index(k) for k in key)
        self.position = self.applied

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.built.columns) if self.built else ()

    @functools.cached_property
    def target(self) -> TableName:
        assert self.built is not None
        return self.built.table.target

    @property
    def key(self) -> tuple[str, ...]:
        assert self.built is not None
        return self.built.primary_key

    @property
    def keys_may_repeat(self) -> bool:
        """Keyed by the config's `primary_key` (REPLICA IDENTITY FULL): not unique in the
        source, unlike its primary key or a unique index."""
        return self.built is not None and self.built.table.primary_key is not None

    @property
    def label(self) -> str:
        return self.built.table.written_name if self.built else str(self.name)

    @property
    def takes_changes(self) -> bool:
        return self.apply and self.drift is None and self.error is None
