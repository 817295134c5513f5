"""`replicator compile`: the SQL each table's sync would run, printed, nothing executed."""

from __future__ import annotations

import click

from .config import TableConfig
from .database import connect, render
from .errors import ReplicatorError
from .identifiers import display_ident
from .inspect_table import inspect_table
from .project import Project
from .redact import redact
from .settings import SOURCE_URL
from .table_sql import TableSql


def compile_tables(project: Project, tables: tuple[TableConfig, ...]) -> int:
    """Print each table's statements; a table that cannot be built is reported, exit 1."""
    failed = 0
    with connect(project.env.connection(SOURCE_URL), "source") as conn:
        for table in tables:
            try:
                built = inspect_table(conn, table, project.templates)
                cursor = _cursor_note(project, table)
            except ReplicatorError as exc:
                click.echo(redact(f"-- {table.written_name}: error: {exc}\n"))
                failed += 1
                continue
            click.echo(format_table_sql(built, cursor))
    return 1 if failed else 0


def _cursor_note(project: Project, table: TableConfig) -> str:
    state = project.store.read(table.name)
    if state is None or state.last_synced_at is None:
        return "none (no state: the next sync is a full load)"
    if state.cursor is None:
        return "none (the source was empty at the last sync)"
    return f"{state.cursor.value} ({state.cursor.type})"


def format_table_sql(built: TableSql, cursor: str) -> str:
    """The readable compile output of one table."""
    table = built.table
    key = ", ".join(map(display_ident, built.primary_key)) or "none"
    lines = [
        f"-- {table.written_name} -> {table.target}",
        f"-- mode {table.mode}; primary key ({key}); replication key "
        f"{display_ident(table.replication_key) if table.replication_key else 'none'}",
        f"-- model: {built.model.origin}",
        "",
        "-- destination table",
        render(built.create_destination) + ";",
        "",
        "-- extract (full load)",
        render(built.full_extract) + ";",
    ]
    if built.incremental_extract is not None:
        lines += [
            "",
            f"-- extract (incremental); cursor: {cursor}",
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
