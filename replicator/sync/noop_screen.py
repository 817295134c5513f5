"""Cursor tables with nothing new, found for the whole run before any is synced: each one
planned (its catalog facts read ahead), then all probed together (probe_many.py), then
finished as a `noop` without its destination lock or a state file written on its own. A run
of 1,000 untouched tables costs a few round trips more than a run of ten.

Only the plainest case is screened: a cursor table (no `cdc`) with a state, whose plan is
incremental on a copy the tool owns that has the indexes its config asks for, no unfinished
reload, on a plain run (no `-f`, `--since`, `--deletes`). A table with `deletes` whose
delete check is due is screened when its copy holds as many rows as its model reads
(probe_many.counts_match: one count a side, fifty tables a statement), which is its delete
check's answer when nothing was deleted. Everything else goes through the run's usual
steps, planned under its lock; a table the screen finds changed keeps the screen's plan,
and only what can change is read again under its lock (plan/drift.recheck).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import psycopg

from ..base.errors import ReplicatorError, StateError
from ..plan.decide import delete_check_due
from ..plan.drift import plan_now
from ..postgres.database import Endpoints
from ..project.config import TableConfig
from ..report.output import SyncOutput
from ..report.results import TableResult, utc_now
from .context import EarlyPlan, RunContext, TableJob
from .full_load.resume import unfinished_targets
from .probe_many import counts_match, probe_many
from .table_actions import finish_noop, missing_indexes

CURSOR_MODES = ("incremental-deduped", "incremental-append")


def screen_noops(
    run: RunContext, ends: Endpoints, tables: Sequence[TableConfig], output: SyncOutput
) -> dict[str, TableResult]:
    """The results of the tables found untouched, by written name (already finished)."""
    if run.full_refresh or run.resync is not None or run.check_deletes:
        return {}
    jobs = [job for table in tables if (job := _candidate(run, ends, table, output))]
    probed = probe_many(ends.source, [(job.name, job.built, job.state) for job in jobs])
    due = [
        job
        for job in jobs
        if (found := probed.get(job.name)) is not None
        and not found.changed
        and delete_check_due(job.table, job.state)
    ]
    checked, exact = counts_match(
        ends.source, ends.dest, [(job.name, job.built, job.state) for job in due]
    )
    unchecked = {job.name for job in due} - checked
    results = {}
    for job in jobs:
        found = probed.get(job.name)
        if found is not None and found.changed:  # its sync need not count its rows again
            run.early[job.name] = EarlyPlan(job.state, job.planned, found)
        if found is None or found.changed or job.name in unchecked:
            continue
        job = dataclasses.replace(job, started=time.monotonic())  # its own time alone
        with job.built.reading_model():
            checked_at = exact if job.name in checked else None
            results[job.name] = finish_noop(job, found, deletes_checked=checked_at)
    return results


def _candidate(
    run: RunContext, ends: Endpoints, table: TableConfig, output: SyncOutput
) -> TableJob | None:
    """The table's job when it may be screened; None to leave it to the usual steps."""
    if table.mode not in CURSOR_MODES or table.problem:
        return None
    try:
        state = run.project.store.read(table.name)
    except StateError:
        return None
    if state is None or state.last_synced_at is None:
        return None
    started, started_at = time.monotonic(), utc_now()
    try:
        if table.target.sql() in unfinished_targets(ends.dest):
            return None
        planned = plan_now(
            ends.source, ends.dest, table, run.project.templates, state, ahead=run.ahead_for(table)
        )
        # under its lock: the indexes built, the schema change taken (table_actions)
        if missing_indexes(planned) or planned.observed.evolution is not None:
            return None
    except (ReplicatorError, psycopg.Error):
        return None  # its own sync says why
    if planned.plan.action != "incremental" or planned.observed.ownership != "owned":
        return None
    return TableJob(run, ends, table, planned, state, output, started, started_at)
