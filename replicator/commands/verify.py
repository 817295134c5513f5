"""`replicator verify`: prove each table's copy, or find (and with --repair, fix) exactly the
rows that differ. Read-only without --repair; with it, each table's destination lock is
held while it is compared and repaired, so it never runs between a sync's read and merge.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Collection

from rich.console import Console
from rich.table import Table

from ..base.errors import ReplicatorError, StateError
from ..base.redact import redact
from ..cdc.apply.applied import applied_positions
from ..cdc.pending import Key, pending_keys
from ..cdc.preflight import capture_problem
from ..compare.verdict import REPEATED_KEY, Verdict
from ..compare.verify_table import PendingLookup, verify_table
from ..plan.inspect_table import inspect_source
from ..postgres.database import Endpoints, connect
from ..postgres.table_lock import lock_connections
from ..project.config import TableConfig
from ..project.project import Project
from ..report.logs import json_output, quiet
from ..report.output import some_tables
from ..report.results import utc_now
from ..report.webhook import build_verify_payload, post
from ..spark.runner import SparkRunner

log = logging.getLogger("replicator.verify")


def run_verify(
    project: Project,
    names: tuple[str, ...],
    repair: bool,
    as_json: bool,
    verbose: int,
    force: bool = False,
) -> int:
    """Verify the tables; exit 0 when every one is equal (or was repaired), else 1."""
    tables = project.select(names)
    connections = project.connections()
    settings = project.settings
    spark = SparkRunner.for_run(settings, verbose)
    run_id, started_at = uuid.uuid4().hex, utc_now()
    verdicts: list[Verdict] = []
    try:
        with (
            connect(connections.source, "source") as source,
            connect(connections.destination, "destination") as dest,
            lock_connections(),
        ):
            ends = Endpoints(source, dest, connections.source, connections.destination)
            for table in tables:
                verdicts.append(_verify_one(project, ends, table, spark, repair, force))
    except ReplicatorError as exc:  # a database could not be reached: every table not done
        done = {v.name for v in verdicts}
        rest = [t for t in tables if t.written_name not in done]
        verdicts += [_failed(table, str(exc)) for table in rest]
        log.error("%s; %d of %d table(s) not verified", redact(str(exc)), len(rest), len(tables))
    finally:
        spark.finish()
    if settings.webhook is not None:
        payload = build_verify_payload(run_id, started_at, utc_now(), verdicts, repair)
        post(settings.webhook, payload)
    _print(verdicts, as_json or json_output(), repair)
    return 0 if all(v.fixed for v in verdicts) else 1


def _verify_one(
    project: Project,
    ends: Endpoints,
    table: TableConfig,
    spark: SparkRunner,
    repair: bool,
    force: bool,
) -> Verdict:
    try:
        state = project.store.read(table.name)
        never = state is None or state.last_synced_at is None
        problem = _uncapturable(project, ends, table) if never else None
    except StateError as exc:
        state, problem = None, str(exc)
    if problem is not None:
        verdict = _failed(table, problem)
    else:
        log.info("%s: verifying%s", table.written_name, " and repairing" if repair else "")
        verdict = verify_table(
            ends,
            table,
            project.templates,
            state,
            spark,
            fix=repair,
            force=force,
            pending=_pending_changes(project, ends, table),
        )
    level = logging.ERROR if verdict.status == "failed" else logging.INFO
    if verdict.status == "different" and not verdict.fixed:
        level = logging.WARNING
    log.log(
        level,
        verdict.line(),
        extra={"fields": {"event": "verify.table", **verdict.as_dict()}},
    )
    return verdict


def _uncapturable(project: Project, ends: Endpoints, table: TableConfig) -> str | None:
    """Why a `cdc` table never loaded cannot be, with the fix (the sync fails it for that:
    "run sync first" would not help); None when it can, or is not a `cdc` table."""
    if table.mode != "cdc":
        return None
    try:
        info, built = inspect_source(ends.source, table, project.templates)
        problem = capture_problem(ends.source, info, built, project.cdc_tables)
    except ReplicatorError:
        return None  # the comparison says why
    return None if problem is None else problem.removeprefix(f"{table.written_name}: ")


def _pending_changes(project: Project, ends: Endpoints, table: TableConfig) -> PendingLookup | None:
    """For a `cdc` table, its changes still in the slot (read only when the comparison
    finds differences). Its applied position is read now, before the comparison's
    snapshots: a change a concurrent sync applies in between still counts as pending."""
    if table.mode != "cdc":
        return None
    names = project.capture_names()
    since = applied_positions(ends.dest).get(table.target)
    if names is None or since is None:
        return None

    def lookup(key: tuple[str, ...], differing: list[Key], now: bool) -> Collection[Key] | None:
        assert names is not None and since is not None
        applied = (applied_positions(ends.dest).get(table.target) or since) if now else since
        return pending_keys(
            ends.source_url, names.slot, names.publication, table.name, key, applied, differing
        )

    return lookup


def _failed(table: TableConfig, error: str) -> Verdict:
    return Verdict(table.written_name, "failed", error=redact(error))


def _print(verdicts: list[Verdict], as_json: bool, repair: bool) -> None:
    if as_json:
        print(
            json.dumps(
                [v.as_dict() for v in verdicts],
                indent=None if json_output() else 2,
                ensure_ascii=False,
            )
        )
        return
    if quiet():
        return
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    grid = Table(title="verify" + (" --repair" if repair else ""))
    for title in ("table", "status", "rows", "missing", "extra", "different", "not yet synced"):
        grid.add_column(title, overflow="fold")
    if repair:
        grid.add_column("repaired")
    for v in verdicts:
        counts = [v.rows_compared, v.missing, v.extra, v.different, v.not_yet_synced]
        counts += [v.repaired] if repair else []
        # a table that failed was not compared: its zeros would read as an equal, empty table
        grid.add_row(v.name, v.status, *("-" if v.status == "failed" else f"{n:,}" for n in counts))
    console.print(grid)
    for v in verdicts:  # its history table, checked against the copy (history_check.py)
        if v.history is not None:
            console.print(f"{v.name}: {v.history.line()}", markup=False, soft_wrap=True)
    errors: dict[str, list[str]] = {}  # one error of many tables (a database out of reach)
    for v in verdicts:
        if v.error:
            errors.setdefault(v.error, []).append(v.name)
    for error, names in errors.items():
        said = names[0] if len(names) == 1 else some_tables(names)
        console.print(f"{said}: {error}", markup=False, soft_wrap=True)
    for v in verdicts:
        for example in v.examples:
            key = json.dumps(example["key"], ensure_ascii=False)
            copies = example.get("count", 1)  # a table without a key: a row and its copies
            times = f" ({copies:,} copies)" if copies > 1 else ""
            kind = example["kind"].replace("_", " ")
            console.print(f"{v.name}: {kind} {key}{times}", markup=False, soft_wrap=True)
        more = v.differences - sum(
            e.get("count", 1) for e in v.examples if e["kind"] != REPEATED_KEY
        )
        if v.examples and more > 0:
            console.print(f"{v.name}: ... and {more:,} more{_more_said(v, repair)}")


def _more_said(v: Verdict, repair: bool) -> str:
    """What became of the differences the examples leave out."""
    if not repair:
        return " (all of them with --repair)"
    done = f"all {v.differences:,}" if v.fixed else f"{v.repaired:,} of {v.differences:,}"
    return f"; {done} differences repaired"
