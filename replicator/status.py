"""`replicator status`: what sync-state says about each table, and what the next sync will do."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .config import TableConfig
from .errors import StateError
from .plan import plan_table
from .project import Project
from .redact import redact


def table_status(project: Project, table: TableConfig) -> dict[str, Any]:
    """One table's status row; the pinned keys of `status --json` are always present."""
    row: dict[str, Any] = {
        "name": table.written_name,
        "destination": str(table.target),
        "mode": table.mode,
        "cursor": None,
        "cursor_type": None,
        "last_synced_at": None,
        "last_status": None,
        "last_error": None,
        "rows": None,
        "pending_full_reload": None,
        "next_action": None,
    }
    try:
        state = project.store.read(table.name)
    except StateError as exc:
        row.update(last_status="error", last_error=redact(str(exc)))
        return row
    plan = plan_table(table.mode or "", state)
    row["pending_full_reload"] = plan.action == "full_reload"
    row["next_action"] = (
        plan.action if plan.action == "incremental" else f"full_reload: {plan.reason}"
    )
    if state is None:
        return row
    if state.cursor is not None:
        row.update(cursor=state.cursor.value, cursor_type=state.cursor.type)
    row["last_synced_at"] = state.last_synced_at
    if state.last_run is not None:
        row.update(
            last_status=state.last_run.status,
            rows=state.last_run.rows,
            last_error=state.last_run.error,
        )
    return row


def print_status(project: Project, as_json: bool) -> int:
    rows = [table_status(project, t) for t in project.config.tables]
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        grid = Table(box=None, pad_edge=False)
        for title in ("table", "mode", "cursor", "last sync", "status", "rows", "next"):
            grid.add_column(title, overflow="fold")
        for row in rows:
            grid.add_row(
                row["name"],
                row["mode"],
                _text(row["cursor"]),
                _text(row["last_synced_at"]),
                _text(row["last_status"]),
                _text(row["rows"]),
                _text(row["next_action"]),
            )
        console.print(grid)
        for row in rows:
            if row["last_error"]:
                console.print(f"{row['name']}: {row['last_error']}", markup=False)
    return 1 if any(r["last_status"] == "error" for r in rows) else 0


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
