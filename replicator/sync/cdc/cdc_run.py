"""The `cdc` tables of one run (docs/how-it-works/cdc.md).

1. Set-up, once (setup.py): the slot and publication names (sync-state/cdc.json), the
   publication listing the `cdc` tables, the slot (created when missing; a lost one is
   made again and every `cdc` table reloads with reason `slot lost`). Each selected table
   is planned for it, and the plan kept for the table's turn (context.EarlyPlan).
2. Each selected table's plan is carried out like any other (run.py); a full reload loads it from a
   snapshot with its log position (cdc/source/slot_snapshot.py), one that goes on from the log
   is deferred here.
3. Once every table was planned: one drain of the slot for the deferred tables
   (cdc/drain.py); each gets its result and state; a table the log shows changed shape
   is reloaded right after.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import (
    DatabaseError,
    Interrupted,
    ReplicatorError,
    TableLocked,
    TableProblem,
    one_line,
)
from ...base.failpoints import pause_point
from ...base.identifiers import INTERNAL_SCHEMA, TableName
from ...cdc.apply.applied import applied_positions, forget_applied
from ...cdc.capture_table import CaptureTable, ShapeColumn, copy_shape
from ...cdc.drain import drain
from ...cdc.preflight import applied_where, capture_problem
from ...cdc.rows.shaped_log import log_shaping
from ...cdc.source.dba_publication import publication_problem, via_root_problem
from ...cdc.source.slot import (
    add_table_statement,
    emit_heartbeat,
    flushed_lsn,
    lsn_text,
    parse_lsn,
    published_tables,
    slot_info,
)
from ...cdc.source.slot_health import slot_alarm
from ...plan.decide import Plan
from ...plan.drift import Planned, destination_has_rows, plan_now
from ...plan.evolution import Evolution
from ...postgres import ddl
from ...postgres.catalog import taken_names
from ...postgres.database import Endpoints, execute, transaction
from ...postgres.history_tables import Versions
from ...postgres.partition_tree import PARTITIONED
from ...postgres.swap import LOCK_TIMEOUT
from ...postgres.table_lock import table_lock
from ...project.cdc_config import retained_limit
from ...project.cdc_state import CaptureState
from ...project.config import TableConfig
from ...project.settings import HASH_SALT
from ...project.state import LSN_CURSOR_TYPE, Cursor, TableState
from ...report.results import TableResult, utc_now
from ..context import EarlyPlan, RunContext, TableJob, failure, record_failure
from ..scripts import side_table
from .log_evolution import evolve_at_log, needs_evolution
from .setup import set_up_capture

log = logging.getLogger("replicator.sync")

# The schema changes one run takes in place at their places in the log, each followed by a
# drain of the table again (log_evolution.py); another one waits for the next run.
EVOLUTION_ROUNDS = 3


@dataclass
class _Earlier:
    """What a table's drains before the last one in the run did: its copy took a schema
    change in place after each."""

    reason: str  # `schema evolved: ...`
    positions: dict[TableName, int]  # where the copies were when the first drain began
    not_null: list[str]  # set once the table is drained past its evolution
    changes: int = 0
    deleted: int = 0
    truncated: bool = False
    versions: Versions = field(default_factory=Versions)

    @classmethod
    def after(
        cls,
        previous: _Earlier | None,
        table: CaptureTable,
        job: TableJob,
        positions: dict[TableName, int],
        not_null: list[str],
    ) -> _Earlier:
        """The drains so far, the one that left `table` included; `job`: the table planned
        after its copy took the change."""
        reason = job.plan.reason
        if previous is not None:
            previous.add_to(table)
            reason = f"{previous.reason}; {reason}"
            positions, not_null = previous.positions, [*previous.not_null, *not_null]
        return cls(
            reason,
            positions,
            not_null,
            table.changes,
            table.deleted,
            table.truncated,
            table.versions,
        )

    def add_to(self, table: CaptureTable) -> None:
        table.changes += self.changes
        table.deleted += self.deleted
        table.versions += self.versions
        table.truncated = table.truncated or self.truncated


class CaptureRun:
    """What a run's `cdc` tables share: the set-up, the deferred tables, the drain."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.names: CaptureState | None = None
        self.setup_error: str | None = None
        self.positions: dict = {}
        self.deferred: list[TableJob] = []

    # ------------------------------------------------------------ 1. set-up

    def set_up(self, ends: Endpoints, selected: tuple[TableConfig, ...]) -> None:
        """Names, publication and slot (capture_setup.py); an error here fails every
        selected `cdc` table. A run that selects none only reads the names: its drain
        moves the slot past what no copy needs (drain_deferred)."""
        if not any(t.mode == "cdc" for t in selected):
            try:
                self.names = self.run.project.capture_names()
            except ReplicatorError as exc:
                log.warning("cdc: the replication slot is not moved: %s", one_line(exc))
            return
        try:
            planned = self._plan(ends, selected)
            self.names, lost = set_up_capture(self.run.project, ends, selected, planned)
            if lost is not None:  # remade, its copies reloading: said, and the run exits 1
                self.run.slot_lost = lost
                self.run.warnings.append(lost)
            self.positions = applied_positions(ends.dest)
        except (ReplicatorError, psycopg.Error) as exc:
            self.setup_error = f"log capture set-up: {one_line(exc)}"
            log.error("%s", self.setup_error)
            with contextlib.suppress(ReplicatorError):  # the slot still moves, if it exists
                self.names = self.run.project.capture_names()

    def _plan(self, ends: Endpoints, selected: tuple[TableConfig, ...]) -> dict[TableName, Planned]:
        """The selected `cdc` tables planned once, for the set-up and for their turn; a
        table that cannot be is left to its turn, which says why."""
        run = self.run
        planned: dict[TableName, Planned] = {}
        for table in selected:
            if table.mode != "cdc":
                continue
            try:
                state = run.project.store.read(table.name)
                early = plan_now(
                    ends.source,
                    ends.dest,
                    table,
                    run.project.templates,
                    state,
                    ahead=run.ahead_for(table),
                )
            except (ReplicatorError, psycopg.Error):
                continue
            run.early[table.written_name] = EarlyPlan(state, early)
            planned[table.name] = early
        return planned

    # ------------------------------------------------------------ 2. planning

    def adjust(self, ends: Endpoints, planned: Planned, state: TableState | None) -> Planned:
        """A `cdc` table's plan: the set-up's failure, a table the log cannot carry, a
        reload whose reason the log gives (`slot lost`, a shape change it showed), a copy
        whose position is not in the destination."""
        table = planned.built.table
        captured = self.run.project.cdc_tables  # a partition of one cannot be captured too
        problem = capture_problem(ends.source, planned.source, planned.built, captured)
        if problem is not None:  # the table's own reason first: the set-up may fail for it
            raise TableProblem(problem)
        if self.setup_error is not None:
            raise TableProblem(f"{table.written_name}: {self.setup_error}")
        names = self.names
        foreign = names is not None and not names.created
        if foreign and planned.source.kind == PARTITIONED:
            via_root = via_root_problem(ends.source, names.publication, table.name)
            if via_root is not None:  # its changes pass under its partitions' names
                forget_applied(ends.dest, table.target)
                raise TableProblem(f"{table.written_name}: {via_root[0]}: {via_root[1]}")
        alone = planned.source.has_children
        if foreign and table.name not in published_tables(ends.source, names.publication):
            # Its changes are not in the log from here on: when the DBA adds it back, its
            # copy must reload, not continue from a position with a gap after it.
            forget_applied(ends.dest, table.target)
            raise TableProblem(
                f"{table.written_name}: not in publication {names.publication} (named in "
                "tables-config.json `cdc`): its changes would never arrive; add it "
                f"({add_table_statement(names.publication, table.name, alone)})"
            )
        if foreign:
            shaping = planned.built.shaping
            withheld = publication_problem(
                ends.source,
                names.publication,
                table.name,
                [
                    c.name
                    for c in planned.source.columns
                    if not shaping or c.name not in shaping.exclude
                ],
                None
                if shaping is None or applied_where(ends.source, planned.source, planned.built)
                else shaping.where,
                alone,
            )
            if withheld is not None:
                raise TableProblem(f"{table.written_name}: {withheld[0]}: {withheld[1]}")
        plan = planned.plan
        if plan.action == "incremental":
            position = self.positions.get(table.target)
            if position is None:
                plan = Plan("full_reload", "no log position in the destination")
            else:  # the copy holds every commit before both (the state's moves every run)
                reached = parse_lsn(state.cursor.value) if state and state.cursor else 0
                plan = Plan("incremental", f"lsn {lsn_text(max(position, reached))}")
        return replace(planned, plan=plan)

    def defer(self, job: TableJob) -> None:
        self.deferred.append(job)

    # ------------------------------------------------------------ 3. the drain

    def drain_deferred(self, ends: Endpoints) -> tuple[list[TableResult], list[TableConfig]]:
        """Apply the log to every deferred table: their results, and the tables the log
        shows changed shape (to reload now). Without any (none selected, or each failed
        before), the slot still moves up to the first change a copy needs. Then what the
        slot holds is checked (cdc/source/slot_health.py)."""
        if not self.deferred:
            if self.names is not None:
                self._drain(ends, [], [])
                self._check_slot(ends)
            return [], []
        assert self.names is not None
        results: list[TableResult] = []
        with ExitStack() as locks:
            jobs = []
            for job in self.deferred:
                try:
                    locks.enter_context(table_lock(ends.dest_url, job.table.target, job.name))
                    jobs.append(job)
                except TableLocked as exc:
                    self.run.locked.add(job.name)
                    results.append(failure(job.table, str(exc), 0.0))
            self.run.draining.update(job.name for job in jobs)
            drifted = self._drain(ends, jobs, results)
            drop_leftover_sides(ends.dest, jobs)
        self._check_slot(ends)
        return results, drifted

    def _check_slot(self, ends: Endpoints) -> None:
        """After the drain: a slot that still holds too much WAL is a warning, in the log
        and the webhook (a lost one failed the run's cdc tables at the set-up)."""
        assert self.names is not None
        try:
            info = slot_info(ends.source, self.names.slot)
        except psycopg.Error as exc:
            log.warning("cdc: replication slot %s not checked: %s", self.names.slot, exc)
            return
        if info is None or (info.lost and self.setup_error is not None):
            return
        alarm = slot_alarm(info, *retained_limit(self.run.project.config.cdc))
        if alarm is not None:
            log.warning("source: %s", alarm.text)
            self.run.warnings.append(alarm.text)

    def _drain(
        self, ends: Endpoints, jobs: list[TableJob], results: list[TableResult]
    ) -> list[TableConfig]:
        """Drain for `jobs`; a table whose copy takes a schema change in place at its place
        in the log (log_evolution.py) takes it, and the slot is drained again for those,
        up to EVOLUTION_ROUNDS times (a change beyond waits at its position for the next
        run). Returns the tables to reload."""
        drifted: list[TableConfig] = []
        earlier: dict[str, _Earlier] = {}
        for round_ in range(EVOLUTION_ROUNDS + 1):
            drained = self._drain_once(ends, jobs, results, earlier)
            evolved: list[TableJob] = []
            for job, table in drained:
                if table.drift is not None and table.error is None:
                    self._mark_drifted(job, f"schema changed: {table.drift}")
                    drifted.append(job.table)
                    continue
                if round_ < EVOLUTION_ROUNDS and needs_evolution(job, table):
                    try:
                        taken = evolve_at_log(job, table)
                    except (ReplicatorError, psycopg.Error) as exc:
                        table.error = one_line(exc)
                    else:
                        if isinstance(taken, str):
                            forget_applied(ends.dest, job.table.target)
                            self._mark_drifted(job, taken)
                            drifted.append(job.table)
                            continue
                        job, not_null = taken
                        earlier[job.name] = _Earlier.after(
                            earlier.get(job.name), table, job, self.positions, not_null
                        )
                        evolved.append(job)
                        continue
                done = earlier.get(job.name)
                if done is not None and done.not_null and table.error is None:
                    problem = _set_not_null(ends, done.not_null)
                    if problem is not None:  # rows the source lacks: the copy is not exact
                        forget_applied(ends.dest, job.table.target)
                        self._mark_drifted(job, f"{done.reason} (then: {problem})")
                        drifted.append(job.table)
                        continue
                results.append(self._finish(job, table, done))
            if not evolved:
                break
            jobs = evolved
        return drifted

    def _drain_once(
        self,
        ends: Endpoints,
        jobs: list[TableJob],
        results: list[TableResult],
        earlier: dict[str, _Earlier],
    ) -> list[tuple[TableJob, CaptureTable]]:
        """One read of the slot for `jobs`; each with its table as the drain left it (none
        when the drain failed: each job's failure is in `results`)."""
        assert self.names is not None
        names = self.names
        # Read again: a table loaded earlier in this run has its position only now.
        self.positions = applied_positions(ends.dest)
        salt = self.run.project.env.get(HASH_SALT)
        tables = [
            CaptureTable(
                job.table.name,
                job.built,
                self.positions[job.table.target],
                shaping=log_shaping(ends.source, job.built, job.planned.source, salt),
                where=applied_where(ends.source, job.planned.source, job.built),
                copy_shape=self._copy_shape(ends, job),
            )
            for job in jobs
        ]
        tables += self._watched(jobs)
        # Each table's run is the drain's: timed from here, not from its planning, which
        # came before every other table the run synced (its `1 rows in 4.6 s` was theirs).
        begun, begun_at = time.monotonic(), utc_now()
        jobs = [
            replace(job, started=begun, started_at=begun_at) if job.name not in earlier else job
            for job in jobs
        ]
        for job in jobs:
            if job.name not in earlier:
                job.started_log("incremental", f"applying the log ({job.plan.reason})")
        try:
            info = slot_info(ends.source, names.slot)
            if not jobs and (info is None or info.lost):
                return []  # nothing to move (a lost slot failed the set-up, or is said after)
            if info is None or info.confirmed is None:
                raise TableProblem(f"replication slot {names.slot} disappeared during the run")
            pause_point("cdc-before-upto")  # a test's change here is in the drain
            emit_heartbeat(ends.source)
            upto = flushed_lsn(ends.source)
            drained = drain(
                ends.source_url,
                ends.dest_url,
                names.slot,
                names.publication,
                tables,
                info.confirmed,
                upto,
            )
        except Interrupted:
            raise
        except (ReplicatorError, psycopg.Error) as exc:
            if not jobs:
                log.warning("cdc: replication slot %s not moved: %s", names.slot, one_line(exc))
            for job in jobs:
                result = failure(job.table, one_line(exc), 0.0, "incremental", job.plan.reason)
                record_failure(self.run, job.table, job.state, job.started_at, result)
                results.append(result)
            return []
        behind = max(flushed_lsn(ends.source) - drained.end, 0)
        log.info(
            "cdc: slot %s read up to %s in %d batch(es); %d bytes of log written since",
            names.slot,
            lsn_text(drained.end),
            drained.batches,
            behind,
            extra={
                "fields": {
                    "event": "cdc.drained",
                    "lsn": lsn_text(drained.end),
                    "lag_bytes": behind,
                }
            },
        )
        return list(zip(jobs, drained.tables, strict=False))

    @staticmethod
    def _copy_shape(ends: Endpoints, job: TableJob) -> tuple[ShapeColumn, ...] | None:
        """The copy's columns, for a table that takes schema changes in place (None for
        any other: the log is compared with the columns it copies)."""
        destination = job.observed.destination
        if job.table.on_schema_change != "evolve" or job.built.shaping is not None:
            return None
        if destination is None:
            return None
        return copy_shape(ends.dest, destination.oid, job.built)

    def _watched(self, jobs: list[TableJob]) -> list[CaptureTable]:
        """`cdc` tables with a copy that this drain does not apply to (not selected, loaded
        earlier in this run, or locked by another run): the slot keeps their changes."""
        selected = {job.table.name for job in jobs}
        watched = []
        for table in self.run.project.config.tables:
            if table.mode != "cdc" or table.name in selected:
                continue
            position = self.positions.get(table.target)
            if position is not None:
                watched.append(CaptureTable(table.name, None, position, apply=False))
        return watched

    def _mark_drifted(self, job: TableJob, reason: str) -> None:
        """The log shows the table changed shape (`reason`), and its copy cannot take the
        change in place: it is reloaded right after the drain (and by the next run, if that
        reload cannot run now)."""
        assert job.state is not None
        log.info("%s: %s: reloading it", job.name, reason)
        job.write_state(
            job.state.model_copy(update={"pending_full_reload": True, "pending_reason": reason})
        )

    def _finish(
        self, job: TableJob, table: CaptureTable, earlier: _Earlier | None = None
    ) -> TableResult:
        """The table's result and state after the drain (and the drains before it in the
        run, `earlier`, when its copy took a schema change in between)."""
        run, state = self.run, job.state
        assert state is not None
        if earlier is not None:
            earlier.add_to(table)
        # The later of sync-state's cursor (it moves on with the slot while the table has
        # no changes) and the copy's position when the drain began (a run killed after an
        # apply, before its state write, left the cursor behind that).
        known = [parse_lsn(state.cursor.value)] if state.cursor else []
        positions = earlier.positions if earlier is not None else self.positions
        known += [p for p in (positions.get(job.table.target),) if p is not None]
        before = lsn_text(max(known)) if known else lsn_text(table.applied)
        if table.error is not None:
            result = failure(job.table, table.error, 0.0, "incremental", job.plan.reason)
            if table.forgotten:  # its position is gone: the next sync reloads it, and why
                reason = f"the log could not be applied: {table.error}"
                state = state.model_copy(
                    update={"pending_full_reload": True, "pending_reason": reason}
                )
            record_failure(run, job.table, state, job.started_at, result)
            return result
        after = lsn_text(table.position)
        finished = utc_now()
        pending = isinstance(job.observed.evolution, Evolution)  # not taken: still to come
        update: dict = {
            "cursor": Cursor(value=after, type=LSN_CURSOR_TYPE),
            "schema_signature": (
                state.schema_signature if pending else job.observed.signature.as_json()
            ),
            "last_synced_at": finished,
            "holds_rows": (
                destination_has_rows(job.ends.dest, job.table.target)
                if table.changes
                else job.observed.destination_has_rows
            ),
            "destination_oid": job.observed_destination_oid(),
        }
        action = "incremental" if table.changes or earlier is not None else "noop"
        reason = f"lsn {before} -> {after}" if table.changes else f"lsn {after}"
        if earlier is not None:  # the reason says it first (docs/guides/schema-drift.md)
            reason = f"{earlier.reason}; {reason}"
        if table.truncated:  # the log's TRUNCATE emptied the copy before the changes after it
            reason += "; truncated"
        result = job.success(action, table.changes, reason, 0, before, after)
        result = replace(result, deleted=table.deleted)
        if table.history is not None:
            result = replace(
                result,
                versions_added=table.versions.added,
                versions_closed=table.versions.closed,
            )
        job.write_state(
            state.model_copy(update={**update, "last_run": job.outcome(result, finished)})
        )
        return result


def _set_not_null(ends: Endpoints, statements: list[str]) -> str | None:
    """Set the NOT NULLs an evolution left for after the drain; why not, if it cannot."""
    try:
        with transaction(ends.dest):
            limit = sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT))
            execute(ends.dest, limit)
            for statement in statements:
                execute(ends.dest, statement)
    except DatabaseError as exc:
        return str(exc).removeprefix("destination: ")
    return None


def drop_leftover_sides(dest: psycopg.Connection[Any], jobs: Sequence[TableJob]) -> None:
    """Drop the side tables these (locked) `cdc` tables' killed reloads left. A `cdc` table's
    reload killed before its swap leaves its side table: no `cdc` load resumes, and the copy
    goes on from the log, so nothing would drop it until the table's next reload. The drain
    drops it, holding the table's lock (another run's load of the table would hold it too)."""
    sides = {side_table(job.table.target).name: job for job in jobs}
    if not sides:
        return
    for name in sorted(taken_names(dest, INTERNAL_SCHEMA, list(sides))):
        execute(dest, ddl.drop_table(side_table(sides[name].table.target)))
        log.info(
            "%s: dropped the side table a reload killed before its swap left (%s.%s)",
            sides[name].name,
            INTERNAL_SCHEMA,
            name,
        )
