"""`replicator status --history [N]`: each selected table's last N runs, from
`_replicator.runs` in the destination (report/history.py), newest first."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..plan.salt import shown
from ..postgres.database import connect
from ..project.config import TableConfig
from ..project.project import Project
from ..project.settings import DEST_URL
from ..report import history
from ..report.history_rows import RunRow
from ..report.logs import json_output
from .status import expanded_or_known

log = logging.getLogger(__name__)


def selected_runs(
    project: Project, names: tuple[str, ...], per_table: int
) -> tuple[tuple[TableConfig, ...], list[RunRow], list[str]]:
    """The selected tables, their last `per_table` runs (in the tables' order, newest first
    within each), and notes (patterns matched against sync-state when the source is out of
    reach)."""
    project, notes = expanded_or_known(project)
    tables = project.select(names)
    url = project.optional_destination() or project.env.connection(DEST_URL)  # exit 2 unset
    with connect(url, "destination") as dest:
        found = history.recent(dest, [str(t.name) for t in tables], per_table)
    order = {str(t.name): i for i, t in enumerate(tables)}
    found.sort(key=lambda row: order[row.table_name])  # stable: newest first stays
    return tables, found, notes


def print_history(project: Project, names: tuple[str, ...], per_table: int, as_json: bool) -> int:
    tables, rows, notes = selected_runs(project, names, per_table)
    # a reason recorded before the salt's fingerprint left the messages may still hold one
    rows = [dataclasses.replace(r, reason=shown(r.reason)) for r in rows]
    if as_json:
        found = [row.as_json() for row in rows]
        print(json.dumps(found, indent=None if json_output() else 2, ensure_ascii=False))
        for note in notes:
            log.info("%s", note)
        return 0
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    console.print(_grid(rows))
    missing = [t.written_name for t in tables if str(t.name) not in {r.table_name for r in rows}]
    for note in notes:
        console.print(note, markup=False, soft_wrap=True)
    if missing:
        console.print(f"no run recorded for: {', '.join(missing)}", markup=False, soft_wrap=True)
    return 0


def _grid(rows: Sequence[RunRow]) -> Table:
    grid = Table(box=None, pad_edge=False)
    for title in ("table", "started", "status", "action", "rows", "seconds", "lag", "why"):
        grid.add_column(title, overflow="fold")
    for row in rows:
        why = row.error if row.status != "success" and row.error else row.reason
        grid.add_row(
            *(
                Text(value)  # plain text: an error may hold `[...]`, never rich markup
                for value in (
                    row.table_name,
                    row.started_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
                    row.status,
                    row.action or "-",
                    "-" if row.rows is None else f"{row.rows:,}",
                    f"{row.seconds:.1f}",
                    "-" if row.lag_seconds is None else f"{row.lag_seconds:.1f} s",
                    why or "",
                )
            )
        )
    return grid
