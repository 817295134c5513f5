"""`replicator report [-o FILE]`: the HTML page of the selected tables' last runs
(report/html_page.py), written to FILE, by default `report.html` in the project folder."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from ..base.errors import UsageError
from ..project.project import Project
from ..report.html_page import render, table_view
from ..report.logs import say
from .status_history import selected_runs

DEFAULT_FILE = "report.html"


def write_report(project: Project, names: tuple[str, ...], output: Path | None, runs: int) -> int:
    path = output if output is not None else project.root / DEFAULT_FILE
    if not path.parent.is_dir():
        raise UsageError(f"-o {path}: the folder {path.parent} does not exist; create it first")
    tables, found, notes = selected_runs(project, names, runs)
    by_table: dict[str, list] = {}
    for row in found:
        by_table.setdefault(row.table_name, []).append(row)
    views = [
        table_view(str(t.name), str(t.destination), by_table.get(str(t.name), [])) for t in tables
    ]
    page = render(f"replicator: {project.root.name}", datetime.now(UTC), views, runs)
    _replace(path, page)
    for note in notes:
        say(note, "report.note")
    say(
        f"wrote {path}: {len(views)} table(s), {len(found)} run(s)",
        "report.wrote",
        path=str(path),
    )
    return 0


def _replace(path: Path, text: str) -> None:
    """Write under a temporary name, then rename: a browser reloading it never reads half."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
