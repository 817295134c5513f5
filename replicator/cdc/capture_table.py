"""A `cdc` table as the drain sees it: what it copies, where its copy is current to, what
the drain did to it, and, for a table that takes schema changes in place (`on_schema_change:
"evolve"`), the copy's own columns, which the log's shape is compared with.

Such a table's copy may be a shape behind the source's catalog: an ALTER the log has not
reached yet. Its changes are applied while the log's shape fits the copy's (the same
columns and types, a length or precision no wider than the copy's), and it stops at the
first transaction whose shape does not: the commits before it are applied and recorded, the
slot keeps that one, and the run takes the change in place there (sync/cdc/log_evolution.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..base.identifiers import TableName
from ..plan.table_sql import TableSql
from ..postgres.catalog import FIRST_NORMAL_OID
from ..postgres.database import fetch_all
from ..postgres.history_tables import HistoryTable, Versions
from ..postgres.naming import MARK_COLUMN
from .rows.shaped_log import LogShape, LogShaping
from .source.pgoutput import Relation, RelationColumn

# Types whose modifier is a length or precision, as their oids: a value of a narrower one is
# a value of the wider with the same text (plan/evolution.widens).
_VARCHAR, _VARBIT, _NUMERIC = 1043, 1562, 1700
_SIZED = frozenset((_VARCHAR, _VARBIT, _NUMERIC, 1083, 1114, 1184, 1266))
_COLUMNS = """
SELECT attname, atttypid::int, atttypmod FROM pg_catalog.pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""


@dataclass(frozen=True)
class ShapeColumn:
    """A column as the log's Relation message describes one: its type as the source's oid."""

    name: str
    type_oid: int
    typmod: int


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
    versions: Versions = field(default_factory=Versions)  # written in its history table
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
    # `on_schema_change: "evolve"`: the copy's columns (copy_shape), and once the log's
    # shape stops fitting them, that Relation message and the end of the last commit before
    # its transaction, the table's position from there (see above)
    copy_shape: tuple[ShapeColumn, ...] | None = None
    evolving: Relation | None = None
    stop: int | None = None

    def __post_init__(self) -> None:
        names = list(self.columns)
        key = self.built.primary_key if self.built else ()
        self.key_positions = tuple(names.index(k) for k in key)
        self.position = self.applied

    @functools.cached_property
    def column_types(self) -> tuple[tuple[str, int], ...]:
        """The staged columns, each with its type as the source's oid: the copy's own
        (`copy_shape`), else the ones it copies."""
        columns = self.copy_shape
        if columns is None:
            columns = self.built.columns if self.built else ()
        return tuple((c.name, c.type_oid) for c in columns)

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.column_types)

    @functools.cached_property
    def target(self) -> TableName:
        assert self.built is not None
        return self.built.table.target

    @property
    def key(self) -> tuple[str, ...]:
        assert self.built is not None
        return self.built.primary_key

    @functools.cached_property
    def history(self) -> HistoryTable | None:
        return self.built.history if self.built is not None else None

    @property
    def keys_may_repeat(self) -> bool:
        """Keyed by the config's `primary_key` (REPLICA IDENTITY FULL): not unique in the
        source, unlike its primary key or a unique index."""
        return self.built is not None and self.built.table.primary_key is not None

    @property
    def label(self) -> str:
        return self.built.table.written_name if self.built else str(self.name)

    @property
    def applies(self) -> bool:
        """Its staged changes are applied (those before its stop, if it has one)."""
        return self.apply and self.drift is None and self.error is None

    @property
    def takes_changes(self) -> bool:
        return self.applies and self.evolving is None

    def end_of(self, batch_end: int) -> int:
        """Its position once a batch that ends at `batch_end` is applied."""
        return batch_end if self.stop is None else min(self.stop, batch_end)

    def fits(self, logged: Sequence[RelationColumn]) -> bool:
        """Whether the log's shape can be applied to the copy (`copy_shape`) as it is."""
        shape = self.copy_shape
        assert shape is not None
        return len(logged) == len(shape) and all(
            a.name == b.name and a.type_oid == b.type_oid and _fits(a, b.typmod)
            for a, b in zip(logged, shape, strict=True)
        )


def _fits(logged: RelationColumn, typmod: int) -> bool:
    if logged.type_modifier == typmod or typmod == -1:
        return True
    if logged.type_oid not in _SIZED or logged.type_modifier == -1:
        return False
    if logged.type_oid == _NUMERIC:  # (precision << 16 | scale) + 4: the same scale
        was, now = logged.type_modifier - 4, typmod - 4
        return was & 0xFFFF == now & 0xFFFF and was >> 16 <= now >> 16
    return logged.type_modifier <= typmod


def copy_shape(
    dest: psycopg.Connection[Any], destination_oid: int, built: TableSql
) -> tuple[ShapeColumn, ...]:
    """The copy's columns, read from the copy (a user-defined type named by the source's
    oid of the column's type: the two servers number their own types)."""
    source_oids = {c.name: c.type_oid for c in built.columns}
    return tuple(
        ShapeColumn(name, oid if oid < FIRST_NORMAL_OID else source_oids.get(name, 0), typmod)
        for name, oid, typmod in fetch_all(dest, _COLUMNS, (destination_oid,))
        if name != MARK_COLUMN
    )


def source_shape(source: psycopg.Connection[Any], oid: int) -> tuple[ShapeColumn, ...]:
    """The source table's columns now, as a Relation message would describe them."""
    return tuple(ShapeColumn(*row) for row in fetch_all(source, _COLUMNS, (oid,)))
