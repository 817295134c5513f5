"""Which source schema changes a copy can take in place (`on_schema_change: "evolve"`), and
the ALTERs that apply them, generated with sqlglot like the rest of the DDL.

Pure: from the changes `schema_diff.diff` found, either an `Evolution` (what to ALTER, which
added columns to bring to the source's values) or the reason it cannot evolve, which the
reload's reason then carries. In place means the copy keeps its OID, grants, comments,
indexes and views; sync/incremental/evolve.py runs it. What can evolve:

- a column added (its values are brought to the source's after the ALTER);
- a column dropped;
- a column renamed (same column number);
- a type widened without changing any value's text: smallint -> integer -> bigint,
  varchar(n) -> varchar(m >= n) or text, numeric(p, s) -> numeric(p' >= p, s) or numeric,
  timestamp(p) -> timestamp(p' >= p) (with or without time zone, and time);
- NOT NULL set or dropped.

Anything else (the table recreated, a key or replication key changed, a narrowing, a type
change that can change a value's text, columns reordered, a type's definition changed, a
column rewritten in place) reloads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..base.identifiers import TableName, display_ident
from .schema_diff import (
    Change,
    ColumnAdded,
    ColumnDropped,
    ColumnRenamed,
    NullabilityChanged,
    TypeChanged,
)
from .signature import SignedColumn

if TYPE_CHECKING:
    from sqlglot import exp

_INTEGERS = ("smallint", "integer", "bigint")
_SIZED = re.compile(
    r"^(character varying|numeric|timestamp|time|bit varying)\((\d+)(?:,(\d+))?\)(.*)$"
)


@dataclass(frozen=True)
class Evolution:
    """The changes a copy takes in place, in the order they are applied."""

    changes: tuple[Change, ...]

    @property
    def added(self) -> tuple[SignedColumn, ...]:
        return tuple(c.column for c in self.changes if isinstance(c, ColumnAdded))

    @property
    def reshapes(self) -> bool:
        """Whether an ALTER touches a column a view may use (a drop or a type change, which
        PostgreSQL refuses while a view depends on the column)."""
        return any(isinstance(c, ColumnDropped | TypeChanged) for c in self.changes)

    def alters(
        self,
        target: TableName,
        types: dict[str, str],
        current: dict[str, str],
        defaults: dict[str, str] | None = None,
    ) -> list[str]:
        """The ALTER TABLE statements, rendered by sqlglot, with each column's type in the
        copy (`types`: a hashed column's is text whatever the source's is; `current`: the
        copy's types now). An added column is added nullable, with the constant its source
        default gives (`defaults`, as text) where there is one: its rows have that value
        at once (a change of the catalog alone), and the default is dropped again, as the
        copy keeps none. Its other values come after (evolve.py), then NOT NULL is set."""
        defaults = defaults or {}
        statements = []
        for change in self.changes:
            if isinstance(change, ColumnAdded):
                name = change.column.name
                expression: exp.Expression = _add(target, name, types[name], defaults.get(name))
            elif isinstance(change, TypeChanged):
                if current.get(change.name) == types[change.name]:  # hashed: text, still
                    continue
                widened = TypeChanged(change.name, change.old, types[change.name])
                expression = widened.expression(target)
            else:
                expression = change.expression(target)
            statements.append(expression.sql(dialect="postgres"))
        for column in self.added:
            if column.name in defaults:
                statements.append(_drop_default(target, column.name).sql(dialect="postgres"))
        return statements

    def history_alters(
        self, history: TableName, types: dict[str, str], current: dict[str, str]
    ) -> list[str]:
        """The change in the copy's history table (postgres/history_tables.py): a column
        added (nullable and without a default: the past had no value) or renamed, a type
        widened; a dropped column stays (the past had it), and NOT NULL and defaults are the
        copy's alone."""
        statements = []
        for change in self.changes:
            expression: exp.Expression | None = None
            if isinstance(change, ColumnAdded):
                expression = _add(history, change.column.name, types[change.column.name], None)
            elif isinstance(change, TypeChanged) and current.get(change.name) != types[change.name]:
                expression = TypeChanged(change.name, change.old, types[change.name]).expression(
                    history
                )
            elif isinstance(change, ColumnRenamed):
                expression = change.expression(history)
            if expression is not None:
                statements.append(expression.sql(dialect="postgres"))
        return statements

    def nullable_first(self, target: TableName) -> tuple[Evolution, list[str]]:
        """The evolution with no NOT NULL set, and the statements that set them after: for
        a copy that takes them only once it is current past the snapshot its new values
        came from (a `cdc` copy still holds the rows the source deleted since)."""
        kept: list[Change] = []
        later: list[str] = []
        for change in self.changes:
            name = None
            if isinstance(change, NullabilityChanged) and change.not_null:
                name = change.name
            elif isinstance(change, ColumnAdded) and change.column.not_null:
                name = change.column.name
                kept.append(ColumnAdded(replace(change.column, not_null=False)))
            else:
                kept.append(change)
            if name is not None:
                statement = NullabilityChanged(name, True).expression(target)
                later.append(statement.sql(dialect="postgres"))
        return Evolution(tuple(kept)), later

    def not_null(self, target: TableName) -> list[str]:
        """SET NOT NULL of the added columns the source has NOT NULL, once they are filled."""
        return [
            NullabilityChanged(c.name, True).expression(target).sql(dialect="postgres")
            for c in self.added
            if c.not_null
        ]


def _add(target: TableName, name: str, type_text: str, default: str | None) -> exp.Expression:
    from sqlglot import exp

    column = ColumnAdded(SignedColumn(name, type_text, False)).expression(target)
    if default is not None:
        definition = column.find(exp.ColumnDef)
        assert definition is not None
        value = exp.Cast(this=exp.Literal.string(default), to=definition.args["kind"].copy())
        definition.append(
            "constraints", exp.ColumnConstraint(kind=exp.DefaultColumnConstraint(this=value))
        )
    return column


def _drop_default(target: TableName, name: str) -> exp.Expression:
    from sqlglot import exp

    action = exp.AlterColumn(this=exp.to_identifier(name, quoted=True), drop=True)
    return exp.Alter(this=target.table(), kind="TABLE", actions=[action])


def evolution(changes: Sequence[Change]) -> Evolution | str:
    """The changes as an Evolution, or why the copy cannot take them in place."""
    for change in changes:
        why = _cannot(change)
        if why is not None:
            return why
    return Evolution(tuple(changes))


def _cannot(change: Change) -> str | None:
    if isinstance(change, ColumnAdded | ColumnDropped | ColumnRenamed | NullabilityChanged):
        return None
    if isinstance(change, TypeChanged):
        if widens(change.old, change.new):
            return None
        return (
            f"{display_ident(change.name)} {change.old} -> {change.new} is not a widening that "
            "keeps every value's text"
        )
    return f"a {change.kind} is not taken in place"


def widens(old: str, new: str) -> bool:
    """Whether every value of type `old` is a value of `new` with the same text."""
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(new) >= _INTEGERS.index(old)
    if new == "text" and (old == "character varying" or old.startswith("character varying(")):
        return True
    if old == "character varying" and new == "character varying":
        return True
    before, after = _SIZED.match(old), _SIZED.match(new)
    if before is not None and (new == before.group(1) or new == before.group(1) + before.group(4)):
        return True  # unconstrained: every value fits, as it was
    if before is None or after is None:
        return False
    kind, size, scale, rest = before.groups()
    kind2, size2, scale2, rest2 = after.groups()
    return kind == kind2 and rest == rest2 and scale == scale2 and int(size2) >= int(size)
