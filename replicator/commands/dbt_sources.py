"""`replicator dbt-sources`: dbt's `sources.yml` (version 2) for the copies, so a dbt project
selects from them with `{{ source('sales', 'orders') }}` and `dbt source freshness` checks
them, without anyone writing the file for hundreds of tables.

- One source per destination schema, named as the schema (`--name` names it, or prefixes
  each name when the copies are in several schemas).
- Each table lists the copy's columns as a sync makes them (models, `columns` and `where`
  applied), with `data_type` and the source's `COMMENT`s as descriptions.
- Freshness is the load's, not the data's: a `loaded_at_query` (dbt 1.10 and later) reads
  the time of the table's last successful sync from `_replicator.runs`, this project's rows
  only (sync-state/.project's id, made by the first sync or by this command). A table that
  never loaded has none, which dbt reports as past every limit (an error with
  `error_after`, a warning with `warn_after` alone).
- `warn_after` and `error_after` come from `tables[].freshness` or the top-level default.

The same config and catalogs give the same bytes: sources, tables and keys in a fixed order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
import yaml
from psycopg import sql

from ..base.errors import ReplicatorError, UsageError
from ..base.identifiers import TableName
from ..base.redact import redact
from ..plan.inspect_table import inspect_source
from ..plan.read_ahead import read_ahead
from ..postgres.catalog import Column
from ..postgres.database import connect, fetch_all
from ..postgres.naming import RUNS_TABLE
from ..project.config import TableConfig
from ..project.project import Project
from ..report.logs import say

HASHED = "hashed: the sha256 of the source's value (tables[].columns.hash)"


@dataclass(frozen=True)
class _Copy:
    """One table as dbt sees it: the copy's name and columns, and the source's comments."""

    table: TableConfig
    columns: tuple[Column, ...]
    hashed: frozenset[str]
    comment: str | None
    column_comments: dict[str, str]


def write_sources(
    project: Project, names: tuple[str, ...], output: Path | None, name: str | None
) -> int:
    """Print (or write to `output`) the sources.yml of the selected tables; exit 1 with
    nothing written when a table cannot be described."""
    if output is not None and str(output) == "-":  # the usual name of stdout
        output = None
    if output is not None and not output.parent.is_dir():
        raise UsageError(f"-o {output}: the folder {output.parent} does not exist; create it first")
    tables = project.select(names)
    for line in project.unmatched:  # said, as ls and check say it: a pattern written wrong
        click.echo(redact(f"warning: {line}"), err=True)
    copies, problems = _describe(project, tables)
    if problems:
        for problem in problems:
            click.echo(redact(f"error: {problem}"), err=True)
        click.echo(
            "error: no sources.yml written: fix the tables above, or leave them out with -s",
            err=True,
        )
        return 1
    # made now if no sync made it yet: the queries name the id that project's syncs record
    text = render(copies, name, project.claim_identity())
    if output is None:
        click.echo(text, nl=False)
        return 0
    temporary = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, output)
    schemas = len({c.table.target.schema for c in copies})
    say(
        f"wrote {output}: {len(copies)} table(s) in {schemas} source(s)",
        "dbt_sources.wrote",
        path=str(output),
    )
    return 0


def _describe(project: Project, tables: Sequence[TableConfig]) -> tuple[list[_Copy], list[str]]:
    copies: list[_Copy] = []
    problems: list[str] = []
    with connect(project.env.source(), "source") as conn:
        ahead = read_ahead(conn, None, tables)
        comments = _comments(conn, [i.oid for i in ahead.sources.values() if i is not None])
        for table in tables:
            try:
                source, built = inspect_source(conn, table, project.templates, ahead)
            except ReplicatorError as exc:
                problems.append(str(exc))
                continue
            hashed = frozenset(built.shaping.hash) if built.shaping is not None else frozenset()
            of_table = comments.get(source.oid, {})
            copies.append(
                _Copy(
                    table,
                    built.destination_columns,
                    hashed,
                    of_table.get(""),
                    {k: v for k, v in of_table.items() if k},
                )
            )
    return copies, problems


def _comments(conn: psycopg.Connection[Any], oids: list[int]) -> dict[int, dict[str, str]]:
    """The source tables' COMMENTs: by table OID, "" for the table's own, else by column."""
    rows = fetch_all(
        conn,
        "SELECT d.objoid, coalesce(a.attname, ''), d.description "
        "FROM pg_catalog.pg_description d LEFT JOIN pg_catalog.pg_attribute a "
        "ON a.attrelid = d.objoid AND a.attnum = d.objsubid AND d.objsubid > 0 "
        "WHERE d.classoid = 'pg_catalog.pg_class'::regclass AND d.objoid = ANY(%s)",
        (oids,),
    )
    found: dict[int, dict[str, str]] = {}
    for oid, column, text in rows:
        found.setdefault(oid, {})[column] = text
    return found


def render(copies: Sequence[_Copy], name: str | None, project_id: str) -> str:
    """The YAML document: sources by schema, tables by name, in a fixed order."""
    by_schema: dict[str, list[_Copy]] = {}
    for copy in sorted(copies, key=lambda c: (c.table.target.schema, c.table.target.name)):
        by_schema.setdefault(copy.table.target.schema, []).append(copy)
    several = len(by_schema) > 1
    sources = [
        {
            "name": _source_name(schema, name, several),
            "schema": schema,
            "description": "Copies kept by replicator.",
            "tables": [_table(copy, project_id) for copy in of_schema],
        }
        for schema, of_schema in by_schema.items()
    ]
    header = (
        "# Written by `replicator dbt-sources`; run it again after a change of\n"
        "# tables-config.json or of the source's columns rather than editing this file.\n"
    )
    body = yaml.safe_dump(
        {"version": 2, "sources": sources},
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )
    return header + body


def _source_name(schema: str, name: str | None, several: bool) -> str:
    if name is None:
        return schema
    return f"{name}_{schema}" if several else name


def _table(copy: _Copy, project_id: str) -> dict[str, Any]:
    table = copy.table
    config: dict[str, Any] = {
        "loaded_at_query": loaded_at_query(table.source, project_id),
        "meta": {"replicator": {"source_table": str(table.source), "mode": table.mode}},
    }
    if table.freshness is not None:
        config["freshness"] = table.freshness.dbt()
    entry: dict[str, Any] = {"name": table.target.name}
    if copy.comment:
        entry["description"] = copy.comment
    entry["config"] = config
    entry["columns"] = [_column(copy, column) for column in copy.columns]
    return entry


def _column(copy: _Copy, column: Column) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": column.name, "data_type": column.type}
    description = copy.column_comments.get(column.name)
    if column.name in copy.hashed:
        description = f"{description} ({HASHED})" if description else HASHED[0].upper() + HASHED[1:]
    if description:
        entry["description"] = description
    return entry


def loaded_at_query(source: TableName, project_id: str) -> str:
    """When the table's last successful sync ended, from this project's runs: the rows of
    another project sharing the destination never make a copy look fresh."""
    return (
        sql.SQL(
            "select max(finished_at) from {} where table_name = {} and status = 'success' "
            "and project_id = {}"
        )
        .format(
            RUNS_TABLE.identifier(),
            sql.Literal(str(source)),
            sql.Literal(project_id),
        )
        .as_string(None)
    )
