"""`replicator compile`: what each table's next sync would do and run, printed, nothing executed.

Per table: the plan (incremental or a full reload, and why), the schema changes found against
the last load (each with the ALTER that expresses it), and the statements: destination DDL,
the full reload's side table, key and swap, the extracts, staging and merge. Catalogs are
read; nothing is written anywhere. `--json` gives the same as one document.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click
import psycopg

from ..errors import ReplicatorError
from ..identifiers import display_ident
from ..plan.decide import Plan
from ..plan.drift import Observed, plan_now
from ..plan.table_sql import TableSql
from ..postgres import ddl
from ..postgres.database import Statement, connect, render
from ..postgres.naming import INTERNAL_SCHEMA, default_key_name
from ..postgres.swap import move_statements, swap_statements
from ..project.config import TableConfig
from ..project.project import Project
from ..project.settings import DEST_URL, SOURCE_URL
from ..project.state import TableState
from ..redact import redact
from ..report.logs import json_output
from ..sync.full_load import side_key_name, side_key_statement, side_table, side_table_statements


def compile_tables(project: Project, tables: tuple[TableConfig, ...], as_json: bool = False) -> int:
    """Print each table's plan and statements; a table that cannot be built is reported,
    exit 1."""
    failed = 0
    documents: list[dict[str, Any]] = []
    with (
        connect(project.env.connection(SOURCE_URL), "source") as conn,
        _destination(project) as (dest, dest_note),
    ):
        if dest_note and not as_json:
            click.echo(f"-- {dest_note}\n")
        for table in tables:
            try:
                compiled = _compile_table(project, conn, dest, table)
            except ReplicatorError as exc:
                failed += 1
                if as_json:
                    documents.append({"name": table.written_name, "error": redact(str(exc))})
                else:
                    click.echo(redact(f"-- {table.written_name}: error: {exc}\n"))
                continue
            if as_json:
                documents.append(compiled.as_json(dest_note))
            else:
                click.echo(compiled.text())
    if as_json:
        indent = None if json_output() else 2  # one line under --log-format json
        click.echo(json.dumps(documents, indent=indent, ensure_ascii=False))
    return 1 if failed else 0


@contextlib.contextmanager
def _destination(project: Project) -> Iterator[tuple[psycopg.Connection[Any] | None, str | None]]:
    """The destination, to look at its tables; compile still works without it."""
    url = project.env.optional_connection(DEST_URL)
    if url is None:
        yield None, f"destination not inspected: {DEST_URL} is not set"
        return
    try:
        conn = connect(url, "destination")
    except ReplicatorError as exc:
        yield None, redact(f"destination not inspected: {exc}")
        return
    with conn:
        yield conn, None


class CompiledTable:
    """One table's plan, drift and statements."""

    def __init__(
        self, built: TableSql, observed: Observed, plan: Plan, cursor: str, destination_known: bool
    ) -> None:
        self.built, self.observed, self.plan, self.cursor = built, observed, plan, cursor
        self.destination_known = destination_known

    def full_reload_statements(self) -> list[str]:
        """What a full reload runs on the destination, in order (COPY shown as a comment)."""
        built = self.built
        target, side = built.table.target, side_table(built.table.target)
        statements: list[Statement] = [
            ddl.create_schema(target.schema),
            ddl.create_schema(INTERNAL_SCHEMA),
            *side_table_statements(built),
        ]
        key = side_key_statement(built)
        texts = ["-- enum, domain and composite types the columns use: created when missing"]
        texts += [render(s) for s in statements]
        texts.append(f"-- COPY ... FROM STDIN into {side.sql()}, one per partition")
        if key is not None:
            texts.append(render(key))
        texts.append(f"ANALYZE {side.sql()}")
        key_name = default_key_name(target)
        swap = (
            swap_statements(side, target, side_key_name(built), key_name)
            if self.observed.destination is not None or not self.destination_known
            else move_statements(side, target, side_key_name(built), key_name)
        )
        texts += [render(s) for s in swap]
        return texts

    def changes_json(self) -> dict[str, list[dict[str, Any]]]:
        target = self.built.table.target
        return {
            "schema": [c.as_json(target) for c in self.observed.schema_changes],
            "destination": [c.as_json(target) for c in self.observed.destination_changes],
        }

    def as_json(self, dest_note: str | None) -> dict[str, Any]:
        built = self.built
        table = built.table
        incremental = built.incremental_extract
        return {
            "name": table.written_name,
            "destination": str(table.target),
            "mode": table.mode,
            "model": built.model.origin,
            "next_action": self.plan.action,
            "reason": self.plan.reason,
            "fix": self.plan.fix,
            "destination_note": dest_note,
            "changes": self.changes_json(),
            "cursor": self.cursor,
            "sql": {
                "create_destination": render(built.create_destination),
                "full_reload": self.full_reload_statements(),
                "extract_full": render(built.full_extract),
                "extract_incremental": render(incremental) if incremental is not None else None,
                "create_staging": (
                    [render(built.create_internal_schema), render(built.create_staging)]
                    if built.merge is not None
                    else None
                ),
                "merge": built.merge,
            },
        }

    def text(self) -> str:
        """The readable compile output of one table."""
        built = self.built
        table = built.table
        key = ", ".join(map(display_ident, built.primary_key)) or "none"
        plan = self.plan
        lines = [
            f"-- {table.written_name} -> {table.target}",
            f"-- mode {table.mode}; primary key ({key}); replication key "
            f"{display_ident(table.replication_key) if table.replication_key else 'none'}",
            f"-- model: {built.model.origin}",
            f"-- next sync: {plan.action} ({plan.reason})",
        ]
        if plan.fix:
            lines.append(f"-- fix: {plan.fix}")
        for title, changes in (
            ("source schema changes since the last load", self.observed.schema_changes),
            ("destination table changes", self.observed.destination_changes),
        ):
            if not changes:
                continue
            lines.append(f"-- {title} (a sync reloads the table instead of running these):")
            for change in changes:
                expression = change.expression(table.target)
                lines.append(f"--   {change.describe()}")
                if expression is not None:
                    lines.append(f"--     {expression.sql(dialect='postgres')};")
        lines += [
            "",
            "-- destination table",
            render(built.create_destination) + ";",
            "",
            "-- full reload: side table, load, key, swap",
            *[s if s.startswith("--") else s + ";" for s in self.full_reload_statements()],
            "",
            "-- extract (full load)",
            render(built.full_extract) + ";",
        ]
        if built.incremental_extract is not None:
            lines += [
                "",
                f"-- extract (incremental); cursor: {self.cursor}",
                render(built.incremental_extract) + ";",
            ]
        if built.merge is not None:
            lines += [
                "",
                "-- staging table",
                render(built.create_internal_schema) + ";",
                render(built.create_staging) + ";",
                "",
                "-- merge",
                built.merge + ";",
            ]
        return "\n".join(lines) + "\n"


def _compile_table(
    project: Project,
    conn: psycopg.Connection[Any],
    dest: psycopg.Connection[Any] | None,
    table: TableConfig,
) -> CompiledTable:
    state = project.store.read(table.name)
    planned = plan_now(conn, dest, table, project.templates, state)
    return CompiledTable(
        planned.built, planned.observed, planned.plan, _cursor_note(state), dest is not None
    )


def _cursor_note(state: TableState | None) -> str:
    if state is None or state.last_synced_at is None:
        return "none (no state: the next sync is a full load)"
    if state.cursor is None:
        return "none (the source was empty at the last sync)"
    return f"{state.cursor.value} ({state.cursor.type})"
