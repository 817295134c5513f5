"""DDL as sqlglot expressions: every identifier quoted, every type PostgreSQL's own text."""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from ..base.identifiers import TableName
from .catalog import Column


def _type(type_text: str) -> exp.DataType:
    # Kept verbatim: format_type() output is already valid, exact PostgreSQL.
    return exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=type_text)


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def column_def(column: Column) -> exp.ColumnDef:
    constraints = (
        [exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())] if column.not_null else []
    )
    return exp.ColumnDef(this=_ident(column.name), kind=_type(column.type), constraints=constraints)


def create_schema(schema: str) -> exp.Create:
    return exp.Create(this=exp.Table(this=_ident(schema)), kind="SCHEMA", exists=True)


def create_table(
    name: TableName,
    columns: Iterable[Column],
    primary_key: Iterable[str] = (),
    *,
    unlogged: bool = False,
    if_not_exists: bool = False,
) -> exp.Create:
    """CREATE [UNLOGGED] TABLE with the columns in order and, if given, the primary key."""
    parts: list[exp.Expression] = [column_def(c) for c in columns]
    key = [_ident(c) for c in primary_key]
    if key:
        parts.append(exp.PrimaryKey(expressions=key))
    return exp.Create(
        this=exp.Schema(this=name.table(), expressions=parts),
        kind="UNLOGGED TABLE" if unlogged else "TABLE",
        exists=if_not_exists,
    )


def drop_table(name: TableName, *, if_exists: bool = True) -> exp.Drop:
    return exp.Drop(tables=[name.table()], kind="TABLE", exists=if_exists)
