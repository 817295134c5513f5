"""`replicator ls`: the tables the config selects once its patterns are expanded (dbt's
`ls`): what each run will sync, and which entry of tables-config.json chose each."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..base.errors import ReplicatorError
from ..base.identifiers import display_ident
from ..plan.table_key import preferred_key
from ..postgres.catalog import describe_table
from ..postgres.database import connect
from ..project.config import TableConfig
from ..project.project import Project
from ..report.logs import json_output


def list_tables(project: Project, names: tuple[str, ...], as_json: bool) -> int:
    """Print the selected tables (the project is expanded); exit 0."""
    tables = project.select(names)
    keys = _primary_keys(project, tables)
    rows = [
        {
            "name": t.written_name,
            "destination": str(t.target),
            "mode": t.mode,
            # written as `name` is: a column that needs quotes in SQL has them
            "replication_key": display_ident(t.replication_key) if t.replication_key else None,
            "primary_key": [display_ident(c) for c in keys[t.source]]
            if keys.get(t.source)
            else None,
            "entry": t.entry,
            "pattern": t.pattern,
            "deletes": t.deletes,
            "where": t.where,
            "columns": t.columns.model_dump(exclude_defaults=True) if t.columns else None,
        }
        for t in tables
    ]
    if as_json:
        print(json.dumps(rows, indent=None if json_output() else 2, ensure_ascii=False))
        return 0
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    grid = Table(box=None, pad_edge=False)
    for title in ("table", "destination", "mode", "replication key", "primary key", "entry"):
        grid.add_column(title, overflow="fold")
    for row in rows:
        chosen = f"tables[{row['entry']}]" + (f" {row['pattern']}" if row["pattern"] else "")
        grid.add_row(
            row["name"],
            row["destination"],
            row["mode"],
            row["replication_key"] or "",
            ", ".join(row["primary_key"] or ()),
            chosen,
        )
    console.print(grid)
    for line in [*project.unmatched, *(v.line() for v in project.vanished)]:
        console.print(line, markup=False, soft_wrap=True)
    return 0


def _primary_keys(project: Project, tables: tuple[TableConfig, ...]) -> dict[Any, tuple[str, ...]]:
    """Each table's key: the config's `primary_key`, else the source's (read only for the
    tables without one in the config)."""
    keys = {t.source: tuple(t.primary_key) for t in tables if t.primary_key}
    unknown = [t for t in tables if not t.primary_key]
    if not unknown:
        return keys
    try:
        with connect(project.connections().source, "source") as source:
            for table in unknown:
                info = describe_table(source, table.source)
                if info is not None:
                    keys[table.source] = preferred_key(table, info)
    except ReplicatorError:  # the source is out of reach: the config's keys alone
        pass
    return keys
