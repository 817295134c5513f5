"""Delete propagation for cursor tables (`tables[].deletes`): after a successful incremental
run (or no-op), the keys of the model and of the destination are compared, in one snapshot
each (compare/), and destination rows whose key the source no longer has are deleted
(`delete`), or kept with `_replicator_deleted_at` set (`mark`), in one transaction.

Guards: the check never follows a failed run, a full reload (exact already) or a `--since`
re-sync (a partial read); and a check that would delete more than half of the destination's
rows fails the table (exit 1) unless `sync --deletes --force` says the source really lost
them. A key deleted and inserted again is in the source, so its row stays.
"""

from __future__ import annotations

import dataclasses
import logging
from traceback import format_exception

import psycopg
from psycopg import sql

from ...base.errors import ReplicatorError, StateError, TableProblem, one_line
from ...base.failpoints import failpoint
from ...base.interrupts import raise_if_requested
from ...plan.decide import delete_check_due
from ...plan.drift import destination_has_rows
from ...postgres.catalog import describe_table
from ...postgres.database import execute, transaction
from ...postgres.history_tables import gone_steps
from ...postgres.naming import MARK_COLUMN
from ...postgres.open_transactions import snapshot_xmax
from ...project.state import TableState
from ...report.results import TableResult, utc_now
from ..context import TableJob, table_error

log = logging.getLogger("replicator.sync")

BATCH_KEYS = 10_000  # keys per DELETE statement (all in one transaction)


def propagate_deletes(job: TableJob, result: TableResult) -> TableResult:
    """The delete check when it is due; the result gains its count, or becomes a failure."""
    if not _due(job, result):
        return result
    try:
        exact = snapshot_xmax(job.ends.dest)  # before the check reads the copy: see state.py
        deleted, closed = _delete_gone_rows(job)
    except (ReplicatorError, psycopg.Error) as exc:
        raise_if_requested()
        log.debug("%s: traceback:\n%s", job.name, "".join(format_exception(exc)))
        text = one_line(exc).removeprefix(f"{job.name}: ")
        failure = dataclasses.replace(
            result, status="failure", error=table_error(job.table, f"delete check: {text}")
        )
        _record(job, failure, checked=None)
        return failure
    done = dataclasses.replace(result, deleted=deleted, marked=job.table.deletes == "mark")
    if closed:
        done = dataclasses.replace(done, versions_closed=(done.versions_closed or 0) + closed)
    _record(job, done, checked=exact)
    return done


def _due(job: TableJob, result: TableResult) -> bool:
    if job.table.deletes == "ignore" or result.status != "success":
        return False
    if result.action not in ("incremental", "noop") or job.run.resync is not None:
        return False
    return job.run.check_deletes or delete_check_due(job.table, job.state)


def _delete_gone_rows(job: TableJob) -> tuple[int, int]:
    """The rows deleted (or marked), and the history versions that closed."""
    # verify's comparison, imported when a check is due: a batch without one never loads it
    from ...compare.comparison import compared, sides_of
    from ...compare.repair import remove

    ends = job.ends
    destination = describe_table(job.ends.dest, job.table.target)
    if destination is None:
        raise TableProblem(f"{job.name}: destination table {job.table.target} is gone")
    sides = sides_of(ends, job.table, job.built, destination.columns, keys_only=True)
    history = job.built.history
    if history is not None:  # the check's time, on the source's clock as the versions' are
        (checked_at,) = execute(ends.source, "SELECT now()").fetchone()
    with (
        job.built.reading_model(),
        compared(ends, job.table, sides, job.run.spark) as (found, _),
    ):
        gone = found.extra
        if not gone:
            return 0, 0
        if 2 * len(gone) > found.destination_rows and not job.run.force_deletes:
            raise TableProblem(
                f"{job.name}: it would delete {len(gone):,} of "
                f"{found.destination_rows:,} rows, more than half: nothing was deleted. If "
                f"the source really lost them, run `replicator sync --deletes --force -s "
                f"{job.name}`"
            )
        with transaction(job.ends.dest):
            for start in range(0, len(gone), BATCH_KEYS):
                statement, params = remove(
                    sides.shape, sides.target, gone[start : start + BATCH_KEYS]
                )
                execute(job.ends.dest, statement, params)
            closed = 0
            if history is not None:
                present = (
                    sql.SQL("c.{} IS NULL").format(sql.Identifier(MARK_COLUMN))
                    if sides.target.mark
                    else sql.SQL("true")
                )
                for step in gone_steps(history, checked_at, present):
                    closed += execute(job.ends.dest, step.statement, step.params).rowcount
            failpoint("deletes-before-commit")
    log.info(
        "%s: %s row(s) no longer in the source (deleted, or out of the model) %s here",
        job.name,
        f"{len(gone):,}",
        "marked deleted" if sides.target.mark else "deleted",
        extra={"fields": {"event": "table.deleted", "name": job.name, "rows": len(gone)}},
    )
    return len(gone), closed


def _record(job: TableJob, result: TableResult, *, checked: str | None) -> None:
    """The check's time and the destination's xmax as it began (`checked`, when it ran) and
    the run's outcome, in the state the action just wrote (its cursor stays)."""
    store = job.run.project.store
    try:
        state = store.read(job.table.name) or TableState(table=str(job.table.name))
    except StateError:
        return
    finished = utc_now()
    update: dict = {"last_run": job.outcome(result, finished)}
    if checked is not None:
        update.update(deletes_checked_at=finished, exact_xmax=checked)
    if result.deleted:
        update["holds_rows"] = destination_has_rows(job.ends.dest, job.table.target)
    job.write_state(state.model_copy(update=update))
