"""A run that cannot reach a database: every table not done fails with the run's error,
said once (the same line for each of 160 tables would bury everything else)."""

from __future__ import annotations

import logging

from ..base.errors import ReplicatorError, StateError
from ..base.redact import redact
from ..project.config import TableConfig
from ..report.results import TableResult
from .context import RunContext, failure, record_failure

log = logging.getLogger("replicator.sync")


def fail_the_rest(run: RunContext, tables: tuple[TableConfig, ...], exc: ReplicatorError) -> None:
    """Every table not done fails with the run's error, which is logged once with their
    count: the same line for each of 160 tables would bury everything else. Each one's
    state still records the failed run (`status`), and the webhook still lists each one."""
    done = {r.name for r in run.results}
    rest = [t for t in tables if t.written_name not in done]
    for table in rest:
        result = failure(table, str(exc), 0.0)
        _record_unreachable(run, table, result)
        run.results.append(result)
    failed = sum(r.status == "failure" for r in run.results)  # those before it too
    log.error(
        "%s; %d of %d table(s) not synced: the next run tries them again",
        redact(str(exc)),
        failed,
        len(tables),
        extra={
            "fields": {
                "event": "run.unreachable",
                "run_id": run.run_id,
                "error": redact(str(exc)),
                "tables": [t.written_name for t in rest],
            }
        },
    )


def _record_unreachable(run: RunContext, table: TableConfig, result: TableResult) -> None:
    """A run that could not reach a database is still the table's last run (`status` says
    so), unless its state file cannot be trusted, which stays as it is."""
    try:
        state = run.project.store.read(table.name)
    except StateError:
        return
    record_failure(run, table, state, run.started_at, result)
