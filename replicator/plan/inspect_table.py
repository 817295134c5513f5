"""Inspect one table on the source and build its SQL: shared by compile, check and sync."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import psycopg

from ..base.errors import DatabaseError
from ..base.identifiers import TableName
from ..postgres.catalog import Column, TableInfo, describe_query, describe_table
from ..postgres.types.type_closure import holds_text_copied
from ..project.config import TableConfig
from ..project.templates import Templates
from .read_ahead import NOTHING_READ, ReadAhead
from .selection import source_tables
from .shaping import Shaping, readable_columns, shape_model, shaping_of
from .table_sql import TableProblem, TableSql, build_table_sql


def inspect_table(
    conn: psycopg.Connection[Any], table: TableConfig, templates: Templates
) -> TableSql:
    """Describe the source table and its model, and build the table's statements."""
    return inspect_source(conn, table, templates)[1]


def inspect_source(
    conn: psycopg.Connection[Any],
    table: TableConfig,
    templates: Templates,
    ahead: ReadAhead = NOTHING_READ,
) -> tuple[TableInfo, TableSql]:
    """The source table as the catalog describes it (or as `ahead` read it), and the
    table's statements."""
    if table.problem is not None:  # a pattern's match that cannot be synced (selection.py)
        raise TableProblem(table.problem)
    sources = ahead.sources
    source = (
        sources[table.source] if table.source in sources else describe_table(conn, table.source)
    )
    if source is None:
        near = near_table(conn, table.source)
        fix = f"did you mean {near}? Fix its name" if near else "create it, or fix its name"
        raise TableProblem(
            f"{table.written_name}: source table does not exist: {fix} "
            f"(tables[{table.entry}] in tables-config.json)"
        )
    configured = shaping_of(conn, table)
    shaping = _fitted(configured, table, source, source.columns)
    readable = readable_columns(source, shaping, table.written_name)
    model = templates.model(table.source, readable, source.read_as)
    if model.is_default:
        output = tuple(c for c in source.columns if c.name in readable)
    else:
        try:
            output = describe_query(conn, model.sql)
        except DatabaseError as exc:
            raise TableProblem(f"{table.written_name}: model {model.origin}: {exc}") from None
    if table.pattern is not None and not model.is_default:
        # a model file may return a column its table lacks (a join): shaped there too
        shaping = _fitted(configured, table, source, (*source.columns, *output))
    if shaping is not None:
        model, output = shape_model(conn, table, source, model, output, shaping)
    as_text = holds_text_copied(conn, (c.type_oid for c in output))
    built = build_table_sql(
        table, source, model, output, templates, shaping, copies_as_text=as_text
    )
    return source, built


def _fitted(
    shaping: Shaping | None, table: TableConfig, source: TableInfo, columns: Sequence[Column]
) -> Shaping | None:
    """The table's shaping on the columns it has: a pattern's `exclude` and `hash` where
    `columns` hold them (Shaping.where_present), `include` as the exclusion of the others."""
    if shaping is not None and table.pattern is not None:
        shaping = shaping.where_present({c.name for c in columns})
    return shaping.resolved(source) if shaping is not None else None


def near_table(conn: psycopg.Connection[Any], missing: TableName) -> TableName | None:
    """The source's table a typo (or another case) away from `missing`, if one is close.
    Schema and table are compared apart: a long schema name shared by two tables would
    make any two of their names look close."""

    def close(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()

    scored = [
        (close(missing.schema, t.schema) * close(missing.name, t.name), str(t), t)
        for t in source_tables(conn)
    ]
    best = max(scored, default=None)
    return best[2] if best is not None and best[0] >= 0.75 else None
