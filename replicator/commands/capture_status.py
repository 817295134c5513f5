"""What `status` shows of log capture: each `cdc` table's distance from the log's end
(`slot_lag_bytes`, and `lag` in the grid), and the slot's retained WAL, with the warning a
sync gives (cdc/source/slot_health.py): past `cdc.max_retained_wal`, or `wal_status`
unreserved (an abandoned slot keeps WAL until the source's disk fills); a lost slot makes
the next sync reload every `cdc` table and exit 1: the plan says so, with the sync's text."""

from __future__ import annotations

from typing import Any

import psycopg

from ..base.errors import ReplicatorError
from ..cdc.source.slot import flushed_lsn, parse_lsn, slot_info
from ..cdc.source.slot_health import dba_slot_text, size_text, slot_alarm
from ..project.cdc_config import retained_limit
from ..project.config import TableConfig
from ..project.project import Project
from ..project.state import LSN_CURSOR_TYPE
from ..sync.cdc.setup import SLOT_DROPPED, SLOT_LOST

KEEP_COPIES = (
    "`replicator cdc restart --repair` starts a new slot and keeps the copies (only the rows "
    "that differ are written, no reload)"
)


def _plan_each(rows: list[dict[str, Any]], next_action: str) -> None:
    for row in rows:
        if row["next_action"] == "incremental":
            reloads = next_action.startswith("full_reload")
            row.update(next_action=next_action, pending_full_reload=reloads, lag=None)


def capture_notes(
    project: Project,
    source: psycopg.Connection[Any],
    tables: tuple[TableConfig, ...],
    rows: list[dict[str, Any]],
) -> list[str]:
    """Fill the `cdc` rows' lag; the notes about the slot."""
    try:
        names = project.capture_names()
    except ReplicatorError as exc:
        return [str(exc)]
    if names is None:
        return ["cdc: no replication slot yet (the first sync creates it)"]
    info = slot_info(source, names.slot)
    flushed = flushed_lsn(source)
    copies = [
        row
        for table, row in zip(tables, rows, strict=True)
        if table.mode == "cdc" and row["cursor"] and row["cursor_type"] == LSN_CURSOR_TYPE
    ]
    for row in copies:  # a copy that goes on from the log (not one just switched to cdc)
        behind = max(flushed - parse_lsn(row["cursor"]), 0)
        row["slot_lag_bytes"] = behind
        row["lag"] = f"{size_text(behind)} of log"
    if not names.created and (info is None or info.lost):  # the sync's own text
        problem = "does not exist" if info is None else "is lost"
        _plan_each(copies, f"fail: replication slot {names.slot} {problem}")
        return [f"cdc: error: {dba_slot_text(names.slot, lost=info is not None)}"]
    if info is None:  # what the next sync does to every copy (capture_setup)
        _plan_each(copies, f"full_reload: {SLOT_DROPPED}")
        return [
            f"cdc: replication slot {names.slot} does not exist in the source: the next sync "
            f"makes it again and reloads every cdc table ({SLOT_DROPPED}); fix: {KEEP_COPIES}"
        ]
    note = (
        f"cdc: slot {names.slot} retains {size_text(info.retained_bytes)} of WAL "
        f"(wal_status {info.wal_status})"
    )
    alarm = slot_alarm(info, *retained_limit(project.config.cdc))
    for table, row in zip(tables, rows, strict=True):
        if table.mode == "cdc":
            row["slot_warning"] = alarm.text if alarm is not None else None
    if alarm is None:
        return [note]
    if alarm.lost:  # what the next sync does to every copy (capture_setup)
        _plan_each(copies, f"full_reload: {SLOT_LOST}")
    return [f"{note}: {'error' if alarm.lost else 'warning'}: {alarm.text}"]
