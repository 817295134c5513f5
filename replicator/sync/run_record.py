"""After a run (finished, failed or interrupted; each `sync --follow` tick is one): its rows
in `_replicator.runs` and the metrics file. Neither can fail the run: a destination or a
disk that cannot take them is a warning (report/history.py, report/metrics.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from ..base.errors import ReplicatorError, StateError
from ..postgres.database import connect
from ..project.config import TableConfig
from ..project.project import Project
from ..project.state import TableState
from ..report import history, metrics
from ..report.history_rows import RunFacts, RunRow, from_state, parse_time, run_rows
from .context import RunContext

log = logging.getLogger("replicator.sync")

# How a run that could not reach the destination fails its tables (postgres/database.py).
UNREACHABLE = "cannot connect to the destination database"


def record_run(
    run: RunContext, tables: Sequence[TableConfig], interrupted: str | None = None
) -> None:
    """`interrupted`: what stopped the run ("interrupted by SIGTERM"), when a signal did."""
    try:
        _record(run, tables, interrupted)
    except Exception as exc:  # a bug here must not turn a good run into a failed one
        log.warning("the run's history and metrics were not recorded: internal error: %s", exc)
    finally:
        run.close_history_session()
        run.project.store.remember(False)  # the run's states were read: files from now on


def _record(run: RunContext, tables: Sequence[TableConfig], interrupted: str | None) -> None:
    project = run.project
    settings = project.settings
    states = _states(project, project.config.tables)
    facts = RunFacts(
        run.run_id,
        datetime.now(UTC),
        frozenset(run.locked),
        interrupted,
        "not started: `sync --follow` was stopping",
        frozenset(run.draining),
    )
    rows = run_rows(facts, tables, run.results, states)
    if any((r.error or "").startswith(UNREACHABLE) for r in run.results):  # said once already
        log.warning("the run's history was not recorded: the destination was out of reach")
    else:
        history.record(
            project.connections().destination,
            rows,
            settings.history_days,
            run.history_session,
        )
    if settings.metrics_textfile is not None:
        registry = metrics.registry_for(
            _figures(project.config.tables, rows, states),
            metrics.RunFigures(
                facts.finished_at, sum(r.status in ("failed", "interrupted") for r in rows)
            ),
            _slots(project),
        )
        metrics.write(settings.metrics_textfile, registry)


def _states(project: Project, tables: Sequence[TableConfig]) -> dict[str, TableState | None]:
    """Each table's state after the run, by written name (None: none, or unreadable)."""
    states: dict[str, TableState | None] = {}
    for table in tables:
        try:
            states[table.written_name] = project.store.read(table.name)
        except StateError:
            states[table.written_name] = None
    return states


def _figures(
    tables: Sequence[TableConfig],
    rows: Sequence[RunRow],
    states: dict[str, TableState | None],
) -> list[metrics.TableFigures]:
    """Every table of the project: this run's row, else its last run from sync-state."""
    ran = {row.table_name: row for row in rows if row.status != "skipped"}
    figures = []
    for table in tables:
        state = states.get(table.written_name)
        name = str(table.name)
        last = ran.get(name) or from_state(table, state)
        synced = state.last_synced_at if state is not None else None
        figures.append(metrics.TableFigures(name, last, parse_time(synced) if synced else None))
    return figures


def _slots(project: Project) -> dict[str, int]:
    """The retained WAL of the project's slot (none before it has one), kept when no
    table uses it any more: that is when it grows."""
    try:
        names = project.capture_names()
        if names is None:
            return {}
        from ..cdc.source.slot_health import retained_wal_bytes  # once there is a slot

        with connect(project.connections().source, "source") as source:
            return retained_wal_bytes(source, [names.slot])
    except ReplicatorError as exc:
        log.warning("the slot's retained WAL is not in the metrics: %s", exc)
        return {}
