"""The difference between two schema signatures, as a list of typed changes.

Pure: `diff(old, new)` compares what a table was built from with what it is now. Each change
says what it is in one line (for the summary, the webhook and errors) and renders the sqlglot
ALTER that would apply it to the destination table, where PostgreSQL has one. The tool itself
reloads a changed table rather than altering it (an altered column would keep stale values);
the ALTERs are shown by `compile` so a user sees exactly what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..base.identifiers import TableName, display_ident
from ..postgres.naming import MARK_COLUMN, MARK_TYPE, default_key_name
from .signature import Signature, SignedColumn

if TYPE_CHECKING:  # sqlglot is loaded when a change is rendered: most runs have none
    from sqlglot import exp


def _ident(name: str) -> exp.Identifier:
    from sqlglot import exp

    return exp.to_identifier(name, quoted=True)


def _type(type_text: str) -> exp.DataType:
    """The type verbatim: format_type() output is already valid, exact PostgreSQL."""
    from sqlglot import exp

    return exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=type_text)


def _column_def(name: str, type_text: str, not_null: bool = False) -> exp.ColumnDef:
    """A column as an ALTER TABLE ... ADD renders it (postgres/ddl.column_def is the same
    for the statements a run executes, through psycopg.sql)."""
    from sqlglot import exp

    constraints = [exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())] if not_null else []
    return exp.ColumnDef(this=_ident(name), kind=_type(type_text), constraints=constraints)


def _alter(target: TableName, *actions: exp.Expression) -> exp.Alter:
    from sqlglot import exp

    return exp.Alter(this=target.table(), kind="TABLE", actions=list(actions))


def _key(columns: tuple[str, ...]) -> str:
    return "(" + ", ".join(map(display_ident, columns)) + ")" if columns else "none"


@dataclass(frozen=True)
class Change:
    """One difference; `kind` is the stable phrase that starts its description."""

    kind: ClassVar[str] = "changed"

    def detail(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind}: {self.detail()}"

    def expression(self, target: TableName) -> exp.Expression | None:
        """The statement that would make the destination match; None where there is none."""
        return None

    def as_json(self, target: TableName) -> dict[str, Any]:
        expression = self.expression(target)
        return {
            "kind": self.kind,
            "description": self.describe(),
            "sql": expression.sql(dialect="postgres") if expression is not None else None,
        }


@dataclass(frozen=True)
class TableRecreated(Change):
    kind: ClassVar[str] = "table recreated"
    old_oid: int
    new_oid: int

    def detail(self) -> str:
        return f"dropped and created again (oid {self.old_oid} -> {self.new_oid})"


@dataclass(frozen=True)
class ColumnAdded(Change):
    kind: ClassVar[str] = "column added"
    column: SignedColumn

    def detail(self) -> str:
        null = " NOT NULL" if self.column.not_null else ""
        return f"{display_ident(self.column.name)} {self.column.type}{null}"

    def expression(self, target: TableName) -> exp.Expression:
        c = self.column
        return _alter(target, _column_def(c.name, c.type, c.not_null))


@dataclass(frozen=True)
class MarkColumnChanged(Change):
    """`deletes` switched to or from "mark": the destination gains or loses its metadata
    column (a sync reloads the table, as for any change of its columns)."""

    kind: ClassVar[str] = "deletes changed"
    wanted: bool  # True: the column is to be added

    def detail(self) -> str:
        if self.wanted:
            return f"{display_ident(MARK_COLUMN)} to add (deletes is mark)"
        return f"{display_ident(MARK_COLUMN)} to drop (deletes is no longer mark)"

    def expression(self, target: TableName) -> exp.Expression:
        if self.wanted:
            return _alter(target, _column_def(MARK_COLUMN, MARK_TYPE))
        return ColumnDropped(MARK_COLUMN).expression(target)


@dataclass(frozen=True)
class ColumnDropped(Change):
    kind: ClassVar[str] = "column dropped"
    name: str

    def detail(self) -> str:
        return display_ident(self.name)

    def expression(self, target: TableName) -> exp.Expression:
        from sqlglot import exp

        drop = exp.Drop(tables=[exp.column(_ident(self.name))], kind="COLUMN")
        return _alter(target, drop)


@dataclass(frozen=True)
class ColumnRenamed(Change):
    kind: ClassVar[str] = "column renamed"
    old: str
    new: str

    def detail(self) -> str:
        return f"{display_ident(self.old)} -> {display_ident(self.new)}"

    def expression(self, target: TableName) -> exp.Expression:
        from sqlglot import exp

        rename = exp.RenameColumn(
            this=exp.column(_ident(self.old)), to=exp.column(_ident(self.new))
        )
        return _alter(target, rename)


@dataclass(frozen=True)
class TypeChanged(Change):
    kind: ClassVar[str] = "type changed"
    name: str
    old: str
    new: str

    def detail(self) -> str:
        return f"{display_ident(self.name)} {self.old} -> {self.new}"

    def expression(self, target: TableName) -> exp.Expression:
        from sqlglot import exp

        dtype = _type(self.new)
        return _alter(target, exp.AlterColumn(this=_ident(self.name), dtype=dtype))


@dataclass(frozen=True)
class NullabilityChanged(Change):
    kind: ClassVar[str] = "nullability changed"
    name: str
    not_null: bool

    def detail(self) -> str:
        now = "NOT NULL" if self.not_null else "nullable"
        return f"{display_ident(self.name)} is now {now}"

    def expression(self, target: TableName) -> exp.Expression:
        from sqlglot import exp

        if self.not_null:
            # allow_null as a node, not False: sqlglot renders SET NOT NULL either way but
            # warns "unsupported" for a plain False.
            action = exp.AlterColumn(this=_ident(self.name), allow_null=exp.false())
        else:
            action = exp.AlterColumn(this=_ident(self.name), drop=True, allow_null=True)
        return _alter(target, action)


@dataclass(frozen=True)
class ColumnsReordered(Change):
    kind: ClassVar[str] = "columns reordered"
    old: tuple[str, ...]
    new: tuple[str, ...]

    def detail(self) -> str:
        return f"{_key(self.old)} -> {_key(self.new)}"


@dataclass(frozen=True)
class PrimaryKeyChanged(Change):
    kind: ClassVar[str] = "primary key changed"
    old: tuple[str, ...]
    new: tuple[str, ...]

    def detail(self) -> str:
        return f"{_key(self.old)} -> {_key(self.new)}"

    def expression(self, target: TableName) -> exp.Expression:
        """Drops the key by PostgreSQL's default name (a reload keeps the table's key name)."""
        from sqlglot import exp

        actions: list[exp.Expression] = []
        if self.old:
            name = _ident(default_key_name(target))
            actions.append(exp.Drop(tables=[exp.Table(this=name)], kind="CONSTRAINT"))
        if self.new:
            key = exp.PrimaryKey(expressions=[_ident(c) for c in self.new])
            actions.append(exp.AddConstraint(expressions=[key]))
        return _alter(target, *actions)


@dataclass(frozen=True)
class ReplicationKeyChanged(Change):
    kind: ClassVar[str] = "replication key changed"
    old: str | None
    new: str | None

    def detail(self) -> str:
        old = display_ident(self.old) if self.old else "none"
        return f"{old} -> {display_ident(self.new) if self.new else 'none'}"


@dataclass(frozen=True)
class EnumLabelAdded(Change):
    kind: ClassVar[str] = "enum label added"
    type_name: str
    label: str

    def detail(self) -> str:
        from sqlglot import exp

        return f"{self.type_name} {exp.Literal.string(self.label).sql(dialect='postgres')}"

    def expression(self, target: TableName) -> exp.Expression:
        from sqlglot import exp

        schema, _, name = self.type_name.partition(".")
        qualified = exp.Dot(this=_ident(schema), expression=_ident(name)).sql(dialect="postgres")
        label = exp.Literal.string(self.label).sql(dialect="postgres")
        # sqlglot has no ALTER TYPE node: a Command whose parts are quoted by sqlglot.
        return exp.Command(this="ALTER", expression=f"TYPE {qualified} ADD VALUE {label}")


@dataclass(frozen=True)
class TypeDefinitionChanged(Change):
    kind: ClassVar[str] = "type definition changed"
    type_name: str
    what: str

    def detail(self) -> str:
        return f"{self.type_name} ({self.what})"


def diff(old: Signature, new: Signature) -> list[Change]:
    """Every difference from `old` to `new`, table first, then columns, keys and types."""
    changes: list[Change] = []
    recreated = (
        old.table_oid is not None and new.table_oid is not None and old.table_oid != new.table_oid
    )
    if recreated:
        assert old.table_oid is not None and new.table_oid is not None
        changes.append(TableRecreated(old.table_oid, new.table_oid))
    changes += _column_changes(old.columns, new.columns, by_number=not recreated)
    if old.primary_key != new.primary_key:
        changes.append(PrimaryKeyChanged(old.primary_key, new.primary_key))
    if old.replication_key != new.replication_key:
        changes.append(ReplicationKeyChanged(old.replication_key, new.replication_key))
    changes += _type_changes(old.types, new.types)
    return changes


def describe(changes: list[Change]) -> str:
    """`column added: note text; type changed: amount numeric(10,2) -> numeric(12,2)`."""
    return "; ".join(change.describe() for change in changes)


def _column_changes(
    old: tuple[SignedColumn, ...], new: tuple[SignedColumn, ...], *, by_number: bool
) -> list[Change]:
    """Columns matched by their number where both sides know it (a rename keeps it), else by
    name; then what was dropped, what was added, and whether the shared ones moved."""
    numbered = by_number and all(c.attnum for c in old + new)
    match_key = (lambda c: c.attnum) if numbered else (lambda c: c.name)
    new_by_key = {match_key(c): c for c in new}
    old_keys = {match_key(c) for c in old}
    changes: list[Change] = []
    for before in old:
        after = new_by_key.get(match_key(before))
        if after is None:
            changes.append(ColumnDropped(before.name))
            continue
        if after.name != before.name:
            changes.append(ColumnRenamed(before.name, after.name))
        if after.type != before.type:
            changes.append(TypeChanged(after.name, before.type, after.type))
        if after.not_null != before.not_null:
            changes.append(NullabilityChanged(after.name, after.not_null))
    changes += [ColumnAdded(c) for c in new if match_key(c) not in old_keys]
    kept_old = [match_key(c) for c in old if match_key(c) in new_by_key]
    kept_new = [match_key(c) for c in new if match_key(c) in old_keys]
    if kept_old != kept_new:
        old_names = {match_key(c): c.name for c in old}
        new_names = {match_key(c): c.name for c in new}
        changes.append(
            ColumnsReordered(
                tuple(old_names[k] for k in kept_old), tuple(new_names[k] for k in kept_new)
            )
        )
    return changes


def _type_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Types both sides use: enum labels added (in place), any other change to a definition."""
    changes: list[Change] = []
    for name in sorted(old.keys() & new.keys()):
        before, after = old[name], new[name]
        if before == after:
            continue
        if before.get("kind") == after.get("kind") == "enum":
            labels_before, labels_after = before["labels"], after["labels"]
            kept = [label for label in labels_after if label in labels_before]
            if kept == labels_before:
                added = [label for label in labels_after if label not in labels_before]
                changes += [EnumLabelAdded(name, label) for label in added]
                continue
            changes.append(TypeDefinitionChanged(name, "enum labels renamed, removed or reordered"))
        else:
            changes.append(TypeDefinitionChanged(name, f"{before.get('kind')} definition"))
    return changes
