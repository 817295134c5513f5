"""`replicator refresh` and `replicator state ...`: read or edit sync-state under the run lock."""

from __future__ import annotations

import json

import click

from ..errors import ReplicatorError, StateError
from ..identifiers import display_ident
from ..postgres.catalog import describe_table
from ..postgres.database import connect
from ..project.project import Project
from ..project.runlock import run_lock
from ..project.settings import SOURCE_URL
from ..project.state import Cursor, TableState
from ..report.logs import json_output, say
from ..sync.cursor import canonical_value


def mark_for_refresh(project: Project, names: tuple[str, ...]) -> int:
    """Flag tables for a full reload at the next sync (the flag clears when it commits)."""
    tables = project.select(names)
    with run_lock(project.state_dir):
        for table in tables:
            state = project.store.read(table.name) or TableState(table=str(table.name))
            updated = state.model_copy(
                update={"pending_full_reload": True, "pending_reason": "refresh requested"}
            )
            project.store.write(updated, table.name)
            say(
                f"{table.written_name}: marked for a full reload at the next sync",
                "state.refresh",
                name=table.written_name,
            )
    return 0


def show_state(project: Project, names: tuple[str, ...]) -> int:
    """Print the states as one JSON object keyed by table name (null: no state yet)."""
    out: dict[str, object] = {}
    failed = False
    for table in project.select(names):
        try:
            state = project.store.read(table.name)
        except StateError as exc:
            out[table.written_name] = {"error": str(exc)}
            failed = True
            continue
        out[table.written_name] = state.model_dump(mode="json") if state else None
    indent = None if json_output() else 2  # one line under --log-format json
    click.echo(json.dumps(out, indent=indent, ensure_ascii=False))
    return 1 if failed else 0


def reset_state(project: Project, names: tuple[str, ...]) -> int:
    """Delete tables' state files: their next sync reloads them in full."""
    tables = project.select(names)
    with run_lock(project.state_dir):
        for table in tables:
            existed = project.store.delete(table.name)
            verb = "state removed" if existed else "had no state"
            say(
                f"{table.written_name}: {verb}; the next sync reloads it in full",
                "state.reset",
                name=table.written_name,
            )
    return 0


def set_cursor(project: Project, name: str, value: str) -> int:
    """Set a table's cursor, cast by the source to the replication key's type and reprinted."""
    table = project.config.find(name)
    if table.replication_key is None:
        raise ReplicatorError(f"{table.written_name}: mode full-refresh has no cursor")
    with connect(project.env.connection(SOURCE_URL), "source") as conn:
        info = describe_table(conn, table.name)
        column = info.column(table.replication_key) if info else None
        if column is None:
            raise ReplicatorError(
                f"{table.written_name}: replication key column "
                f"{display_ident(table.replication_key)} not found in the source table"
            )
        canonical = canonical_value(conn, value, column.type, table.written_name)
    with run_lock(project.state_dir):
        state = project.store.read(table.name)
        if state is None or state.last_synced_at is None:
            raise ReplicatorError(
                f"{table.written_name}: has no state yet; its first sync is a full load "
                "(run `replicator sync` first, then set the cursor)"
            )
        project.store.write(
            # A hand-set cursor invalidates what the probe knows: the next run reads from it.
            state.model_copy(
                update={
                    "cursor": Cursor(value=canonical, type=column.type),
                    "window": None,
                    "pending": None,
                }
            ),
            table.name,
        )
    say(
        f"{table.written_name}: cursor set to {canonical} ({column.type})",
        "state.cursor_set",
        name=table.written_name,
        cursor=canonical,
    )
    return 0
