"""`replicator sync`: every selected table, one at a time, failures isolated (DESIGN §3)."""

from __future__ import annotations

import logging
import time
import traceback
import uuid

import psycopg

from .catalog import TableInfo, describe_table
from .config import TableConfig
from .database import connect
from .errors import ConfigError, LockHeld, ReplicatorError, StateError
from .failpoints import failpoint
from .full_load import Endpoints, full_reload
from .incremental import incremental_sync, probe
from .inspect_table import inspect_source
from .plan import Plan, plan_table
from .project import Project
from .redact import redact, register_secret
from .results import TableResult, utc_now
from .runlock import run_lock
from .settings import SPARK_MASTER, SPARK_MIN_ROWS, WEBHOOK_SECRET, WEBHOOK_URL, Connections
from .signature import schema_signature
from .spark_runner import SparkRunner
from .state import RunOutcome, TableState
from .sync_output import SyncOutput
from .table_sql import TableSql
from .webhook import WebhookTarget, build_payload, post

log = logging.getLogger("replicator.sync")


class RunContext:
    """What every table of one run shares."""

    def __init__(self, project: Project, full_refresh: bool, verbose: int) -> None:
        self.project = project
        self.full_refresh = full_refresh
        self.verbose = verbose
        self.run_id = uuid.uuid4().hex
        self.started_at = utc_now()
        config = project.config.spark
        master = project.env.get(SPARK_MASTER) or config.master
        self.webhook = webhook_target(project)
        self.spark = SparkRunner(
            master, config.conf, quiet=verbose == 0, min_rows=_min_rows(project)
        )


def webhook_target(project: Project) -> WebhookTarget | None:
    """webhook.url / .secret, REPLICATOR_WEBHOOK_URL / _SECRET winning."""
    configured = project.config.webhook
    url = project.env.get(WEBHOOK_URL) or (configured.url if configured else None)
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise ConfigError([f"{WEBHOOK_URL} must be an http:// or https:// URL"])
    secret = project.env.get(WEBHOOK_SECRET) or (configured.secret if configured else None)
    register_secret(secret)
    return WebhookTarget(url, secret)


def _min_rows(project: Project) -> int:
    """spark.min_rows, or REPLICATOR_SPARK_MIN_ROWS when set (a whole number, else exit 2)."""
    value = project.env.get(SPARK_MIN_ROWS)
    if value is None:
        return project.config.spark.min_rows
    if not value.isdigit():
        raise ConfigError([f"{SPARK_MIN_ROWS} must be a whole number of rows, got {value!r}"])
    return int(value)


def run_sync(
    project: Project,
    names: tuple[str, ...],
    full_refresh: bool,
    verbose: int,
    *,
    always_summarize: bool = False,
) -> int:
    """Sync the tables; exit code 0 when every table succeeded, else 1."""
    tables = project.select(names)
    connections = project.connections()
    run = RunContext(project, full_refresh, verbose)
    output = SyncOutput(always_summarize)
    try:
        with run_lock(project.state_dir):
            results = _sync_all(run, tables, connections, output)
    except LockHeld as exc:
        _notify(run, [], status="skipped", error=str(exc))
        raise
    failed = sum(r.status == "failure" for r in results)
    log.info(
        "sync finished: %d succeeded, %d failed",
        len(results) - failed,
        failed,
        extra={
            "fields": {
                "event": "run.finished",
                "run_id": run.run_id,
                "status": "failure" if failed else "success",
            }
        },
    )
    _notify(run, results)
    output.summary(results)
    return 0 if all(r.status == "success" for r in results) else 1


def _sync_all(
    run: RunContext,
    tables: tuple[TableConfig, ...],
    connections: Connections,
    output: SyncOutput,
) -> list[TableResult]:
    """Every table, one at a time; a database that cannot be reached fails the rest."""
    results: list[TableResult] = []
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
        with (
            connect(connections.source, "source") as source,
            connect(connections.destination, "destination") as dest,
        ):
            ends = Endpoints(source, dest, connections.source, connections.destination)
            for table in tables:
                results.append(_sync_table(run, ends, table, output))
    except ReplicatorError as exc:
        done = {r.name for r in results}
        results += [_failure(t, str(exc), 0.0) for t in tables if t.written_name not in done]
        for result in results[len(done) :]:
            log.error(result.line())
    finally:
        run.spark.finish()
    return results


def _notify(
    run: RunContext,
    results: list[TableResult],
    status: str | None = None,
    error: str | None = None,
) -> None:
    """The webhook, when one is configured; its failure never changes the exit code."""
    if run.webhook is None:
        return
    payload = build_payload(
        run.run_id, run.started_at, utc_now(), results, status, redact(error) if error else None
    )
    post(run.webhook, payload)


def _failure(
    table: TableConfig,
    error: str,
    seconds: float,
    action: str | None = None,
    reason: str | None = None,
) -> TableResult:
    return TableResult(table.written_name, "failure", action, None, reason, redact(error), seconds)


def _sync_table(
    run: RunContext, ends: Endpoints, table: TableConfig, output: SyncOutput
) -> TableResult:
    started, started_at = time.monotonic(), utc_now()
    store = run.project.store
    try:
        state = store.read(table.name)
    except StateError as exc:
        result = _failure(table, str(exc), time.monotonic() - started)
        log.error(result.line())
        return result  # an untrusted state file is never overwritten
    plan: Plan | None = None
    try:
        source, built = inspect_source(ends.source, table, run.project.templates)
        destination_exists = describe_table(ends.dest, table.target) is not None
        plan = plan_table(
            table.mode or "",
            state,
            full_refresh=run.full_refresh,
            destination_exists=destination_exists,
        )
        if plan.action == "incremental":
            assert state is not None
            result = _incremental(run, ends, table, built, state, plan, started, started_at, output)
        else:
            result = _full_reload(
                run, ends, table, built, source, state, plan, started, started_at, output
            )
    except (ReplicatorError, psycopg.Error) as exc:
        result = _failure(
            table,
            _one_line(exc),
            time.monotonic() - started,
            plan.action if plan else None,
            plan.reason if plan else None,
        )
        _record_failure(run, table, state, started_at, result)
    except Exception as exc:  # a bug: keep going with the next table
        log.debug("traceback:\n%s", "".join(traceback.format_exception(exc)))
        result = _failure(table, f"internal error: {_one_line(exc)}", time.monotonic() - started)
        _record_failure(run, table, state, started_at, result)
    (log.info if result.status == "success" else log.error)(
        result.line(),
        extra={"fields": {"event": "table.finished", "run_id": run.run_id, **result.as_dict()}},
    )
    return result


def _full_reload(
    run: RunContext,
    ends: Endpoints,
    table: TableConfig,
    built: TableSql,
    source: TableInfo,
    state: TableState | None,
    plan: Plan,
    started: float,
    started_at: str,
    output: SyncOutput,
) -> TableResult:
    """Load the table in full through a side table and a swap; record the new state."""
    reason = plan.reason
    log.info("%s: full_reload (%s)", table.written_name, reason)
    with output.progress(table.written_name) as progress:
        loaded = full_reload(ends, built, source, run.spark, progress)
    finished = utc_now()
    result = TableResult(
        table.written_name,
        "success",
        "full_reload",
        loaded.rows,
        reason,
        None,
        time.monotonic() - started,
        loaded.bytes,
        state.cursor.value if state and state.cursor else None,
        loaded.cursor.value if loaded.cursor else None,
    )
    run.project.store.write(
        TableState(
            table=str(table.name),
            cursor=loaded.cursor,
            pending=loaded.pending,
            window=loaded.window,
            schema_signature=schema_signature(
                source, built.columns, built.primary_key, table.replication_key
            ),
            last_synced_at=finished,
            last_run=_outcome(run, started_at, finished, result),
        ),
        table.name,
    )
    return result


def _incremental(
    run: RunContext,
    ends: Endpoints,
    table: TableConfig,
    built: TableSql,
    state: TableState,
    plan: Plan,
    started: float,
    started_at: str,
    output: SyncOutput,
) -> TableResult:
    """Probe without Spark; read, stage and merge only when something changed."""
    before = state.cursor.value if state.cursor else None
    probed = probe(ends.source, built, state)
    if not probed.changed:
        finished = utc_now()
        result = TableResult(
            table.written_name,
            "success",
            "noop",
            0,
            plan.reason,
            None,
            time.monotonic() - started,
            0,
            before,
            before,
        )
        run.project.store.write(
            state.model_copy(
                update={
                    "pending": probed.pending,
                    "last_synced_at": finished,
                    "last_run": _outcome(run, started_at, finished, result),
                }
            ),
            table.name,
        )
        return result
    log.info("%s: incremental (%s)", table.written_name, plan.reason)
    with output.progress(table.written_name) as progress:
        synced = incremental_sync(ends, built, state, run.spark, probed.rows, progress)
    after = synced.cursor.value if synced.cursor else None
    finished = utc_now()
    result = TableResult(
        table.written_name,
        "success",
        "incremental",
        synced.rows_read,
        f"cursor {before or 'none'} -> {after or 'none'}",
        None,
        time.monotonic() - started,
        synced.bytes,
        before,
        after,
    )
    failpoint("after-merge-before-state")
    run.project.store.write(
        state.model_copy(
            update={
                "cursor": synced.cursor,
                "pending": synced.pending,
                "window": synced.window,
                "last_synced_at": finished,
                "last_run": _outcome(run, started_at, finished, result),
            }
        ),
        table.name,
    )
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _outcome(run: RunContext, started_at: str, finished_at: str, result: TableResult) -> RunOutcome:
    return RunOutcome(
        run_id=run.run_id,
        started_at=started_at,
        finished_at=finished_at,
        status=result.status,
        action=result.action,
        rows=result.rows,
        reason=result.reason,
        error=result.error,
    )


def _record_failure(
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
            base.model_copy(update={"last_run": _outcome(run, started_at, utc_now(), result)}),
            table.name,
        )
    except OSError as exc:
        log.error("%s: could not record the failure in sync-state: %s", table.written_name, exc)
