"""`replicator sync`: every selected table, one at a time, failures isolated.

The steps of each table's sync are in docs/how-it-works/ (full-load.md, incremental.md,
cdc.md); an interrupted run is recorded and reported before the process exits."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from traceback import format_exception
from typing import TYPE_CHECKING, Any

import psycopg

from ..base.errors import (
    Interrupted,
    LockHeld,
    ReplicatorError,
    StateError,
    StateWriteError,
    TableLocked,
    TableProblem,
    one_line,
)
from ..base.interrupts import raise_if_requested, stop_requested, stop_signal_name
from ..base.redact import redact
from ..cdc.source.unused_slot import unused_slot
from ..plan.decide import Plan
from ..plan.drift import plan_now, recheck
from ..plan.read_ahead import read_ahead
from ..postgres.database import Endpoints, connect, connect_all
from ..postgres.ownership import adopt_legacy, bookkeeping_gone
from ..postgres.table_lock import lock_connections, open_ahead, table_lock
from ..project.config import TableConfig
from ..project.project import Project
from ..project.runlock import run_lock
from ..project.settings import Connections, WebhookTarget
from ..project.state import TableState
from ..project.templates import stray_models
from ..report.output import SyncOutput, some_tables
from ..report.results import TableResult, utc_now
from ..report.webhook import build_payload, post
from .context import RunContext, TableJob, failure, record_failure
from .incremental.resync import resync_bounds
from .noop_screen import screen_noops
from .run_record import record_run
from .run_tables import expanded
from .table_actions import carry_out, keep_configured_indexes
from .unreachable import fail_the_rest

if TYPE_CHECKING:  # loaded by a run with cdc tables only (_capture_run)
    from .cdc.cdc_run import CaptureRun

log = logging.getLogger("replicator.sync")


def run_sync(
    project: Project,
    names: tuple[str, ...],
    full_refresh: bool,
    verbose: int,
    *,
    since: str | None = None,
    until: str | None = None,
    always_summarize: bool = False,
    check_deletes: bool = False,
    force_deletes: bool = False,
    notify: Callable[[dict[str, Any], bool], None] | None = None,
) -> int:
    """Sync the tables; exit code 0 when every table succeeded, else 1.

    With `since` (and `until`), re-read that replication-key range of the one selected table
    and merge it, leaving its cursor where it is. `notify` decides about the webhook instead
    of posting every run (`sync --follow`): it gets the payload and whether the run failed."""
    project = expanded(project, names, lambda payload: _deliver_to(project, notify, payload))
    for line in [*project.unmatched, *(v.line() for v in project.vanished)]:
        # a pattern that matches nothing while tables it copied are left behind: an error
        (log.error if project.abandoned and line in project.unmatched else log.warning)("%s", line)
    tables = project.select(names)
    for path, near in stray_models(project.templates, [t.name for t in project.config.tables]):
        log.warning(
            "%s is the model of no table in tables-config.json and is not read%s",
            path,
            f" (did you mean {near}?)" if near else "",
        )
    if check_deletes and all(t.deletes == "ignore" for t in tables):
        log.warning("--deletes: no selected table has `deletes` set: there is nothing to check")
    connections = project.connections()
    resync = resync_bounds(tables, names, full_refresh, since, until, connections.source)
    run = RunContext(
        project,
        full_refresh,
        verbose,
        resync,
        check_deletes=check_deletes,
        force_deletes=force_deletes,
    )
    run.notify = notify
    if project.abandoned:  # the run exits 1, and the webhook says why
        run.warnings.extend(project.unmatched)
    output = SyncOutput(always_summarize, project.settings.progress_interval)
    project.store.remember(True)  # this run's states, read back by record_run
    try:
        with run_lock(project.state_dir), lock_connections():
            project.claim_identity()  # made by its first sync (project/identity.py), and
            connections = project.connections()  # carried by its destination sessions
            try:
                _sync_all(run, tables, connections, output)
            finally:
                _flush_states(run)
    except LockHeld as exc:
        _notify(run, [], status="skipped", error=str(exc))
        raise
    except Interrupted as exc:
        _report_interrupted(run, tables, output, exc)
        record_run(run, tables, exc.describe())
        raise
    except BaseException:  # a bug: no history is written, and its session is closed
        run.close_history_session()
        raise
    finally:
        run.lineage.close(run.results)
    results = run.results
    failed = sum(r.status == "failure" for r in results)
    skipped = _cut_short(tables, results)
    status = "failure" if failed else "interrupted" if skipped else "success"
    log.log(
        logging.WARNING if skipped else logging.INFO,
        "sync finished: %d succeeded, %d failed%s",
        len(results) - failed,
        failed,
        f"; cut short by {stop_signal_name()} (`sync --follow` stopping), {len(skipped)} of "
        f"{len(tables)} table(s) skipped: {some_tables(skipped)}"
        if skipped
        else "",
        extra={
            "fields": {
                "event": "run.finished",
                "run_id": run.run_id,
                "status": status,
                **({"skipped": skipped} if skipped else {}),
            }
        },
    )
    record_run(run, tables)  # before the webhook: its receiver may query the history
    if skipped:
        stopped = f"cut short by {stop_signal_name()} (`sync --follow` stopping)"
        _notify(run, results, status=None if failed else status, error=stopped, skipped=skipped)
    else:
        _notify(run, results)
    output.summary(results, skipped)
    failures = {r.name for r in results if r.status == "failure"}
    if not failures:
        return 1 if run.state_unwritten or run.slot_lost or project.abandoned else 0
    # Every failure was a table another host is syncing: "try again later", like the run lock.
    return TableLocked.exit_code if failures <= run.locked else 1


def _sync_all(
    run: RunContext,
    tables: tuple[TableConfig, ...],
    connections: Connections,
    output: SyncOutput,
) -> list[TableResult]:
    """Every table, one at a time, into `run.results`; a database that cannot be reached
    fails the rest."""
    results = run.results
    log.info(
        "sync started: %d table(s), run %s",
        len(tables),
        run.run_id,
        extra={
            "fields": {
                "event": "run.started",
                "run_id": run.run_id,
                "tables": [t.written_name for t in tables],
            }
        },
    )
    try:
        with ExitStack() as opened:
            source, dest = connect_all(
                (connections.source, "source"), (connections.destination, "destination")
            )
            opened.enter_context(source)
            opened.callback(run.keep_for_history, dest)
            ends = Endpoints(source, dest, connections.source, connections.destination)
            # before a table (or the capture's set-up) creates the registry again
            run.bookkeeping_gone = bookkeeping_gone(dest)
            run.ahead = read_ahead(source, dest, tables)
            cdc = any(t.mode == "cdc" for t in run.project.config.tables)
            capture = _capture_run(run) if cdc else None
            if not cdc and (unused := unused_slot(source, run.project)) is not None:
                said = ": ".join(unused)
                log.warning("source: %s", said)
                run.warnings.append(said)  # the webhook's too: this slot only grows
            if capture is not None:
                capture.set_up(ends, tables)
            untouched = screen_noops(run, ends, tables, output)
            if len(untouched) < len(tables):  # the first table's lock, while it plans
                open_ahead(ends.dest_url)
            for table in tables:
                if stop_requested():  # `sync --follow` asked to stop: finish here
                    break
                result = untouched.get(table.written_name)
                if result is not None:
                    _log_result(run, result)
                    results.append(result)
                    continue
                ends = _reconnected(run, ends, opened)
                result = _sync_table(run, ends, table, output, capture)
                if result is not None:  # None: a `cdc` table the drain below syncs
                    results.append(result)
            if capture is not None and not stop_requested():  # else its tables wait too
                ends = _reconnected(run, ends, opened)
                drained, drifted = capture.drain_deferred(ends)
                for result in drained:
                    _log_result(run, result)
                results.extend(drained)
                for table in drifted:  # reloaded now: it is no longer deferred
                    result = _sync_table(run, ends, table, output, capture)
                    if result is not None:
                        results.append(result)
                order = {t.written_name: i for i, t in enumerate(tables)}
                results.sort(key=lambda r: order.get(r.name, 0))
    except ReplicatorError as exc:  # a database could not be reached: every table not done
        fail_the_rest(run, tables, exc)
    finally:
        run.spark.finish()


def _capture_run(run: RunContext) -> CaptureRun:
    """The run's cdc tables, their modules imported here: a run without one (a cron run of
    cursor tables) never loads the log's reader, decoder and apply."""
    from .cdc.cdc_run import CaptureRun

    return CaptureRun(run)


def _reconnected(run: RunContext, ends: Endpoints, opened: ExitStack) -> Endpoints:
    """The run's two connections, each opened again if it was lost (a server restarted, a
    session terminated): the table that was using it failed, the next ones go on. One that
    cannot be opened again fails the rest of the run (`fail_the_rest`)."""
    source, dest = ends.source, ends.dest
    if source.closed or source.broken:
        log.warning("source: the connection was lost; connecting again")
        source = opened.enter_context(connect(ends.source_url, "source"))
    if dest.closed or dest.broken:
        log.warning("destination: the connection was lost; connecting again")
        dest = connect(ends.dest_url, "destination")
        opened.callback(run.keep_for_history, dest)
    return (
        ends
        if (source, dest) == (ends.source, ends.dest)
        else replace(ends, source=source, dest=dest)
    )


def _cut_short(tables: tuple[TableConfig, ...], results: list[TableResult]) -> list[str]:
    """The tables a stopping `sync --follow` did not start (none when it was not stopping)."""
    if not stop_requested():
        return []
    done = {r.name for r in results}
    return [t.written_name for t in tables if t.written_name not in done]


def _flush_states(run: RunContext) -> None:
    """The states of tables the run left as they were, written together (their last run):
    a disk that cannot take them fails the run, said once."""
    try:
        run.project.store.flush()
    except StateWriteError as exc:
        log.error("%s", exc)
        run.state_unwritten = True


def _notify(
    run: RunContext,
    results: list[TableResult],
    status: str | None = None,
    error: str | None = None,
    within: float = 60.0,
    skipped: list[str] | None = None,
) -> None:
    """The webhook, when one is configured; its failure never changes the exit code."""
    if run.webhook is None:
        return
    if run.slot_lost is not None and status is None:  # the run exits 1: so says its notice
        status, error = "failure", error or run.slot_lost
    error = redact(error) if error else None
    warnings = [redact(w) for w in run.warnings]
    payload = build_payload(
        run.run_id, run.started_at, utc_now(), results, status, error, warnings, skipped
    )
    _deliver(run.webhook, run.notify, payload, within)


def _deliver_to(
    project: Project,
    notify: Callable[[dict[str, Any], bool], None] | None,
    payload: dict[str, Any],
) -> None:
    webhook = project.settings.webhook
    if webhook is not None:
        _deliver(webhook, notify, payload)


def _deliver(
    webhook: WebhookTarget,
    notify: Callable[[dict[str, Any], bool], None] | None,
    payload: dict[str, Any],
    within: float = 60.0,
) -> None:
    """Post the payload, or hand it to `sync --follow`'s notifier, which decides."""
    if notify is not None:
        notify(payload, payload["status"] != "success")
        return
    post(webhook, payload, within=within)


def _report_interrupted(
    run: RunContext, tables: tuple[TableConfig, ...], output: SyncOutput, exc: Interrupted
) -> None:
    """A run stopped by SIGTERM or SIGINT: the log line, the webhook (quickly: whoever sent
    the signal will not wait long) and the summary of what was done."""
    results = run.results
    done = {r.name for r in results}
    waiting = [t.written_name for t in tables if t.written_name not in done]
    stopped = [r.name for r in results if r.error and r.error.startswith(exc.describe())]
    finished = len(results) - len(stopped)
    stopped += [name for name in waiting if name in run.draining]  # the log's batches so far
    waiting = [name for name in waiting if name not in run.draining]
    log.error(
        "run interrupted by %s: %d of %d table(s) finished%s%s; the next run continues from "
        "what was committed",
        exc.signal_name,
        finished,
        len(tables),
        f", {', '.join(stopped)} stopped" if stopped else "",
        f", not started: {', '.join(waiting)}" if waiting else "",
        extra={"fields": {"event": "run.finished", "run_id": run.run_id, "status": "interrupted"}},
    )
    _notify(run, results, status="interrupted", error=exc.describe(), within=10.0)
    output.summary(results)
    exc.reported = True


def _sync_table(
    run: RunContext,
    ends: Endpoints,
    table: TableConfig,
    output: SyncOutput,
    capture: CaptureRun | None = None,
) -> TableResult | None:
    started, started_at = time.monotonic(), utc_now()
    store = run.project.store
    try:
        state = store.read(table.name)
    except StateError as exc:
        result = failure(table, str(exc), time.monotonic() - started)
        log.error(result.line())
        return result  # an untrusted state file is never overwritten
    try:
        with table_lock(ends.dest_url, table.target, table.written_name):
            result = _sync_locked_table(
                run, ends, table, state, started, started_at, output, capture
            )
        if result is None:
            return None
    except Interrupted as exc:  # what the table's load created is gone; its state stays
        result = failure(table, f"{exc.describe()} before it finished", time.monotonic() - started)
        record_failure(run, table, state, started_at, result)
        run.results.append(result)
        raise
    except TableLocked as exc:  # another host's run: its state is not ours to touch
        run.locked.add(table.written_name)
        result = failure(table, str(exc), time.monotonic() - started)
    except ReplicatorError as exc:  # the lock's own connection
        result = failure(table, one_line(exc), time.monotonic() - started)
        record_failure(run, table, state, started_at, result)
    finally:
        run.early.pop(table.written_name, None)  # planned again if it comes round again
    _log_result(run, result)
    return result


def _log_result(run: RunContext, result: TableResult) -> None:
    """The line that says a table is done (event `table.finished`), and its OpenLineage
    COMPLETE or FAIL."""
    run.lineage.finished(result)
    (log.info if result.status == "success" else log.error)(
        result.line(),
        extra={"fields": {"event": "table.finished", "run_id": run.run_id, **result.as_dict()}},
    )


def _sync_locked_table(
    run: RunContext,
    ends: Endpoints,
    table: TableConfig,
    state: TableState | None,
    started: float,
    started_at: str,
    output: SyncOutput,
    capture: CaptureRun | None,
) -> TableResult | None:
    """Plan the table (or bring the screen's plan up to date) and carry the plan out, its
    destination lock held; a failure is recorded in its state and returned as the result.
    None: a `cdc` table that goes on from the log, deferred to the run's drain
    (cdc/cdc_run.py)."""
    plan: Plan | None = None
    try:
        early = run.early.get(table.written_name)
        planned = None
        if early is not None and early.state == state:
            planned = recheck(ends.dest, table, state, early.planned, run.full_refresh)
        if planned is None:
            planned = plan_now(
                ends.source,
                ends.dest,
                table,
                run.project.templates,
                state,
                run.full_refresh,
                ahead=run.ahead_for(table),
            )
        plan = planned.plan
        if plan.action == "fail":
            raise TableProblem(f"{table.written_name}: {plan.reason}; {plan.fix}")
        if run.resync is not None and plan.action != "incremental":
            raise TableProblem(
                f"{table.written_name}: cannot re-sync a key range: the table needs a full "
                f"reload first ({plan.reason}); run `replicator sync -s {table.written_name}`"
            )
        if table.mode == "cdc" and capture is not None:
            planned = capture.adjust(ends, planned, state)
            plan = planned.plan
        if planned.observed.ownership == "legacy":
            _adopt(run, ends, table)
        if plan.action != "full_reload":  # a reload builds them on its new table
            keep_configured_indexes(ends.dest, planned)
        job = TableJob(run, ends, table, planned, state, output, started, started_at)
        if plan.action == "incremental" and table.mode == "cdc" and capture is not None:
            capture.defer(job)
            return None
        result = carry_out(job)
    except (ReplicatorError, psycopg.Error) as exc:
        raise_if_requested()  # a query cancelled by SIGTERM/SIGINT: not the table's failure
        log.debug("%s: traceback:\n%s", table.written_name, "".join(format_exception(exc)))
        result = failure(
            table,
            one_line(exc),
            time.monotonic() - started,
            plan.action if plan and plan.action in ("full_reload", "incremental") else None,
            plan.reason if plan else None,
        )
        record_failure(run, table, state, started_at, result)
    except Exception as exc:  # a bug: keep going with the next table
        raise_if_requested()
        log.debug("%s: traceback:\n%s", table.written_name, "".join(format_exception(exc)))
        result = failure(table, f"internal error: {one_line(exc)}", time.monotonic() - started)
        record_failure(run, table, state, started_at, result)
    return result


def _adopt(run: RunContext, ends: Endpoints, table: TableConfig) -> None:
    """Record a table the sync-state says the tool loaded; the first in a run whose
    bookkeeping was dropped says what that means, once."""
    dropped = run.bookkeeping_gone
    if dropped is not None and not run.said_gone:
        run.said_gone = True
        log.warning(
            "replicator's bookkeeping in the destination was dropped (%s): the tables this "
            "project's sync-state says it loaded are recorded as replicator's again; the rest "
            "of it is gone too: cdc tables reload in full (their log positions were kept "
            "there) and unfinished resumable loads start over",
            dropped,
        )
    adopt_legacy(ends.dest, table, dropped)
