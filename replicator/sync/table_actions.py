"""What `sync` does to one table once it is planned: a full reload, an incremental merge (or
a noop), a start without backfill, a re-sync of a key range; each writes the table's new state
only after the destination committed."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Protocol

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError, TableProblem
from ..base.failpoints import failpoint
from ..base.identifiers import display_ident
from ..plan.cursor import ProbeResult, probe, waiting_line
from ..plan.decide import Plan
from ..plan.drift import Planned, destination_has_rows, destination_oid
from ..plan.evolution import Evolution
from ..plan.table_sql import batch_query
from ..postgres.copy_objects import CopyIndex, create_on_copy
from ..postgres.database import execute, run_steps
from ..postgres.open_transactions import snapshot_xmax
from ..project.state import LSN_CURSOR_TYPE, Cursor, Pending, TableState, Window
from ..report.results import TableResult, utc_now
from .context import KeyBounds, TableJob
from .full_load.load import full_reload
from .full_load.resume import abandon, resumable
from .incremental.batch import IncrementalResult, batch_size, incremental_sync
from .incremental.deletes import propagate_deletes
from .incremental.evolve import take_in_place
from .skip_backfill import start_without_backfill

log = logging.getLogger("replicator.sync")


def carry_out(job: TableJob) -> TableResult:
    """Run the job's plan (full_reload, incremental or skip_backfill)."""
    if job.plan.action != "full_reload" and resumable(job.table.mode, job.table.replication_key):
        abandon(job.ends.dest, job.table.target, job.name)  # a `sync -f` killed, say
    with job.built.reading_model():
        if job.plan.action == "incremental":
            if job.run.resync is not None:
                return _resync(job)
            return propagate_deletes(job, _incremental(job))
        if job.plan.action == "skip_backfill":
            return _skip_backfill(job)
        return _full_reload(job)


def keep_configured_indexes(dest: psycopg.Connection[Any], planned: Planned) -> None:
    """Build on the copy the indexes `tables[].indexes` asks for that it lacks (added to the
    config since its last load, or dropped by someone)."""
    missing = missing_indexes(planned)
    target = planned.built.table.target
    for index in missing:
        log.info(
            "%s: building index %s (tables[].indexes)",
            planned.built.table.written_name,
            display_ident(index.name),
        )
        try:
            run_steps(dest, [create_on_copy(index, target)])
        except DatabaseError as exc:
            raise TableProblem(
                f"{planned.built.table.written_name}: the index {display_ident(index.name)} "
                "that tables-config.json asks for cannot be built on the copy: "
                f"{str(exc).removeprefix('destination: ')}; fix the rows or the entry"
            ) from None


def missing_indexes(planned: Planned) -> list[CopyIndex]:
    """The configured indexes the copy lacks (none while it does not exist)."""
    destination = planned.observed.destination
    if destination is None:
        return []
    return [i for i in planned.built.indexes if i.name not in destination.index_names]


def _full_reload(job: TableJob) -> TableResult:
    """Load the table in full through a side table and a swap; record the new state."""
    job.started_log("full_reload", f"full_reload ({job.plan.reason})")
    with job.output.progress(job.name) as progress:
        loaded = full_reload(
            job.ends,
            job.built,
            job.source,
            job.run.spark,
            progress,
            capture=job.table.mode == "cdc",
            resumable=resumable(job.table.mode, job.table.replication_key),
            fresh=job.run.full_refresh,
        )
    if loaded.lsn is not None:  # a `cdc` table: its cursor is its position in the log
        from ..cdc.source.slot import lsn_text  # the log's modules: for a cdc table only

        loaded = replace(loaded, cursor=Cursor(value=lsn_text(loaded.lsn), type=LSN_CURSOR_TYPE))
    failpoint("after-swap-before-state")
    old = job.state.cursor.value if job.state and job.state.cursor else None
    new = loaded.cursor.value if loaded.cursor else None
    result = job.success("full_reload", loaded.rows, job.plan.reason, loaded.bytes, old, new)
    if loaded.versions is not None:
        result = replace(
            result,
            versions_added=loaded.versions.added,
            versions_closed=loaded.versions.closed,
        )
    state = _write_new_state(job, loaded, result)
    _say_waiting(job, loaded.cursor, loaded.pending)
    if loaded.resumed is None:
        return result
    return _catch_up(job, state, result)


def _catch_up(job: TableJob, state: TableState, loaded: TableResult) -> TableResult:
    """After a resumed load (`state`: what it wrote): the rows changed since its first
    part's snapshot, read as an incremental batch from that snapshot's cursor (and the
    delete check when it is due)."""
    plan = Plan("incremental", "catching up after the resumed load")
    catching_up = replace(job, state=state, planned=replace(job.planned, plan=plan))
    caught = propagate_deletes(catching_up, _incremental(catching_up))
    log.info(
        "%s: caught up after the resumed load: %s row(s) read again",
        job.name,
        f"{caught.rows or 0:,}",
    )
    result = replace(
        caught,
        action="full_reload",
        rows=loaded.rows,
        bytes=(loaded.bytes or 0) + (caught.bytes or 0),
        reason=loaded.reason,
        cursor_from=loaded.cursor_from,
    )
    if caught.status == "success":
        latest = job.run.project.store.read(job.table.name)
        assert latest is not None
        finished = utc_now()
        job.write_state(latest.model_copy(update={"last_run": job.outcome(result, finished)}))
    return result


def finish_noop(
    job: TableJob, probed: ProbeResult, deletes_checked: str | None = None
) -> TableResult:
    """A cursor table with nothing new: its result, and its state's note of this run (written
    with the others' at the run's end). `deletes_checked`: the screen found that nothing was
    deleted (noop_screen.py), which counts as the table's delete check: the destination's
    xmax before it looked (state.exact_xmax)."""
    state = job.state
    assert state is not None
    before = state.cursor.value if state.cursor else None
    _warn_of_vanished_rows(job, state, probed.rows)
    finished = utc_now()
    result = job.success("noop", 0, job.plan.reason, 0, before, before)
    job.write_state_later(
        state.model_copy(
            update={
                "pending": probed.pending,
                "schema_signature": job.observed.signature.as_json(),
                "last_synced_at": finished,
                "last_run": job.outcome(result, finished),
                "holds_rows": job.observed.destination_has_rows,
                "destination_oid": job.observed_destination_oid(),
                **(
                    {"deletes_checked_at": finished, "exact_xmax": deletes_checked}
                    if deletes_checked is not None
                    else {}
                ),
            }
        )
    )
    return result


def _incremental(job: TableJob) -> TableResult:
    """Probe without Spark; read, stage and merge only when something changed."""
    state = job.state
    assert state is not None
    before = state.cursor.value if state.cursor else None
    signature = job.observed.signature.as_json()
    evolved = isinstance(job.observed.evolution, Evolution)
    if evolved:
        try:
            state = _evolve(job, state)
        except CannotEvolve as exc:
            return _full_reload(exc.job)
    early = job.run.early.pop(job.name, None)
    if early is not None and early.probe is not None and early.state == state:
        probed = early.probe  # the screen's count, a moment old: the batch reads all there
    else:
        probed = probe(job.ends.source, job.built, state)
    if not probed.changed:
        return finish_noop(job, probed)
    job.started_log("incremental", f"incremental ({job.plan.reason})")
    _warn_of_vanished_rows(job, state, probed.rows)
    rows = probed.rows
    if not probed.exact:  # the probe stopped counting: only Spark's choice needs the size
        spark = job.run.spark
        rows = batch_size(job.ends.source, job.built, state) if spark.may_choose() else 0
    synced = _merge(job, state, rows)
    after = synced.cursor.value if synced.cursor else None
    reason = f"cursor {before or 'none'} -> {after or 'none'}"
    if evolved:  # the reason says it first (docs/guides/schema-drift.md)
        reason = f"{job.plan.reason}; {reason}"
    result = job.success("incremental", synced.rows_read, reason, synced.bytes, before, after)
    if synced.versions is not None:
        result = replace(
            result,
            versions_added=synced.versions.added,
            versions_closed=synced.versions.closed,
        )
    failpoint("after-merge-before-state")
    finished = utc_now()
    job.write_state(
        state.model_copy(
            update={
                "cursor": synced.cursor,
                "pending": synced.pending,
                "window": synced.window,
                "schema_signature": signature,
                "last_synced_at": finished,
                "last_run": job.outcome(result, finished),
                # a merge of rows leaves at least one (a delete check after it may not)
                "holds_rows": True if synced.rows_read else job.observed.destination_has_rows,
                "destination_oid": job.observed_destination_oid(),
                "batch_rows": synced.rows_read,
            }
        )
    )
    _say_waiting(job, synced.cursor, synced.pending)
    return result


class CannotEvolve(Exception):
    """The copy refused the change in place: the table is reloaded instead (`job`)."""

    def __init__(self, job: TableJob) -> None:
        self.job = job


def _evolve(job: TableJob, state: TableState) -> TableState:
    """Take the source's schema change in place (sync/incremental/evolve.py) and record the
    new signature at once: the batch that follows reads the new columns. A change the copy
    refuses (a view that cannot be recreated, NOT NULL over rows the source no longer has)
    reloads the table instead, with the reason."""
    evolution, destination = job.observed.evolution, job.observed.destination
    assert isinstance(evolution, Evolution) and destination is not None
    why = take_in_place(job.ends, job.built, job.source, destination, evolution, job.plan.reason)
    if why is not None:
        change = job.plan.reason.removeprefix("schema evolved: ")
        plan = Plan("full_reload", f"schema changed: {change} (cannot evolve: {why})")
        raise CannotEvolve(replace(job, planned=replace(job.planned, plan=plan)))
    evolved = state.model_copy(update={"schema_signature": job.observed.signature.as_json()})
    job.write_state(evolved)
    return evolved


def _say_waiting(job: TableJob, cursor: Cursor | None, pending: Pending | None) -> None:
    """A cursor the source's open transactions hold back, said (a warning when the same ones
    have held it for long: plan/cursor.waiting_line)."""
    if pending is None:
        return
    long, line = waiting_line(job.name, cursor, pending)
    (log.warning if long else log.info)(line)


def _warn_of_vanished_rows(job: TableJob, state: TableState, rows: int) -> None:
    """Fewer rows at or past the cursor than the last sync read there: some were deleted in
    the source (or their key moved back), which no cursor can see. And a source that became
    empty (a TRUNCATE) while the destination still has rows. Not said of a table whose
    `deletes` setting propagates them."""
    if job.table.deletes != "ignore":
        return
    if rows == 0 and _emptied(job):
        log.warning(
            "%s: the source returns no rows, but the destination table still has rows (a "
            "TRUNCATE or DELETE in the source): deletes are not propagated for this table: "
            "set `deletes`, or run `replicator verify --repair -s %s`",
            job.name,
            job.name,
            extra={"fields": {"event": "table.source_empty", "name": job.name}},
        )
        return
    read = state.window.rows if state.window else None
    if read is None or rows >= read:
        return
    log.warning(
        "%s: %d row(s) the last sync read at or past the cursor are gone from the source "
        "(deleted, or their replication key moved back): deletes are not propagated for "
        "this table: set `deletes`, or run `replicator verify --repair -s %s`",
        job.name,
        read - rows,
        job.name,
        extra={"fields": {"event": "table.vanished_rows", "name": job.name, "rows": read - rows}},
    )


def _emptied(job: TableJob) -> bool:
    """The model returns no row at all, and the destination table still has some."""
    (source_rows,) = execute(
        job.ends.source, sql.SQL("SELECT EXISTS ({})").format(sql.SQL(job.built.model.sql))
    ).fetchone()
    if source_rows:
        return False
    (dest_rows,) = execute(
        job.ends.dest,
        sql.SQL("SELECT EXISTS (SELECT FROM {})").format(job.table.target.identifier()),
    ).fetchone()
    return bool(dest_rows)


def _skip_backfill(job: TableJob) -> TableResult:
    """initial_load skip: no row copied; the destination created or adopted, the cursor
    set at the source's newest key (a `cdc` table's: adopted at the slot's position)."""
    destination, signature = job.observed.destination, job.observed.signature
    if job.table.mode == "cdc":
        from .cdc.adopt_at_slot import adopt_at_slot  # the log's modules: a cdc table's only

        start = adopt_at_slot(job.ends, job.built, destination, signature, _slot_of(job))
    else:
        start = start_without_backfill(job.ends, job.built, destination, signature)
    cursor = start.cursor.value if start.cursor else None
    table_note = "created empty" if start.created else "adopted"
    starts = "applies the log from" if job.table.mode == "cdc" else "cursor starts at"
    reason = f"{job.plan.reason}: destination table {table_note}, {starts} {cursor or 'none'}"
    result = job.success("noop", 0, reason, 0, None, cursor)
    _write_new_state(job, start, result)
    return result


def _slot_of(job: TableJob) -> str:
    """The project's slot (the run's capture set-up made sure it exists)."""
    names = job.run.project.capture_names()
    assert names is not None
    return names.slot


def _resync(job: TableJob) -> TableResult:
    """sync --since/--until: re-read and merge one key range; the cursor stays."""
    bounds, state, key = job.run.resync, job.state, job.table.replication_key
    assert bounds is not None and state is not None and key is not None
    cursor = state.cursor.value if state.cursor else "none"
    span = f"{bounds.since} .. {bounds.until or 'newest'}"
    job.started_log("incremental", f"re-sync of {span} (cursor {cursor} kept)")
    batch = batch_query(
        job.built.model.sql, key, job.built.replication_key_type, bounds.since, bounds.until
    )
    (rows,) = execute(
        job.ends.source, sql.SQL("SELECT count(*) FROM ({}) AS b").format(batch)
    ).fetchone()
    synced = _merge(job, state, rows, bounds)
    reason = f"cursor {cursor} kept; re-sync {span}"
    result = job.success("incremental", synced.rows_read, reason, synced.bytes, cursor, cursor)
    job.write_state(state.model_copy(update={"last_run": job.outcome(result, utc_now())}))
    return result


def _merge(
    job: TableJob, state: TableState, rows: int, bounds: KeyBounds | None = None
) -> IncrementalResult:
    """One batch read and merged, with progress on the terminal: past the cursor, or the
    key range of a re-sync."""
    with job.output.progress(job.name) as progress:
        return incremental_sync(
            job.ends,
            job.built,
            state,
            job.run.spark,
            rows,
            progress,
            bounds,
            job.run.ahead.leftovers,
        )


class _Position(Protocol):
    """Where a load left the table (LoadResult, StartResult)."""

    @property
    def cursor(self) -> Cursor | None: ...

    @property
    def pending(self) -> Pending | None: ...

    @property
    def window(self) -> Window | None: ...


def _write_new_state(job: TableJob, position: _Position, result: TableResult) -> TableState:
    """A table's state after a load (or a start without one): everything from this run, so
    a pending refresh mark is cleared only now. Returns the state written."""
    finished = utc_now()
    state = TableState(
        table=str(job.table.name),
        cursor=position.cursor,
        pending=position.pending,
        window=position.window,
        schema_signature=job.observed.signature.as_json(),
        last_synced_at=finished,
        last_run=job.outcome(result, finished),
        holds_rows=destination_has_rows(job.ends.dest, job.table.target),
        destination_oid=destination_oid(job.ends.dest, job.table.target),
        # swapped in exact: a row only the copy holds from here is the source's deleted one,
        # or one written into the copy after (state.py); asked only where deletes matter
        exact_xmax=snapshot_xmax(job.ends.dest) if job.table.deletes != "ignore" else None,
    )
    job.write_state(state)
    return state
