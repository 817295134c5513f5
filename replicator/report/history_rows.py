"""What one run did to each of its tables, as the rows of `_replicator.runs` (pure).

A row is built from the table's result and its sync-state after the run (the state's
`last_run` holds the table's own start and end times). `lag_seconds` says how stale the copy
is when the table's run ends: after a success, the run's own duration (the copy holds the
source as of the start of its read); otherwise the time since the last successful sync
ended, NULL when there never was one. The same figures come from sync-state alone for a
table the run did not sync (`from_state`), so the metrics keep its last values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Literal

from ..project.config import TableConfig
from ..project.state import TableState
from .results import TableResult

RunStatus = Literal["success", "failed", "interrupted", "skipped"]
STATUSES: tuple[RunStatus, ...] = ("success", "failed", "interrupted", "skipped")


@dataclass(frozen=True)
class RunRow:
    """One row of `_replicator.runs`: the fields in the table's column order
    (docs/guides/metrics-and-report.md)."""

    run_id: str
    table_name: str  # the source table, schema.table
    destination: str
    started_at: datetime
    finished_at: datetime
    action: str | None
    reason: str | None
    status: RunStatus
    rows: int | None
    bytes: int | None
    deleted: int | None
    error: str | None
    cursor_before: str | None
    cursor_after: str | None
    lag_seconds: float | None
    versions_added: int | None = None  # in the table's history table (tables[].history)
    versions_closed: int | None = None

    @property
    def seconds(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()

    def values(self) -> tuple[Any, ...]:
        # not dataclasses.astuple, which deep-copies every field (a run of 1,000 tables
        # felt it), and these fields are all immutable
        return tuple(getattr(self, name) for name in COLUMNS)

    def as_json(self) -> dict[str, Any]:
        return {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in zip(COLUMNS, self.values(), strict=True)
        }


COLUMNS = tuple(f.name for f in fields(RunRow))


@dataclass(frozen=True)
class RunFacts:
    """What the run as a whole says about its tables' rows."""

    run_id: str
    finished_at: datetime  # for tables whose state does not say (skipped, state unreadable)
    locked: frozenset[str] = frozenset()  # tables another host was syncing: skipped
    interrupted: str | None = None  # "interrupted by SIGTERM" when a signal stopped the run
    not_started: str = "not started: the run stopped before it"
    draining: frozenset[str] = frozenset()  # `cdc` tables whose drain began


def run_rows(
    facts: RunFacts,
    tables: Sequence[TableConfig],
    results: Sequence[TableResult],
    states: Mapping[str, TableState | None],
) -> list[RunRow]:
    """One row per table of the run, in its order; a table without a result was skipped."""
    found = {r.name: r for r in results}
    return [
        _row(facts, table, found.get(table.written_name), states.get(table.written_name))
        for table in tables
    ]


def _row(
    facts: RunFacts, table: TableConfig, result: TableResult | None, state: TableState | None
) -> RunRow:
    status = _status(facts, table.written_name, result)
    started, finished = _times(facts, result, state)
    cursor = state.cursor.value if state is not None and state.cursor is not None else None
    before = result.cursor_from if result is not None else None
    return RunRow(
        run_id=facts.run_id,
        table_name=str(table.name),
        destination=str(table.destination),
        started_at=started,
        finished_at=finished,
        action=result.action if result else None,
        reason=_reason(facts, table.written_name, result),
        status=status,
        rows=result.rows if result else None,
        bytes=result.bytes if result else None,
        deleted=result.deleted if result else None,
        error=result.error if result else None,
        cursor_before=before if before is not None or status == "success" else cursor,
        cursor_after=(result.cursor_to if result else None) or cursor,
        lag_seconds=lag_seconds(status, started, finished, state),
        versions_added=result.versions_added if result else None,
        versions_closed=result.versions_closed if result else None,
    )


def _status(facts: RunFacts, name: str, result: TableResult | None) -> RunStatus:
    if result is None and facts.interrupted and name in facts.draining:
        return "interrupted"
    if result is None or name in facts.locked:
        return "skipped"
    if result.status == "success":
        return "success"
    if facts.interrupted and (result.error or "").startswith(facts.interrupted):
        return "interrupted"
    return "failed"


def _reason(facts: RunFacts, name: str, result: TableResult | None) -> str | None:
    if result is not None:
        return result.reason
    if facts.interrupted and name in facts.draining:
        return (
            f"stopped in the log's drain: the run was {facts.interrupted} (its batches "
            "applied so far stay)"
        )
    if facts.interrupted:
        return f"not started: the run was {facts.interrupted}"
    return facts.not_started


def _times(
    facts: RunFacts, result: TableResult | None, state: TableState | None
) -> tuple[datetime, datetime]:
    """The table's start and end: its state's last run when this run wrote it, else the
    run's end and the result's duration."""
    last = state.last_run if state is not None else None
    if last is not None and last.run_id == facts.run_id:
        return parse_time(last.started_at), parse_time(last.finished_at)
    seconds = result.seconds if result is not None else 0.0
    return facts.finished_at - timedelta(seconds=seconds), facts.finished_at


def lag_seconds(
    status: str, started: datetime, finished: datetime, state: TableState | None
) -> float | None:
    """How stale the copy is as the table's run ends (see the module's docstring)."""
    if status == "success":
        return max((finished - started).total_seconds(), 0.0)
    if state is None or state.last_synced_at is None:
        return None
    return max((finished - parse_time(state.last_synced_at)).total_seconds(), 0.0)


def from_state(table: TableConfig, state: TableState | None) -> RunRow | None:
    """The table's last run as its sync-state recorded it (None when it has none)."""
    last = state.last_run if state is not None else None
    if state is None or last is None:
        return None
    started, finished = parse_time(last.started_at), parse_time(last.finished_at)
    interrupted = (last.error or "").startswith("interrupted by ")
    status: RunStatus = (
        "success" if last.status == "success" else "interrupted" if interrupted else "failed"
    )
    return RunRow(
        run_id=last.run_id,
        table_name=str(table.name),
        destination=str(table.destination),
        started_at=started,
        finished_at=finished,
        action=last.action,
        reason=last.reason,
        status=status,
        rows=last.rows,
        bytes=None,
        deleted=None,
        error=last.error,
        cursor_before=None,
        cursor_after=state.cursor.value if state.cursor is not None else None,
        lag_seconds=lag_seconds(status, started, finished, state),
    )


def parse_time(text: str) -> datetime:
    """A time as sync-state writes it (`...Z`), aware."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
