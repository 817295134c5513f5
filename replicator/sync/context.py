"""What the tables of one sync run share, and what each planned table carries through its
action: the run's context, the connections, the table's job, a re-sync's key range."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.errors import StateWriteError
from ..base.redact import mask_values, redact
from ..plan.cursor import ProbeResult
from ..plan.decide import Plan
from ..plan.drift import Observed, Planned
from ..plan.read_ahead import NOTHING_READ, ReadAhead
from ..plan.table_sql import TableSql
from ..postgres.catalog import TableInfo
from ..postgres.database import Endpoints, idle
from ..project.config import TableConfig
from ..project.project import Project
from ..project.state import RunOutcome, TableState
from ..report.lineage import RunLineage
from ..report.output import SyncOutput
from ..report.results import TableResult, utc_now
from ..spark.runner import SparkRunner

log = logging.getLogger("replicator.sync")


@dataclass(frozen=True)
class KeyBounds:
    """A replication-key range, both ends included (`until` None: no upper end)."""

    since: str
    until: str | None = None


@dataclass(frozen=True)
class EarlyPlan:
    """A table planned before its turn: by the no-op screen, which found it changed
    (sync/noop_screen.py, with its probe), or by the capture's set-up (sync/cdc/setup.py).
    The table's sync takes the plan while its state is still `state`, and reads again under
    its lock only what can change meanwhile (plan/drift.recheck)."""

    state: TableState | None
    planned: Planned
    probe: ProbeResult | None = None


class RunContext:
    """What every table of one run shares."""

    def __init__(
        self,
        project: Project,
        full_refresh: bool,
        verbose: int,
        resync: KeyBounds | None = None,
        *,
        check_deletes: bool = False,
        force_deletes: bool = False,
    ) -> None:
        settings = project.current_settings()
        self.project = project
        self.full_refresh = full_refresh
        self.resync = resync
        self.check_deletes = check_deletes  # `sync --deletes`: check now, whatever the interval
        self.force_deletes = force_deletes  # `--force`: past the more-than-half guard
        self.locked: set[str] = set()  # tables another replicator was syncing
        self.results: list[TableResult] = []  # in config order, as the tables finish
        # `cdc` tables whose drain began: stopped there, not "not started" (what a batch
        # applied before an interrupt stays)
        self.draining: set[str] = set()
        self.verbose = verbose
        self.run_id = uuid.uuid4().hex
        self.started_at = utc_now()
        self.webhook = settings.webhook
        self.lineage = RunLineage.for_run(project, self.run_id)  # OpenLineage, if configured
        self.spark = SparkRunner.for_run(settings, verbose)
        if settings.warm_server is not None and settings.min_rows == 0:
            # Every batch goes to it (spark.min_rows 0): connecting (about a second, mostly
            # the client's imports) overlaps the catalog reads and planning.
            self.spark.warm_up()
        # what of `_replicator` was missing as the run began (ownership.bookkeeping_gone),
        # and whether the run has said what that means
        self.bookkeeping_gone: str | None = None
        self.said_gone = False
        self.state_unwritten = False  # the run's deferred states could not be written
        self.warnings: list[str] = []  # for someone to act on: in the webhook too
        # tables planned before their turn, by written name
        self.early: dict[str, EarlyPlan] = {}
        # the catalogs read for all the run's tables at once (plan/read_ahead.py), and the
        # tables whose first plan took its facts
        self.ahead: ReadAhead = NOTHING_READ
        self._planned: set[str] = set()
        # the tool's slot was found lost (its copies reload): the run exits 1 all the same
        self.slot_lost: str | None = None
        # `sync --follow`: decides whether a run's webhook is posted (follow.py)
        self.notify: Callable[[dict[str, Any], bool], None] | None = None
        # the run's destination session once its tables are done, if idle: the run's history
        # row is written on it (run_record.py), not on a connection of its own
        self.history_session: psycopg.Connection[Any] | None = None

    def keep_for_history(self, conn: psycopg.Connection[Any]) -> None:
        """At the end of the tables: keep the run's destination session for the history
        row when it can take it; close it otherwise."""
        if self.history_session is None and idle(conn):
            self.history_session = conn
        else:
            conn.close()

    def close_history_session(self) -> None:
        if self.history_session is not None:
            self.history_session.close()
            self.history_session = None

    def ahead_for(self, table: TableConfig) -> ReadAhead:
        """The read-ahead facts for a table's first plan in the run; a later plan of it
        (after its reload in this run, say) reads the catalogs again."""
        if table.written_name in self._planned:
            return NOTHING_READ
        self._planned.add(table.written_name)
        return self.ahead


@dataclass(frozen=True)
class TableJob:
    """One planned table of a run: what every action needs."""

    run: RunContext
    ends: Endpoints
    table: TableConfig
    planned: Planned
    state: TableState | None
    output: SyncOutput
    started: float
    started_at: str

    @property
    def name(self) -> str:
        return self.table.written_name

    @property
    def built(self) -> TableSql:
        return self.planned.built

    @property
    def source(self) -> TableInfo:
        return self.planned.source

    @property
    def observed(self) -> Observed:
        return self.planned.observed

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    def observed_destination_oid(self) -> int | None:
        """The destination table this run found (and wrote to, unless it replaced it)."""
        destination = self.observed.destination
        return destination.oid if destination is not None else None

    def success(
        self,
        action: str,
        rows: int,
        reason: str,
        size: int,
        cursor_from: str | None,
        cursor_to: str | None,
    ) -> TableResult:
        history = self.table.history_table is not None  # none written unless said
        return TableResult(
            name=self.name,
            status="success",
            action=action,
            rows=rows,
            reason=reason,
            error=None,
            seconds=time.monotonic() - self.started,
            bytes=size,
            cursor_from=cursor_from,
            cursor_to=cursor_to,
            versions_added=0 if history else None,
            versions_closed=0 if history else None,
        )

    def started_log(self, action: str, text: str) -> None:
        """The line that says a table's load begins (event `table.started` in JSON), and
        its OpenLineage START."""
        self.run.lineage.started(self.planned)
        log.info(
            "%s: %s",
            self.name,
            text,
            extra={
                "fields": {
                    "event": "table.started",
                    "run_id": self.run.run_id,
                    "name": self.name,
                    "action": action,
                    "reason": self.plan.reason,
                }
            },
        )

    def write_state(self, state: TableState) -> None:
        self.run.project.store.write(self._kept(state), self.table.name)

    def write_state_later(self, state: TableState) -> None:
        """A table the run left as it was: written with the others at the run's end."""
        self.run.project.store.write_later(self._kept(state), self.table.name)

    def _kept(self, state: TableState) -> TableState:
        """The state, saying which history table this sync kept (none: None)."""
        history = self.table.history_table
        kept = str(history) if history is not None else None
        return (
            state
            if state.history_table == kept
            else state.model_copy(update={"history_table": kept})
        )

    def outcome(self, result: TableResult, finished: str) -> RunOutcome:
        return outcome(self.run, self.started_at, finished, result)


def outcome(run: RunContext, started_at: str, finished_at: str, result: TableResult) -> RunOutcome:
    """A table's result as its state's `last_run`."""
    return RunOutcome(
        run_id=run.run_id,
        started_at=started_at,
        finished_at=finished_at,
        status=result.status,
        action=result.action,
        rows=result.rows,
        reason=result.reason,
        error=result.error,
        versions_added=result.versions_added,
        versions_closed=result.versions_closed,
    )


def failure(
    table: TableConfig,
    error: str,
    seconds: float,
    action: str | None = None,
    reason: str | None = None,
) -> TableResult:
    return TableResult(
        name=table.written_name,
        status="failure",
        action=action,
        rows=None,
        reason=reason,
        error=table_error(table, error),
        seconds=seconds,
    )


def table_error(table: TableConfig, error: str) -> str:
    """A table's error as it may be told anywhere: secrets masked, and for a table with
    columns or rows that must not leave the source, the values PostgreSQL's messages quote
    (its error may be about one of them)."""
    shaped = table.columns is not None or table.where is not None
    return redact(mask_values(error) if shaped else error)


def record_failure(
    run: RunContext,
    table: TableConfig,
    state: TableState | None,
    started_at: str,
    result: TableResult,
) -> None:
    """Keep the table's cursor and flags; note the failure as its last run."""
    base = state or TableState(table=str(table.name))
    try:
        run.project.store.write(
            base.model_copy(update={"last_run": outcome(run, started_at, utc_now(), result)}),
            table.name,
        )
    except StateWriteError as exc:
        if redact(str(exc)) != result.error:  # else the table's own error says it already
            log.error("%s: could not record the failure in sync-state: %s", table.written_name, exc)
